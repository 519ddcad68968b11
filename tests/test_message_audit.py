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
    cfg = HyFDCAConfig(
        rounds=2, lam=0.1, encryption=scheme, paillier_bits=512, reference=False, eval_every=0, dual_mode="block"
    )
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


# -- scale-invariant audit (issue 15 item 4): a leak need not be the raw bytes; a multiple of a raw
# row, or a vector whose signs are the labels, leaks as much. The adversary is the receiver of
# the messages audited (the server / coordinator): it reads every array and every plaintext float
# blob (the "none" scheme's ``enc(v)`` is the float64 bytes of ``v``).

COLLINEAR = 0.999
"""|centred cosine| above which a message vector counts as a multiple of a raw row or column."""


def message_vectors(m) -> list[tuple[str, np.ndarray]]:
    """Every vector the receiver of ``m`` can read: 1-D arrays, rows and columns of 2-D arrays,
    ``uint64`` read as signed (masked words), and byte blobs that are plausible float64 vectors."""
    out: list[tuple[str, np.ndarray]] = []

    def add(name, a):
        a = np.asarray(a.view(np.int64) if a.dtype == np.uint64 else a, dtype=np.float64)
        if a.ndim == 1 and a.size >= 4:
            out.append((name, a))
        elif a.ndim == 2:
            out.extend((f"{name}[{i}]", r) for i, r in enumerate(a) if r.size >= 4)
            out.extend((f"{name}[:, {j}]", c) for j, c in enumerate(a.T) if c.size >= 4)

    for k, v in m.payload.items():
        items = v if isinstance(v, list) else [v]
        for i, x in enumerate(items):
            if isinstance(x, np.ndarray) and x.dtype.kind in "fiu":
                add(k, x)
            elif isinstance(x, (bytes, bytearray)) and len(x) >= 36:
                for head in (0, 4):  # the "none" scheme's blob: a 4-byte length, then float64 values
                    if (len(x) - head) % 8 == 0:
                        f = np.frombuffer(bytes(x)[head:], dtype="<f8")
                        if np.isfinite(f).all() and np.abs(f).max() < 1e6:
                            add(f"{k}[{i}] (float64 bytes)", f)
    return out


def _centred_cos(v: np.ndarray, M: np.ndarray) -> np.ndarray:
    """|centred cosine| of ``v`` with every row of ``M`` (0 where either is constant)."""
    vc = v - v.mean()
    Mc = M - M.mean(axis=1, keepdims=True)
    den = np.linalg.norm(Mc, axis=1) * np.linalg.norm(vc)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.abs(Mc @ vc) / den
    return np.where(den > 1e-12, c, 0.0)


def scaled_leaks(raw_messages, split, partition, receiver: str = "server") -> list[str]:
    """What the ``receiver`` reads that is a raw row or column of the sender's data up to scale
    (``|centred cosine| > COLLINEAR``), or whose signs are the sender's labels (>= 95 % of at least
    24 non-zero entries, in the partition's or the sorted-ID order)."""
    refs = {}
    for c in partition.clients:
        pos = split.train.positions(c.sample_ids)
        X = np.concatenate([split.train.blocks[b][pos].reshape(len(pos), -1) for b in c.blocks], axis=1)
        y = 2.0 * split.train.y[pos] - 1.0 if c.has_labels else None
        order = np.argsort(np.asarray(c.sample_ids).astype(str), kind="stable")
        refs[c.client_id] = (X.astype(np.float64), y, order)
    found = []
    for raw in raw_messages:
        m = decode(raw)
        if m.receiver != receiver or m.sender not in refs:
            continue
        X, y, order = refs[m.sender]
        for name, v in message_vectors(m):
            where = f"{name} of {m.kind} {m.sender}->{m.receiver} round {m.round}"
            if v.std() == 0:
                continue
            if v.size == X.shape[1] + 1:  # a label holder's share with fit_intercept: its blocks, then intercept
                v = v[:-1]
            if v.size == X.shape[1] and _centred_cos(v, X).max() > COLLINEAR:
                found.append(f"a raw row of {m.sender} up to scale in {where}")
            if v.size == X.shape[0]:
                for ordered in (X, X[order]):
                    if _centred_cos(v, ordered.T).max() > COLLINEAR:
                        found.append(f"a raw column of {m.sender} up to scale in {where}")
                for lab in () if y is None else (y, y[order]):
                    nz = v != 0
                    if nz.sum() >= 24 and np.mean(np.sign(v[nz]) == lab[nz]) >= 0.95:
                        found.append(f"the labels of {m.sender} as signs in {where}")
    return found


def audit_split(seed: int = 0) -> DatasetSplit:
    """120 training / 40 test samples, 3 blocks of 16 random features, 2 random classes: enough
    coordinates that a chance |centred cosine| above 0.999 does not happen."""
    rng = np.random.default_rng(seed)

    def make(n, prefix):
        blocks = {f"b{j}": rng.normal(size=(n, 16)).astype(np.float32) for j in range(BLOCKS)}
        return HybridDataset(
            "audit", [f"{prefix}-{i}" for i in range(n)], rng.integers(0, 2, size=n), blocks, ["neg", "pos"]
        )

    return DatasetSplit(make(120, "tr"), make(40, "te"))


def _hyfdca_raw(scheme: str, secure: bool, local_fraction: float = 1e-3, **kw) -> tuple[list[bytes], object, object]:
    # local_fraction 1e-3: one local step per client and round (H = ceil(1e-3 x 60 samples) = 1)
    from hybridfl.algorithms.hyfdca import HyFDCAConfig
    from hybridfl.runtime.simulation import build_federation

    split = audit_split()
    part = GridPartitioner(2, 3, seed=0).partition(split.train)
    cfg = HyFDCAConfig(
        rounds=2,
        lam=0.1,
        encryption=scheme,
        paillier_bits=512,
        reference=False,
        eval_every=0,
        local_fraction=local_fraction,
        secure_aggregation=secure,
        dual_mode="block",  # the paper's protocol (the default before the measured best)
        output="last",
        **{"fit_intercept": False, **kw},  # the paper's problem unless a test asks for the intercept
    )
    raw: list[bytes] = []
    fed = build_federation("hyfdca", split, part, cfg, seed=0, recorder=raw.append)
    for c in fed.clients.values():
        c.require_secagg = secure  # the pre-fix client, which sent its share in the clear whatever its key
    fed.run(monitor=False)
    return raw, split, part


def test_scaled_audit_catches_plaintext_hyfdca():
    """The paper's protocol without encryption and without secure aggregation: with one local step
    (``local_fraction`` 1e-3) the server reads a scaled raw row in each primal share; with full local passes, the labels
    as the signs of the dual changes. The byte-exact audit above sees neither (it passes here)."""
    _, canaries = canary_split()
    raw, split, part = _hyfdca_raw("none", secure=False)
    found = scaled_leaks(raw, split, part)
    assert any("raw row" in f and "hyfdca.primal" in f for f in found), found
    assert audit(raw, patterns(canaries, split, part)) == []  # blind to it
    raw, split, part = _hyfdca_raw("none", secure=False, local_fraction=1.0)
    found = scaled_leaks(raw, split, part)
    assert any("labels" in f and "hyfdca.dual" in f for f in found), found
    assert audit(raw, patterns(canaries, split, part)) == []


def test_scaled_audit_catches_ckks_shares_without_secure_aggregation():
    """CKKS hides the duals, but the primal share is plaintext (HyFDCA Alg. 4): with one local step
    the round-1 share is a multiple of a raw row (issue 15: 0.1163 x row tr-44)."""
    raw, split, part = _hyfdca_raw("ckks", secure=False)
    found = scaled_leaks(raw, split, part)
    assert found and all("hyfdca.primal" in f for f in found), found


def test_scaled_audit_with_the_intercept_block():
    """fit_intercept adds one entry (the intercept's) to a label holder's primal share: without
    secure aggregation the rest is still a raw row up to scale; with it (CKKS) nothing leaks."""
    raw, split, part = _hyfdca_raw("ckks", secure=False, fit_intercept=True)
    found = scaled_leaks(raw, split, part)
    assert any("raw row" in f and "hyfdca.primal" in f for f in found), found
    raw, split, part = _hyfdca_raw("ckks", secure=True, fit_intercept=True)
    assert scaled_leaks(raw, split, part) == []


@pytest.mark.parametrize("scheme", ["paillier", "ckks"])
def test_encrypted_hyfdca_with_secure_aggregation_passes_the_scaled_audit(scheme):
    """The default (secure aggregation) with encryption: nothing the server reads is a raw row or
    column up to scale, or has the labels' signs (the server's ``w`` is the model, public)."""
    raw, split, part = _hyfdca_raw(scheme, secure=True)
    assert scaled_leaks(raw, split, part) == []
    assert scaled_leaks(raw, split, part, receiver="server") == []


def test_hyfem_known_leakage_class_histogram():
    """Known leakage (docs/privacy.md): HyFEM's properties reply carries each client's exact class
    histogram (the server weights the output layer per class). This test pins the claim."""
    from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem

    split, _ = canary_split()
    part = ClassBlockPartitioner(
        num_clients=3, classes_per_client=2, blocks_per_client=2, no_full_client=False, seed=0
    ).partition(split.train)
    raw: list[bytes] = []
    run_hyfem(
        split,
        part,
        HyFEMConfig(rounds=1, local_steps=2, hidden=8, extractor_dim=4, baselines=False),
        seed=0,
        recorder=raw.append,
    )
    seen = {}
    for m in map(decode, raw):
        if m.kind == "hyfem.properties" and m.receiver == "server":
            seen[m.sender] = m.payload["class_counts"]
    for c in part.clients:
        y = split.train.y[split.train.positions(c.sample_ids)]
        assert np.array_equal(seen[c.client_id], np.bincount(y, minlength=2))


def test_fedbcd_known_leakage_labels_in_gradient_signs():
    """Known leakage (docs/privacy.md, FedBCD): with a linear top on binary labels, each column of
    ``dL/dH_k`` that the label party sends through the coordinator has the batch labels as its
    signs (up to one global sign per column: ``(sigmoid(z) - y) w_k``). This test pins the claim."""
    from hybridfl.algorithms.fedbcd import FedBCDConfig
    from hybridfl.runtime.simulation import build_federation

    split = audit_split()
    part = VerticalPartitioner(3, label_party=0).partition(split.train)
    raw: list[bytes] = []
    cfg = FedBCDConfig(variant="p", rounds=3, local_steps=2, batch_size=32)
    fed = build_federation("fedbcd", split, part, cfg, seed=0, recorder=raw.append)
    fed.run(monitor=False)
    label_id = part.clients[0].client_id
    party = fed.clients[label_id]
    y = 2.0 * party.y.numpy() - 1.0
    batch, checked, leaked = None, 0, 0
    for m in map(decode, raw):
        if m.receiver == label_id and "batch" in m.payload:
            batch = np.asarray(m.payload["batch"])
        if m.sender == label_id and m.receiver == "server" and batch is not None:
            for k, g in m.payload.items():
                if not k.startswith("grad.") or g.shape[0] != batch.size:
                    continue
                lab = y[party.rows[batch]]
                for col in np.asarray(g, dtype=np.float64).T:
                    nz = col != 0
                    if nz.sum() < 24:
                        continue
                    checked += 1
                    agree = np.mean(np.sign(col[nz]) == lab[nz])
                    leaked += agree >= 0.95 or agree <= 0.05
    assert checked > 0 and leaked == checked, (leaked, checked)
