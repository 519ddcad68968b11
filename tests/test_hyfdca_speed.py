"""HyFDCA speed work (issue 17): the faster paths compute exactly what the plain ones do, and the
secret-key CKKS option gives the plaintext ``w`` to 1e-6 (``python -m benchmarks.hyfdca_speed`` measures
the times)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.privacy.he import CKKSBackend, KeyDealer, SecretKeyMissing, _unpack, server_backend
from hybridfl.runtime.simulation import build_federation
from tests.conftest import HYFDCA_BEFORE

pytestmark = pytest.mark.usefixtures("isolated_cache")


def _cfg(**kw) -> HyFDCAConfig:
    # alignment="plaintext": the same holder sets and sample order as PSI's (test_hyfdca_psi), without
    # PSI's setup time; these tests are about the segment passes and their encryption, not the alignment
    base = dict(
        HYFDCA_BEFORE,
        lam=1e-2,
        rounds=4,
        eval_every=0,
        dual_mode="segment",
        batch_size=200,
        reference=False,
        alignment="plaintext",
    )
    base.update(kw)
    return HyFDCAConfig(**base)


def test_segment_matrix_cache_follows_the_segment_layout(credit_small):
    """The cached segment rows are ``X[seg_rows[s]]`` after setup and again after a state with
    another layout is restored (never a stale slice)."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=1))
    fed.setup()
    fed.loop().run()
    c = next(iter(fed.clients.values()))

    def dense(M):
        return M.toarray() if sp.issparse(M) else np.asarray(M)

    for s, rows in enumerate(c.seg_rows):
        assert np.array_equal(dense(c._seg_matrix(s)), dense(c.X[rows]))
    st = c.get_state()
    st["seg_rows.0"] = st["seg_rows.0"][::-1].copy()
    c.set_state(st)
    assert np.array_equal(dense(c._seg_matrix(0)), dense(c.X[st["seg_rows.0"]]))


def test_secret_key_ckks_ciphertexts_add_and_decrypt_with_public_key_ones():
    d = KeyDealer("ckks")
    pub_enc = d.client_backend()
    sec_enc = pub_enc.with_secret_key_encryption()
    server = server_backend("ckks", d.public_material())
    v = np.random.default_rng(0).normal(size=300)
    total = server.add([sec_enc.encrypt(v), pub_enc.encrypt(v), server.encrypt(v)])
    assert np.abs(pub_enc.decrypt(total) - 3 * v).max() < 1e-6
    assert np.abs(sec_enc.decrypt(total) - 3 * v).max() < 1e-6
    other = KeyDealer("ckks").client_backend()  # another key pair reads nothing
    assert np.abs(other.decrypt(sec_enc.encrypt(v)) - v).max() > 1.0
    with pytest.raises(SecretKeyMissing):
        server.with_secret_key_encryption()


def test_secret_key_ckks_segment_run_matches_plaintext(credit_small):
    """CKKS clients encrypt with the secret key (always), the server adds as
    before, and ``w`` is the plaintext run's to 1e-6 (relative)."""
    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    plain = run_hyfdca(credit_small, part, _cfg())
    cfg = _cfg(encryption="ckks")
    fed = build_federation("hyfdca", credit_small, part, cfg)
    for c in fed.clients.values():
        assert isinstance(c.he, CKKSBackend)
        with pytest.raises(ValueError, match="symmetric"):  # TenSEAL: a secret-key context has no public key
            c.he.ctx.has_public_key()
    enc = run_hyfdca(credit_small, part, cfg)
    w0, w1 = np.array(plain.summary["w"]), np.array(enc.summary["w"])
    assert np.linalg.norm(w1 - w0) <= 1e-6 * np.linalg.norm(w0)
    assert enc.summary["bytes_total"] > 3 * plain.summary["bytes_total"]  # ciphertexts crossed and were counted


def test_packed_segment_gram_is_one_ciphertext_vector_per_segment_and_ckks_matches_plaintext(credit_small):
    """Segment mode packs each segment's batch Gram triangles into one vector per holder (issue 17):
    the ``hyfdca.init`` reply holds one ciphertext vector per segment, of length ``sum_B b_B (b_B + 1)
    / 2``, in fewer CKKS ciphertexts than one vector per batch would take; the Gram matrices the
    holders decrypt and the CKKS run's ``w`` equal the plaintext run's to 1e-6 (relative), and the
    holders' duals at the hinge box's bounds are exactly there, as in plaintext."""
    from hybridfl.runtime.messages import decode

    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    cfg = _cfg(rounds=2, batch_size=100)  # 400 samples per segment: 4 batches of 100, 5,050 values each
    runs = {}
    for scheme in ("none", "ckks"):
        raw: list[bytes] = []
        fed = build_federation(
            "hyfdca", credit_small, part, cfg.model_copy(update={"encryption": scheme}), recorder=raw.append
        )
        fed.setup()
        fed.loop(monitor=False).run()
        runs[scheme] = (fed, [decode(b) for b in raw])
    fed, msgs = runs["ckks"]
    slots = next(iter(fed.clients.values())).he.slots
    inits = [m for m in msgs if m.receiver == "server" and "gram" in m.payload]
    assert len(inits) == len(fed.clients)
    for m in inits:
        c = fed.clients[m.sender]
        assert len(m.payload["gram"]) == len(c.seg_batches)
        for ct, batches in zip(m.payload["gram"], c.seg_batches):
            tri = [r.size * (r.size + 1) // 2 for r in batches]
            assert len(batches) == 4 and c.he.length(ct) == sum(tri)
            n_ct = len(_unpack(ct[4:]))  # the packed vector's ciphertexts
            assert n_ct == -(-sum(tri) // slots) < sum(-(-t // slots) for t in tri)  # 5 instead of 8
    plain = runs["none"][0]
    for cid, c in fed.clients.items():
        for gs_enc, gs_plain in zip(c.gram, plain.clients[cid].gram):
            for G1, G0 in zip(gs_enc, gs_plain):
                assert np.abs(G1 - G0).max() <= 1e-6 * np.abs(G0).max()
    w0, w1 = plain.server.w, fed.server.w
    assert np.linalg.norm(w1 - w0) <= 1e-6 * np.linalg.norm(w0)
    assert np.abs(w0).max() > 0
    # the holders' decrypted hinge duals near the box's bounds sit exactly on them (accept_alpha), not a
    # CKKS noise away (which would make every later step on them a non-zero change)
    for cid, c in fed.clients.items():
        b1, b0 = c.y * c.alpha, plain.clients[cid].y * plain.clients[cid].alpha
        assert np.any(b1 == 0.0) and np.any(b1 == 1.0)
        assert not np.any(((b1 > 0) & (b1 < 1e-7)) | ((b1 < 1) & (b1 > 1 - 1e-7)))
        assert np.abs(b1 - b0).max() <= 1e-6


def test_packed_gram_of_another_count_length_or_value_is_refused_by_name(credit_small):
    """The packed ``gram`` (one vector per segment) is checked on both sides: the server refuses an
    ``hyfdca.init`` reply with one vector too few or of another length than its segment's
    ``sum_B b_B (b_B + 1) / 2``, and a holder refuses a ``hyfdca.norms`` message whose ``gram`` has
    another count, another length or a NaN, naming the field and keeping the Gram it had."""
    from hybridfl.runtime.messages import Message
    from hybridfl.runtime.validate import PayloadError

    part = GridPartitioner(3, 3, 1, 0).partition(credit_small.train)
    fed = build_federation("hyfdca", credit_small, part, _cfg(rounds=1, batch_size=100))
    fed.setup()
    srv = fed.server
    cid, c = next(iter(fed.clients.items()))
    lengths = [srv.gram_length(g) for g in srv.client_segs[cid]]
    assert lengths == [sum(r.size * (r.size + 1) // 2 for r in bs) for bs in c.seg_batches]
    good = [c.he.encrypt(np.ones(n)) for n in lengths]
    srv.check_ciphertexts(Message("hyfdca.init", cid, "server", 0, {"gram": good}), "gram", lengths)
    for bad in (good[:-1], [c.he.encrypt(np.ones(lengths[0] - 1)), *good[1:]]):
        with pytest.raises(PayloadError, match="gram"):
            srv.check_ciphertexts(Message("hyfdca.init", cid, "server", 0, {"gram": bad}), "gram", lengths)
    before = [[G.copy() for G in gs] for gs in c.gram]
    nan = np.ones(lengths[0])
    nan[3] = np.nan
    for bad in (good[:-1], good + good[:1], [c.he.encrypt(np.ones(lengths[0] + 1)), *good[1:]], [nan, *good[1:]]):
        bad = [x if isinstance(x, bytes) else c.he.encrypt(x) for x in bad]
        with pytest.raises(PayloadError, match="gram"):
            c._store_gram(Message("hyfdca.norms", "server", cid, 0, {"gram": bad}))
        assert all(np.array_equal(G, G0) for gs, gs0 in zip(c.gram, before) for G, G0 in zip(gs, gs0))
