"""Small Fleet and ServerAppIo requests run their handlers on the SuperLink's event loop
(:class:`hybridfl.runtime.flower.superlink.InlineHandlers`): FastAPI and Flower still hand them to
Starlette's ``run_in_threadpool`` from exactly the modules the switch replaces it in (this fails
loudly when a new FastAPI or Flower changes that); Flower's real SuperLink app, stock and with the
switch, answers a SuperNode's real request sequence (signed register, activate, heartbeat, pull;
unsigned, malformed and oversized requests; a ServerApp request without its token; a Control API
request) identically, with the small requests' handlers on the event loop's thread and the others
in worker threads."""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
from base64 import b64encode

import pytest

from hybridfl.runtime.flower import superlink


def test_the_modules_still_hand_their_work_to_starlettes_run_in_threadpool():
    """Each module of :data:`~superlink.INLINE_MODULES` names Starlette's own ``run_in_threadpool``
    (the one the switch wraps); a new FastAPI or Flower that moves the hand-off elsewhere fails
    here, and :func:`~superlink.install_inline_handlers` then changes nothing."""
    from starlette.concurrency import run_in_threadpool

    for name in superlink.INLINE_MODULES:
        assert importlib.import_module(name).run_in_threadpool is run_in_threadpool, name


def _fresh(monkeypatch) -> None:
    """Undo :func:`superlink.install_inline_handlers` after the test (monkeypatch restores)."""
    from starlette.concurrency import run_in_threadpool

    for name in superlink.INLINE_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "run_in_threadpool", run_in_threadpool)


def test_install_changes_nothing_when_a_module_hands_off_elsewhere(monkeypatch, caplog):
    _fresh(monkeypatch)
    module = importlib.import_module(superlink.INLINE_MODULES[0])

    async def other(func, *a, **k):
        return func(*a, **k)

    monkeypatch.setattr(module, "run_in_threadpool", other)
    with caplog.at_level(logging.WARNING, logger="hybridfl.runtime.flower.superlink"):
        assert superlink.install_inline_handlers() is False
    assert "none inline" in caplog.text
    assert module.run_in_threadpool is other
    for name in superlink.INLINE_MODULES[1:]:
        assert not getattr(importlib.import_module(name).run_in_threadpool, "hybridfl_inline", False)


@pytest.mark.parametrize(
    "method,path,headers,marked",
    [
        ("POST", "/v1/fleet/pull-messages", [(b"content-length", b"12")], True),
        ("POST", "/v1/runtime/pull-object", [(b"Content-Length", b"65536")], True),
        ("POST", "/v1/runtime/push-object", [(b"content-length", b"65537")], False),
        ("POST", "/v1/fleet/push-object", [], False),  # no length: maybe streamed, maybe large
        ("POST", "/v1/fleet/push-object", [(b"content-length", b"1"), (b"content-length", b"1")], False),
        ("POST", "/v1/fleet/push-object", [(b"content-length", b"-1")], False),
        ("POST", "/v1/control/list-runs", [(b"content-length", b"0")], False),
        ("GET", "/v1/fleet/pull-messages", [(b"content-length", b"0")], False),
        ("POST", "/health", [(b"content-length", b"0")], False),
    ],
)
def test_which_requests_run_inline(method, path, headers, marked):
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    assert superlink.InlineHandlers(None).marks(scope) is marked
    assert superlink.InlineHandlers(None).marks({**scope, "type": "websocket"}) is False


def test_in_memory_state_only():
    assert superlink.in_memory(["--host", "0.0.0.0"])
    assert superlink.in_memory(["--database", ":flwr-in-memory:"])
    assert not superlink.in_memory(["--database", "/tmp/state.db"])
    assert not superlink.in_memory(["--database=/tmp/state.db"])
    assert not superlink.in_memory(["--database"])


def _signed(private_key, public: bytes) -> dict:
    """A SuperNode's signed identity headers, as Flower's ``NodeAuthHttpInterceptor`` makes them."""
    from flwr.common.constant import TIMESTAMP_HEADER
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.date import now
    from flwr.supercore.primitives.asymmetric import sign_message

    stamp = now().isoformat()
    return {
        FLEET_HTTP_PUBLIC_KEY_HEADER: b64encode(public).decode(),
        TIMESTAMP_HEADER: stamp,
        FLEET_HTTP_SIGNATURE_HEADER: b64encode(sign_message(private_key, stamp.encode("ascii"))).decode(),
    }


async def registered_node(client, private_key, public: bytes) -> int:
    """Register and activate a SuperNode with key ``public`` on the SuperLink app behind the httpx
    ``client`` (signed as Flower's SuperNode does); its node ID."""
    from flwr.proto.fleet_pb2 import ActivateNodeRequest, RegisterNodeFleetRequest, RegisterNodeFleetResponse

    proto = {"content-type": "application/protobuf"}
    r = await client.post(
        "/v1/fleet/register-node",
        content=RegisterNodeFleetRequest(public_key=public).SerializeToString(),
        headers=proto | _signed(private_key, public),
    )
    node = RegisterNodeFleetResponse.FromString(r.content).node_id
    activate = ActivateNodeRequest(public_key=public, heartbeat_interval=30).SerializeToString()
    await client.post("/v1/fleet/activate-node", content=activate, headers=proto | _signed(private_key, public))
    return node


def _session(inline: bool, monkeypatch) -> tuple[list, dict]:
    """Flower's SuperLink app (in-memory state), stock or with the gate and the inline switch, and a
    SuperNode's requests against it: (per request: status, content type, body with the node's
    random ID taken out), and the threads each Fleet handler ran in (``"loop"`` or ``"worker"``)."""
    import flwr.superlink.main as link
    import httpx
    from flwr.proto.fleet_pb2 import (
        ActivateNodeRequest,
        ActivateNodeResponse,
        PullMessagesRequest,
        RegisterNodeFleetRequest,
        RegisterNodeFleetResponse,
    )
    from flwr.proto.heartbeat_pb2 import SendNodeHeartbeatRequest
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
    from flwr.superlink.servicer.fleet import fleet_handlers
    from starlette.middleware import Middleware

    threads: dict[str, set] = {}
    for name in ("register_node", "activate_node", "send_node_heartbeat", "pull_messages", "push_object"):
        original = getattr(fleet_handlers, name)

        def record(*a, _name=name, _original=original, **k):
            where = "loop" if threading.get_ident() == loop_thread else "worker"
            threads.setdefault(_name, set()).add(where)
            return _original(*a, **k)

        monkeypatch.setattr(fleet_handlers, name, record)
    stock = link._get_middleware
    if inline:
        _fresh(monkeypatch)
        assert superlink.install_inline_handlers()
        monkeypatch.setattr(
            link, "_get_middleware", lambda: [Middleware(superlink.InlineHandlers), *superlink.gated(stock())]
        )
    app = link.create_app()
    private, public_key = generate_key_pairs()
    public = public_key_to_bytes(public_key)
    answers: list = []
    node: list[int] = []
    proto = {"content-type": "application/protobuf"}

    async def send(client, path: str, body: bytes, headers: dict) -> None:
        r = await client.post(path, content=body, headers=headers)
        out = r.content
        kind = {"register-node": RegisterNodeFleetResponse, "activate-node": ActivateNodeResponse}
        if path.rsplit("/", 1)[1] in kind and r.status_code == 200:
            got = kind[path.rsplit("/", 1)[1]].FromString(out)
            node.append(got.node_id)
            out = b"the node's ID" if got.node_id == node[0] > 0 else b"no node ID"
        answers.append((path, r.status_code, r.headers.get("content-type"), out))

    async def run() -> None:
        nonlocal loop_thread
        loop_thread = threading.get_ident()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://superlink") as c:
            await send(
                c,
                "/v1/fleet/register-node",
                RegisterNodeFleetRequest(public_key=public).SerializeToString(),
                proto | _signed(private, public),
            )
            activate = ActivateNodeRequest(public_key=public, heartbeat_interval=30)
            await send(c, "/v1/fleet/activate-node", activate.SerializeToString(), proto | _signed(private, public))
            me = Node(node_id=node[0])
            beat = SendNodeHeartbeatRequest(node=me, heartbeat_interval=30).SerializeToString()
            await send(c, "/v1/fleet/send-node-heartbeat", beat, proto | _signed(private, public))
            pull = PullMessagesRequest(node=me).SerializeToString()
            await send(c, "/v1/fleet/pull-messages", pull, proto | _signed(private, public))
            await send(c, "/v1/fleet/pull-messages", pull, proto)  # unsigned
            await send(c, "/v1/fleet/pull-messages", b"\xff\xff\xff", proto | _signed(private, public))
            await send(
                c, "/v1/fleet/pull-messages", pull, {"content-type": "application/json"} | _signed(private, public)
            )
            big = PushObjectRequest(
                node=me, run_id=1, object_id="0" * 64, object_content=b"\0" * superlink.INLINE_BODY_LIMIT
            )
            await send(c, "/v1/fleet/push-object", big.SerializeToString(), proto | _signed(private, public))
            await send(c, "/v1/runtime/get-nodes", b"", proto)  # the ServerApp's request without its token
            await send(c, "/v1/control/list-runs", b"", proto)

    loop_thread = 0
    asyncio.run(run())
    return answers, threads


def test_flowers_superlink_answers_the_same_with_handlers_inline():
    with pytest.MonkeyPatch.context() as mp:
        stock, stock_threads = _session(False, mp)
    with pytest.MonkeyPatch.context() as mp:
        inline, inline_threads = _session(True, mp)
    assert [a[:3] for a in stock] == [a[:3] for a in inline]
    for (path, status, _, body), (_, _, _, other) in zip(stock, inline):
        if path.startswith("/v1/control/"):
            continue  # the runs listing carries the time of the request
        assert body == other, path
    statuses = [a[1] for a in stock]
    assert statuses[:4] == [200, 200, 200, 200]  # a SuperNode's signed register, activate, heartbeat, pull
    assert statuses[4] == 401 and all(s >= 400 for s in statuses[5:9]) and statuses[9] == 200
    assert all(where == {"worker"} for where in stock_threads.values()), stock_threads
    assert inline_threads.pop("push_object") == {"worker"}  # larger than INLINE_BODY_LIMIT
    assert inline_threads == {
        n: {"loop"} for n in ("register_node", "activate_node", "send_node_heartbeat", "pull_messages")
    }
