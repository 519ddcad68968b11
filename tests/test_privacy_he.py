"""Homomorphic encryption backends: round trips, additions with public material only, no secret
key at the server."""

import struct

import numpy as np
import pytest

from hybridfl.errors import ConfigError
from hybridfl.privacy import KeyDealer, SecretKeyMissing, server_backend
from hybridfl.privacy.he import PlainBackend


@pytest.fixture(scope="module", params=["none", "paillier", "ckks"])
def dealer(request):
    # 1024-bit Paillier keeps the test fast; the library default is 2048.
    return KeyDealer(request.param, paillier_bits=1024)


def test_encrypt_add_decrypt_round_trip(dealer):
    rng = np.random.default_rng(0)
    n = 40 if dealer.scheme == "paillier" else 5000  # CKKS: more than one ciphertext (2048 slots)
    a, b, c = rng.normal(0, 50, n), rng.normal(0, 1, n), -rng.random(n)
    c1, c2 = dealer.client_backend(), dealer.client_backend()
    server = server_backend(dealer.scheme, dealer.public_material())
    total = server.add([c1.encrypt(a), c2.encrypt(b), c1.encrypt(c)])
    got = c2.decrypt(total)
    tol = {"none": 1e-12, "paillier": 1e-9, "ckks": 1e-6}[dealer.scheme]
    np.testing.assert_allclose(got, a + b + c, atol=tol)
    assert got.shape == (n,)
    assert c1.seconds > 0 and server.seconds >= 0


@pytest.mark.parametrize("scheme", ["paillier", "ckks"])  # the plaintext baseline protects nothing by design
def test_server_backend_cannot_decrypt(scheme):
    dealer = KeyDealer(scheme, paillier_bits=1024)
    server = server_backend(dealer.scheme, dealer.public_material())
    ct = dealer.client_backend().encrypt(np.arange(5.0))
    assert not server.can_decrypt
    with pytest.raises(SecretKeyMissing):
        server.decrypt(ct)


def test_ciphertexts_hide_the_values(dealer):
    v = np.array([0.123456789, -2.5, 3.0])
    ct = dealer.client_backend().encrypt(v)
    leaked = all(x.tobytes() in ct for x in v.astype("<f8"))
    # The plaintext baseline carries the float64 bytes (a positive control for the same check).
    assert leaked == (dealer.scheme == "none")


def test_ckks_public_material_has_no_secret_key():
    import tenseal as ts

    dealer = KeyDealer("ckks")
    ctx = ts.context_from(dealer.public_material()[4:])
    assert ctx.is_public() and not ctx.has_secret_key()


def test_adding_vectors_of_different_lengths_fails():
    d = KeyDealer("ckks")
    s = server_backend("ckks", d.public_material())
    c = d.client_backend()
    with pytest.raises(ValueError, match="different lengths"):
        s.add([c.encrypt(np.zeros(3)), c.encrypt(np.zeros(4))])


def test_unknown_scheme_is_one_sentence():
    with pytest.raises(ConfigError, match="unknown encryption scheme 'rsa'"):
        KeyDealer("rsa")


def test_a_ciphertext_is_parsed_before_use(dealer):
    """The server's check of an untrusted ciphertext: a good one passes; one with a correct length
    header and a garbage body (before: only the header was read, and CKKS failed later inside
    ``add`` with "failed to parse CKKS stream", stopping the run) is refused with one sentence."""
    import struct

    server = server_backend(dealer.scheme, dealer.public_material())
    good = dealer.client_backend().encrypt(np.arange(5.0))
    server.check(good)
    garbage = struct.pack(">I", 5) + b"\xff" * (len(good) - 4)
    for bad in (garbage, good[:-3], good[:3], good + b"\x00"):
        with pytest.raises(ValueError) as e:
            server.check(bad)
        assert str(e.value).count(". ") == 0
    if dealer.scheme == "ckks":  # the body as before: length-framed parts, each a garbage stream
        framed = struct.pack(">I", 5) + struct.pack(">I", 64) + b"\xab" * 64
        with pytest.raises(ValueError, match="does not parse"):
            server.check(framed)
        with pytest.raises(Exception, match="parse"):  # the failure the check now prevents
            server.add([good, framed])


def test_secret_key_ckks_ciphertexts_are_seed_compressed():
    """A client's secret-key ciphertext (SEAL's seeded symmetric form wrapped as a TenSEAL vector)
    is about half a public-key one, parses at the server, adds to public-key ciphertexts and
    decrypts to the sum. Fails loudly if a TenSEAL version stops loading the seeded form."""
    from hybridfl.privacy.he import _unpack

    d = KeyDealer("ckks")
    pk, sk = d.client_backend(), d.client_backend().with_secret_key_encryption()
    server = server_backend("ckks", d.public_material())
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 3, 3000), rng.normal(0, 3, 3000)  # two parts at 2048 slots
    ca, cb = sk.encrypt(a), pk.encrypt(b)
    assert len(_unpack(ca[4:])) == 2 and len(ca) < 0.55 * len(cb)
    server.check(ca)
    np.testing.assert_allclose(sk.decrypt(ca), a, atol=1e-7)
    # what the server reads: no value's float64 bytes, a fresh seed and c0 per encryption, no decryption
    v = np.array([0.123456789, -2.5, 3.0])
    c1, c2 = sk.encrypt(v), sk.encrypt(v)
    assert not any(x.tobytes() in c1 for x in v.astype("<f8")) and c1 != c2 and len(c1) == len(c2)
    with pytest.raises(SecretKeyMissing):
        server.decrypt(c1)
    np.testing.assert_allclose(pk.decrypt(server.add([ca, cb, sk.encrypt(b)])), a + 2 * b, atol=1e-6)


def test_seeded_ciphertexts_without_in_memory_files(monkeypatch):
    """Where SEAL cannot save to an in-memory file, the seeded ciphertext goes through a temporary
    file: the same size, and it decrypts."""
    from hybridfl.privacy import ckks_params

    sk = KeyDealer("ckks").client_backend().with_secret_key_encryption()
    v = np.linspace(-2.0, 2.0, 100)
    fast = sk.encrypt(v)
    monkeypatch.setattr(ckks_params, "_in_memory_files", lambda: False)
    slow = sk.encrypt(v)
    assert abs(len(slow) - len(fast)) < 64 and len(slow) < 40_000
    np.testing.assert_allclose(sk.decrypt(slow), v, atol=1e-7)


def test_plain_ciphertexts_are_the_header_and_the_float_bytes():
    """The plaintext backend reads bodies in place and copies once; its bytes stay the length
    header and the little-endian float64 values, its sum the sum from zero, its decryption a
    writable copy, for bytes, bytearray and memoryview inputs alike."""
    be = PlainBackend()
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(7), np.array([-0.0, 1e300, -2.5, 0.0, 3.0, -1e-300, 7.0], dtype=np.float32)
    ca, cb = be.encrypt(a), be.encrypt(b.astype(np.float64))
    assert ca == struct.pack(">I", 7) + a.astype("<f8").tobytes()
    assert cb == struct.pack(">I", 7) + b.astype("<f8").tobytes()
    want = struct.pack(">I", 7) + (np.zeros(7) + a + b.astype(np.float64)).tobytes()
    for wrap in (bytes, bytearray, memoryview):
        total = be.add([wrap(ca), wrap(cb)])
        assert isinstance(total, bytes) and total == want
        be.check(wrap(ca))
        out = be.decrypt(wrap(ca))
        assert out.dtype == np.float64 and out.flags.writeable and out.flags.owndata
        out[0] = 99.0
        assert np.array_equal(be.decrypt(ca), a)
    assert be.encrypt(np.empty(0)) == struct.pack(">I", 0)
    with pytest.raises(ValueError, match="has 48 bytes, not 56"):
        be.check(ca[:-8])


def test_plain_check_finds_a_non_finite_value_in_any_piece():
    """The plaintext check reads a long vector piece by piece (no temporary of its length): a NaN
    or an infinity in the first, a middle or the last piece, or in a short vector, is refused."""
    from hybridfl.privacy import backend as he

    be = PlainBackend()
    n = 3 * he._FINITE_CHUNK + 5
    for size in (n, 3):
        for where in {w for w in (0, he._FINITE_CHUNK + 1, size - 1) if w < size}:
            for bad in (np.nan, np.inf, -np.inf):
                v = np.ones(size)
                v[where] = bad
                with pytest.raises(ValueError, match="NaN or infinite"):
                    be.check(be.encrypt(v))
        be.check(be.encrypt(np.ones(size)))


def test_plain_float32_vectors_cross_as_float32():
    """A float32 vector (HyFDCA's batch Gram values) is a float32 plaintext: the length header with
    its top bit (``FLOAT32``) and the float32 bytes; its length and check read the header without
    the bit; a sum of float32 vectors is the float32 rounding of their float64 sum, and float64
    when one of them is float64; decryption gives float64 values (a view of the float32 values
    with ``copy=False``); a body of the wrong size or with a NaN is refused."""
    from hybridfl.privacy.he import FLOAT32, HEBackend

    be = PlainBackend()
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal(9).astype(np.float32) for _ in range(3))
    ca, cb, cc = be.encrypt(a), be.encrypt(b), be.encrypt(c)
    assert ca == struct.pack(">I", 9 | FLOAT32) + a.astype("<f4").tobytes()
    assert HEBackend.length(ca) == 9 and len(ca) == 4 + 36
    be.check(ca)
    total = be.add([ca, cb, cc])
    want = (a.astype(np.float64) + b + c).astype(np.float32)
    assert total == struct.pack(">I", 9 | FLOAT32) + want.tobytes()
    mixed = be.add([ca, be.encrypt(b.astype(np.float64))])
    assert mixed == struct.pack(">I", 9) + (a.astype(np.float64) + b).tobytes()
    out = be.decrypt(total)
    assert out.dtype == np.float64 and np.array_equal(out, want.astype(np.float64))
    view = be.decrypt(total, copy=False)
    assert view.dtype == np.float32 and np.array_equal(view, want)
    with pytest.raises(ValueError, match="has 32 bytes, not 36"):
        be.check(ca[:-4])
    bad = a.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        be.check(be.encrypt(bad))
    with pytest.raises(ValueError, match="different lengths"):
        be.add([ca, be.encrypt(a[:5])])


def test_a_length_header_that_does_not_match_its_body_is_refused(dealer):
    """The ``FLOAT32`` bit of the length header: a CKKS or Paillier ciphertext that sets it is
    refused by the server's check and by a client's decryption (the server would otherwise add it
    to another holder's ciphertext of the same length as if it were one of its values), and a
    plaintext one whose bit and body disagree (float32 header, float64 body, or the reverse) is
    refused by both too, instead of being read as another count of values."""
    from hybridfl.privacy.he import FLOAT32

    server = server_backend(dealer.scheme, dealer.public_material())
    client = dealer.client_backend()
    v = np.arange(1.0, 6.0)
    good = client.encrypt(v)
    flagged = struct.pack(">I", 5 | FLOAT32) + good[4:]
    bad = [flagged]
    if dealer.scheme == "none":
        single = client.encrypt(v.astype(np.float32))
        bad.append(struct.pack(">I", 5) + single[4:])  # a float32 body under a float64 header
    for c in bad:
        with pytest.raises(ValueError, match="bytes, not|float32 bit"):
            server.check(c)
        for copy in (True, False):
            with pytest.raises(ValueError, match="bytes, not|float32 bit"):
                client.decrypt(c, copy=copy)
    np.testing.assert_allclose(client.decrypt(server.add([good, good])), 2 * v, atol=1e-6)
