"""HyFDCA's encryption policy is the client's own (issue 15, item 2): a client holding a key pair
refuses a run config (the server's) asking for no or another encryption scheme, and refuses a key
below the minimum size unless the test-only ``HYBRIDFL_ALLOW_WEAK_KEYS=1`` is set; the normal
encrypted path still works."""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.algorithms.hyfdca.spec import SECRET, build_client, hello_payload
from hybridfl.data.export import export_clients
from hybridfl.errors import EncryptionPolicyError
from hybridfl.privacy.ckks_params import security_problem
from hybridfl.privacy.he import (
    MIN_CKKS_DEGREE,
    WEAK_KEYS_ENV,
    CKKSBackend,
    KeyDealer,
    PlainBackend,
)
from hybridfl.privacy.keys import SECRET_FILE, write_secret
from hybridfl.privacy.keysize import check_key_size, key_size
from hybridfl.runtime.flower.bridge import SETUP
from hybridfl.runtime.flower.node import client_step
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from hybridfl.runtime.simulation import build_federation, client_data
from tests.conftest import HYFDCA_BEFORE

POS = [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def weak_dealer():
    return KeyDealer("paillier", paillier_bits=512)


def _cfg(**kw) -> HyFDCAConfig:
    return HyFDCAConfig(
        **{**HYFDCA_BEFORE, "lam": 0.1, "rounds": 2, "positive_classes": POS, "reference": False, "eval_every": 0, **kw}
    )


def _hello(cfg: HyFDCAConfig) -> bytes:
    return encode(
        Message(
            SETUP,
            SERVER,
            "node-1",
            0,
            {"algorithm": "hyfdca", "config": cfg.model_dump_json(), "seed": 0, "session": "s", "nonce": b"n" * 32},
        )
    )


def test_client_with_a_key_refuses_a_server_hello_without_encryption(tmp_path, tiny, weak_dealer):
    """The downgrade: the server's hello asks for ``encryption: none``; the node's client directory
    holds ``he_secret.key``. Before the fix the client answered with an empty ``he_public`` and ran
    in plaintext."""
    split, part = tiny
    d = export_clients(split, part, tmp_path / "export")[0]
    write_secret(weak_dealer, d / SECRET_FILE)
    cid = part.clients[0].client_id
    with pytest.raises(EncryptionPolicyError) as e:
        client_step(_hello(_cfg(encryption="none")), str(d), {})
    msg = str(e.value)
    assert msg == (
        f"client {cid!r} holds a paillier key pair and refuses a run whose config asks for no encryption "
        "(the server cannot change a client's encryption)."
    )
    # another scheme is refused as well, before any CKKS material is made
    with pytest.raises(EncryptionPolicyError, match=f"client {cid!r} holds a paillier key pair .* asks for ckks"):
        client_step(_hello(_cfg(encryption="ckks")), str(d), {})
    # the scheme the key holds is accepted: the hello carries the public modulus, not b""
    reply = decode(client_step(_hello(_cfg(encryption="paillier")), str(d), {}))
    assert reply.payload["he_scheme"] == "paillier"
    assert bytes(reply.payload["he_public"]) == weak_dealer.public_material()


def test_build_client_refuses_the_downgrade_too(tiny, weak_dealer):
    """Not only the hello: building the client for an algorithm message with a plaintext config
    (a server that skipped or lied in the hello) is refused, so no plaintext backend is ever made."""
    split, part = tiny
    cd = client_data(split, part, {SECRET: weak_dealer.to_bytes()})[1]
    with pytest.raises(EncryptionPolicyError, match="asks for no encryption"):
        build_client(cd, _cfg(encryption="none"), 0)
    with pytest.raises(EncryptionPolicyError, match="asks for no encryption"):
        hello_payload(cd, _cfg(encryption="none"))
    # a client without any key still runs a plaintext run
    plain = client_data(split, part)[1]
    assert hello_payload(plain, _cfg(encryption="none")) == {"he_scheme": "none", "he_public": b""}
    assert isinstance(build_client(plain, _cfg(encryption="none"), 0).he, PlainBackend)


def test_weak_keys_are_refused_without_the_test_flag(tiny, weak_dealer, monkeypatch):
    """The minimum key size is the client's: read from its key file's modulus, not from the
    server's ``paillier_bits``. Without ``HYBRIDFL_ALLOW_WEAK_KEYS`` a 512-bit key is refused, and
    the simulation (which deals a key of the config's size) refuses it as well."""
    monkeypatch.delenv(WEAK_KEYS_ENV, raising=False)
    split, part = tiny
    cd = client_data(split, part, {SECRET: weak_dealer.to_bytes()})[0]
    cfg = _cfg(encryption="paillier", paillier_bits=4096)  # the server's setting changes nothing
    with pytest.raises(EncryptionPolicyError) as e:
        hello_payload(cd, cfg)
    assert str(e.value) == (
        f"client {cd.client_id!r} refuses its 512-bit Paillier key, below the minimum 2048 bits; make a key of at "
        f"least 2048 bits ({WEAK_KEYS_ENV}=1 allows weaker keys in tests only)."
    )
    with pytest.raises(EncryptionPolicyError, match="512-bit Paillier key"):
        build_client(cd, cfg, 0)
    with pytest.raises(EncryptionPolicyError, match="512-bit Paillier key"):
        build_federation("hyfdca", split, part, _cfg(encryption="paillier", paillier_bits=512), 0)
    # "0" or any other value is not the flag
    monkeypatch.setenv(WEAK_KEYS_ENV, "0")
    with pytest.raises(EncryptionPolicyError):
        hello_payload(cd, cfg)
    # with the flag (this test session's default, tests/conftest.py) the same key is accepted
    monkeypatch.setenv(WEAK_KEYS_ENV, "1")
    assert bytes(hello_payload(cd, cfg)["he_public"]) == weak_dealer.public_material()


def test_ckks_keys_below_128_bit_security_are_refused_without_the_test_flag(monkeypatch):
    """A CKKS key's degree and coefficient modulus, read from its TenSEAL context, must meet the HE
    standard's 128-bit bound (our KeyDealer makes only such keys; a foreign key file could not):
    degree 2048 is refused, and our default key (degree 4096, 109 bits) is accepted. A modulus
    above the bound (120 bits at 4096) is refused by the rule too; TenSEAL cannot even make such
    a context (SEAL's own 128-bit check), so the rule is checked directly."""
    import tenseal as ts

    def backend(degree, bits):
        ctx = ts.context(ts.SCHEME_TYPE.CKKS, degree, coeff_mod_bit_sizes=bits)
        ctx.global_scale = 2**20
        return CKKSBackend(ctx, degree // 2)

    small = backend(2048, [30, 24])
    assert key_size(small) == 2048
    monkeypatch.delenv(WEAK_KEYS_ENV, raising=False)
    with pytest.raises(
        EncryptionPolicyError, match=f"polynomial modulus degree 2048, below the minimum {MIN_CKKS_DEGREE}"
    ):
        check_key_size(small, "client 'c'")
    assert (
        security_problem(4096, 120)
        == "120-bit coefficient modulus at degree 4096, above the 109 bits of 128-bit security"
    )
    assert security_problem(8192, 120) == security_problem(4096, 109) == ""
    default = KeyDealer("ckks").client_backend()
    assert key_size(default) == 4096
    check_key_size(default, "client 'c'")
    monkeypatch.setenv(WEAK_KEYS_ENV, "1")
    check_key_size(small, "client 'c'")


def test_full_size_keys_run_encrypted_without_the_flag(tiny, monkeypatch):
    """The normal path: a 2048-bit Paillier key and a default (degree-4096) CKKS key are accepted without
    the flag; a whole CKKS run (keys dealt by the simulation) gives the plaintext run's model."""
    monkeypatch.delenv(WEAK_KEYS_ENV, raising=False)
    split, part = tiny
    strong = KeyDealer("paillier", paillier_bits=2048)
    cd = client_data(split, part, {SECRET: strong.to_bytes()})[0]
    assert key_size(strong.client_backend()) == 2048
    assert bytes(hello_payload(cd, _cfg(encryption="paillier"))["he_public"]) == strong.public_material()
    be = build_client(cd, _cfg(encryption="paillier"), 0).he
    np.testing.assert_allclose(be.decrypt(be.encrypt(np.array([1.5, -2.25]))), [1.5, -2.25])

    def run(cfg):
        fed = build_federation("hyfdca", split, part, cfg, 0)
        fed.setup()
        fed.loop(monitor=False).run()
        return fed

    plain = run(_cfg(encryption="none"))
    enc = run(_cfg(encryption="ckks"))
    assert all(c.he.name == "ckks" for c in enc.clients.values())
    assert np.linalg.norm(plain.server.output_w()) > 0
    np.testing.assert_allclose(enc.server.output_w(), plain.server.output_w(), rtol=1e-5, atol=1e-6)


def test_server_refuses_hello_material_it_cannot_trust(tiny, weak_dealer):
    """What the server does with each client's hello payload: different public keys, another
    scheme, a non-bytes ``he_public``, unreadable material or a CKKS context holding its secret key
    are each one-sentence DataErrors, before any round."""
    from hybridfl.algorithms.hyfdca.spec import build_server
    from hybridfl.errors import DataError
    from hybridfl.runtime.simulation import server_data

    split, part = tiny
    cfg = HyFDCAConfig(encryption="paillier", paillier_bits=512, rounds=1)
    sd = server_data(split, part)
    pub = weak_dealer.public_material()
    ok = {"he_scheme": "paillier", "he_public": pub}
    assert build_server(sd, cfg, 0, {"a": ok, "b": ok}).he is not None
    other = KeyDealer("paillier", paillier_bits=512).public_material()
    cases = [
        ({"a": ok, "b": {**ok, "he_public": other}}, "different HE keys"),
        ({"a": ok, "b": {**ok, "he_scheme": "ckks"}}, "uses ckks encryption"),
        ({"a": ok, "b": {**ok, "he_public": "abc"}}, "not bytes"),
    ]
    for hello, match in cases:
        with pytest.raises(DataError, match=match):
            build_server(sd, cfg, 0, hello)
    ckks = HyFDCAConfig(encryption="ckks", rounds=1)
    junk = {"he_scheme": "ckks", "he_public": b"\x00\x00\x10\x00garbage"}
    with pytest.raises(DataError, match="cannot be read"):
        build_server(sd, ckks, 0, {"a": junk})
    secret_ctx = KeyDealer("ckks", ckks_degree=8192)
    slots = secret_ctx.public_material()[:4]  # a context serialised with its secret key, as a client might leak it
    leaked = {"he_scheme": "ckks", "he_public": slots + secret_ctx._secret}
    with pytest.raises(DataError, match="secret key"):
        build_server(sd, ckks, 0, {"a": leaked})
