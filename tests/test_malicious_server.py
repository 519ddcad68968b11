"""A malicious server against the real client classes (issue 28, "Found" 1 and 2: HyFDCA labels and
rows, secure aggregation undone by the server alone). Each test plays one attack exactly as its
docstring says, on the ``tiny`` federation (80 digits, 2 x 2 grid, four clients, two holders per
sample; HyFEM: ``hyfem_small``-like, four clients), after an honest setup (and round 1).

Checked against the code before this work (commit c8f500a, a temporary worktree, the same test
file): every test here failed there except where noted:

- ``test_label_oracle_recovers_at_most_one_refusal_per_run``: failed (every query answered on its
  label: all 40 labels from 40 queries);
- ``test_row_read_out_with_no_peers_is_refused_and_the_client_stops``: failed (``peers=[]``
  answered; the two replies differed by ``0.5 y_k x_k``, row ``k`` exactly);
- ``test_single_peer_set_is_refused_with_threshold_three``: failed (``secagg_threshold`` did not
  exist);
- ``test_round_number_lie_does_not_widen_the_change_bound``: failed (a fresh client accepted the
  +5 jump when the message said round 4);
- ``test_self_unmask_is_refused`` and ``test_an_unmask_request_is_answered_once``: failed (the
  victim answered an unmask naming all its peers dropped, reply minus correction = its words; and
  answered the same request twice);
- ``test_hyfem_client_refuses_no_peers_and_an_untagged_fit``: failed (both answered: the
  extractors unmasked, and in the clear);
- ``test_the_stop_survives_a_rebuild``: failed (no stop to keep).
"""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.conftest import HYFDCA_BEFORE

POS = [0, 1, 2, 3, 4]


def _cfg(**kw) -> HyFDCAConfig:
    base = {**HYFDCA_BEFORE, "lam": 0.1, "rounds": 3, "positive_classes": POS, "reference": False, "eval_every": 0}
    return HyFDCAConfig(**{**base, **kw})


def _after_round_1(tiny, **kw):
    """A consensus-mode federation (plaintext duals: the checks are the same under Paillier or
    CKKS) after setup and one honest round; the victim is the first client."""
    split, part = tiny
    cfg = _cfg(dual_mode="consensus", local_fraction=0.2, sigma=30, **kw)
    fed = build_federation("hyfdca", split, part, cfg)
    fed.setup()
    fed.server.run_round(1, fed.transport)
    cid = fed.transport.client_ids[0]
    return fed, cid, fed.clients[cid]


def _enc(fed, cid: str, alpha: np.ndarray) -> list[bytes]:
    """``enc(alpha)`` of ``cid``'s segments from a full ``(n_k,)`` vector (the server holds the
    public key: it can encrypt anything)."""
    client = fed.clients[cid]
    return [fed.server.he.encrypt(alpha[rows]) for rows in client.seg_rows]


def _msg(kind: str, cid: str, rnd: int, payload: dict) -> Message:
    return decode(encode(Message(kind, SERVER, cid, rnd, payload)))


_TAG = [1000]


def _primal(fed, cid: str, rnd: int, alpha: np.ndarray, peers=None, acked: bool = False) -> Message:
    """``hyfdca.primal`` carrying ``alpha`` with a fresh tag, ``peers`` (default: every other
    client, as an honest server) and ``acked``."""
    _TAG[0] += 1
    others = [c for c in fed.transport.client_ids if c != cid] if peers is None else list(peers)
    payload = {"alpha": _enc(fed, cid, alpha), "tag": _TAG[0], "peers": others, "acked": acked}
    return _msg("hyfdca.primal", cid, rnd, payload)


def test_label_oracle_recovers_at_most_one_refusal_per_run(tiny):
    """Label oracle (issue 28, Found 1). After an honest round 1, the server sends the victim, for
    each of its samples ``k`` in turn, a returning client's ``hyfdca.primal`` (round 2, 3, ...: one
    new round per query, all peers named, fresh tag) carrying the victim's last ``alpha`` with
    ``alpha_k = 0.5``; the client accepts it iff ``y_k = +1`` (hinge dual domain ``y alpha in
    [0, 1]``). The attacker reads accept as +1 and refuse as -1, and asks again after a refusal.

    Measured: the refusal channel carries one bit per run. The first refusal stops the client, and
    every later query is refused with the same sentence whatever the label, so the attacker's guesses
    after it are right only on the negative samples (no information: the answer is the same for
    +1 and -1). What is still learnt is what the accepted queries before the first refusal said
    (the labels of the samples asked before the first negative one, plus that one): before this
    work all 40 labels came out of 40 queries."""
    fed, cid, client = _after_round_1(tiny)
    y, base = client.y.copy(), client.alpha.copy()
    answers = []
    for q, k in enumerate(range(y.size)):  # sample k asked in round 2 + q
        a = base.copy()
        a[k] = 0.5  # the attacker does not know y_k: it always sends +0.5
        try:
            client.handle(_primal(fed, cid, 2 + q, a))
            answers.append((k, True, ""))
        except ProtocolError as e:
            answers.append((k, False, str(e)))
    first = next(i for i, (_, ok, _) in enumerate(answers) if not ok)
    informative = answers[: first + 1]
    after = answers[first + 1 :]
    # every answer up to the first refusal is the label; every one after it is "stopped", whatever the label
    assert all((y[k] > 0) == ok for k, ok, _ in informative)
    assert after and all(not ok for _, ok, _ in after)
    assert all("has stopped taking part in this run after refusing 'hyfdca.primal' of round" in m for _, _, m in after)
    assert {y[k] > 0 for k, _, _ in after} == {True, False}  # positives and negatives answered alike
    refusal_bits = 1  # the stop itself; the refusals after it are one constant answer
    recovered = len(informative)
    assert recovered < y.size and refusal_bits == 1
    print(f"label oracle: {recovered} of {y.size} labels before the stop, {len(after)} queries refused alike")


def test_row_read_out_with_no_peers_is_refused_and_the_client_stops(tiny):
    """Row read-out (issue 28, Found 1). Two ``alpha``s the client would accept (its last one, and
    the same with ``alpha_k = 0.5`` on a positive sample ``k``), each in a ``hyfdca.primal`` with
    ``peers=[]`` (masked with nobody) and ``acked=False`` (the same base both times): before this
    work both were answered and the difference of the two replies was ``0.5 y_k x_k``, row ``k``.
    Now the first is refused by the peers rule (an exchange of one client, below the threshold, 3 of 4)
    and the second because the client stopped; neither returns anything and ``alpha`` is kept."""
    fed, cid, client = _after_round_1(tiny)
    k = int(np.flatnonzero(client.y > 0)[0])
    a1 = client.alpha.copy()
    a2 = a1.copy()
    a2[k] = 0.5
    with pytest.raises(PayloadError, match=r"'peers' refused \(.*masks only in an exchange of at least 3 clients"):
        client.handle(_primal(fed, cid, 2, a1, peers=[]))
    with pytest.raises(ProtocolError, match="has stopped taking part in this run after refusing 'hyfdca.primal'"):
        client.handle(_primal(fed, cid, 3, a2, peers=[]))
    assert np.array_equal(client.alpha, a1)


def test_single_peer_set_is_refused_with_threshold_three(tiny):
    """The same read-out with a single-peer set (``peers`` = one other client, an exchange of 2):
    refused under the default threshold (a majority of the four clients: 3) and with
    ``secagg_threshold: 3``; accepted with an explicit ``secagg_threshold: 2`` (an exchange of two
    is honest with 50 % participation of four clients); an honest primal naming all peers is
    answered, masked."""
    for t in (0, 3):
        fed, cid, client = _after_round_1(tiny, secagg_threshold=t)
        other = [c for c in fed.transport.client_ids if c != cid][0]
        with pytest.raises(PayloadError, match="at least 3 clients of its roster, not 2"):
            client.handle(_primal(fed, cid, 2, client.alpha.copy(), peers=[other]))
    fed, cid, client = _after_round_1(tiny, secagg_threshold=2)
    other = [c for c in fed.transport.client_ids if c != cid][0]
    assert client.handle(_primal(fed, cid, 2, client.alpha.copy(), peers=[other])).payload["masked"].size
    fed, cid, client = _after_round_1(tiny, secagg_threshold=3)
    reply = client.handle(_primal(fed, cid, 2, client.alpha.copy())).payload
    assert reply["masked"].dtype == np.uint64 and "share" not in reply


def test_round_number_lie_does_not_widen_the_change_bound(tiny):
    """Round-number lie (issue 28, Found 1). ``nu = 2`` (the box is not checked, only the change
    bound ``nu R``). After an honest round 1 the server sends a returning ``hyfdca.primal`` whose
    ``alpha`` is the victim's with +5 on one sample: refused at round 2 (``5 > 2 * 1``); the same
    message saying round 4 is refused too (the client stopped). On a fresh federation the round-4
    message alone is refused as well: ``R`` is the client's own count of dual steps since its last
    accepted ``alpha`` (1), never ``msg.round`` minus its last round (3, which accepted it
    before this work)."""
    for first in (2, None):
        fed, cid, client = _after_round_1(tiny, nu=2.0)
        a = client.alpha.copy()
        a[0] += 5.0
        if first is not None:
            with pytest.raises(PayloadError, match="changing alpha by more than nu per round"):
                client.handle(_primal(fed, cid, first, a))
            with pytest.raises(ProtocolError, match="has stopped taking part"):
                client.handle(_primal(fed, cid, 4, a))
        else:
            with pytest.raises(PayloadError, match=r"more than nu per round since round 1 \(1 of its own dual steps"):
                client.handle(_primal(fed, cid, 4, a))
        assert client.alpha[0] != a[0]


def _answered_exchange(tiny):
    """The victim answers an honest returning ``hyfdca.primal`` (round 2, all peers): its masked
    reply, the exchange's tag and peers."""
    fed, cid, client = _after_round_1(tiny)
    msg = _primal(fed, cid, 2, client.alpha.copy())
    reply = client.handle(msg).payload["masked"]
    return fed, cid, client, msg, reply


def test_self_unmask_is_refused(tiny):
    """Self-unmask (issue 28, Found 2). The victim answered a masked ``hyfdca.primal``; the server
    sends ``hyfdca.unmask`` to the victim itself with ``dropped`` = all its peers. Before this work
    it answered, and reply minus correction was its words exactly (checked here with the masks
    computed from its own state). Now it is refused (1 of 4 clients would survive, below the
    threshold, a majority of 4: 3); naming the victim itself as dropped is refused too (fresh run)."""
    fed, cid, client, msg, masked = _answered_exchange(tiny)
    tag, peers = int(msg.payload["tag"]), list(msg.payload["peers"])
    # what the attack would read before double masking: its masks with every peer removed left the
    # unmasked words; now its self-mask (a fresh seed, forgotten once shared) stays on them
    words = masked - client.secagg._mask_sum(tag, peers)
    assert not np.array_equal(words.view(np.int64), client.sa_pending - client.sa_base)  # fixed(share) - base
    with pytest.raises(
        PayloadError, match="unmasks only if at least 3 of the 4 clients of the exchange survive, not 1"
    ):
        client.handle(_msg("hyfdca.unmask", cid, 2, {"tag": tag, "dropped": peers, "survivors": [], "shares": []}))
    fed, cid, client, msg, _ = _answered_exchange(tiny)
    ask = {"tag": int(msg.payload["tag"]), "dropped": [cid], "survivors": [], "shares": []}
    with pytest.raises(PayloadError, match="exactly the other clients of its last exchange"):
        client.handle(_msg("hyfdca.unmask", cid, 2, ask))


def test_an_unmask_request_is_answered_once(tiny):
    """Asking the same unmask twice (issue 28, Found 2): an honest request (one peer dropped, the
    victim and two peers survive, their self-mask shares relayed) is answered; the same request again is refused (a request is answered once), and
    the client then stops."""
    fed, cid, client, msg, _ = _answered_exchange(tiny)
    tag, peers = int(msg.payload["tag"]), list(msg.payload["peers"])
    # two peers answer the same exchange: their self-mask shares to the victim ride in their replies
    shares = []
    for p in peers[:2]:
        theirs = [c for c in fed.transport.client_ids if c != p]
        payload = {"alpha": _enc(fed, p, fed.clients[p].alpha.copy()), "tag": tag, "peers": theirs, "acked": False}
        reply = fed.clients[p].handle(_msg("hyfdca.primal", p, 2, payload)).payload
        shares.append(reply["self_shares"][theirs.index(cid)])
    ask = {"tag": tag, "dropped": peers[2:], "survivors": peers[:2], "shares": shares}
    reply = client.handle(_msg("hyfdca.unmask", cid, 2, ask)).payload
    assert reply["correction"].dtype == np.uint64 and len(reply["revealed"]) == 2 and len(reply["revealed"][0]) == 16
    with pytest.raises(ProtocolError, match="each request is answered once"):
        client.handle(_msg("hyfdca.unmask", cid, 2, ask))
    with pytest.raises(ProtocolError, match="after refusing 'hyfdca.unmask' of round 2"):
        client.handle(_msg("hyfdca.ip", cid, 3, {"w": np.zeros(client.X.shape[1])}))


def test_the_stop_survives_a_rebuild(tiny):
    """Fail closed across a rebuild (Flower builds the client anew for every message from its
    saved state; checkpoints): the state of a stopped client, restored into a fresh client of
    another federation, still refuses an honest message."""
    fed, cid, client = _after_round_1(tiny)
    with pytest.raises(PayloadError):
        client.handle(_primal(fed, cid, 2, client.alpha.copy(), peers=[]))
    state = dict(client.get_state())
    fresh_fed, _, _ = _after_round_1(tiny)
    fresh = fresh_fed.clients[cid]
    fresh.set_state(state)
    with pytest.raises(ProtocolError, match="has stopped taking part"):
        fresh.handle(_msg("hyfdca.ip", cid, 2, {"w": np.zeros(fresh.X.shape[1])}))
    assert client.failed_state() == {"protocol": state["protocol"]}


def test_hyfem_client_refuses_no_peers_and_an_untagged_fit(digits_split):
    """HyFEM (issue 28, Found 2), ``secure_aggregation: true``, after setup (``hyfem.keys``): the
    server's round-1 ``hyfem.fit`` to a client with ``peers=[]`` is refused (peers rule), and the
    same ``hyfem.fit`` without ``tag`` and ``peers`` is refused (the client's own policy: it never
    sends its extractors in the clear). The honest message is answered with ``ext_masked`` only."""
    from hybridfl.algorithms.hyfem import HyFEMConfig
    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.partitioners import ClassBlockPartitioner

    split = DatasetSplit(digits_split.train.take(np.arange(120)), digits_split.test.take(np.arange(40)))
    part = ClassBlockPartitioner(
        num_clients=4, classes_per_client=6, blocks_per_client=2, no_full_client=False, seed=0
    ).partition(split.train)
    cfg = HyFEMConfig(rounds=1, local_steps=1, hidden=8, extractor_dim=4, baselines=False, secure_aggregation=True)
    fed = build_federation("hyfem", split, part, cfg)
    fed.setup()
    cid = fed.transport.client_ids[0]
    client = fed.clients[cid]
    honest = fed.server.fit_message(cid, 1, fed.transport.client_ids)
    no_peers = Message(honest.kind, SERVER, cid, 1, {**honest.payload, "peers": []})
    with pytest.raises(PayloadError, match="masks only in an exchange of at least 3 clients of its roster, not 1"):
        client.handle(decode(encode(no_peers)))
    clear = {k: v for k, v in honest.payload.items() if k not in ("tag", "peers")}
    with pytest.raises(PayloadError, match="'tag' missing: client .* never sends its extractors in the clear"):
        client.handle(decode(encode(Message(honest.kind, SERVER, cid, 1, clear))))
    reply = client.handle(decode(encode(honest))).payload
    assert "ext_masked" in reply and not any(k.startswith("ext.") for k in reply)
