"""Private set intersection (PSI) of sample IDs: a thin wrapper of OpenMined's ``openmined-psi``.

The library (imported as ``private_set_intersection.python``, wheel ``openmined-psi``) implements
the ECDH PSI protocol on NIST P-256 with the RAW data structure (no false positives):

- the *client* blinds its IDs with its secret key ``a``: ``request`` = ``H(x)^a`` for every ID
  ``x``, in its order (one 33-byte compressed point each);
- the *server* with secret key ``b`` sends ``setup`` = the sorted ``H(y)^b`` of its IDs and
  ``response`` = ``(H(x)^a)^b``, in request order;
- the client unblinds ``H(x)^b`` and looks it up in the setup: it learns which of *its* IDs the
  server holds. The server learns nothing but the number of the client's IDs; an observer of the
  bytes (our coordinator, relaying them) learns the two set sizes and nothing else.

:class:`PSIClient` and :class:`PSIServer` produce and take the protocol's messages as ``bytes``.
Every received blob is checked before the library sees it (:func:`check_request`,
:func:`check_setup`, :func:`check_response`: protobuf decoding, known fields only, a count cap,
33-byte compressed points, a strictly sorted setup, a response as long as the request); a bad one
raises :class:`PSIError`, one sentence without the data.

**Both cores.** The library's calls hold the GIL, so threads do not help (measured: two threads
take as long as one). The work is one elliptic-curve exponentiation per ID and step, independent
across IDs, so each step splits its IDs into contiguous chunks and runs them in a pool of forked
processes (Linux; elsewhere in process), each worker rebuilding
the same client or server from the secret key (``CreateFromKey``) and the chunks' messages being
concatenated (protobuf repeated fields) -- the bytes on the wire are exactly those of one
single-core run (tested). Splitting the protocol itself into shards by a keyed hash would need a
key shared by both sides and would leak shard sizes; splitting the computation needs neither.
Below :data:`PARALLEL_MIN_IDS` IDs a step runs in process (a pool costs more than it saves).

**Order without the coordinator.** :class:`KeyAgreement` (X25519, from ``cryptography``) gives two
parties a key through messages an honest-but-curious relay sees but cannot use, and
:func:`order_tags` / :func:`match_tags` send an ordered list of IDs both hold as keyed hashes
(HMAC-SHA-256, :data:`TAG_BYTES` bytes each) under that key: FedBCD's label party imposes its
order of the intersection this way (:mod:`hybridfl.algorithms.fedbcd`).

:func:`plaintext_intersection` is the reference the tests and the benchmark compare with; it is
not a protocol.
"""

from __future__ import annotations

import hashlib
import hmac
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from hybridfl.errors import ProtocolError

POINT_BYTES = 33
"""Bytes of one blinded ID: a compressed P-256 point (prefix 2 or 3, then the 32-byte ``x``)."""

MAX_IDS = 10_000_000
"""The default cap on the IDs a PSI message may carry (a request, setup or response)."""

PARALLEL_MIN_IDS = 4096
"""Steps with fewer IDs than this run in process; larger ones run in the process pool."""

TAG_BYTES = 16
"""Bytes of one order tag (HMAC-SHA-256 truncated to 128 bits)."""

DH_BYTES = 32
"""Bytes of an X25519 public key."""

_FPR = 1e-9  # required by the library's setup call; the RAW data structure has no false positives


class PSIError(ProtocolError):
    """A PSI message is malformed, too large or inconsistent (one sentence, without the data).

    ``part`` names what was wrong: ``request``, ``setup``, ``response``, ``tags``, ``key`` or
    ``ids``.
    """

    def __init__(self, message: str, part: str = ""):
        super().__init__(message)
        self.part = part

    def __reduce__(self):  # keeps ``part`` across a worker process
        return (type(self), (str(self), self.part))


def _lib():
    import private_set_intersection.python as psi

    return psi


def library_version() -> str:
    """The version of the installed ``openmined-psi`` library (e.g. ``"2.0.6"``)."""
    return str(_lib().__version__)


def plaintext_intersection(*id_lists: Sequence[str]) -> list[str]:
    """The IDs held in every list, in the first list's order: the plaintext reference (tests and
    benchmarks), not a private protocol."""
    if not id_lists:
        return []
    common = set(map(str, id_lists[0]))
    for ids in id_lists[1:]:
        common &= set(map(str, ids))
    return [str(s) for s in id_lists[0] if str(s) in common]


# ---------------------------------------------------------------------- the process pool
def default_workers() -> int:
    """The number of worker processes a step uses by default: the CPUs this process may run on
    (1 where processes cannot be forked: not Linux)."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, len(os.sched_getaffinity(0)))


_SHARED: dict[str, Any] = {}
"""The pool of :func:`one_pool` while its block runs (``pool``, ``pid``, ``workers``)."""


@contextmanager
def one_pool(workers: int | None = None) -> Iterator[None]:
    """Every parallel PSI step inside the block (of this process) runs in one pool of
    ``workers`` forked processes (default :func:`default_workers`), forked at the first such step
    and shut down when the block ends, so no process outlives it; without the block each step
    forks a pool of its own. For the in-process simulation, whose clients all run in this one
    process: its PSI alignment is dozens of steps (three per pair of clients), and forking a
    process that holds a whole federation's data costs tens of milliseconds each time. Nested
    blocks use the outer pool."""
    if _SHARED or workers == 1 or default_workers() <= 1:
        yield
        return
    _SHARED.update(pool=None, pid=os.getpid(), workers=default_workers() if workers is None else max(1, workers))
    try:
        yield
    finally:
        pool = _SHARED.get("pool")
        _SHARED.clear()
        if pool is not None:
            pool.shutdown(wait=True)


def _run(fn: Callable[..., Any], tasks: list[tuple], workers: int) -> list[Any]:
    """``[fn(*t) for t in tasks]``, in a pool of ``workers`` forked processes when there are
    several tasks (inside :func:`one_pool`, in its pool). Forked, not spawned: a spawned worker
    re-imports the caller's main script (which breaks scripts without a ``__main__`` guard) and
    hybridfl (half a second); a fork copies the loaded library in milliseconds. The pool lives for
    one step only (or :func:`one_pool`'s block), so no process outlives it."""
    if workers <= 1 or len(tasks) <= 1:
        return [fn(*t) for t in tasks]
    if _SHARED.get("pid") == os.getpid():
        if _SHARED["pool"] is None:
            _SHARED["pool"] = ProcessPoolExecutor(_SHARED["workers"], mp_context=multiprocessing.get_context("fork"))
        return list(_SHARED["pool"].map(fn, *zip(*tasks)))
    with ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)), mp_context=multiprocessing.get_context("fork")
    ) as ex:
        return list(ex.map(fn, *zip(*tasks)))


def _chunks(n: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` ranges: one range below :data:`PARALLEL_MIN_IDS`, else two per
    worker (balances cores that other processes also use)."""
    parts = 1 if workers <= 1 or n < PARALLEL_MIN_IDS else min(2 * workers, n)
    edges = np.linspace(0, n, parts + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a] or [(0, 0)]


def _split(joined: bytes) -> list[bytes]:
    return [joined[i : i + POINT_BYTES] for i in range(0, len(joined), POINT_BYTES)]


# worker steps (module level: run in the pool); ``key`` is the side's secret key
def _w_request(key: bytes, ids: list[str]) -> bytes:
    return _lib().client.CreateFromKey(key, True).CreateRequest(ids).SerializeToString()


def _w_setup(key: bytes, ids: list[str], n_client: int) -> list[bytes]:
    psi = _lib()
    s = psi.server.CreateFromKey(key, True).CreateSetupMessage(_FPR, max(n_client, 1), ids, psi.DataStructure.RAW)
    return list(s.raw.encrypted_elements)


def _w_respond(key: bytes, joined: bytes) -> bytes:
    psi = _lib()
    req = psi.Request(reveal_intersection=True, encrypted_elements=_split(joined))
    try:
        return psi.server.CreateFromKey(key, True).ProcessRequest(req).SerializeToString()
    except RuntimeError:
        raise PSIError("the PSI request holds a value that is not a point of the curve.", "request") from None


def _w_intersect(key: bytes, setup: bytes, joined: bytes, offset: int) -> list[int]:
    psi = _lib()
    resp = psi.Response(encrypted_elements=_split(joined))
    try:
        found = psi.client.CreateFromKey(key, True).GetIntersection(psi.ServerSetup.FromString(setup), resp)
    except RuntimeError:
        raise PSIError("the PSI response holds a value that is not a point of the curve.", "response") from None
    return [offset + int(i) for i in found]


# ---------------------------------------------------------------------- checks of received blobs
def _parse(kind: str, cls: Any, blob: Any, max_bytes: int) -> Any:
    if not isinstance(blob, (bytes, bytearray)):
        raise PSIError(f"a PSI {kind} must be bytes, got {type(blob).__name__}.", kind)
    if len(blob) > max_bytes:
        raise PSIError(f"the PSI {kind} is {len(blob)} bytes, over the limit of {max_bytes} bytes.", kind)
    from google.protobuf.message import DecodeError

    try:
        return cls.FromString(bytes(blob))
    except DecodeError:
        raise PSIError(f"the PSI {kind} is not a well-formed PSI message.", kind) from None


def _max_bytes(max_ids: int) -> int:
    return 16 + max_ids * (POINT_BYTES + 2)  # per element: tag, length, point; plus the header fields


def _points(kind: str, elements: Sequence[bytes], max_ids: int) -> bytes:
    n = len(elements)
    if n > max_ids:
        raise PSIError(f"the PSI {kind} holds {n} IDs, over the limit of {max_ids}.", kind)
    joined = b"".join(elements)
    if len(joined) != n * POINT_BYTES or any(len(e) != POINT_BYTES for e in elements):
        raise PSIError(f"the PSI {kind} holds an element that is not a {POINT_BYTES}-byte point.", kind)
    if n and not np.isin(np.frombuffer(joined, np.uint8)[::POINT_BYTES], (2, 3)).all():
        raise PSIError(f"the PSI {kind} holds an element that is not a compressed point.", kind)
    return joined


def check_request(blob: bytes, max_ids: int = MAX_IDS) -> int:
    """The number of IDs in a PSI request, after checking it: bytes of at most the size
    :data:`MAX_IDS`-style cap allows, a protobuf ``Request`` with only its own fields, at most
    ``max_ids`` elements, each a compressed point (:data:`POINT_BYTES` bytes, prefix 2 or 3), no
    point twice (a requester's IDs are distinct, so are their blinded points).

    Raises:
        PSIError: the first problem found.
    """
    return len(_checked_request(blob, max_ids)) // POINT_BYTES


def _checked_request(blob: bytes, max_ids: int) -> bytes:
    psi = _lib()
    req = _parse("request", psi.Request, blob, _max_bytes(max_ids))
    joined = _points("request", req.encrypted_elements, max_ids)
    clean = psi.Request(reveal_intersection=req.reveal_intersection, encrypted_elements=req.encrypted_elements)
    if len(clean.SerializeToString()) != len(blob):
        raise PSIError("the PSI request holds fields a PSI request does not have.", "request")
    n = len(joined) // POINT_BYTES
    if n > 1 and np.unique(np.frombuffer(joined, dtype=f"S{POINT_BYTES}")).size != n:
        # distinct IDs blind to distinct points: a repeat is an amplification (one exponentiation
        # for the sender, one per copy for the responder) or a probe, refused before any work
        raise PSIError("the PSI request repeats a point.", "request")
    return joined


def check_setup(blob: bytes, max_ids: int = MAX_IDS) -> int:
    """The number of IDs in a PSI server setup, after checking it: a protobuf ``ServerSetup`` of
    the RAW data structure with only its own fields, at most ``max_ids`` elements, each a
    compressed point, strictly increasing (sorted, no repeat: the library needs it sorted).

    Raises:
        PSIError: the first problem found.
    """
    return len(_checked_setup(blob, max_ids)[0]) // POINT_BYTES


def _checked_setup(blob: bytes, max_ids: int) -> tuple[bytes, Any]:
    psi = _lib()
    s = _parse("setup", psi.ServerSetup, blob, _max_bytes(max_ids))
    if s.WhichOneof("data_structure") != "raw":
        raise PSIError("the PSI setup does not use the RAW data structure.", "setup")
    els = s.raw.encrypted_elements
    joined = _points("setup", els, max_ids)
    clean = psi.ServerSetup()
    clean.raw.encrypted_elements.extend(els)
    if len(clean.SerializeToString()) != len(blob):
        raise PSIError("the PSI setup holds fields a PSI setup does not have.", "setup")
    if len(els) > 1:
        a = np.frombuffer(joined, dtype=f"S{POINT_BYTES}")  # equal-length byte strings compare lexicographically
        if not (a[1:] > a[:-1]).all():
            raise PSIError("the PSI setup is not strictly sorted.", "setup")
    return joined, clean


def check_response(blob: bytes, n_request: int) -> int:
    """The number of elements of a PSI response, after checking it: a protobuf ``Response`` with
    only its own fields holding exactly ``n_request`` compressed points (one per request element).

    Raises:
        PSIError: the first problem found.
    """
    return len(_checked_response(blob, n_request)) // POINT_BYTES


def _checked_response(blob: bytes, n_request: int) -> bytes:
    psi = _lib()
    r = _parse("response", psi.Response, blob, _max_bytes(n_request))
    if len(r.encrypted_elements) != n_request:
        raise PSIError(
            f"the PSI response holds {len(r.encrypted_elements)} elements, the request had {n_request}.", "response"
        )
    joined = _points("response", r.encrypted_elements, n_request)
    if len(psi.Response(encrypted_elements=r.encrypted_elements).SerializeToString()) != len(blob):
        raise PSIError("the PSI response holds fields a PSI response does not have.", "response")
    return joined


def _ids(ids: Sequence[str]) -> list[str]:
    out = [str(s) for s in ids]
    if len(out) > MAX_IDS:
        raise PSIError(f"a PSI side holds {len(out)} IDs, over the limit of {MAX_IDS}.", "ids")
    return out


# ---------------------------------------------------------------------- the two roles
class PSIClient:
    """The PSI client (receiver): learns which of its IDs the server holds.

    Args:
        ids: ``(n,)`` its IDs (str; converted with ``str``), in its order.
        key: its secret key (32 bytes) to rebuild a client; ``None``: a fresh random key.
        workers: processes per step (default :func:`default_workers`; 1: in process).

    The key is secret: :meth:`secret_key` exists to keep a client between two messages (a party's
    state on its own node), never to be sent.

    Raises:
        PSIError: more than :data:`MAX_IDS` IDs.
    """

    def __init__(self, ids: Sequence[str], key: bytes | None = None, workers: int | None = None):
        psi = _lib()
        self.ids = _ids(ids)
        c = psi.client.CreateWithNewKey(True) if key is None else psi.client.CreateFromKey(bytes(key), True)
        self._key = bytes(c.GetPrivateKeyBytes())
        self.workers = default_workers() if workers is None else max(1, int(workers))

    def secret_key(self) -> bytes:
        """The client's secret key (32 bytes): keep it on the node, never send it."""
        return self._key

    def request(self) -> bytes:
        """The request ``H(x)^a`` of every ID, in ID order: ``len(ids) * 35 + 2`` bytes or so."""
        tasks = [(self._key, self.ids[a:b]) for a, b in _chunks(len(self.ids), self.workers)]
        joined = b"".join(_run(_w_request, tasks, self.workers))  # concatenated protobufs = one request
        return _lib().Request.FromString(joined).SerializeToString()

    def intersect(self, setup: bytes, response: bytes, max_ids: int = MAX_IDS) -> np.ndarray:
        """``(m,)`` sorted int64 positions in ``ids`` of the IDs the server also holds, from the
        server's ``setup`` and its ``response`` to :meth:`request`.

        Raises:
            PSIError: a malformed setup or response (:func:`check_setup`, :func:`check_response`).
        """
        _s, clean = _checked_setup(setup, max_ids)
        joined = _checked_response(response, len(self.ids))
        s = clean.SerializeToString()
        tasks = [
            (self._key, s, joined[a * POINT_BYTES : b * POINT_BYTES], a)
            for a, b in _chunks(len(self.ids), self.workers)
        ]
        found = [i for part in _run(_w_intersect, tasks, self.workers) for i in part]
        return np.unique(np.asarray(found, dtype=np.int64))


class PSIServer:
    """The PSI server (sender): answers a client's request; learns only the request's size.

    Args:
        ids: ``(n,)`` its IDs (str; converted with ``str``).
        key: its secret key (32 bytes); ``None``: a fresh random key.
        workers: processes per step (default :func:`default_workers`; 1: in process).

    Raises:
        PSIError: more than :data:`MAX_IDS` IDs.
    """

    def __init__(self, ids: Sequence[str], key: bytes | None = None, workers: int | None = None):
        psi = _lib()
        self.ids = _ids(ids)
        s = psi.server.CreateWithNewKey(True) if key is None else psi.server.CreateFromKey(bytes(key), True)
        self._key = bytes(s.GetPrivateKeyBytes())
        self.workers = default_workers() if workers is None else max(1, int(workers))

    def secret_key(self) -> bytes:
        """The server's secret key (32 bytes): keep it on the node, never send it."""
        return self._key

    def setup(self, n_client: int = 1) -> bytes:
        """The RAW setup: the sorted ``H(y)^b`` of every ID (``n_client``, the client's set size,
        only feeds the library's false-positive bound, which RAW does not use)."""
        psi = _lib()
        tasks = [(self._key, self.ids[a:b], int(n_client)) for a, b in _chunks(len(self.ids), self.workers)]
        els = sorted(e for part in _run(_w_setup, tasks, self.workers) for e in part)
        out = psi.ServerSetup()
        out.raw.encrypted_elements.extend(els)
        return out.SerializeToString()

    def respond(self, request: bytes, max_ids: int = MAX_IDS) -> bytes:
        """The response ``(H(x)^a)^b`` to a client's request, in request order.

        Raises:
            PSIError: a malformed request (:func:`check_request`), or one holding a value that is
                not a curve point.
        """
        joined = _checked_request(request, max_ids)
        n = len(joined) // POINT_BYTES
        tasks = [(self._key, joined[a * POINT_BYTES : b * POINT_BYTES]) for a, b in _chunks(n, self.workers) if b > a]
        return b"".join(_run(_w_respond, tasks, self.workers))


# ---------------------------------------------------------------------- key agreement and order tags
class KeyAgreement:
    """One side of an X25519 key agreement (``cryptography``): :meth:`public` crosses, the
    private key stays; :meth:`shared_key` derives a 32-byte key both sides get and a passive
    relay cannot (an active one that replaces the public keys could: authenticate them for that).

    Args:
        private: a 32-byte private key to restore a side (state between two messages); ``None``:
            a fresh one.

    Raises:
        PSIError: ``private`` is not 32 bytes.
    """

    def __init__(self, private: bytes | None = None):
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        if private is None:
            self._sk = X25519PrivateKey.generate()
        else:
            if not isinstance(private, (bytes, bytearray)) or len(private) != DH_BYTES:
                raise PSIError(f"an X25519 private key must be {DH_BYTES} bytes.", "key")
            self._sk = X25519PrivateKey.from_private_bytes(bytes(private))

    def private_bytes(self) -> bytes:
        """The 32-byte private key: keep it on the node, never send it."""
        from cryptography.hazmat.primitives import serialization as ser

        return self._sk.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())

    def public(self) -> bytes:
        """The 32-byte public key (sent to the other side)."""
        return self._sk.public_key().public_bytes_raw()

    def shared_key(self, peer: bytes, context: bytes, initiator: bool) -> bytes:
        """The 32-byte key shared with the holder of public key ``peer``:
        ``SHA-256(context, X25519(private, peer), initiator's public, responder's public)``.

        Raises:
            PSIError: ``peer`` is not 32 bytes or not a usable public key (e.g. a low-order point).
        """
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

        if not isinstance(peer, (bytes, bytearray)) or len(peer) != DH_BYTES:
            raise PSIError(f"an X25519 public key must be {DH_BYTES} bytes.", "key")
        try:
            secret = self._sk.exchange(X25519PublicKey.from_public_bytes(bytes(peer)))
        except ValueError:
            raise PSIError("the X25519 public key is not usable (a low-order point).", "key") from None
        mine, theirs = self.public(), bytes(peer)
        pair = mine + theirs if initiator else theirs + mine
        return hashlib.sha256(len(context).to_bytes(2, "big") + context + secret + pair).digest()


def _tag(key: bytes, s: str) -> bytes:
    return hmac.digest(key, s.encode("utf-8"), "sha256")[:TAG_BYTES]


def order_tags(key: bytes, ids: Sequence[str]) -> bytes:
    """The order tags of ``ids`` (in that order): ``HMAC-SHA-256(key, id)`` truncated to
    :data:`TAG_BYTES` bytes each, concatenated (``len(ids) * TAG_BYTES`` bytes)."""
    return b"".join(_tag(key, str(s)) for s in ids)


def match_tags(key: bytes, ids: Sequence[str], tags: bytes, max_tags: int | None = None) -> np.ndarray:
    """``(m,)`` int64 positions in ``ids`` of the IDs whose tags :func:`order_tags` gave, in the
    tags' order (the other side's order).

    Raises:
        PSIError: ``tags`` is not bytes, not a whole number of tags, holds more than ``max_tags``
            (default ``len(ids)``) or none, repeats a tag, or holds a tag of no ID in ``ids``.
    """
    if not isinstance(tags, (bytes, bytearray)):
        raise PSIError(f"the order tags must be bytes, got {type(tags).__name__}.", "tags")
    cap = len(ids) if max_tags is None else int(max_tags)
    n, rest = divmod(len(tags), TAG_BYTES)
    if rest or n == 0:
        raise PSIError(f"the order tags are {len(tags)} bytes, not a positive multiple of {TAG_BYTES}.", "tags")
    if n > cap:
        raise PSIError(f"the order tags name {n} samples, more than the {cap} held.", "tags")
    index = {_tag(key, str(s)): i for i, s in enumerate(ids)}
    want = [bytes(tags[i : i + TAG_BYTES]) for i in range(0, len(tags), TAG_BYTES)]
    if len(set(want)) != n:
        raise PSIError("the order tags name a sample twice.", "tags")
    rows = [index.get(t, -1) for t in want]
    if -1 in rows:
        raise PSIError("the order tags name a sample that is not held here.", "tags")
    return np.asarray(rows, dtype=np.int64)


# ---------------------------------------------------------------------- signed offers (with a roster)
def offer_fields(n: int, dh: bytes, blob: bytes) -> list[bytes]:
    """What its owner's signature over a PSI request or setup covers
    (:class:`~hybridfl.privacy.roster.PeerAuth`, purposes ``psi-request`` / ``psi-setup``): the
    owner's set size ``n`` (8 bytes), its X25519 public key ``dh`` and the blob's SHA-256. A
    relay can then neither append a point, nor swap the key, nor claim another size."""
    return [int(n).to_bytes(8, "big"), bytes(dh), hashlib.sha256(bytes(blob)).digest()]


def response_fields(requester: str, request_sha256: bytes, response: bytes) -> list[bytes]:
    """What the responder's signature over a PSI response covers (purpose ``psi-response``): the
    requester's name, the SHA-256 of the request it answers (``offer_fields(...)[2]``) and of the
    response."""
    return [requester.encode(), bytes(request_sha256), hashlib.sha256(bytes(response)).digest()]


def sign_offer(auth: Any, run: bytes, purpose: str, n: int, dh: bytes, blob: bytes) -> dict[str, Any]:
    """The fields that go with a PSI request or setup: ``n`` (its owner's set size) and, with a
    roster (``auth``, a :class:`~hybridfl.privacy.roster.PeerAuth`; ``None``: none), ``sig``,
    its signature over :func:`offer_fields` for ``run`` and ``purpose``."""
    out: dict[str, Any] = {"n": int(n)}
    if auth is not None:
        out["sig"] = auth.sign(run, purpose, offer_fields(n, dh, blob))
    return out


def verify_offer(auth: Any, run: bytes, sender: str, purpose: str, n: int, dh: bytes, blob: bytes, sig: Any) -> None:
    """With a roster (``auth``; ``None``: nothing checked), ``sig`` must be ``sender``'s
    signature over :func:`offer_fields` (``n``, ``dh``, ``blob``) for ``run`` and ``purpose``.

    Raises:
        PeerAuthError: it is missing or does not verify against the roster.
    """
    if auth is not None:
        auth.verify(run, sender, purpose, offer_fields(n, dh, blob), sig)


def check_request_size(request: bytes, n: int) -> None:
    """A PSI request must hold exactly ``n`` points (its sender's, signed, set size) and no point
    twice; checked before any exponentiation.

    Raises:
        PSIError: it does not (or it is malformed: :func:`check_request`).
    """
    if check_request(request, max_ids=n) != n:
        raise PSIError(f"the PSI request does not hold the {n} IDs its sender has.", "request")
