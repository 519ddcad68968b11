"""The SuperNode authentication's signatures once a second (:mod:`hybridfl.runtime.flower.signing`),
played with Flower's real interceptor and SuperLink app: every request is accepted or refused as by
the stock check (a forged, stale, other node's or tampered header is refused whether or not its
triple was verified before), and the work is done once per signed timestamp."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import types
from base64 import b64decode, b64encode

import pytest

from hybridfl.runtime.flower import signing


def _interceptor_module():
    """A fresh copy of the names Flower's interceptor module uses (so the patch stays in the test)."""
    import flwr.supernode.node_auth_http_interceptor as real

    return types.SimpleNamespace(now=real.now, sign_message=real.sign_message)


def test_the_supernode_signs_one_timestamp_a_second(monkeypatch):
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, verify_signature

    module = _interceptor_module()
    calls = []
    real_sign = module.sign_message
    module.sign_message = lambda k, m: calls.append(m) or real_sign(k, m)
    clock = [1000.0]
    monkeypatch.setattr(signing.time, "monotonic", lambda: clock[0])
    signing.reuse_signed_timestamps(module, seconds=1.0)
    private, public = generate_key_pairs()

    def header():
        stamp = module.now().isoformat()
        return stamp, module.sign_message(private, stamp.encode("ascii"))

    first = header()
    clock[0] += 0.5
    assert header() == first  # within the second: the same timestamp and signature
    clock[0] += 0.6
    second = header()
    assert second[0] > first[0] and second[1] != first[1]  # a fresh one after it
    assert len(calls) == 2
    for stamp, sig in (first, second):
        assert verify_signature(public, stamp.encode("ascii"), sig)
    other, _ = generate_key_pairs()
    assert module.sign_message(other, second[0].encode("ascii")) != second[1]  # never another key's
    signing.reuse_signed_timestamps(module)  # once
    assert len(calls) == 3


def test_flowers_check_is_the_one_patched():
    """``authenticate_node`` checks the timestamp window before the signature, and verifies it
    through the module's ``verify_signature`` name (what :func:`install_remember_verified` replaces)."""
    from flwr.superlink.routers.fleet import node_auth

    src = inspect.getsource(node_auth.authenticate_node)
    assert src.index("Timestamp outside the allowed window") < src.index("verify_signature(")
    assert 'bytes_to_public_key(public_key), timestamp.encode("ascii"), signature' in src


def _requests(remember: bool, monkeypatch) -> tuple[list[int], int]:
    """Flower's SuperLink app (in-memory state), a registered SuperNode, and Fleet pulls with: its
    header, the same header again, a tampered signature, another (unregistered) key's valid header,
    a header 400 s old (signed and verified when it was fresh). Returns the status codes and how
    many times a signature was really verified."""
    import flwr.superlink.main as link
    import httpx
    from flwr.common.constant import TIMESTAMP_HEADER
    from flwr.proto.fleet_pb2 import (
        PullMessagesRequest,
    )
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.constant import FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
    from flwr.superlink.routers.fleet import node_auth

    from tests.test_flower_superlink_inline import _signed, registered_node

    verified = []
    real = node_auth.verify_signature
    monkeypatch.setattr(node_auth, "verify_signature", lambda *a: verified.append(1) or real(*a))
    monkeypatch.setattr(node_auth, "bytes_to_public_key", node_auth.bytes_to_public_key)  # restored after
    if remember:
        signing.install_remember_verified()
    app = link.create_app()
    private, public_key = generate_key_pairs()
    public = public_key_to_bytes(public_key)
    stranger, stranger_public = generate_key_pairs()
    proto = {"content-type": "application/protobuf"}
    codes: list[int] = []

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://superlink") as c:
            node = await registered_node(c, private, public)
            verified.clear()
            pull = PullMessagesRequest(node=Node(node_id=node)).SerializeToString()
            header = _signed(private, public)
            tampered = dict(header)
            sig = bytearray(b64decode(header[FLEET_HTTP_SIGNATURE_HEADER]))
            sig[-1] ^= 1
            tampered[FLEET_HTTP_SIGNATURE_HEADER] = b64encode(bytes(sig)).decode()
            for h in (header, header, tampered, _signed(stranger, public_key_to_bytes(stranger_public))):
                codes.append((await c.post("/v1/fleet/pull-messages", content=pull, headers=proto | h)).status_code)
            later = datetime.datetime.fromisoformat(header[TIMESTAMP_HEADER]) + datetime.timedelta(seconds=400)
            monkeypatch.setattr(node_auth, "now", lambda: later)
            codes.append((await c.post("/v1/fleet/pull-messages", content=pull, headers=proto | header)).status_code)

    asyncio.run(run())
    return codes, len(verified)


def test_the_superlink_accepts_and_refuses_as_flowers_check_verifying_each_triple_once():
    with pytest.MonkeyPatch.context() as mp:
        stock, stock_verified = _requests(False, mp)
    with pytest.MonkeyPatch.context() as mp:
        remembered, verified = _requests(True, mp)
    # the header, again, tampered, another key's (not registered to the node), 400 s later
    assert stock == remembered == [200, 200, 401, 401, 401]
    assert stock_verified == 4  # the stale header fails on its age, before any verification
    assert verified == 3  # the repeated header is not verified again; the tampered one is


def test_a_remembered_triple_is_tied_to_its_key_object():
    """:func:`signing.remember_verified` answers from memory only for the very key object it
    verified with (``loaded_once`` hands out one per key's bytes); a failed check is never
    remembered."""
    from flwr.supercore.primitives.asymmetric import (
        bytes_to_public_key,
        generate_key_pairs,
        public_key_to_bytes,
        sign_message,
        verify_signature,
    )

    calls = []
    verify = signing.remember_verified(lambda *a: calls.append(1) or verify_signature(*a), size=2)
    load = signing.loaded_once(bytes_to_public_key)
    private, public = generate_key_pairs()
    raw = public_key_to_bytes(public)
    key = load(raw)
    assert load(raw) is key
    sig = sign_message(private, b"t1")
    assert verify(key, b"t1", sig) and verify(key, b"t1", sig) and len(calls) == 1
    assert verify(bytes_to_public_key(raw), b"t1", sig) and len(calls) == 2  # another object: checked
    assert not verify(key, b"t2", sig) and not verify(key, b"t2", sig) and len(calls) == 4
    for t in (b"t3", b"t4"):  # pushes the first out (size 2)
        verify(key, t, sign_message(private, t))
    assert verify(key, b"t1", sig) and len(calls) == 7
