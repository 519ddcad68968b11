"""The gated SuperLink (:mod:`hybridfl.runtime.flower.superlink`): Flower's SuperLink middleware is
exactly the list the gate was written for (this fails loudly when Flower changes it), each gated
middleware passes a Fleet or ServerAppIo request on untouched (so skipping it changes nothing),
Control API requests still go through it, and an unknown list is left alone. A deployed run over
the gated SuperLink equals the simulation: ``tests/test_flower.py`` and
``tests/test_flower_executor.py`` (``LocalFederation`` starts it by default)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware

from hybridfl.runtime.flower import superlink

PATHS = ("/v1/fleet/pull-messages", "/v1/fleet/push-object", "/v1/runtime/pull-messages", "/v1/runtime/push-object")


def _scope(path: str, app: Starlette, parsed=None) -> dict:
    """An HTTP request scope; ``parsed``: the protobuf request that Flower's protobuf translation
    puts in the request state (``request.state.protobuf_request``)."""
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "headers": [(b"content-type", b"application/protobuf")],
        "query_string": b"",
        "http_version": "1.1",
        "scheme": "https",
        "server": ("127.0.0.1", 9092),
        "client": ("127.0.0.1", 40000),
        "root_path": "",
        "app": app,
        "state": {} if parsed is None else {"protobuf_request": parsed},
    }


async def _call(asgi, scope: dict) -> list[dict]:
    """Send one request with body ``b"abc"`` through ``asgi``; the messages it sent back."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"abc", "more_body": False}

    async def send(m: dict) -> None:
        sent.append(m)

    await asgi(scope, receive, send)
    return sent


def _endpoint(seen: list[bytes]):
    async def app(scope, receive, send):
        body = (await receive())["body"]
        seen.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-hybridfl", b"1")]})
        await send({"type": "http.response.body", "body": b"reply:" + body})

    return app


def test_flower_superlink_middleware_is_the_one_gated():
    """Flower's SuperLink middleware, outermost first, is :data:`~superlink.EXPECTED`; if a new
    Flower changes it, read the new middleware before raising the pin (the gate then gates nothing)."""
    import flwr.superlink.main as link

    names = tuple(m.cls.__name__ for m in link._get_middleware())
    assert names == superlink.EXPECTED
    gated = superlink.gated(link._get_middleware())
    assert [m.cls.__name__ for m in gated].count("PathGate") == 7
    direct = [
        m.kwargs["middleware"].__name__ for m in gated if superlink.DirectDispatch in (m.cls, m.kwargs.get("inner"))
    ]
    assert direct == list(superlink.DIRECT)  # the SuperNode authentication behind its path gate


@pytest.mark.parametrize("path", PATHS)
def test_each_gated_middleware_passes_what_it_skips_on_untouched(path, monkeypatch):
    """Each of the seven gated middlewares, run for real around an endpoint on each Fleet or
    ServerAppIo request the gate lets skip it (no tracing, no event log, as the gate assumes; the
    request parsed as the protobuf translation leaves it): the endpoint gets the request body and
    the client gets exactly the endpoint's response, as with the middleware skipped. So the gate
    changes nothing on these paths."""
    from flwr.proto.fleet_pb2 import PullMessagesRequest

    monkeypatch.delenv("FLWR_TRACING_ENABLED", raising=False)
    monkeypatch.delenv("FLWR_ENABLE_EVENT_LOG", raising=False)
    import flwr.superlink.main as link

    app = Starlette()
    classes = {m.cls.__name__: m for m in link._get_middleware()}
    skip = superlink.gates()
    assert sorted(skip) == sorted(set(superlink.EXPECTED) - {"BaseHTTPMiddleware", "ProtobufTranslationMiddleware"})
    assert [n for n in skip if skip[n](path)] == (["NodeAuthMiddleware"] if path.startswith("/v1/fleet/") else [])
    for name in [n for n in skip if not skip[n](path)]:
        seen_direct: list[bytes] = []
        seen_through: list[bytes] = []
        asyncio.run(_call(_endpoint(seen_direct), _scope(path, app, PullMessagesRequest())))
        m = classes[name]
        scope = _scope(path, app, PullMessagesRequest())
        through = asyncio.run(_call(m.cls(_endpoint(seen_through), *m.args, **m.kwargs), scope))
        assert seen_through == seen_direct == [b"abc"], name
        start = [x for x in through if x["type"] == "http.response.start"][0]
        assert start["status"] == 200 and (b"x-hybridfl", b"1") in start["headers"], name
        body = b"".join(x.get("body", b"") for x in through if x["type"] == "http.response.body")
        assert body == b"reply:abc", name


def test_the_gate_skips_only_what_it_may():
    """A Control API request goes through a gated control middleware; a Fleet request goes around
    it; with Flower's tracing or event log switched on, those two middlewares are not gated."""
    calls: list[str] = []

    class Recorder:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            calls.append(scope["path"])
            await self.app(scope, receive, send)

    gate = superlink.PathGate(_endpoint([]), Recorder, superlink.gates()["ControlAuthenticationMiddleware"])
    app = Starlette()
    asyncio.run(_call(gate, _scope("/v1/control/start-run", app)))
    asyncio.run(_call(gate, _scope("/v1/fleet/pull-messages", app)))
    assert calls == ["/v1/control/start-run"]


def test_a_fleet_request_without_authentication_is_still_refused_through_the_gate():
    """Flower's SuperNode authentication behind the gate: a Fleet request without the signed
    headers is refused (401) before the endpoint sees it; the ServerApp's request goes around it."""
    from fastapi import HTTPException
    from flwr.proto.fleet_pb2 import PullMessagesRequest
    from flwr.superlink.routers.fleet.node_auth import NodeAuthMiddleware

    seen: list[bytes] = []
    gate = superlink.PathGate(_endpoint(seen), NodeAuthMiddleware, superlink.gates()["NodeAuthMiddleware"])
    app = Starlette()
    with pytest.raises(HTTPException) as err:
        asyncio.run(_call(gate, _scope("/v1/fleet/pull-messages", app, PullMessagesRequest())))
    assert err.value.status_code == 401 and seen == []
    asyncio.run(_call(gate, _scope("/v1/runtime/pull-messages", app, PullMessagesRequest())))
    assert seen == [b"abc"]


def test_tracing_or_event_log_on_keeps_their_middleware(monkeypatch):
    monkeypatch.setenv("FLWR_TRACING_ENABLED", "1")
    monkeypatch.setenv("FLWR_ENABLE_EVENT_LOG", "1")
    skip = superlink.gates()
    assert "RuntimeTracingMiddleware" not in skip and "FleetEventLogMiddleware" not in skip
    assert len(skip) == 5


def test_an_unknown_middleware_list_is_left_alone(caplog):
    """A Flower whose middleware differs: nothing gated, one warning."""

    class Other:
        def __init__(self, app):
            self.app = app

    listed = [Middleware(Other)]
    with caplog.at_level(logging.WARNING, logger="hybridfl.runtime.flower.superlink"):
        assert superlink.gated(listed) is listed
    assert "not the one expected" in caplog.text


def _route(mode: str):
    """An ASGI endpoint as Flower's protobuf routes behave (reads the parsed request from the
    request state, reads the body again, leaves its result in the state and sends a placeholder
    response), or one that fails as ``mode`` says."""
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.error import ApiErrorCode, FlowerError
    from starlette.responses import JSONResponse

    async def app(scope, receive, send):
        body = (await receive()).get("body", b"")
        if mode == "raise":
            raise RuntimeError("a handler bug")
        if mode == "flower_error":
            raise FlowerError(ApiErrorCode.INVALID_PROTOBUF_PAYLOAD, "secret detail")
        if mode == "not_found":
            await JSONResponse({"detail": "Not Found"}, status_code=404)(scope, receive, send)
            return
        parsed = scope["state"]["protobuf_request"]
        reply = Node(node_id=1000 * len(body) + parsed.ByteSize())
        scope["state"]["protobuf_response"] = iter([reply, reply]) if mode == "stream" else reply
        await JSONResponse(None, headers={"x-hybridfl": str(len(body))})(scope, receive, send)

    return app


def _chain(middleware: list, app):
    for m in reversed(middleware):
        app = m.cls(app, *m.args, **m.kwargs)
    return app


CASES = [  # (path, content type, body (None: a valid request), endpoint mode, status (None: an error))
    ("/v1/runtime/pull-messages", b"application/protobuf", None, "ok", 200),
    ("/v1/runtime/pull-messages", b"application/protobuf", None, "stream", 200),
    ("/v1/runtime/pull-messages", b"application/protobuf", b"\xff\xff\xff", "ok", None),
    ("/v1/runtime/pull-messages", b"application/json", None, "ok", None),
    ("/v1/runtime/pull-messages", b"application/protobuf", None, "raise", 500),
    ("/v1/runtime/pull-messages", b"application/protobuf", None, "flower_error", None),
    ("/v1/runtime/no-such-route", b"application/protobuf", None, "not_found", 404),
    ("/v1/fleet/pull-messages", b"application/protobuf", None, "ok", 401),
    ("/v1/fleet/pull-messages", b"application/protobuf", b"\xff\xff\xff", "ok", None),
    ("/v1/runtime/pull-messages", b"application/protobuf", "disconnect", "ok", 500),
    ("/v1/runtime/no-such-route", b"application/protobuf", "disconnect", "not_found", 404),
]


@pytest.mark.parametrize("path,ctype,body,mode,status", CASES)
def test_the_gated_chain_answers_every_request_as_the_stock_chain(path, ctype, body, mode, status, monkeypatch):
    """Flower's real middleware chain, stock and as :func:`superlink.gated` builds it (the path
    gates and :class:`superlink.DirectDispatch` for the error translation, the protobuf translation
    and the SuperNode authentication), around the same route, on ServerAppIo and Fleet requests
    that succeed, stream, carry a bad protobuf body or content type, hit a failing handler or no
    route, or lack the SuperNode's signed headers: the client gets the same status, headers and
    body from both."""
    monkeypatch.delenv("FLWR_TRACING_ENABLED", raising=False)
    monkeypatch.delenv("FLWR_ENABLE_EVENT_LOG", raising=False)
    import flwr.superlink.main as link
    from flwr.proto.fleet_pb2 import PullMessagesRequest
    from flwr.proto.node_pb2 import Node

    stock = link._get_middleware()
    gated = superlink.gated(stock)
    assert [m.cls.__name__ for m in gated].count("DirectDispatch") == 2
    data = PullMessagesRequest(node=Node(node_id=7)).SerializeToString() if body is None else body
    answers = []
    for middleware in (stock, gated):
        scope = _scope(path, Starlette())
        scope["headers"] = [(b"content-type", ctype)]
        sent: list[dict] = []
        asked: list[int] = []

        async def receive() -> dict:
            asked.append(1)
            if body == "disconnect":  # the client went away before sending its body
                return {"type": "http.disconnect"}
            if len(asked) > 1:  # the body was read: the client waits, as a real one does
                await asyncio.Event().wait()
            return {"type": "http.request", "body": data, "more_body": False}

        async def send(m: dict) -> None:
            sent.append(m)

        asyncio.run(_chain(middleware, _route(mode))(scope, receive, send))
        start = [m for m in sent if m["type"] == "http.response.start"]
        assert len(start) == 1
        answers.append(
            (start[0]["status"], sorted(start[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:]))
        )
    assert answers[0] == answers[1]
    got, headers, out = answers[0]
    assert got == status if status is not None else got >= 400
    if got == 200:
        assert (b"x-hybridfl", str(len(data)).encode()) in headers and out
    assert b"secret detail" not in out and b"a handler bug" not in out
