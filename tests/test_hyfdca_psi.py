"""HyFDCA sample alignment by private set intersection between the clients (``alignment: psi``,
:mod:`hybridfl.algorithms.hyfdca.align`): the same segments, order and results as the plaintext
alignment in every dual mode, with and without secure aggregation and encryption; the holder sets
equal the plaintext ones for random holdings (property test); no sample ID crosses in any message
or rests in the server's state; bad relays and inconsistent counts are refused; the clients' state
survives a rebuild between every two messages (as over Flower)."""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.algorithms.hyfdca.align import (
    AlignClientMixin,
    AlignServerMixin,
    check_psi_hello,
    plaintext_segments,
    segment_order,
)
from hybridfl.algorithms.hyfdca.spec import privacy_warning
from hybridfl.data import DatasetSplit, HybridDataset
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.rebuild import reference_and_rebuilt

POS = [1]


def _split(n: int = 90, seed: int = 0) -> DatasetSplit:
    """Random features over 3 blocks, long unique sample IDs (nothing in a blob matches them by chance)."""
    rng = np.random.default_rng(seed)

    def make(prefix: str, m: int) -> HybridDataset:
        ids = [f"{prefix}-{i:05d}-{rng.integers(10**8):08d}@bank.example" for i in range(m)]
        blocks = {f"b{j}": rng.normal(size=(m, 3)).astype(np.float32) for j in range(3)}
        y = rng.integers(0, 2, m)
        y[:2] = [0, 1]
        return HybridDataset("ids", ids, y, blocks, ["n", "p"])

    return DatasetSplit(make("customer", n), make("test", 30))


def _overlapping(split: DatasetSplit, seed: int = 1) -> Partition:
    """Four clients with random overlapping holdings (several segments per client), every
    sample held by at least one client, the blocks spread so every sample has every block."""
    rng = np.random.default_rng(seed)
    ids = np.array(split.train.ids, dtype=str)
    held = [rng.random(ids.size) < 0.5 for _ in range(4)]
    held[0] |= ~np.any(held, axis=0)
    blocks = [("b0", "b1"), ("b2",), ("b0", "b1", "b2"), ("b1", "b2")]
    # ruff: the names are deliberately not in sorted client order (the segment order follows the
    # server's client order, the PSI roles follow the names)
    names = ["client-b", "client-a", "client-d", "client-c"]
    return Partition([ClientShard(names[k], ids[held[k]], blocks[k]) for k in range(4)])


def _run(split, part, secrets=None, **kw):
    base = {"lam": 0.1, "rounds": 2, "positive_classes": POS, "reference": False, "eval_every": 0, "batch_size": 16}
    cfg = HyFDCAConfig(**{**base, **kw})
    raw: list[bytes] = []
    fed = build_federation("hyfdca", split, part, cfg, seed=0, recorder=raw.append, secrets=secrets)
    fed.setup()
    fed.loop(monitor=False).run()
    return fed, raw


def _same(a, b, atol: float = 1e-12) -> None:
    sa, sb = a.server, b.server
    assert sa.seg_holders == sb.seg_holders and sa.seg_n == sb.seg_n and sa.N == sb.N
    assert sa.client_segs == sb.client_segs
    for cid in a.clients:
        ca, cb = a.clients[cid], b.clients[cid]
        assert len(ca.seg_rows) == len(cb.seg_rows)
        for ra, rb in zip(ca.seg_rows, cb.seg_rows):
            np.testing.assert_array_equal(ra, rb)  # same rows, same order within each segment
        np.testing.assert_allclose(ca.alpha, cb.alpha, atol=atol, rtol=0)
    np.testing.assert_allclose(sa.w, sb.w, atol=atol, rtol=0)


@pytest.mark.parametrize(
    "kw",
    [
        {"dual_mode": "block"},
        {"dual_mode": "consensus", "local_steps": 5},
        {"dual_mode": "segment"},
        {"dual_mode": "segment", "segment_schedule": "parallel", "secure_aggregation": False},
        {"dual_mode": "block", "secure_aggregation": False},
        {"dual_mode": "segment", "encryption": "paillier", "paillier_bits": 512, "rounds": 1},
    ],
)
def test_psi_alignment_gives_the_plaintext_results(kw):
    split = _split(90 if "encryption" not in kw else 40)
    part = _overlapping(split)
    psi_fed, _ = _run(split, part, alignment="psi", **kw)
    plain_fed, _ = _run(split, part, alignment="plaintext", **kw, secrets=psi_fed.secrets)
    assert len(psi_fed.server.seg_n) > len(part.clients)  # several segments per client
    _same(psi_fed, plain_fed)  # Paillier decrypts exactly: the same to 1e-12 too
    truth = plaintext_segments({c.client_id: c.sample_ids for c in part.clients}, [c.client_id for c in part.clients])
    assert [list(k) for k, _ in truth] == psi_fed.server.seg_holders
    assert [len(v) for _, v in truth] == psi_fed.server.seg_n


def test_psi_alignment_gives_the_plaintext_results_under_ckks():
    """CKKS adds fresh noise to every encryption, so two runs differ at its noise level whatever the
    alignment: the segments and row orders are identical, w and alpha agree to that noise (the
    plaintext alignment run twice differs by as much)."""
    split = _split(48)
    part = _overlapping(split, seed=2)
    kw = {"encryption": "ckks", "dual_mode": "segment", "rounds": 1}
    psi_fed = _run(split, part, alignment="psi", **kw)[0]
    plain = [_run(split, part, alignment="plaintext", secrets=psi_fed.secrets, **kw)[0] for _ in range(2)]
    noise = float(np.abs(plain[0].server.w - plain[1].server.w).max())
    assert 0 < noise < 1e-6
    _same(psi_fed, plain[0], atol=1e-6)


# ---------------------------------------------------------------------- the protocol alone
class _Client(AlignClientMixin):
    def __init__(self, cid, ids):
        self.client_id = cid
        self.ids = np.asarray(ids, dtype=str)
        self._align_init()

    def handle(self, msg: Message) -> Message:
        msg = decode(encode(msg))
        step = {
            "hyfdca.hello": self.align_hello,
            "hyfdca.psi_serve": self.align_serve,
            "hyfdca.psi_result": self.align_result,
            "hyfdca.psi_tags": self.align_tags,
        }[msg.kind]
        out = step(msg)
        if msg.kind == "hyfdca.hello":
            out.update(blocks=["b0"], n_samples=int(self.ids.size))
        return decode(encode(msg.reply(client_seconds=0.0, he_seconds=0.0, **out)))


class _Server(AlignServerMixin):
    def __init__(self, clients):
        self.clients = clients
        self.client_ids = list(clients)
        self.sent: list[Message] = []

    def _setup_exchange(self, transport, msgs, stats, check=None):
        out = []
        for m in msgs:
            self.sent.append(m)
            r = self.clients[m.receiver].handle(m)
            self.sent.append(r)
            if check is not None:
                check(r)
            out.append(r)
        return out

    def align(self):
        names = sorted(self.client_ids)
        hello = self._setup_exchange(
            None, [Message("hyfdca.hello", SERVER, c, 0, self.psi_hello_payload()) for c in self.client_ids], {}
        )
        for r in hello:
            i = names.index(r.sender)
            check_psi_hello(r, i > 0, i < len(names) - 1)
        return self.psi_align(None, {}, hello)


holdings = st.integers(2, 4).flatmap(
    lambda k: st.lists(st.lists(st.integers(0, 14), min_size=1, max_size=10, unique=True), min_size=k, max_size=k)
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(holdings)
def test_psi_holder_sets_equal_the_plaintext_ones(rows):
    names = [f"c{9 - k}" for k in range(len(rows))]  # server order differs from the name order
    held = {n: [f"id-{v}" for v in r] for n, r in zip(names, rows)}
    clients = {n: _Client(n, held[n]) for n in names}
    got = _Server(clients).align()
    truth = plaintext_segments(held, names)
    assert got == [(k, len(v)) for k, v in truth]
    owner = defaultdict(set)
    for n in names:
        for s in held[n]:
            owner[s].add(n)
    for n, c in clients.items():  # each client knows every holder of each of its samples
        for i, s in enumerate(c.ids):
            assert {names[j] for j in np.flatnonzero(c.align_held[i])} == owner[str(s)]
        assert c.align_secret == {} and c.align_keys == {}  # the keys are dropped once aligned


def test_segment_order_follows_the_server_client_order():
    assert segment_order([("b", "c"), ("a",), ("a", "c")], ["c", "b", "a"]) == [("b", "c"), ("a", "c"), ("a",)]


# ---------------------------------------------------------------------- audit
def _id_patterns(ids) -> list[tuple[str, bytes]]:
    out = []
    for s in ids:
        for enc in ("utf-8", "utf-16-le", "utf-16-be", "utf-32-le"):
            out.append((f"{s} ({enc})", s.encode(enc)))
        out.append((f"{s} (sha256)", hashlib.sha256(s.encode()).digest()[:16]))
        out.append((f"{s} (sha256 hex)", hashlib.sha256(s.encode()).hexdigest()[:16].encode()))
        out.append((f"{s} (random part)", s.split("-")[2].split("@")[0].encode()))
    return out


def _strings(v, out: set) -> None:
    if isinstance(v, str):
        out.add(v)
    elif isinstance(v, (bytes, bytearray)):
        out.add(bytes(v).decode("latin-1"))
    elif isinstance(v, np.ndarray):
        if v.dtype.kind in "USO":
            out.update(map(str, v.ravel().tolist()))
        else:
            out.add(v.tobytes().decode("latin-1"))
    elif isinstance(v, dict):
        for k, x in v.items():
            _strings(k, out)
            _strings(x, out)
    elif isinstance(v, (list, tuple, set)):
        for x in v:
            _strings(x, out)


@pytest.mark.parametrize("mode", ["block", "segment"])
def test_no_sample_id_crosses_or_rests_at_the_server(mode):
    split = _split()
    part = _overlapping(split)
    fed, raw = _run(split, part, alignment="psi", dual_mode=mode)
    every = list(split.train.ids) + list(split.test.ids)
    pats = _id_patterns(every)
    blob = b"\x00".join(raw)
    assert [name for name, p in pats if p in blob] == []
    kinds = {decode(r).kind for r in raw}
    assert {"hyfdca.psi_serve", "hyfdca.psi_result", "hyfdca.psi_tags"} <= kinds
    # the server's state: its attributes and checkpoint hold no ID in any encoding
    seen: set = set()
    _strings(vars(fed.server), seen)
    _strings(fed.server.get_state(), seen)
    text = "\x00".join(seen).encode("latin-1", "replace")
    assert [name for name, p in pats if p in text] == []
    # the audit can fail: the plaintext alignment sends the IDs
    _, raw_plain = _run(split, part, alignment="plaintext", dual_mode=mode)
    assert any(p in b"\x00".join(raw_plain) for _, p in pats)


def test_plaintext_alignment_is_named_in_the_privacy_warning():
    assert "sample IDs" in privacy_warning(HyFDCAConfig(alignment="plaintext"))
    assert "sample IDs" in privacy_warning(HyFDCAConfig(alignment="plaintext", encryption="ckks"))
    assert "sample IDs" not in (privacy_warning(HyFDCAConfig()) or "")
    assert HyFDCAConfig().alignment == "psi"


# ---------------------------------------------------------------------- bad input
def _aligned_pair():
    a, b = _Client("a", ["x", "y", "z"]), _Client("b", ["y", "z", "w"])
    return a, b, _Server({"a": a, "b": b})


def test_a_client_refuses_a_relay_from_a_peer_it_does_not_know():
    a, b, server = _aligned_pair()
    hello = [
        c.handle(Message("hyfdca.hello", SERVER, n, 0, server.psi_hello_payload())) for n, c in (("a", a), ("b", b))
    ]
    req = hello[0].payload["psi_request"]
    for key in ("request.mallory", "request.b"):  # unknown, and not a lower peer of b
        bad = Message("hyfdca.psi_serve", SERVER, "b", 0, {key: req, key.replace("request", "dh"): b"\x09" * 32})
        with pytest.raises(PayloadError, match="not expected"):
            b.handle(bad)
    with pytest.raises(PayloadError, match="clients"):
        a.handle(Message("hyfdca.hello", SERVER, "a", 0, {"alignment": "psi", "clients": ["b"]}))
    with pytest.raises(ProtocolError, match="out of the alignment's order"):
        a.handle(Message("hyfdca.psi_tags", SERVER, "a", 0, {}))


def test_the_server_refuses_inconsistent_counts_and_malformed_blobs(monkeypatch):
    a, b, server = _aligned_pair()
    real = b.align_tags

    def lying(msg):  # b claims one sample fewer shared with a
        out = real(msg)
        out["counts"] = out["counts"].copy()
        j = int(np.flatnonzero(out["sets"].sum(axis=1) == 2)[0])
        out["counts"][j] -= 1
        k = int(np.flatnonzero(out["sets"].sum(axis=1) == 1)[0])
        out["counts"][k] += 1
        return out

    monkeypatch.setattr(b, "align_tags", lying)
    with pytest.raises(ProtocolError, match="held by \\['a', 'b'\\], client 'b' 1 samples"):
        server.align()
    # a hello with IDs, or a request of another size, is refused naming the field
    msg = Message("hyfdca.hello", "a", SERVER, 0, {"ids": ["x"], "blocks": [], "n_samples": 1})
    with pytest.raises(PayloadError, match="'ids' not expected"):
        check_psi_hello(msg, False, True)
    a2 = _Client("a", ["x", "y"])
    p = a2.handle(Message("hyfdca.hello", SERVER, "a", 0, {"alignment": "psi", "clients": ["a", "b"]})).payload
    msg = Message("hyfdca.hello", "a", SERVER, 0, {**p, "n_samples": 3})
    with pytest.raises(PayloadError, match="psi_request"):
        check_psi_hello(msg, False, True)
    # tags that name a sample the receiver does not hold are refused by the receiver
    a3, b3, s3 = _aligned_pair()
    hello = [c.handle(Message("hyfdca.hello", SERVER, n, 0, s3.psi_hello_payload())) for n, c in (("a", a3), ("b", b3))]
    hp = {r.sender: r.payload for r in hello}
    served = b3.handle(
        Message(
            "hyfdca.psi_serve",
            SERVER,
            "b",
            0,
            {"request.a": hp["a"]["psi_request"], "dh.a": hp["a"]["psi_dh"], "n.a": hp["a"]["n_samples"]},
        )
    )
    assert served.payload["response.a"]
    with pytest.raises(PayloadError, match="tags.a"):
        b3.handle(Message("hyfdca.psi_tags", SERVER, "b", 0, {"tags.a": b"\x01" * 16}))


# ---------------------------------------------------------------------- state between messages
def test_client_state_survives_a_rebuild_between_every_message():
    """Over Flower a client is rebuilt from its state file for every message: the same run with a
    rebuild before each message gives the same alignment and model."""
    split = _split(60)
    part = _overlapping(split, seed=3)
    kw = {"dual_mode": "segment", "alignment": "psi"}
    ref, _ = _run(split, part, **kw)
    base = {"lam": 0.1, "rounds": 2, "positive_classes": POS, "reference": False, "eval_every": 0, "batch_size": 16}
    _, fed = reference_and_rebuilt(split, part, HyFDCAConfig(**{**base, **kw}), ref)
    assert fed.server.seg_holders == ref.server.seg_holders and fed.server.seg_n == ref.server.seg_n
    np.testing.assert_allclose(fed.server.w, ref.server.w, atol=1e-12, rtol=0)
