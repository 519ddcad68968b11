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

PATHS = ("/v1/fleet/pull-messages", "/v1/fleet/push-object", "/v1/serverappio/pull-messages")


def _scope(path: str, app: Starlette) -> dict:
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
        "state": {},
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
    assert [m.cls.__name__ for m in gated].count("PathGate") == 6
    kept = [m.cls.__name__ for m in gated if m.cls is not superlink.PathGate]
    assert kept == ["BaseHTTPMiddleware", "ProtobufTranslationMiddleware", "NodeAuthMiddleware"]


@pytest.mark.parametrize("path", PATHS)
def test_each_gated_middleware_passes_fleet_and_serverappio_requests_on_untouched(path, monkeypatch):
    """Each of the six gated middlewares, run for real around an endpoint on a Fleet or
    ServerAppIo request (no tracing, no event log, as the gate assumes): the endpoint gets the
    request body and the client gets exactly the endpoint's response, as with the middleware
    skipped. So the gate changes nothing on these paths."""
    monkeypatch.delenv("FLWR_TRACING_ENABLED", raising=False)
    monkeypatch.delenv("FLWR_ENABLE_EVENT_LOG", raising=False)
    import flwr.superlink.main as link

    app = Starlette()
    classes = {m.cls.__name__: m for m in link._get_middleware()}
    skip = superlink.gates()
    assert sorted(skip) == sorted(
        set(superlink.EXPECTED) - {"BaseHTTPMiddleware", "ProtobufTranslationMiddleware", "NodeAuthMiddleware"}
    )
    for name in skip:
        assert not skip[name](path)  # the gate skips it here
        seen_direct: list[bytes] = []
        seen_through: list[bytes] = []
        asyncio.run(_call(_endpoint(seen_direct), _scope(path, app)))
        m = classes[name]
        through = asyncio.run(_call(m.cls(_endpoint(seen_through), *m.args, **m.kwargs), _scope(path, app)))
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


def test_tracing_or_event_log_on_keeps_their_middleware(monkeypatch):
    monkeypatch.setenv("FLWR_TRACING_ENABLED", "1")
    monkeypatch.setenv("FLWR_ENABLE_EVENT_LOG", "1")
    skip = superlink.gates()
    assert "RuntimeTracingMiddleware" not in skip and "FleetEventLogMiddleware" not in skip
    assert len(skip) == 4


def test_an_unknown_middleware_list_is_left_alone(caplog):
    """A Flower whose middleware differs: nothing gated, one warning."""

    class Other:
        def __init__(self, app):
            self.app = app

    listed = [Middleware(Other)]
    with caplog.at_level(logging.WARNING, logger="hybridfl.runtime.flower.superlink"):
        assert superlink.gated(listed) is listed
    assert "not the one expected" in caplog.text
