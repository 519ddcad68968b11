"""The SuperNode authentication's signatures, made and checked once per second instead of once per
request.

Flower 1.41 authenticates every Fleet request of a SuperNode by a signed timestamp:
``NodeAuthHttpInterceptor`` (``flwr.supernode.node_auth_http_interceptor``) signs
``now().isoformat()`` with the node's ECDSA key (SECP384R1) and sends the timestamp, the signature
and the public key as headers; the SuperLink's ``authenticate_node``
(``flwr.superlink.routers.fleet.node_auth``) accepts a request whose timestamp is less than
``TIMESTAMP_TOLERANCE`` + ``SYSTEM_TIME_TOLERANCE`` (300 + 5 s) old and whose signature verifies
for a key registered to the node the request names. The signature covers the timestamp only, not
the request, so a signed timestamp is a credential for that window, whatever the request. Measured
here: a signature 0.31 ms of the SuperNode's CPU, a verification 0.74 ms of the SuperLink's, on each
of the about 27 Fleet requests of an exchange with 3 SuperNodes.

- :func:`reuse_signed_timestamps` (the SuperNode, :mod:`hybridfl.runtime.flower.supernode`): the
  interceptor signs one timestamp and sends it with every request for :data:`REUSE_SECONDS`, then
  a fresh one. A request's timestamp is then at most that much older than it would be; the
  SuperLink's window check is unchanged.
- :func:`remember_verified` (the SuperLink, :mod:`hybridfl.runtime.flower.superlink`):
  ``authenticate_node``'s ``verify_signature`` remembers the (public key, timestamp, signature)
  triples it verified (the last :data:`REMEMBERED`); the same triple again is accepted without
  verifying it again (and :func:`loaded_once`: a key's bytes are loaded into a key object once).
  Verification is a deterministic function of the triple, so every request is accepted or refused
  exactly as by Flower's check: the timestamp window, the key's node and a signature never seen
  are all checked on every request as before; a signature that fails is never remembered.

Adversary: as Flower's SuperNode authentication (a party without the node's private key, which
cannot forge a signed timestamp; TLS keeps headers from others on the path). Reusing a signed
timestamp for a second does not widen the window in which a captured header would be accepted
(that is the SuperLink's 305 s). ``tests/test_flower_signing.py`` runs Flower's real interceptor
and SuperLink app with both and checks every acceptance and refusal against the stock ones.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

REUSE_SECONDS = 1.0
"""How long (seconds) a SuperNode sends the same signed timestamp."""

REMEMBERED = 4096
"""How many verified (public key, timestamp, signature) triples the SuperLink remembers."""


def reuse_signed_timestamps(module: Any = None, seconds: float = REUSE_SECONDS) -> None:
    """Make Flower's ``NodeAuthHttpInterceptor`` (its module ``module``, default Flower's own) sign a
    timestamp once per ``seconds``: its ``now`` returns the same time for ``seconds`` (monotonic
    clock) after it first returned it, and its ``sign_message`` returns the last signature again for
    the same key and message. Once per module."""
    if module is None:
        import flwr.supernode.node_auth_http_interceptor as module
    if getattr(module.sign_message, "hybridfl_reused", False):
        return
    real_now, real_sign = module.now, module.sign_message
    held: list = [None, 0.0]  # the timestamp sent, the monotonic time it was taken
    last: list = [None]  # (private key, message, signature)

    def now() -> Any:
        t = time.monotonic()
        stamp, at = held
        if stamp is None or t - at >= seconds:
            stamp = real_now()
            held[:] = [stamp, t]
        return stamp

    def sign_message(private_key: Any, message: bytes) -> bytes:
        hit = last[0]
        if hit is not None and hit[0] is private_key and hit[1] == message:
            return hit[2]
        signature = real_sign(private_key, message)
        last[0] = (private_key, bytes(message), signature)
        return signature

    sign_message.hybridfl_reused = True  # type: ignore[attr-defined]
    module.now, module.sign_message = now, sign_message


def remember_verified(original: Callable, size: int = REMEMBERED) -> Callable:
    """``verify_signature(public_key, message, signature) -> bool`` (Flower's ``original``) that
    remembers the last ``size`` triples it verified and returns True for them without verifying
    again; a triple that fails is verified every time. The key is remembered as the object itself
    (:func:`loaded_once` hands out one object per key's bytes; an entry keeps its key object alive,
    so no other object can take its ``id`` while the entry exists)."""
    seen: OrderedDict[tuple[int, bytes, bytes], Any] = OrderedDict()
    lock = threading.Lock()

    def verify_signature(public_key: Any, message: bytes, signature: bytes) -> bool:
        entry = (id(public_key), bytes(message), bytes(signature))
        with lock:
            if seen.get(entry) is public_key:
                seen.move_to_end(entry)
                return True
        ok = bool(original(public_key, message, signature))
        if ok:
            with lock:
                seen[entry] = public_key
                while len(seen) > size:
                    seen.popitem(last=False)
        return ok

    verify_signature.hybridfl_remembers = True  # type: ignore[attr-defined]
    return verify_signature


def loaded_once(original: Callable, size: int = REMEMBERED) -> Callable:
    """``bytes_to_public_key(data)`` (Flower's ``original``) that returns the same key object for the
    same bytes (the last ``size`` keys; key objects are immutable); bytes that do not load raise
    as before, every time."""
    return functools.lru_cache(maxsize=size)(original)


def install_remember_verified() -> None:
    """Replace ``verify_signature`` and ``bytes_to_public_key`` in Flower's SuperNode
    authentication (``flwr.superlink.routers.fleet.node_auth``) by :func:`remember_verified` and
    :func:`loaded_once`, once."""
    import flwr.superlink.routers.fleet.node_auth as node_auth

    if not getattr(node_auth.verify_signature, "hybridfl_remembers", False):
        node_auth.bytes_to_public_key = loaded_once(node_auth.bytes_to_public_key)
        node_auth.verify_signature = remember_verified(node_auth.verify_signature)
