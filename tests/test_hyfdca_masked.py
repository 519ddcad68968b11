"""HyFDCA ``segment_inner_products: masked`` (:mod:`hybridfl.privacy.segmask`): the holders of a
segment hide their inner-product shares and their sum from the server with pads only they can
make. Checked against the encrypted run, and by playing the parties the claim names: the
honest-but-curious server (all the bytes it sees), a client outside the segment, and a server that
tampers with what it relays or sends. Real UCI credit rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.algorithms.hyfdca.protocol import SETUP
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.errors import ProtocolError
from hybridfl.privacy.secagg import keystream, to_fixed
from hybridfl.privacy.segmask import SEALED_BYTES, SegmentMasks
from hybridfl.runtime.messages import SERVER, Message, decode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.conftest import HYFDCA_BEFORE
from tests.rebuild import reference_and_rebuilt
from tests.test_secagg import _clients

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _cfg(**kw) -> HyFDCAConfig:
    # runs compared with each other, and the checks of hostile masked messages, pass
    # alignment="plaintext": the same holder sets and sample order as PSI's (test_hyfdca_psi), without
    # PSI's setup time; the run whose messages the honest-but-curious server reads keeps PSI
    base = dict(
        HYFDCA_BEFORE,
        lam=1e-2,
        rounds=3,
        eval_every=0,
        reference_sdca_epochs=100,
        dual_mode="segment",
        batch_size=100,
        segment_inner_products="masked",
    )
    base.update(kw)
    return HyFDCAConfig(**base)


def _three(names=("a", "b", "c")) -> dict[str, SegmentMasks]:
    """Clients with secure-aggregation keys and each other as peers (``test_secagg._clients``)."""
    return {n: SegmentMasks(c) for n, c in _clients({n: ["x"] for n in names}, {"x": 1}).items()}


def _lie(client, corrupt) -> None:
    """Pass every reply of ``client`` through ``corrupt(msg, reply) -> reply`` (a hostile holder)."""
    orig = client.handle
    client.handle = lambda msg: corrupt(msg, orig(msg))


def _deal(masks: dict[str, SegmentMasks], g: int = 7) -> None:
    """Run the key exchange of segment ``g`` among ``masks`` (relayed faithfully)."""
    names = sorted(masks)
    sealed = {n: m.start({g: names}) for n, m in masks.items()}
    for n, m in masks.items():
        m.open([sealed[h][sorted(x for x in names if x != h).index(n)] for h in names if h != n])


def test_masks_sum_exactly_and_each_holder_recovers_the_sum():
    masks = _three()
    _deal(masks)
    rng = np.random.default_rng(0)
    shares = {n: rng.normal(size=50) * 30 for n in masks}
    for m in masks.values():
        m.use_tag(5)
    words = [masks[n].mask(7, 5, to_fixed(v, "share")) for n, v in shares.items()]
    total = words[0] + words[1] + words[2]
    exact = sum(to_fixed(v, "share") for v in shares.values()) / 2.0**32
    for m in masks.values():
        np.testing.assert_array_equal(m.unmask(7, 5, total), exact)
    # the server's view: a holder's words and the sum differ from the values in every bit position
    for w, v in zip(words, shares.values()):
        assert np.mean(np.abs(w.view(np.int64).astype(float) / 2**32 - v) > 1e3) > 0.99


def test_a_client_outside_the_segment_cannot_open_its_keys():
    """d holds secure-aggregation keys with everyone but is not a holder of segment 7: a sealed key
    relayed to it (the server's mistake or a curious client's) does not open."""
    masks = _three(("a", "b", "c", "d"))
    names = ["a", "b", "c"]
    sealed_for_b = masks["a"].start({7: names})[0]  # a's key sealed for b
    masks["d"].start({7: ["a", "d"]})
    with pytest.raises(ProtocolError, match="does not open"):
        masks["d"].open([sealed_for_b])


def test_tampered_or_misaddressed_keys_are_refused_and_nothing_is_kept():
    masks = _three()
    names = sorted(masks)
    sealed = {n: m.start({7: names}) for n, m in masks.items()}
    b = masks["b"]
    good = [sealed["a"][0], sealed["c"][1]]  # a's for b, c's for b
    flipped = bytearray(good[0])
    flipped[20] ^= 1
    for bad, why in (
        ([bytes(flipped), good[1]], "does not open"),  # tampered
        ([sealed["a"][1], good[1]], "does not open"),  # a's key for c relayed to b
        ([good[1], good[0]], "does not open"),  # swapped senders
        ([good[0]], "expected 2"),
        ([good[0], good[1][:-1]], "bytes"),
    ):
        with pytest.raises(ProtocolError, match=why):
            b.open(bad)
        assert not b.ready
    b.open(good)
    assert b.ready


def test_a_tag_is_never_used_twice():
    m = _three()["a"]
    m.use_tag(3)
    for t in (3, 2):
        with pytest.raises(ProtocolError, match="reuse"):
            m.use_tag(t)


def test_masked_run_matches_the_plaintext_run(credit_small):
    """3 x 3 grid, both schedules: the masked run's w equals the plaintext run's up to the fixed
    point (2^-32 per share), and the masked run under CKKS (duals encrypted) too."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    plain = {}
    for schedule in ("sequential", "parallel"):
        plain[schedule] = run_hyfdca(
            credit_small,
            part,
            _cfg(alignment="plaintext", segment_inner_products="encrypted", segment_schedule=schedule),
        )
        masked = run_hyfdca(credit_small, part, _cfg(alignment="plaintext", segment_schedule=schedule))
        w0, w1 = np.array(plain[schedule].summary["w"]), np.array(masked.summary["w"])
        assert np.linalg.norm(w1 - w0) <= 1e-7 * np.linalg.norm(w0)
    ckks = run_hyfdca(
        credit_small, part, _cfg(alignment="plaintext", encryption="ckks")
    )  # the default schedule: sequential
    w0, w2 = np.array(plain["sequential"].summary["w"]), np.array(ckks.summary["w"])
    assert np.linalg.norm(w2 - w0) <= 1e-6 * np.linalg.norm(w0)


@pytest.mark.parametrize("grid", [(3, 1), (1, 1)], ids=["one-holder-segments", "one-client"])
def test_segments_with_one_holder_are_masked_too(credit_small, grid):
    """A horizontal grid (each segment one holder) and a single client: no key to share, the
    holder's own pad alone hides its inner products; the run equals the encrypted one."""
    part = GridPartitioner(*grid, 1, 0).partition(credit_small.train)
    plain = run_hyfdca(credit_small, part, _cfg(alignment="plaintext", segment_inner_products="encrypted"))
    masked = run_hyfdca(credit_small, part, _cfg(alignment="plaintext"))
    w0, w1 = np.array(plain.summary["w"]), np.array(masked.summary["w"])
    assert np.linalg.norm(w0) > 0
    assert np.linalg.norm(w1 - w0) <= 1e-7 * np.linalg.norm(w0)


def test_honest_but_curious_server_sees_no_share_and_no_sum(credit_small, monkeypatch):
    """Every byte the server sees in a masked CKKS run. The inner-product and Gram words are uint64
    and look uniform (mean bit 0.5; almost none decodes to a value of a plausible size), and no
    holder's share and no sum the holders recover (recorded at the holders) appears in any message,
    as float64 or as fixed point."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    raw: list[bytes] = []
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=2, encryption="ckks"), recorder=raw.append)
    shares, sums = [], []
    mask, unmask = SegmentMasks.mask, SegmentMasks.unmask

    def spy_mask(self, g, tag, fixed):
        shares.append(np.array(fixed))
        return mask(self, g, tag, fixed)

    def spy_unmask(self, g, tag, total):
        out = unmask(self, g, tag, total)
        sums.append(out)
        return out

    monkeypatch.setattr(SegmentMasks, "mask", spy_mask)
    monkeypatch.setattr(SegmentMasks, "unmask", spy_unmask)
    fed.setup()
    fed.loop(monitor=False).run()
    words = []
    for m in (decode(b) for b in raw):
        for k in ("ip", "u", "gram"):
            v = m.payload.get(k)
            if m.kind in ("hyfdca.segstart", "hyfdca.sweep", "hyfdca.init", "hyfdca.norms") and k in m.payload:
                if m.kind in ("hyfdca.init", "hyfdca.norms") and k != "gram":
                    continue
                if m.kind == "hyfdca.init" and m.receiver != SERVER:
                    continue
                assert isinstance(v, np.ndarray) and v.dtype == np.uint64, (m.kind, k)
                words.append(v)
    w = np.concatenate(words)
    assert w.size > 100_000 and len(shares) > 50 and len(sums) > 50
    bits = np.unpackbits(w.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.005
    plausible = np.abs(w.view(np.int64).astype(float) / 2**32) < 1e4  # true values are below 1e3
    assert plausible.mean() < 1e-4
    blob = b"".join(raw)
    rng = np.random.default_rng(0)
    fixed = np.concatenate(shares)
    floats = np.concatenate(sums)
    for v in rng.choice(fixed[fixed != 0], 200):
        assert np.int64(v).tobytes() not in blob
        assert np.float64(v / 2**32).tobytes() not in blob
    for v in rng.choice(floats[floats != 0], 200):
        assert np.float64(v).tobytes() not in blob
        assert to_fixed(np.array([v]), "v").tobytes() not in blob
    assert not fed.server.he.can_decrypt


def _setup_messages(credit_small, **kw):
    """A masked federation after setup, and the recorded messages of its setup."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    raw: list[bytes] = []
    fed = build_federation("hyfdca", credit_small, part, _cfg(**{"alignment": "plaintext", **kw}), recorder=raw.append)
    fed.setup()
    return fed, [decode(b) for b in raw]


def test_client_refuses_hostile_setup_messages(credit_small):
    fed, msgs = _setup_messages(credit_small)
    init = next(m for m in msgs if m.kind == "hyfdca.init" and m.receiver != SERVER)
    norms = next(m for m in msgs if m.kind == "hyfdca.norms" and m.receiver == init.receiver)
    cid = init.receiver
    client = fed.clients[cid]
    state = client.get_state()

    def before(kind):  # the client's protocol where ``kind`` comes (it has answered the whole setup)
        proto = json.loads(state["protocol"])
        proto["setup"] = SETUP.index(kind) - 1  # psi_tags (before init) or init (before norms)
        return {**state, "protocol": json.dumps(proto)}

    def refused(msg, field):
        client.set_state(before(msg.kind))
        with pytest.raises(PayloadError) as e:
            client.handle(msg)
        assert e.value.field == field, e.value
        client.set_state(state)

    def edit(m, **changes):
        p = dict(m.payload)
        for k, v in changes.items():
            if v is None:
                p.pop(k)
            else:
                p[k] = v
        return Message(m.kind, m.sender, m.receiver, m.round, p)

    holders = init.payload["seg_holders"]
    others = [n for n in fed.clients if n not in json.loads(holders[0])]
    refused(edit(init, seg_holders=[json.dumps([n for n in json.loads(holders[0]) if n != cid])]), "seg_holders")
    refused(edit(init, seg_holders=[json.dumps(json.loads(holders[0]) + ["mallory"])]), "seg_holders")
    refused(edit(init, seg_holders=[json.dumps([cid, cid, others[0]])]), "seg_holders")
    refused(edit(init, seg_holders=None), "seg_holders")
    refused(edit(init, seg_masked="yes"), "seg_masked")
    refused(edit(init, secagg_peers=None, secagg_keys=None, secagg_blocks=None), "seg_masked")  # no keys to seal with
    # setup's second message: keys and Gram words
    keys = norms.payload["seg_keys"]
    flipped = bytearray(keys[0])
    flipped[-1] ^= 1
    refused(edit(norms, seg_keys=[bytes(flipped), *keys[1:]]), "seg_keys")
    refused(edit(norms, seg_keys=keys[::-1]), "seg_keys")
    refused(edit(norms, seg_keys=keys[:1]), "seg_keys")
    gram = norms.payload["gram"]
    refused(edit(norms, gram=gram.astype(np.int64)), "gram")
    refused(edit(norms, gram=gram[:-1]), "gram")
    refused(edit(norms, gram=gram.astype(np.float64)), "gram")
    bad = gram.copy()
    bad[0] += np.uint64(2**63)  # unmasks to about 2^31: no holder can have sent it
    refused(edit(norms, gram=bad), "gram")
    refused(edit(norms, norms=[fed.server.he.encrypt(np.ones(3))]), "norms")  # segment mode takes no norms


def test_round_messages_with_a_bad_tag_or_bad_words_are_refused(credit_small):
    """A segment pass from a server that reuses a tag, or sends sums of the wrong dtype, length or
    range: refused by name before the client changes anything."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    raw: list[bytes] = []
    fed = build_federation("hyfdca", credit_small, part, _cfg(alignment="plaintext", rounds=1), recorder=raw.append)
    fed.setup()
    n0 = len(raw)
    snapshot = {c: cl.get_state() for c, cl in fed.clients.items()}
    fed.loop(monitor=False).run()
    msgs = [decode(b) for b in raw[n0:]]
    start = next(m for m in msgs if m.kind == "hyfdca.segstart")
    sweep = next(m for m in msgs if m.kind == "hyfdca.sweep" and m.receiver == start.receiver)
    client = fed.clients[start.receiver]
    client.set_state(snapshot[start.receiver])

    def edit(m, **changes):
        return Message(m.kind, m.sender, m.receiver, m.round, {**m.payload, **changes})

    with pytest.raises(PayloadError) as e:
        client.handle(edit(start, tag=0))  # the Gram's tag
    assert e.value.field == "tag"
    client.set_state(snapshot[start.receiver])  # each refusal stops the client (issue 28): from the snapshot again
    p = {k: v for k, v in start.payload.items() if k != "tag"}
    with pytest.raises(PayloadError) as e:
        client.handle(Message(start.kind, start.sender, start.receiver, start.round, p))
    assert e.value.field == "tag"
    client.set_state(snapshot[start.receiver])
    client.handle(start)  # the pass starts
    before = client.get_state()
    u = sweep.payload["u"]
    for bad, field in (
        (edit(sweep, tag=start.payload["tag"]), "tag"),  # reuse
        (edit(sweep, u=u[:-1]), "u"),
        (edit(sweep, u=u.astype(np.float64)), "u"),
        (edit(sweep, u=u + np.uint64(2**63)), "u"),  # unmasks far out of range
    ):
        with pytest.raises(PayloadError) as e:
            client.handle(bad)
        assert e.value.field == field
        after = client.get_state()
        for k in ("alpha", "w"):
            np.testing.assert_array_equal(after[k], before[k])
        client.set_state(before)  # the refusal stopped the client: the next check from the pass's start
        assert json.loads(after["segmask"])["tag"] == json.loads(before["segmask"])["tag"]
    reply = client.handle(sweep)
    assert reply.payload["ip"].dtype == np.uint64


def test_server_drops_a_reply_with_bad_words(credit_small):
    """A holder's reply whose masked shares are not uint64 of the batch's length is treated as
    missing: its segment loses the pass, nothing of it is added."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(alignment="plaintext", rounds=2))

    def bad_words(msg, r):
        if msg.kind == "hyfdca.sweep" and msg.round == 1 and isinstance(r.payload.get("ip"), np.ndarray):
            r.payload["ip"] = r.payload["ip"].astype(np.int64)
        return r

    _lie(fed.clients[sorted(fed.clients)[0]], bad_words)
    fed.setup()
    hist = fed.loop(monitor=False).run()
    assert hist[0]["segments_updated"] == 2 and hist[1]["segments_updated"] == 3


def test_client_state_survives_a_rebuild_between_every_message(credit_small):
    """Over Flower a client is rebuilt from its state for every message: the segment keys and the
    last tag are part of it, and a run with a rebuild before each message gives the same model, to
    the bit (the pads cancel exactly, whatever keys were drawn)."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    ref, fed = reference_and_rebuilt(credit_small, part, _cfg(rounds=2))
    assert all("segmask" in r.state for r in fed.clients.values())
    np.testing.assert_array_equal(fed.server.w, ref.server.w)


def test_config_needs_segment_mode_and_secure_aggregation():
    with pytest.raises(ValueError, match="dual_mode 'segment'"):
        HyFDCAConfig(segment_inner_products="masked", dual_mode="block")  # block: the default before segment
    with pytest.raises(ValueError, match="secure_aggregation"):
        HyFDCAConfig(segment_inner_products="masked", dual_mode="segment", secure_aggregation=False)


def test_pads_are_chacha20_keystreams_of_the_holder_key():
    """The pad of a holder is exactly the ChaCha20 keystream of its own segment key and the tag
    (the server, without the key, faces ChaCha20)."""
    masks = _three()
    _deal(masks)
    m = masks["a"]
    m.use_tag(9)
    z = np.zeros(16, dtype=np.int64)
    np.testing.assert_array_equal(m.mask(7, 9, z), keystream(m.keys[7]["a"], 9, 16))
    assert len(m.start({7: ["a", "b", "c"]})[0]) == SEALED_BYTES


def test_plaintext_warning_says_what_the_server_still_reads():
    """Without encryption but with masked inner products the warning names the dual changes and
    norms the server reads, not the inner products or Gram matrices it no longer sees."""
    from hybridfl.algorithms.hyfdca.spec import privacy_warning

    line = privacy_warning(_cfg(alignment="psi"))
    assert "dual changes" in line and "squared norms" in line
    assert "inner products" not in line and "Gram" not in line
    plain = privacy_warning(_cfg(alignment="psi", segment_inner_products="encrypted"))
    assert "inner products" in plain and "Gram" in plain


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_overlapping_holdings_with_several_segments_per_client(schedule):
    """Four clients with random overlapping holdings (15 segments, several per client, blocks held
    twice weighted 1/c), PSI alignment: a message then carries several segments' words one after
    another (parallel schedule); the masked run equals the encrypted one to the fixed point."""
    from tests.test_hyfdca_psi import _overlapping, _run, _split

    split = _split(200)
    part = _overlapping(split, seed=3)
    kw = dict(dual_mode="segment", segment_schedule=schedule, alignment="psi", rounds=3)
    plain, _ = _run(split, part, **kw)
    masked, raw = _run(split, part, segment_inner_products="masked", **kw)
    assert len(masked.server.seg_n) > 4 and max(len(s) for s in masked.server.client_segs.values()) > 2
    np.testing.assert_allclose(masked.server.w, plain.server.w, atol=1e-9, rtol=0)
    assert np.abs(plain.server.w).max() > 0.1
    sweeps = [decode(b) for b in raw]
    widest = max(len(m.payload["segs"]) for m in sweeps if m.kind == "hyfdca.sweep" and m.receiver != SERVER)
    assert widest > 1 if schedule == "parallel" else widest == 1


@pytest.mark.parametrize(
    "field,corrupt",
    [
        ("gram", lambda p: {**p, "gram": p["gram"].astype(np.int64)}),
        ("gram", lambda p: {**p, "gram": p["gram"][:-1]}),
        ("gram", lambda p: {k: v for k, v in p.items() if k != "gram"}),
        ("seg_keys", lambda p: {**p, "seg_keys": p["seg_keys"][:-1]}),
        ("seg_keys", lambda p: {**p, "seg_keys": [k[:-1] for k in p["seg_keys"]]}),
        ("seg_keys", lambda p: {k: v for k, v in p.items() if k != "seg_keys"}),
    ],
    ids=["gram-dtype", "gram-length", "gram-missing", "keys-count", "keys-length", "keys-missing"],
)
def test_server_refuses_a_bad_masked_setup_reply(credit_small, field, corrupt):
    """A holder's masked ``hyfdca.init`` reply with Gram words of another dtype or length, or
    sealed keys of another count or length, or either missing: the setup (which needs every
    client) stops with one PayloadError naming the holder and the field, before any key is relayed."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(alignment="plaintext", rounds=1))
    liar = sorted(fed.clients)[4]

    def bad_setup(msg, r):
        return Message(r.kind, r.sender, r.receiver, r.round, corrupt(r.payload)) if msg.kind == "hyfdca.init" else r

    _lie(fed.clients[liar], bad_setup)
    with pytest.raises(PayloadError) as e:
        fed.setup()
    assert e.value.field == field and e.value.sender == liar
    assert not any(m.kind == "hyfdca.norms" for m in fed.transport.log.entries)
