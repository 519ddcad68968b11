"""Private sample alignment (hybridfl.privacy.psi, FedBCD's setup): the PSI wrapper equals the
plaintext intersection, FedBCD's parties align on exactly the intersection in the label party's
order, no raw ID (and no ID outside the intersection) crosses in any message, the coordinator learns
only the intersection's size, and malformed blobs are refused in one sentence."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridfl.algorithms.fedbcd import FedBCDConfig, FedBCDCoordinator, FedBCDParty, run_fedbcd
from hybridfl.data import DatasetSplit, HybridDataset
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import ProtocolError
from hybridfl.privacy import psi
from hybridfl.runtime.messages import SERVER, Message, decode
from hybridfl.runtime.transport import InProcessTransport
from hybridfl.runtime.validate import PayloadError


def one_sentence(e: Exception) -> bool:
    s = str(e)
    return s.endswith(".") and "\n" not in s and ". " not in s[:-1]


def pair(client_ids, server_ids, workers=1):
    c = psi.PSIClient(client_ids, workers=workers)
    s = psi.PSIServer(server_ids, workers=workers)
    req = c.request()
    return c, s, req, s.setup(len(client_ids)), s.respond(req)


# ---------------------------------------------------------------------- the wrapper
id_sets = st.lists(st.text(min_size=1, max_size=12), max_size=25, unique=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(id_sets, id_sets)
def test_psi_equals_the_plaintext_intersection(a, b):
    c, _s, _req, setup, resp = pair(a, b)
    got = [a[i] for i in c.intersect(setup, resp)]
    assert got == psi.plaintext_intersection(a, b)


def test_parallel_steps_send_the_same_bytes_as_one_process(monkeypatch):
    monkeypatch.setattr(psi, "PARALLEL_MIN_IDS", 8)
    a = [f"a{i}" for i in range(0, 120, 2)]
    b = [f"a{i}" for i in range(0, 120, 3)]
    c2, s2, req2, setup2, resp2 = pair(a, b, workers=2)
    c1 = psi.PSIClient(a, key=c2.secret_key(), workers=1)
    s1 = psi.PSIServer(b, key=s2.secret_key(), workers=1)
    assert c1.request() == req2
    assert s1.setup(len(a)) == setup2 and s1.respond(req2) == resp2
    assert list(c2.intersect(setup2, resp2)) == list(c1.intersect(setup2, resp2))
    assert [a[i] for i in c2.intersect(setup2, resp2)] == psi.plaintext_intersection(a, b)


def _pid(_: int) -> int:
    import os

    return os.getpid()


def test_one_pool_serves_every_step_of_its_block_and_ends_with_it(monkeypatch):
    """Inside ``psi.one_pool`` the parallel steps run in one set of forked workers (the same
    processes step after step) and give the same bytes; the workers end with the block; outside
    it every step forks its own."""
    import multiprocessing
    import os

    monkeypatch.setattr(psi, "default_workers", lambda: 2)  # as on this project's 2-core machines
    monkeypatch.setattr(psi, "PARALLEL_MIN_IDS", 8)
    a = [f"a{i}" for i in range(0, 120, 2)]
    b = [f"a{i}" for i in range(0, 120, 3)]
    c1, s1, req1, setup1, resp1 = pair(a, b, workers=1)
    with psi.one_pool():
        first = set(psi._run(_pid, [(i,) for i in range(8)], 2))
        c2 = psi.PSIClient(a, key=c1.secret_key(), workers=2)
        s2 = psi.PSIServer(b, key=s1.secret_key(), workers=2)
        assert c2.request() == req1 and s2.setup(len(a)) == setup1 and s2.respond(req1) == resp1
        assert list(c2.intersect(setup1, resp1)) == list(c1.intersect(setup1, resp1))
        again = set(psi._run(_pid, [(i,) for i in range(8)], 2))
        workers = multiprocessing.active_children()
        assert again <= first and os.getpid() not in first and workers
    assert not any(p.is_alive() for p in workers)  # nothing outlives the block
    assert not multiprocessing.active_children()
    outside = [set(psi._run(_pid, [(i,) for i in range(8)], 2)) for _ in range(2)]
    assert not outside[0] & outside[1] and not outside[0] & first  # a pool per step


def test_fresh_keys_make_unlinkable_blobs():
    """Two runs on the same IDs share no blinded element: the blobs are no deterministic function
    of the IDs that an observer could compare or test guesses against."""
    ids = [f"id-{i}" for i in range(40)]
    _, _, req1, setup1, _ = pair(ids, ids)
    _, _, req2, setup2, _ = pair(ids, ids)

    def points(blob):
        return {blob[i : i + 33] for i in range(len(blob) - 32)}

    assert not points(req1) & points(req2)
    assert not points(setup1) & points(setup2)


def test_malformed_blobs_are_refused_in_one_sentence():
    ids = [f"id-{i}" for i in range(10)]
    c, s, req, setup, resp = pair(ids, ids[3:])
    lib = __import__("private_set_intersection.python", fromlist=["Request"])
    gcs = lib.ServerSetup()
    gcs.gcs.div = 3
    unsorted = lib.ServerSetup()
    unsorted.raw.encrypted_elements.extend(sorted(lib.ServerSetup.FromString(setup).raw.encrypted_elements)[::-1])
    off_curve = lib.Request(reveal_intersection=True, encrypted_elements=[b"\x02" + b"\xff" * 32])
    cases = [
        (lambda: s.respond("not bytes"), "request"),
        (lambda: s.respond(b"\xff\xff\xff"), "request"),
        (lambda: s.respond(lib.Request(encrypted_elements=[b"\x02" * 20]).SerializeToString()), "request"),
        (lambda: s.respond(lib.Request(encrypted_elements=[b"\x05" * 33]).SerializeToString()), "request"),
        (lambda: s.respond(req + b"\x18\x01"), "request"),  # an unknown field
        (lambda: s.respond(off_curve.SerializeToString()), "request"),
        (lambda: s.respond(req, max_ids=3), "request"),
        (lambda: c.intersect(gcs.SerializeToString(), resp), "setup"),
        (lambda: c.intersect(unsorted.SerializeToString(), resp), "setup"),
        (lambda: c.intersect(setup, resp[: len(resp) // 2]), "response"),
        (lambda: c.intersect(setup, lib.Response(encrypted_elements=[b"\x03" * 33]).SerializeToString()), "response"),
        (lambda: psi.match_tags(b"k" * 32, ids, b"\x00" * 15), "tags"),
        (lambda: psi.match_tags(b"k" * 32, ids, b"\x00" * 16), "tags"),
        (lambda: psi.match_tags(b"k" * 32, ids, psi.order_tags(b"k" * 32, ids[:2] * 2)), "tags"),
        (lambda: psi.KeyAgreement().shared_key(b"\x00" * 32, b"x", True), "key"),
        (lambda: psi.KeyAgreement().shared_key(b"\x01" * 7, b"x", True), "key"),
    ]
    for call, part in cases:
        with pytest.raises(psi.PSIError) as e:
            call()
        assert e.value.part == part and one_sentence(e.value), str(e.value)


def test_order_tags_carry_an_order_only_to_the_key_holder():
    a, b = psi.KeyAgreement(), psi.KeyAgreement()
    k1 = a.shared_key(b.public(), b"ctx", initiator=True)
    assert k1 == b.shared_key(a.public(), b"ctx", initiator=False)
    assert k1 != psi.KeyAgreement().shared_key(b.public(), b"ctx", initiator=True)
    mine = [f"s{i}" for i in range(30)]
    order = ["s7", "s2", "s29", "s0"]
    assert [mine[i] for i in psi.match_tags(k1, mine, psi.order_tags(k1, order))] == order
    restored = psi.KeyAgreement(a.private_bytes())
    assert restored.public() == a.public()


# ---------------------------------------------------------------------- FedBCD's alignment
def _parties(id_lists: list[list[str]]) -> dict[str, FedBCDParty]:
    order = [f"p{k}" for k in range(len(id_lists))]
    out = {}
    for k, ids in enumerate(id_lists):
        x = np.zeros((len(ids), 2), np.float32)
        kw = {}
        if k == 0:
            kw = dict(labels=np.zeros(len(ids)), top=torch.nn.Identity(), party_order=order)
        out[order[k]] = FedBCDParty(order[k], np.array(ids, dtype=str), x, torch.nn.Linear(2, 1), ["b"], **kw)
    return out


ids_strategy = st.lists(st.integers(0, 40), min_size=1, max_size=30, unique=True)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ids_strategy, min_size=2, max_size=4))
def test_fedbcd_alignment_equals_the_plaintext_intersection(sets):
    id_lists = [[f"user-{i:03d}" for i in s] for s in sets]
    parties = _parties(id_lists)
    transport = InProcessTransport(parties)
    coord = FedBCDCoordinator(FedBCDConfig())
    common = psi.plaintext_intersection(*id_lists)  # in the label party's order, as before PSI
    if not common:
        with pytest.raises(ProtocolError, match="share no sample ID"):
            coord.setup(transport, transport.client_ids)
        return
    coord.setup(transport, transport.client_ids)
    assert coord.n == len(common)
    every = set().union(*id_lists)
    for v in vars(coord).values():  # the coordinator keeps no ID
        assert not (isinstance(v, str) and v in every)
        assert not (isinstance(v, (list, set, tuple, dict)) and every & {x for x in v if isinstance(x, str)})
    for p in parties.values():
        assert [str(p.ids[r]) for r in p.rows] == common
        assert p._align == {}  # the alignment's secret keys are dropped once aligned


def _split_with_long_ids(n=120, seed=0):
    rng = np.random.default_rng(seed)
    ids = [f"customer-{i:05d}-{rng.integers(10**8):08d}@bank.example" for i in range(n)]
    blocks = {f"b{j}": rng.normal(size=(n, 3)).astype(np.float32) for j in range(3)}
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    test_ids = [f"test-{i:05d}-{rng.integers(10**8):08d}@bank.example" for i in range(40)]
    tb = {f"b{j}": rng.normal(size=(40, 3)).astype(np.float32) for j in range(3)}
    ty = rng.integers(0, 2, 40)
    ty[:2] = [0, 1]
    return DatasetSplit(
        HybridDataset("ids", ids, y, blocks, ["n", "p"]), HybridDataset("ids", test_ids, ty, tb, ["n", "p"])
    )


def test_audit_no_raw_id_and_no_id_outside_the_intersection_crosses():
    split = _split_with_long_ids()
    ids = np.array(split.train.ids, dtype=str)
    rng = np.random.default_rng(1)
    held = [np.sort(rng.choice(len(ids), 90, replace=False)) for _ in range(3)]
    part = Partition([ClientShard(f"party-{k}", ids[h], (f"b{k}",), k == 1) for k, h in enumerate(held)])
    common = set(psi.plaintext_intersection(*(ids[h] for h in held)))
    assert 0 < len(common) < 90
    raw: list[bytes] = []
    res = run_fedbcd(split, part, FedBCDConfig(variant="p", rounds=2, batch_size=8), seed=0, recorder=raw.append)
    assert len(raw) >= res.summary["messages_total"] > 0  # evaluation messages are recorded too
    blob = b"\x00".join(raw)
    every = set(ids) | set(split.test.ids)
    patterns = []
    for s in every:
        for enc in ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le"):
            patterns.append((s, enc, s.encode(enc)))
        patterns.append((s, "sha256", hashlib.sha256(s.encode()).digest()[:16]))
        patterns.append((s, "sha256 hex", hashlib.sha256(s.encode()).hexdigest()[:16].encode()))
    leaks = [f"{s} ({enc})" for s, enc, p in patterns if p in blob]
    assert leaks == []
    outside = [s for s in ids if s not in common]
    assert outside and not any(s.encode() in blob for s in outside)
    # the audit can fail: a planted ID is found
    assert any(p in blob + ids[0].encode("utf-16-le") for _, _, p in patterns)

    # the coordinator's view: everything it receives or sends in the setup besides opaque blobs
    setup = [decode(r) for r in raw if decode(r).round == 0]
    kinds = [m.kind for m in setup]
    assert "fedbcd.psi_serve" in kinds and "fedbcd.align" in kinds
    seen_numbers = set()
    for m in setup:
        for k, v in m.payload.items():
            if isinstance(v, (bytes, bytearray)):
                continue  # opaque PSI blobs, X25519 public keys, keyed order tags
            assert not isinstance(v, np.ndarray), f"{k} in {m.kind}"
            if isinstance(v, list):
                assert k == "blocks", f"a list {k!r} crossed in {m.kind}"
            elif isinstance(v, int) and not isinstance(v, bool) and k == "n_aligned":
                seen_numbers.add(v)
    assert seen_numbers == {len(common)}


def test_alignment_gives_the_same_run_as_the_plaintext_order():
    """The PSI alignment imposes the label party's order, as the plaintext alignment did: a run
    on parties that hold the same samples trains on the dataset order (checked against the
    batches' rows at every party)."""
    split = _split_with_long_ids()
    ids = np.array(split.train.ids, dtype=str)
    perm = np.random.default_rng(2).permutation(len(ids))
    part = Partition(
        [
            ClientShard("party-0", ids, ("b0",), True),
            ClientShard("party-1", ids[perm], ("b1", "b2"), False),  # another row order
        ]
    )
    from hybridfl.runtime.simulation import build_federation

    fed = build_federation("fedbcd", split, part, FedBCDConfig(rounds=1), 0)
    fed.server.setup(fed.transport, fed.transport.client_ids)
    p0, p1 = fed.clients["party-0"], fed.clients["party-1"]
    assert list(p0.rows) == list(range(len(ids)))
    assert list(p1.ids[p1.rows]) == list(ids)


def test_fedbcd_parties_refuse_malformed_or_misdirected_alignment_messages():
    parties = _parties([["a", "b", "c"], ["b", "c", "d"]])
    label, passive = parties["p0"], parties["p1"]
    fresh = {k: p.get_state() for k, p in parties.items()}  # a refusal stops a party: each check from here
    with pytest.raises(ProtocolError, match="only the label party answer"):
        passive.handle(Message("fedbcd.psi_request", SERVER, "p1", 0))
    with pytest.raises(ProtocolError, match="only passive parties answer"):
        label.handle(Message("fedbcd.psi_serve", SERVER, "p0", 0, {"request": b"", "dh": b"\x00" * 32}))
    passive.set_state(fresh["p1"])
    with pytest.raises(ProtocolError, match="before fedbcd.psi_serve"):
        passive.handle(Message("fedbcd.align", SERVER, "p1", 0, {"tags": b"\x00" * 16}))
    label.set_state(fresh["p0"])
    passive.set_state(fresh["p1"])
    req = label.handle(Message("fedbcd.psi_request", SERVER, "p0", 0)).payload
    n = req["n"]
    bad = [
        ({"request": b"garbage!", "dh": req["dh"], "n": n}, "request"),
        ({"request": req["request"], "dh": b"\x00" * 5, "n": n}, "dh"),
        ({"request": "text", "dh": req["dh"], "n": n}, "request"),
        ({"request": req["request"], "dh": req["dh"], "n": n, "extra": 1}, "extra"),
        ({"request": req["request"], "dh": req["dh"], "n": n + 1}, "request"),
    ]
    for payload, field in bad:  # a fresh party each time: a party answers one request per run
        with pytest.raises(PayloadError) as e:
            _parties([["a", "b", "c"], ["b", "c", "d"]])["p1"].handle(
                Message("fedbcd.psi_serve", SERVER, "p1", 0, payload)
            )
        assert e.value.field == field and one_sentence(e.value), str(e.value)
    served = passive.handle(Message("fedbcd.psi_serve", SERVER, "p1", 0, req)).payload
    # state kept between two messages survives a rebuild (Flower rebuilds a party per message)
    rebuilt = _parties([["a", "b", "c"], ["b", "c", "d"]])["p1"]
    rebuilt.set_state(passive.get_state())
    relay = {f"{k}.p1": v for k, v in served.items()}
    requested = label.get_state()
    with pytest.raises(PayloadError) as e:
        label.handle(Message("fedbcd.psi_result", SERVER, "p0", 0, {**relay, "setup.p1": b"\x0a\x01"}))
    assert e.value.field == "setup.p1" and one_sentence(e.value)
    label.set_state(requested)
    with pytest.raises(PayloadError) as e:
        label.handle(Message("fedbcd.psi_result", SERVER, "p0", 0, {**relay, "response.p1": served["setup"]}))
    assert e.value.field == "response.p1" and one_sentence(e.value)
    label.set_state(requested)
    result = label.handle(Message("fedbcd.psi_result", SERVER, "p0", 0, relay)).payload
    assert result["n_aligned"] == 2
    saved = rebuilt.get_state()
    with pytest.raises(PayloadError) as e:
        rebuilt.handle(Message("fedbcd.align", SERVER, "p1", 0, {"tags": result["tags.p1"][:-1]}))
    assert e.value.field == "tags" and one_sentence(e.value)
    rebuilt.set_state(saved)
    assert rebuilt.handle(Message("fedbcd.align", SERVER, "p1", 0, {"tags": result["tags.p1"]})).payload == {
        "n_aligned": 2
    }
    assert [str(rebuilt.ids[r]) for r in rebuilt.rows] == ["b", "c"]


def test_coordinator_refuses_malformed_relay_replies():
    coord = FedBCDCoordinator(FedBCDConfig())
    r = Message("fedbcd.psi_request", "p0", SERVER, 0, {"request": "x", "dh": b"1"})
    for key, kw in (("request", {}), ("dh", {"size": 32}), ("missing", {})):
        with pytest.raises(PayloadError) as e:
            coord.check_blob(r, key, **kw)
        assert one_sentence(e.value)
