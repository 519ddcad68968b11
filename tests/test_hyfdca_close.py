"""HyFDCA segment mode, the closing sweep: each client's last ``hyfdca.sweep`` of a pass carries
its PrimalAggregation share (HyFDCA Alg. 4 lines 2-4), so a pass needs no ``hyfdca.primal``
exchange. Checked here: the same ``w`` after every round as PrimalAggregation with ``enc(alpha)``
(the fallback, forced for every pass), exactly in plaintext; the fallback when a holder's closing
reply is lost; and a malicious server's closing sweeps refused by the client (the tiny 2 x 2
federation: four clients, two holders per segment)."""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.algorithms.hyfdca.segment_pass import SegmentPass
from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError

POS = [0, 1, 2, 3, 4]


def _cfg(**kw) -> HyFDCAConfig:
    base = {"rounds": 3, "batch_size": 16, "encryption": "none", "positive_classes": POS, "alignment": "plaintext"}
    return HyFDCAConfig(**{**base, **kw})


def _run(split, part, cfg, fallback: bool, drop=None, monkeypatch=None):
    """Run ``cfg``; with ``fallback`` no sweep closes (every pass ends with ``hyfdca.primal``, the
    PrimalAggregation with ``enc(alpha)``). ``drop``: ``(round, client)`` whose reply carrying a
    dual change (its closing one) is lost once. Returns ``w`` after every round, the kinds sent
    per round and the federation."""
    if fallback:
        monkeypatch.setattr(SegmentPass, "_closing", lambda self, *a: {})
    fed = build_federation("hyfdca", split, part, cfg)
    send = fed.transport.send_and_receive
    kinds: dict[int, list[str]] = {}
    dropped = []

    def sending(messages):
        messages = list(messages)
        if messages and messages[0].round > 0:
            kinds.setdefault(messages[0].round, []).append(messages[0].kind)
        replies = send(messages)
        if drop is not None and not dropped:
            lost = [r for r in replies if (r.round, r.sender) == drop and len(r.payload.get("dalpha_segs", []))]
            dropped.extend(lost)
            replies = [r for r in replies if r not in lost]
        return replies

    fed.transport.send_and_receive = sending
    fed.setup()
    ws = []
    for rnd in range(1, cfg.rounds + 1):
        fed.server.run_round(rnd, fed.transport)
        ws.append(fed.server.w.copy())
    if fallback:
        monkeypatch.undo()
    return ws, kinds, fed


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"secure_aggregation": False, "segment_inner_products": "encrypted", "output": "last"},
        {"segment_schedule": "parallel", "local_fraction": 0.5, "output": "average_last"},
        {"participation": 0.75, "loss": "logistic"},
    ],
)
def test_closing_sweeps_give_the_same_w_as_primal_aggregation(tiny, monkeypatch, settings):
    """Plaintext: ``w`` (and the step average) after every round equal, bit for bit, to the run
    whose passes all end with ``hyfdca.primal`` (the clients compute the server's new ``alpha``
    themselves, in the server's order of additions), with one exchange fewer per pass, two with
    secure aggregation (the closing sweep is a one-shot masked exchange: no ``hyfdca.unmask``)."""
    split, part = tiny
    cfg = _cfg(**settings)
    new, new_kinds, fed_new = _run(split, part, cfg, fallback=False)
    old, old_kinds, fed_old = _run(split, part, cfg, fallback=True, monkeypatch=monkeypatch)
    for a, b in zip(new, old):
        assert np.array_equal(a, b)
    if cfg.step_average:
        assert np.array_equal(fed_new.server.w_step, fed_old.server.w_step)
    assert new_kinds.keys() == old_kinds.keys()
    for rnd, sent in new_kinds.items():
        assert "hyfdca.primal" not in sent and "hyfdca.unmask" not in sent  # one-shot: never unmasked
        per_pass = 2 if cfg.secure_aggregation else 1  # hyfdca.primal (and its hyfdca.unmask) saved
        assert len(old_kinds[rnd]) - len(sent) == per_pass * old_kinds[rnd].count("hyfdca.segstart")
    assert sum(sent.count("hyfdca.segstart") for sent in new_kinds.values()) >= 2
    for cid, client in fed_new.clients.items():  # the copies the clients computed are the server's alpha
        for s, g in enumerate(client.seg_global):
            assert np.array_equal(
                client.alpha[client.seg_rows[s]], fed_new.server.he.decrypt(fed_new.server.enc_alpha[g])
            )


@pytest.mark.parametrize("secure", [True, False])
def test_a_lost_closing_reply_falls_back_to_primal_aggregation(tiny, monkeypatch, secure):
    """A holder's closing reply lost (round 2): its segment's pass is not added, the shares of the
    closing sweeps are dropped (never unmasked) and the server sends ``hyfdca.primal`` with
    ``enc(alpha)``, which replaces the copy the client had computed: ``w`` after every round equal
    to the run without closing sweeps losing the same reply."""
    split, part = tiny
    settings = {} if secure else {"secure_aggregation": False, "segment_inner_products": "encrypted"}
    cfg = _cfg(**settings)
    victim = build_federation("hyfdca", split, part, cfg).transport.client_ids[1]
    new, kinds, fed = _run(split, part, cfg, fallback=False, drop=(2, victim))
    old, _, _ = _run(split, part, cfg, fallback=True, drop=(2, victim), monkeypatch=monkeypatch)
    for a, b in zip(new, old):
        assert np.array_equal(a, b)
    assert kinds[2].count("hyfdca.primal") == 1 and "hyfdca.primal" not in kinds[1] + kinds[3]
    # the fallback's hyfdca.primal (and, secure, its hyfdca.unmask); the closing sweeps are never unmasked
    assert kinds[2].count("hyfdca.unmask") == int(secure) and "hyfdca.unmask" not in kinds[1] + kinds[3]
    assert len(kinds[2]) == len(kinds[1]) + 1 + int(secure)
    client = fed.clients[victim]
    for s, g in enumerate(client.seg_global):  # its copy is the server's alpha again
        assert np.array_equal(client.alpha[client.seg_rows[s]], fed.server.he.decrypt(fed.server.enc_alpha[g]))


def _msg(kind: str, cid: str, rnd: int, payload: dict) -> Message:
    return decode(encode(Message(kind, SERVER, cid, rnd, payload)))


def _in_pass(tiny):
    """Round 2 of an honest run, stopped after the victim's segment start: the victim (the first
    client, one segment of several batches) has its pass under way; also the honest sweep message
    it would get next."""
    split, part = tiny
    fed = build_federation("hyfdca", split, part, _cfg(segment_inner_products="encrypted"))
    fed.setup()
    fed.server.run_round(1, fed.transport)
    cid = fed.transport.client_ids[0]
    client = fed.clients[cid]
    order = list(range(len(client.seg_batches[0])))
    assert len(order) > 1
    start = {"w": np.zeros(client.X.shape[1]), "segs": [0], "count": [len(order)], "order": order, "seed": 5}
    client.handle(_msg("hyfdca.segstart", cid, 2, {**start, "sigma": 1.0}))
    u = [fed.server.he.encrypt(np.zeros(client.seg_batches[0][0].size))]
    return fed, cid, client, {"segs": [0], "u": u}


def test_a_close_while_the_pass_goes_on_is_refused(tiny):
    """A malicious server asks for the share (``close``) at a sweep after which the victim's pass
    goes on (a share of an ``alpha`` no pass produced): refused by name, nothing computed, and the
    client stops (fail closed)."""
    fed, cid, client, sweep = _in_pass(tiny)
    alpha = client.alpha.copy()
    sa = {"sa_tag": 10**6, "sa_peers": [c for c in fed.transport.client_ids if c != cid], "sa_acked": False}
    with pytest.raises(PayloadError, match="'close' true for a sweep after which a segment of its pass goes on"):
        client.handle(_msg("hyfdca.sweep", cid, 2, {**sweep, "close": True, **sa}))
    assert np.array_equal(client.alpha, alpha)
    with pytest.raises(ProtocolError, match="after refusing"):
        client.handle(_msg("hyfdca.sweep", cid, 2, sweep))


@pytest.mark.parametrize(
    "extra,match",
    [
        ({"close": "yes"}, "'close' not a bool"),
        ({"sa_tag": 10**6}, "'sa_tag'"),  # secure-aggregation fields without close
    ],
)
def test_malformed_closing_fields_are_refused(tiny, extra, match):
    """``close`` that is not a bool, or the exchange's fields on a sweep that does not close:
    refused by name."""
    fed, cid, client, sweep = _in_pass(tiny)
    with pytest.raises(PayloadError, match=match):
        client.handle(_msg("hyfdca.sweep", cid, 2, {**sweep, **extra}))


def test_an_unmask_after_a_sweep_that_did_not_close_is_refused(tiny):
    """``hyfdca.unmask`` comes only right after the masked exchange it unmasks (the closing sweep
    or ``hyfdca.primal``): after an ordinary sweep it is out of place."""
    fed, cid, client, sweep = _in_pass(tiny)
    client.handle(_msg("hyfdca.sweep", cid, 2, sweep))
    ask = {"tag": 1, "dropped": [], "survivors": [], "shares": []}
    with pytest.raises(ProtocolError, match="does not put it after 'sweep'"):
        client.handle(_msg("hyfdca.unmask", cid, 2, ask))


@pytest.mark.parametrize("scheme", ["ckks", "paillier"])
def test_encrypted_duals_give_w_within_the_encoding_error(tiny, monkeypatch, scheme):
    """Under CKKS and Paillier the clients' copies of ``alpha`` are now the exact sums (before: the
    decrypted ones, an encoding error away): ``w`` after every round within ``1e-5`` (relative) of
    the run whose passes end with ``hyfdca.primal``, and each client's copy within its encoding
    error of the server's decrypted ``alpha``."""
    split, part = tiny
    cfg = _cfg(encryption=scheme, paillier_bits=512, segment_inner_products="encrypted")
    new, _, fed = _run(split, part, cfg, fallback=False)
    old, _, _ = _run(split, part, cfg, fallback=True, monkeypatch=monkeypatch)
    for a, b in zip(new, old):
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
        assert not np.array_equal(a, b) or scheme == "paillier"  # CKKS: the noise differs
    for client in fed.clients.values():
        err = client.encoding_error(cfg.rounds)
        for s, g in enumerate(client.seg_global):
            rows = client.seg_rows[s]
            gap = np.abs(client.alpha[rows] - client.he.decrypt(fed.server.enc_alpha[g]))  # a client decrypts
            assert (gap <= err[rows] + 1e-12).all()


def _closing_sweeps(fed, cid, client, tag: int) -> tuple[list[dict], dict]:
    """The honest sweeps of the victim's pass (``_in_pass``) but the last, and its closing sweep
    with secure-aggregation exchange number ``tag`` and every other client as its peers."""
    sizes = [b.size for b in client.seg_batches[0]]
    sweeps = [{"segs": [0], "u": [fed.server.he.encrypt(np.zeros(n))]} for n in sizes]
    peers = [c for c in fed.transport.client_ids if c != cid]
    return sweeps[:-1], {**sweeps[-1], "close": True, "sa_tag": tag, "sa_peers": peers, "sa_acked": False}


def test_a_replayed_closing_sweep_is_refused_and_the_client_stops(tiny):
    """A malicious server sends the victim's closing sweep twice (a second masked share of the same
    pass, under the same exchange number): the first is answered with its masked share, the copy
    is refused (out of order: a closing sweep follows only a start or a sweep) and the client
    answers nothing more (fail closed)."""
    fed, cid, client, _ = _in_pass(tiny)
    sweeps, closing = _closing_sweeps(fed, cid, client, 10**6)
    for p in sweeps:
        client.handle(_msg("hyfdca.sweep", cid, 2, p))
    reply = client.handle(_msg("hyfdca.sweep", cid, 2, closing))
    assert reply.payload["masked"].dtype == np.uint64
    with pytest.raises(ProtocolError, match="does not put it after 'close'"):
        client.handle(_msg("hyfdca.sweep", cid, 2, closing))
    with pytest.raises(ProtocolError, match="after refusing"):
        client.handle(_msg("hyfdca.segstart", cid, 3, {}))


def test_a_closing_sweep_reusing_an_exchange_number_is_refused(tiny):
    """A closing sweep whose ``sa_tag`` is not above every tag the victim masked under (round 1's
    exchanges used them): refused by name before its share is masked, its ``alpha`` unchanged."""
    fed, cid, client, _ = _in_pass(tiny)
    sweeps, closing = _closing_sweeps(fed, cid, client, 1)
    for p in sweeps:
        client.handle(_msg("hyfdca.sweep", cid, 2, p))
    alpha = client.alpha.copy()
    with pytest.raises(PayloadError, match="'sa_tag' refused .*reuse secure-aggregation tag 1"):
        client.handle(_msg("hyfdca.sweep", cid, 2, closing))
    assert np.array_equal(client.alpha, alpha)


def test_the_closing_sweep_is_one_shot_and_an_unmask_after_it_is_refused(tiny):
    """Adversary: a malicious server that got the victim's closing share (a one-shot masked
    exchange: pair masks only, no self-mask shares) and asks for the masks of that exchange with
    its peers named dropped (which would strip the masks): refused by name as out of order (no
    unmasking follows a closing sweep), nothing revealed, and the client stops (fail closed)."""
    fed, cid, client, _ = _in_pass(tiny)
    sweeps, closing = _closing_sweeps(fed, cid, client, 10**6)
    for p in sweeps:
        client.handle(_msg("hyfdca.sweep", cid, 2, p))
    reply = client.handle(_msg("hyfdca.sweep", cid, 2, closing))
    assert reply.payload["masked"].dtype == np.uint64 and "self_shares" not in reply.payload
    ask = {"tag": 10**6, "dropped": closing["sa_peers"], "survivors": [], "shares": []}
    with pytest.raises(ProtocolError, match="does not put it after 'close'"):
        client.handle(_msg("hyfdca.unmask", cid, 2, ask))
    with pytest.raises(ProtocolError, match="after refusing"):
        client.handle(_msg("hyfdca.segstart", cid, 3, {}))


@pytest.fixture(scope="module")
def solo(tiny):
    """The 80 training digits on three clients whose segments include two with one holder: A holds
    samples 0-49 (the first half of the blocks), B samples 30-79 (the second half), C every third
    of samples 0-29 (the second half). Segments: {A} and {B} (one holder each), {A, C}, {A, B}."""
    from hybridfl.data.partition import ClientShard, Partition

    split, _ = tiny
    ids, names = split.train.ids, split.train.block_names
    first, second = tuple(names[: len(names) // 2]), tuple(names[len(names) // 2 :])
    shards = [
        ClientShard("A", ids[:50], first),
        ClientShard("B", ids[30:], second),
        ClientShard("C", ids[0:30:3], second),
    ]
    return split, Partition(shards)


def _solo_off(monkeypatch) -> None:
    """Every pass the ordinary way (start, sweeps, closing sweep), also over one-holder segments."""
    monkeypatch.setattr(SegmentPass, "solo", lambda self: False)


@pytest.mark.parametrize(
    "settings",
    [
        {"secure_aggregation": False, "segment_inner_products": "encrypted", "output": "last"},
        {"segment_inner_products": "encrypted"},
        {"loss": "logistic"},
        {"segment_schedule": "parallel"},
    ],
)
def test_a_pass_over_segments_of_one_holder_is_one_exchange(solo, monkeypatch, settings):
    """A sequential pass over a segment with one holder is one ``hyfdca.segstart`` with ``solo``:
    the holder walks every batch with its own inner products (the whole sum) and replies as a
    closing sweep. Plaintext inner products (``encrypted`` under ``encryption: none``): ``w``
    after every round equal, bit for bit, to the run that takes such passes the ordinary way (start,
    sweeps, closing sweep), with ``sweeps`` exchanges fewer per such pass; masked inner products
    (the default): within the fixed point's resolution. The parallel schedule (segments with
    several holders in the pass) is unchanged."""
    split, part = solo
    cfg = _cfg(**settings)
    new, new_kinds, fed = _run(split, part, cfg, fallback=False)
    srv = fed.server
    solo_segs = [g for g, h in enumerate(srv.seg_holders) if len(h) == 1]
    assert len(solo_segs) == 2 and len(srv.seg_n) == 4
    _solo_off(monkeypatch)
    old, old_kinds, _ = _run(split, part, cfg, fallback=False)
    monkeypatch.undo()
    exact = cfg.segment_inner_products == "encrypted"
    for a, b in zip(new, old):
        assert np.array_equal(a, b) if exact else np.abs(a - b).max() <= 1e-6 * np.abs(b).max()
    sweeps = sum(max(1, int(np.ceil(srv.seg_n[g] / cfg.batch_size))) for g in solo_segs)
    for rnd, sent in new_kinds.items():
        if cfg.segment_schedule == "parallel":
            assert sent == old_kinds[rnd]
        else:
            assert len(old_kinds[rnd]) - len(sent) == sweeps
    if cfg.segment_schedule == "sequential":
        assert all(
            client.protocol.stopped == "" for client in fed.clients.values()
        )  # every client answered every message


def test_a_solo_start_for_a_segment_with_other_holders_is_refused(solo):
    """Adversary: a malicious server asks a client to walk a segment that has other holders alone
    (``solo``), which would step on its own block's inner products only: refused by name before
    anything changes, and the client stops."""
    split, part = solo
    fed = build_federation("hyfdca", split, part, _cfg(segment_inner_products="encrypted"))
    fed.setup()
    client = fed.clients["A"]
    shared = [s for s in range(len(client.seg_rows)) if client.holder_count(s) > 1]
    assert shared
    s = shared[0]
    n = len(client.seg_batches[s])
    start = {"w": np.zeros(client.X.shape[1]), "segs": [s], "count": [n], "order": list(range(n)), "seed": 5}
    sa = {"sa_tag": 10**6, "sa_peers": ["B", "C"], "sa_acked": False}
    alpha = client.alpha.copy()
    with pytest.raises(PayloadError, match="'solo' true for a segment with other holders"):
        client.handle(_msg("hyfdca.segstart", "A", 1, {**start, "sigma": 1.0, "solo": True, **sa}))
    assert np.array_equal(client.alpha, alpha)
    with pytest.raises(ProtocolError, match="after refusing"):
        client.handle(_msg("hyfdca.segstart", "A", 1, {**start, "sigma": 1.0}))


def _solo_start(solo):
    """Client A of the ``solo`` federation after setup, and an honest solo start of its one-holder
    segment (secure aggregation on: an exchange of one, no peers)."""
    split, part = solo
    fed = build_federation("hyfdca", split, part, _cfg(segment_inner_products="encrypted"))
    fed.setup()
    client = fed.clients["A"]
    s = next(s for s in range(len(client.seg_rows)) if client.holder_count(s) == 1)
    n = len(client.seg_batches[s])
    start = {"w": np.zeros(client.X.shape[1]), "segs": [s], "count": [n], "order": list(range(n)), "seed": 5}
    sa = {"sa_tag": 10**6, "sa_peers": [], "sa_acked": False}
    return client, {**start, "sigma": 1.0, "solo": True, **sa}


@pytest.mark.parametrize(
    "change,match",
    [
        ({"solo": "yes"}, "'solo' not a bool"),
        ({"sa_acked": None}, "'sa_acked' missing or not a bool"),
        ({"sa_peers": ["A"]}, "'sa_peers' refused"),  # itself as its peer
        ({"solo": False}, "'sa_acked' not expected"),  # the closing exchange's fields without solo
        ({"w": np.full(1, np.nan)}, "'w'"),
    ],
)
def test_a_malformed_solo_start_is_refused_and_the_client_stops(solo, change, match):
    """A solo start whose ``solo`` is not a bool, whose closing exchange's fields are missing or name
    itself as a peer, that carries them without ``solo``, or brings a bad ``w``: refused by name before any
    step, the client's duals unchanged, and it answers nothing more (fail closed). (A reused
    exchange number: the next test.)"""
    client, msg = _solo_start(solo)
    alpha = client.alpha.copy()
    with pytest.raises(PayloadError, match=match):
        client.handle(_msg("hyfdca.segstart", "A", 1, {**msg, **change}))
    assert np.array_equal(client.alpha, alpha)
    with pytest.raises(ProtocolError, match="after refusing"):
        client.handle(_msg("hyfdca.segstart", "A", 1, msg))


def test_a_solo_start_sent_twice_is_refused(solo):
    """The same solo start again (the server replaying it for a second share of the same pass):
    its exchange number is used up, so it is refused by name and the client stops."""
    client, msg = _solo_start(solo)
    reply = client.handle(_msg("hyfdca.segstart", "A", 1, msg))
    assert reply.payload["dalpha_segs"] == msg["segs"] and "masked" in reply.payload
    with pytest.raises(PayloadError, match="'sa_tag' refused"):
        client.handle(_msg("hyfdca.segstart", "A", 1, msg))
    with pytest.raises(ProtocolError, match="after refusing"):
        client.handle(_msg("hyfdca.segstart", "A", 2, msg))


@pytest.mark.parametrize(
    "corrupt",
    [
        {"ip_segs": [0]},  # a pass that goes on
        {"dalpha_segs": []},  # a pass that does not end
        {"self_shares": [b"\0" * 44]},  # self-mask shares in a one-shot exchange
        {"masked": np.zeros(3, dtype=np.uint64)},  # another length
    ],
)
def test_a_bad_solo_reply_is_dropped_and_the_run_goes_on(solo, corrupt):
    """The server does not trust a solo reply: one that continues or does not end its pass, sends
    self-mask shares in the one-shot exchange or masked words of another length is dropped (that
    segment's pass is not added), the server falls back to ``hyfdca.primal`` for the pass and the
    run goes on; every client's copy of ``alpha`` is the server's again."""
    split, part = solo
    fed = build_federation("hyfdca", split, part, _cfg(rounds=2))
    honest = fed.clients["A"].handle
    hit = []

    def lie(msg):
        r = honest(msg)
        if msg.kind == "hyfdca.segstart" and msg.payload.get("solo") and not hit:
            hit.append(msg.round)
            return Message(r.kind, r.sender, r.receiver, r.round, {**r.payload, **corrupt})
        return r

    fed.clients["A"].handle = lie
    kinds: list[str] = []
    send = fed.transport.send_and_receive

    def sending(messages):
        messages = list(messages)
        kinds.extend(m.kind for m in messages[:1])
        return send(messages)

    fed.transport.send_and_receive = sending
    fed.setup()
    for rnd in (1, 2):
        fed.server.run_round(rnd, fed.transport)
    assert hit and "hyfdca.primal" in kinds and np.isfinite(fed.server.w).all()
    for client in fed.clients.values():
        if client.protocol.stopped:
            continue
        for s, g in enumerate(client.seg_global):
            assert np.array_equal(client.alpha[client.seg_rows[s]], fed.server.he.decrypt(fed.server.enc_alpha[g]))


def test_a_sweep_whose_u_does_not_match_its_batch_is_refused_and_the_client_stops(tiny):
    """A malicious server's ``u`` with the batch's length in its header but another body: a
    float64 body one value short, a float32 body under a float64 header, or a float32 vector of
    another length (the steps would read past its end): refused by name before any step, ``alpha``
    and the pass unchanged, and the client answers nothing more (fail closed)."""
    import struct

    fed, cid, client, sweep = _in_pass(tiny)
    he = fed.server.he
    n = client.seg_batches[0][0].size
    good = sweep["u"][0]
    short = good[:-8]
    as_single = struct.pack(">I", n) + he.encrypt(np.zeros(n, dtype=np.float32))[4:]
    other = he.encrypt(np.zeros(n - 1, dtype=np.float32))
    other = struct.pack(">I", struct.unpack(">I", other[:4])[0] + 1) + other[4:]  # header says n
    for bad, match in [
        (short, "'u' holding a ciphertext that does not decrypt"),
        (as_single, "'u' holding a ciphertext that does not decrypt"),
        (other, "'u' holding a ciphertext that does not decrypt"),
    ]:
        fed, cid, client, sweep = _in_pass(tiny)
        alpha, j = client.alpha.copy(), client.sweep[0]["j"]
        with pytest.raises(PayloadError, match=match):
            client.handle(_msg("hyfdca.sweep", cid, 2, {**sweep, "u": [bad]}))
        assert np.array_equal(client.alpha, alpha) and client.sweep[0]["j"] == j
        with pytest.raises(ProtocolError, match="after refusing"):
            client.handle(_msg("hyfdca.sweep", cid, 2, sweep))


def test_a_ckks_u_of_fewer_values_than_its_header_says_is_refused(tiny):
    """Under CKKS: a ``u`` whose header claims the batch's length but whose body holds fewer values
    (a ciphertext of another vector behind a rewritten header): refused by name before any step
    (the steps would read past its end), and the client stops."""
    import struct

    split, part = tiny
    fed = build_federation("hyfdca", split, part, _cfg(encryption="ckks", segment_inner_products="encrypted"))
    fed.setup()
    fed.server.run_round(1, fed.transport)
    cid = fed.transport.client_ids[0]
    client = fed.clients[cid]
    order = list(range(len(client.seg_batches[0])))
    start = {"w": np.zeros(client.X.shape[1]), "segs": [0], "count": [len(order)], "order": order, "seed": 5}
    client.handle(_msg("hyfdca.segstart", cid, 2, {**start, "sigma": 1.0}))
    n = client.seg_batches[0][0].size
    fewer = fed.server.he.encrypt(np.zeros(n - 3))
    bad = struct.pack(">I", n) + fewer[4:]
    alpha = client.alpha.copy()
    with pytest.raises(PayloadError, match="'u' decrypting to another length than its batch"):
        client.handle(_msg("hyfdca.sweep", cid, 2, {"segs": [0], "u": [bad]}))
    assert np.array_equal(client.alpha, alpha)
    with pytest.raises(ProtocolError, match="after refusing"):
        client.handle(_msg("hyfdca.sweep", cid, 2, {"segs": [0], "u": [fed.server.he.encrypt(np.zeros(n))]}))
