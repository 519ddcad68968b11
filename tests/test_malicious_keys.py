"""A malicious server against the keys of secure aggregation and masked inner products, played
against the real client classes (HyFDCA's and HyFEM's): the server relays the X25519 keys the
clients' pair masks, self-mask shares and segment keys derive from, so without a roster it can
put its own key in place of a peer's and read what the victim masks with it.

Each attack runs twice: without a roster (``signed=False``, what every run did before the keys were
signed: the attack works, the test shows the server reading the victim's words exactly) and with
one (``signed=True``: every client holds the federation's roster and signs its key; the victim
refuses the substituted key in one sentence naming the peer, and stops). Checked against the code
before this work (main at c0450e4, ``PYTHONPATH`` on the main tree, this file's imports of
``key_fields`` and ``KEY_PURPOSE`` stubbed): the three ``signed=True`` attack cases failed there
(DID NOT RAISE: the victim accepted the server's key), the ``signed=False`` cases passed.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.errors import HybridFLError, ProtocolError
from hybridfl.privacy import secagg
from hybridfl.privacy.roster import PeerAuthError, in_memory_auths
from hybridfl.privacy.secagg import SecAggClient, key_fields, mask_quorum, to_fixed, unmask_quorum
from hybridfl.runtime import secagg_messages as sm
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.conftest import HYFDCA_BEFORE

POS = [0, 1, 2, 3, 4]


class Captured(Exception):
    """The attack got what it wanted: the run stops here."""


class Attacker:
    """The server's own X25519 key for each peer of the victim (distinct keys: the client refuses two
    peers with one key) and what it derives from them, on the victim's side of each pair."""

    def __init__(self, victim: SecAggClient, peers: list[str], blocks: list[list[str]]):
        self.victim, self.spies = victim, {}
        for p, bl in zip(peers, blocks):
            sk = X25519PrivateKey.generate().private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            )
            spy = SecAggClient(victim.client_id, victim.blocks, victim.sizes, private=sk)
            spy.peers = {p: (victim.public_bytes(), bl)}  # X25519 is symmetric: the victim's pair key with p
            self.spies[p] = spy

    def publics(self, peers: list[str]) -> list[bytes]:
        return [self.spies[p].public_bytes() for p in peers]

    def read(self, masked: np.ndarray, shares: list[bytes], tag: int, peers: list[str]) -> np.ndarray:
        """The victim's words: its masked reply minus its pair masks and its self-mask (the seed
        rebuilt from its Shamir shares, each encrypted under a pair key the server now holds)."""
        out = np.asarray(masked, dtype=np.uint64).copy()
        parts = []
        for i, p in enumerate(peers):
            out -= self.spies[p]._mask_sum(tag, [p], out.size // self.victim.dim)
            aead = ChaCha20Poly1305(self.spies[p].pair_key(p, secagg.SHARE_CONTEXT))
            blob = shares[i]
            parts.append((i + 1, aead.decrypt(blob[:12], blob[12:], secagg._share_aad(tag, self.victim.client_id, p))))
        out -= secagg.self_mask(secagg.rebuild_seed(parts), tag, out.size)
        return out.view(np.int64)


class Tamper:
    """The server's transport: ``edit`` rewrites what goes to the victim, ``watch`` sees its replies."""

    def __init__(self, inner, victim: str, edit, watch):
        self.inner, self.victim, self.edit, self.watch = inner, victim, edit, watch

    @property
    def client_ids(self) -> list[str]:
        return self.inner.client_ids

    @property
    def clients(self):
        return self.inner.clients

    def send_and_receive(self, msgs):
        msgs = [self.edit(m) if m.receiver == self.victim else m for m in msgs]
        replies = self.inner.send_and_receive(msgs)
        for r in replies:
            if r.sender == self.victim:
                self.watch(r, next(m for m in msgs if m.receiver == self.victim))
        return replies


def _sign(clients: dict) -> None:
    for c, auth in in_memory_auths(sorted(clients)).items():
        clients[c].peer_auth = auth


def _swap_keys(kind: str, attacker_box: list, secagg_of):
    """An ``edit`` that puts the attacker's keys in place of every peer's in the victim's ``kind``
    message (the peers' signatures, over their own keys, relayed unchanged)."""

    def edit(m: Message) -> Message:
        if m.kind != kind:
            return m
        p = dict(m.payload)
        peers, blocks = list(p["secagg_peers"]), [json.loads(b) for b in p["secagg_blocks"]]
        attacker = Attacker(secagg_of(m.receiver), peers, blocks)
        attacker_box.append(attacker)
        p["secagg_keys"] = attacker.publics(peers)
        return Message(m.kind, m.sender, m.receiver, m.round, p)

    return edit


def _hyfdca(tiny, signed: bool, **kw):
    split, part = tiny
    base = {**HYFDCA_BEFORE, "lam": 0.1, "rounds": 2, "positive_classes": POS, "reference": False, "eval_every": 0}
    fed = build_federation("hyfdca", split, part, HyFDCAConfig(**{**base, **kw}))
    if signed:
        _sign(fed.clients)
    return fed


@pytest.mark.parametrize("signed", [False, True])
def test_hyfdca_server_key_in_place_of_a_peers_is_refused(tiny, signed):
    """HyFDCA secure aggregation (consensus mode). The server puts its own X25519 keys in place of
    every peer's in the victim's ``hyfdca.init``. Without a roster the victim masks its round-1
    share with them: the server removes the pair masks and, decrypting the self-mask's Shamir
    shares, the self-mask: the victim's words (its fixed-point share) exactly. With a roster the
    victim refuses ``hyfdca.init`` (the peer's signature does not verify for that key) and stops."""
    fed = _hyfdca(tiny, signed, dual_mode="consensus", local_fraction=0.2, sigma=30)
    victim_id = fed.transport.client_ids[0]
    victim = fed.clients[victim_id]
    box: list[Attacker] = []

    def watch(r: Message, sent: Message) -> None:
        if r.kind == "hyfdca.primal":
            read = box[0].read(
                r.payload["masked"], r.payload["self_shares"], sent.payload["tag"], sent.payload["peers"]
            )
            raise Captured(read, victim.sa_pending - victim.sa_base)

    tamper = Tamper(fed.transport, victim_id, _swap_keys("hyfdca.init", box, lambda c: fed.clients[c].secagg), watch)
    if signed:
        with pytest.raises(PeerAuthError, match=r"refuses a secagg-key of '[^']+' whose signature does not verify"):
            fed.server.setup(tamper, fed.transport.client_ids)
        assert victim.protocol.stopped
        with pytest.raises(ProtocolError, match="has stopped taking part"):
            victim.handle(decode(encode(Message("hyfdca.ip", SERVER, victim_id, 1, {"w": np.zeros(2)}))))
        return
    fed.server.setup(tamper, fed.transport.client_ids)
    with pytest.raises(Captured) as got:
        fed.server.run_round(1, tamper)
    read, words = got.value.args
    assert np.abs(words).max() > 0 and np.array_equal(read, words)  # the victim's share, exactly


@pytest.mark.parametrize("signed", [False, True])
def test_hyfdca_masked_inner_products_server_key_is_refused(tiny, signed):
    """HyFDCA masked inner products (segment mode, ``segment_inner_products: masked``): the segment
    keys are sealed under the secure-aggregation pair keys. With its own key in place of a peer's,
    the server opens the victim's segment key sealed for that peer (without a roster): the pad
    of every masked inner-product share of that segment, so ``words - PRG(K, tag)`` is the victim's
    share; the Gram vector of setup is read here. With a roster the victim refuses ``hyfdca.init``."""
    from hybridfl.privacy import segmask

    fed = _hyfdca(tiny, signed, dual_mode="segment", batch_size=16, segment_inner_products="masked")
    assert fed.config.segment_inner_products == "masked"
    victim_id = fed.transport.client_ids[0]
    victim = fed.clients[victim_id]
    box: list[Attacker] = []

    def watch(r: Message, sent: Message) -> None:
        if r.kind == "hyfdca.init":
            g = victim.seg_global[0]
            h = sorted(x for x in victim.segmask.holders[g] if x != victim_id)[0]
            blob = r.payload["seg_keys"][0]
            aead = ChaCha20Poly1305(box[0].spies[h].pair_key(h, segmask.PURPOSE))
            key = aead.decrypt(blob[:12], blob[12:], segmask._aad(victim_id, h, g))
            raise Captured(key, victim.segmask.keys[g][victim_id], r.payload["gram"])

    tamper = Tamper(fed.transport, victim_id, _swap_keys("hyfdca.init", box, lambda c: fed.clients[c].secagg), watch)
    if signed:
        with pytest.raises(PeerAuthError, match="secure-aggregation key"):
            fed.server.setup(tamper, fed.transport.client_ids)
        assert victim.protocol.stopped
        return
    with pytest.raises(Captured) as got:
        fed.server.setup(tamper, fed.transport.client_ids)
    key, own, gram = got.value.args
    assert key == own  # the victim's pad key for its first segment
    from hybridfl.algorithms.convex import kernels
    from hybridfl.algorithms.hyfdca.gram import partial_gram

    # the first batch's upper triangle of the victim's partial Gram matrix, read off its masked words
    want = to_fixed(kernels.upper_triangle(partial_gram(victim._batch(0, 0)[0], victim.seg_colw[0])), "g")
    n = want.size
    words = (np.asarray(gram[:n], dtype=np.uint64) - secagg.keystream(key, 0, n)).view(np.int64)
    assert np.abs(want).max() > 0 and np.array_equal(words, want)


def _hyfem(digits_split, signed: bool, **kw):
    from hybridfl.algorithms.hyfem import HyFEMConfig
    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.partitioners import ClassBlockPartitioner

    split = DatasetSplit(digits_split.train.take(np.arange(120)), digits_split.test.take(np.arange(40)))
    part = ClassBlockPartitioner(
        num_clients=4, classes_per_client=6, blocks_per_client=2, no_full_client=False, seed=0
    ).partition(split.train)
    cfg = HyFEMConfig(
        rounds=1, local_steps=1, hidden=8, extractor_dim=4, baselines=False, secure_aggregation=True, **kw
    )
    fed = build_federation("hyfem", split, part, cfg)
    if signed:
        _sign(fed.clients)
    return fed


def _extractor_words(client) -> np.ndarray:
    from hybridfl.algorithms.hyfem.secure import _flat

    v = np.concatenate([_flat(client.model.extractor_arrays(b)) for b in client.blocks]) * float(client.data.n_samples)
    return to_fixed(v, "x")


@pytest.mark.parametrize("signed", [False, True])
def test_hyfem_server_key_in_place_of_a_peers_is_refused(digits_split, signed):
    """HyFEM secure aggregation: the server puts its own keys in ``hyfem.keys`` to the victim.
    Without a roster it reads the victim's round-1 extractors (times its sample count) exactly from
    ``ext_masked`` and ``self_shares``; with a roster the victim refuses ``hyfem.keys``."""
    fed = _hyfem(digits_split, signed)
    victim_id = fed.transport.client_ids[0]
    victim = fed.clients[victim_id]
    box: list[Attacker] = []

    def watch(r: Message, sent: Message) -> None:
        if r.kind == "hyfem.fit":
            read = box[0].read(
                r.payload["ext_masked"], r.payload["self_shares"], sent.payload["tag"], sent.payload["peers"]
            )
            raise Captured(read, _extractor_words(victim))

    tamper = Tamper(fed.transport, victim_id, _swap_keys("hyfem.keys", box, lambda c: fed.clients[c].secagg), watch)
    if signed:
        with pytest.raises(PeerAuthError, match=r"refuses a secagg-key of '[^']+' whose signature does not verify"):
            fed.server.setup(tamper, fed.transport.client_ids)
        assert not victim.secagg.peers  # nothing kept: it masks with nobody
        return
    fed.server.setup(tamper, fed.transport.client_ids)
    with pytest.raises(Captured) as got:
        fed.server.run_round(1, tamper)
    read, words = got.value.args
    assert np.abs(words).max() > 0 and np.array_equal(read, words)  # its extractors, exactly


def _table(names, auths, run, purpose=secagg.KEY_PURPOSE, blocks=None):
    """Every client's SecAggClient and the peer table the server relays to ``names[0]``, each
    peer's key signed by its owner for ``run`` and ``purpose``."""
    cl = {c: SecAggClient(c, ["x"], [4]) for c in names}
    blocks = blocks or {c: ["x"] for c in names}
    sigs = {c: auths[c].sign(run, purpose, key_fields(cl[c].public_bytes(), ["x"])) for c in names if c in auths}
    pub = {c: cl[c].public_bytes() for c in names}
    return cl, Message("hyfem.keys", SERVER, names[0], 0, sm.peer_table(pub, blocks, names[0], sigs))


def test_replayed_foreign_or_unsigned_keys_are_refused():
    """The signature binds the run label, the owner's name, the purpose and the key's blocks.
    Refused, each in one sentence naming the peer: a peer's signature of another run (a replay of
    an earlier run's relay), the same key signed for another purpose (its PSI offer's), blocks the
    server changed, a client outside the roster (a key the server made and signed with a credential
    of its own), and a table without signatures. The honest table is taken."""
    names = ["a", "b", "c"]
    auths = in_memory_auths(names)
    run, other = os.urandom(32), os.urandom(32)
    cl, msg = _table(names, auths, run)
    sm.set_peers(cl["a"], msg, auths["a"], run)
    assert sorted(cl["a"].peers) == ["b", "c"] and cl["a"].run_size() == 3
    cases = [
        (_table(names, auths, other)[1], "whose signature does not verify"),
        (_table(names, auths, run, purpose="psi-setup")[1], "whose signature does not verify"),
        (_table(names, auths, run, blocks={"a": ["x"], "b": ["x", "y"], "c": ["x"]})[1], "'b' whose signature"),
        (_table([*names, "mallory"], {**auths, **in_memory_auths(["mallory"])}, run)[1], "'mallory', who is not in"),
    ]
    unsigned = dict(msg.payload)
    del unsigned["secagg_sigs"]
    cases.append((Message(msg.kind, SERVER, "a", 0, unsigned), "refuses an unsigned secagg-key of 'b'"))
    for bad, why in cases:
        fresh = SecAggClient("a", ["x"], [4])
        with pytest.raises(PeerAuthError, match=why) as e:
            sm.set_peers(fresh, decode(encode(bad)), auths["a"], run)
        assert str(e.value).endswith(".") and "\n" not in str(e.value)
        assert not fresh.peers


def test_default_threshold_is_a_majority_and_at_least_two():
    """``secagg_threshold: 0`` (the default): an exchange needs ``max(2, floor(m/2) + 1)`` of the
    run's ``m`` clients (at most ``m``, and the protocol's honest size ``cap``), and an unmasking a
    majority of the exchange's clients surviving; an explicit ``t`` is kept."""
    assert [mask_quorum(0, m) for m in (1, 2, 3, 4, 5, 9)] == [1, 2, 2, 3, 3, 5]
    assert mask_quorum(0, 9, cap=2) == 2 and mask_quorum(0, 9, cap=1) == 1
    assert [unmask_quorum(0, 9, m) for m in (2, 4, 9)] == [2, 3, 5]
    assert mask_quorum(2, 9) == 2 and unmask_quorum(2, 9, 9) == 2
    assert HyFDCAConfig().secagg_threshold == 0
    with pytest.raises(ValueError, match="secagg_threshold 1"):
        HyFDCAConfig(secagg_threshold=1)
    # cyclic groups hold at most half the clients: the default there is 2 (a group is the round)
    assert HyFDCAConfig(participation=1 / 3, participation_mode="cyclic").secagg_threshold == 2


def test_hyfem_minority_peer_set_and_self_unmask_are_refused(digits_split):
    """HyFEM with the default threshold (a majority of 4 clients: 3): a ``hyfem.fit`` naming one peer
    (an exchange of 2) is refused; after an honest fit, an unmasking request naming every peer
    dropped (the victim alone survives: reply minus correction would be its words) and one
    naming the victim itself dropped are refused; the client never unmasks itself."""
    fed = _hyfem(digits_split, signed=True)
    fed.setup()
    ids = fed.transport.client_ids
    cid, victim = ids[0], fed.clients[ids[0]]
    honest = fed.server.fit_message(cid, 1, ids)
    minority = Message(honest.kind, SERVER, cid, 1, {**honest.payload, "peers": [ids[1]]})
    saved = victim.get_state()  # each refusal stops the client (fail closed): restored to play the next
    with pytest.raises(PayloadError, match="at least 3 clients of its roster, not 2"):
        victim.handle(decode(encode(minority)))
    victim.set_state(saved)
    victim.handle(decode(encode(honest)))
    peers = list(honest.payload["peers"])
    saved = victim.get_state()
    for dropped, why in (
        (peers, "at least 3 of the 4 clients of the exchange survive, not 1"),
        ([cid], "exactly the other"),
    ):
        ask = {"tag": 1, "dropped": dropped, "survivors": [], "shares": []}
        with pytest.raises(PayloadError, match=why):
            victim.handle(decode(encode(Message("hyfem.unmask", SERVER, cid, 1, ask))))
        victim.set_state(saved)


def test_a_message_not_from_the_server_is_refused(tiny, digits_split):
    """A client takes messages from the server only: one naming a peer (or anyone) as its sender is
    refused by HyFDCA's and HyFEM's clients and by the Flower node before anything is read."""
    from hybridfl.runtime.flower.node import client_step

    fed = _hyfdca(tiny, signed=False)
    cid = fed.transport.client_ids[0]
    with pytest.raises(ProtocolError, match="refuses a message from 'client-x', which is not the server"):
        fed.clients[cid].handle(Message("hyfdca.hello", "client-x", cid, 0, {}))
    hy = _hyfem(digits_split, signed=False)
    hid = hy.transport.client_ids[0]
    with pytest.raises(ProtocolError, match="which is not the server"):
        hy.clients[hid].handle(Message("hyfem.properties", hid, hid, 0, {}))
    with pytest.raises(HybridFLError, match="not the server, reached a client node"):
        client_step(encode(Message("hyfdca.ip", "client-x", cid, 1, {})), None, {})


def test_signed_keys_change_no_result(tiny):
    """An honest run with every client holding a roster (signed keys relayed and checked) gives the
    same ``w`` as the run without (the masks cancel exactly either way)."""
    ws = {}
    for signed in (False, True):
        fed = _hyfdca(tiny, signed, dual_mode="consensus", local_fraction=0.2, sigma=30)
        fed.setup()
        for rnd in (1, 2):
            fed.server.run_round(rnd, fed.transport)
        ws[signed] = fed.server.w.copy()
        assert bool(fed.server.sa_sigs) == signed
    assert np.abs(ws[False]).max() > 0 and np.array_equal(ws[False], ws[True])


def test_hyfem_client_answers_each_step_once_and_in_order(digits_split):
    """HyFEM's client keeps its own protocol order (a malicious server replaying or reordering):
    after an honest setup and round-1 fit, a second fit of round 1, a fit of an earlier round, an
    unmask before any fit of a new round, and a second properties message are each refused in one
    sentence, and the first refusal stops the client for the run."""
    fed = _hyfem(digits_split, signed=False)
    fed.setup()
    ids = fed.transport.client_ids
    cid, client = ids[0], fed.clients[ids[0]]
    client.handle(decode(encode(fed.server.fit_message(cid, 1, ids))))
    saved = client.get_state()
    again = fed.server.fit_message(cid, 1, ids)
    unmask = Message("hyfem.unmask", SERVER, cid, 2, {"tag": 9, "dropped": [], "survivors": [], "shares": []})
    for msg, why in (
        (again, "each request is answered once"),
        (fed.server.fit_message(cid, 0, ids), "the round number goes back|setup"),
        (unmask, "does not put it at the start of a round"),
        (Message("hyfem.properties", SERVER, cid, 0, {}), "setup is past it|outside round 0|goes back"),
    ):
        with pytest.raises(ProtocolError, match=why):
            client.handle(decode(encode(msg)))
        with pytest.raises(ProtocolError, match="has stopped taking part in this run"):
            client.handle(decode(encode(fed.server.fit_message(cid, 2, ids))))
        client.set_state(saved)
