"""Message audit: run every algorithm with a recording transport, plant unique canary values in
the clients' data, and search every serialised message for them (SPEC.md "Communication and
privacy accounting"): no raw feature value and no label vector may cross. Also: the server never
receives an HE secret key."""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.data import ClassBlockPartitioner, DatasetSplit, GridPartitioner, HybridDataset, VerticalPartitioner
from hybridfl.runtime.messages import decode

N_TRAIN, N_TEST, BLOCKS = 80, 40, 3


def canary_split(seed: int = 0) -> tuple[DatasetSplit, list[np.ndarray]]:
    """Random features with, in every block of the first 20 training rows, a unique pair of
    canary values (8 bytes as float32); labels random over 2 classes."""
    rng = np.random.default_rng(seed)

    def make(n, prefix):
        blocks = {f"b{j}": rng.normal(size=(n, 4)).astype(np.float32) for j in range(BLOCKS)}
        y = rng.integers(0, 2, size=n)
        y[:2] = [0, 1]
        return blocks, y

    tb, ty = make(N_TRAIN, "tr")
    canaries = []
    for j in range(BLOCKS):
        for i in range(20):
            pair = np.array([2.5 + (100 * j + i) / 4096, -1.75 - (100 * j + i) / 4096], dtype=np.float32)
            tb[f"b{j}"][i, :2] = pair
            canaries.append(pair)
    eb, ey = make(N_TEST, "te")
    train = HybridDataset("canary", [f"tr-{i}" for i in range(N_TRAIN)], ty, tb, ["neg", "pos"])
    test = HybridDataset("canary", [f"te-{i}" for i in range(N_TEST)], ey, eb, ["neg", "pos"])
    return DatasetSplit(train, test), canaries


def patterns(canaries, split, partition) -> list[tuple[str, bytes]]:
    out = []
    for k, pair in enumerate(canaries):
        out.append((f"feature canary {k} (float32)", pair.astype(np.float32).tobytes()))
        out.append((f"feature canary {k} (float64)", pair.astype(np.float64).tobytes()))
        out.append((f"feature canary {k} (big-endian float32)", pair.astype(">f4").tobytes()))
    for c in partition.clients:
        if not c.has_labels:
            continue
        y = split.train.y[split.train.positions(c.sample_ids)][:24]
        if y.size < 16 or min(np.sum(y == 0), np.sum(y == 1)) < 4:
            continue  # a near-constant label run would match any run of zeros: no evidence either way
        for enc in (y, 2 * y - 1):  # class indices and +-1 labels
            for dt in ("<i8", "<i4", "<i2", "i1", "<f4", "<f8", "u1"):
                out.append((f"labels of {c.client_id} as {dt}", enc.astype(dt).tobytes()))
    return out


def audit(raw_messages: list[bytes], pats: list[tuple[str, bytes]]) -> list[str]:
    found = []
    for raw in raw_messages:
        for name, pat in pats:
            if pat in raw:
                m = decode(raw)
                found.append(f"{name} in {m.kind} {m.sender}->{m.receiver} round {m.round}")
    return found


def test_audit_finds_a_planted_leak():
    """The audit itself can fail: a message that carries a raw row is caught."""
    from hybridfl.runtime.messages import Message, encode

    split, canaries = canary_split()
    part = VerticalPartitioner(3).partition(split.train)
    leak = encode(Message("leak", "client-0", "server", 1, {"x": split.train.blocks["b1"][:5]}))
    assert audit([leak], patterns(canaries, split, part))


def test_hyfem_messages_carry_no_raw_data():
    from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem

    split, canaries = canary_split()
    part = ClassBlockPartitioner(
        num_clients=3, classes_per_client=2, blocks_per_client=2, no_full_client=False, seed=0
    ).partition(split.train)
    raw: list[bytes] = []
    res = run_hyfem(
        split,
        part,
        HyFEMConfig(rounds=2, local_steps=3, hidden=8, extractor_dim=4, baselines=False),
        seed=0,
        recorder=raw.append,
    )
    assert len(raw) == res.summary["messages_total"] > 0
    pats = patterns(canaries, split, part)
    assert any(name.startswith("labels") for name, _ in pats)
    assert audit(raw, pats) == []


@pytest.mark.parametrize("scheme", ["paillier", "ckks"])
def test_hyfdca_messages_carry_no_raw_data_and_no_secret_key(scheme):
    from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
    from hybridfl.privacy.he import KeyDealer

    split, canaries = canary_split()
    part = GridPartitioner(2, 3, seed=0).partition(split.train)
    cfg = HyFDCAConfig(rounds=2, lam=0.1, encryption=scheme, paillier_bits=512, reference=False, eval_every=0)
    dealer = KeyDealer(scheme, paillier_bits=512)
    raw: list[bytes] = []
    run_hyfdca(split, part, cfg, seed=0, recorder=raw.append, dealer=dealer)
    assert raw
    pats = patterns(canaries, split, part)
    if scheme == "paillier":
        _pk, sk = dealer._secret
        for name, prime in (("p", sk.p), ("q", sk.q)):
            b = int(prime).to_bytes((int(prime).bit_length() + 7) // 8, "big")
            pats.append((f"Paillier secret prime {name}", b))
            pats.append((f"Paillier secret prime {name} (little-endian)", b[::-1]))
    assert audit(raw, pats) == []
    if scheme == "ckks":
        import tenseal as ts

        for r in raw:
            m = decode(r)
            if m.receiver != "server":
                continue
            blobs = [v for v in m.payload.values() if isinstance(v, bytes)] + [
                x for v in m.payload.values() if isinstance(v, list) for x in v if isinstance(x, bytes)
            ]
            for blob in blobs:
                try:
                    ctx = ts.context_from(blob)
                except Exception:
                    continue  # not a context (a ciphertext)
                assert ctx.is_public(), f"{m.kind} from {m.sender} carries a context with a secret key"


def test_fedbcd_messages_carry_no_raw_data():
    from hybridfl.algorithms.fedbcd import FedBCDConfig, run_fedbcd

    split, canaries = canary_split()
    part = VerticalPartitioner(3, label_party=0).partition(split.train)
    raw: list[bytes] = []
    run_fedbcd(
        split, part, FedBCDConfig(variant="p", rounds=3, local_steps=2, batch_size=16), seed=0, recorder=raw.append
    )
    assert raw
    assert audit(raw, patterns(canaries, split, part)) == []
