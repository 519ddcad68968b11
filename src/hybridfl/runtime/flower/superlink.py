"""``python -m hybridfl.runtime.flower.superlink <flower-superlink args>``: the stock
``flower-superlink`` with its HTTP middleware gated by path.

Flower 1.41's SuperLink is one FastAPI app whose every request (Fleet API from the SuperNodes,
ServerAppIo from the ServerApp, Control API from ``flwr``) passes nine Starlette
``BaseHTTPMiddleware`` layers (``flwr.superlink.main._get_middleware``). Six of them do nothing
outside the Control API or without an optional plugin or setting, and a seventh (the SuperNode
authentication) nothing on the ServerApp's own requests, but each still costs a pass
through Starlette's ``BaseHTTPMiddleware`` machinery (a task group and streams per layer: about
0.18 ms of CPU per layer and request measured here, of the SuperLink's ~4.5 ms per request, and a
3-SuperNode exchange is about 72 requests). This launcher wraps each of those seven in
:class:`PathGate`, a plain ASGI layer that sends a request straight to the next layer when the
wrapped middleware would only pass it on, and through the middleware otherwise:

- ``ControlSensitiveResponseMiddleware``, ``ControlAuthenticationMiddleware``,
  ``ControlLicenseMiddleware``, ``ControlEventLogMiddleware``: only Control API paths (Flower's
  own ``_is_control_path``: under ``/v1/control/``; each of them passes every other request on
  untouched);
- ``RuntimeTracingMiddleware``: only when ``FLWR_TRACING_ENABLED=1`` at start (else it passes
  every request on);
- ``FleetEventLogMiddleware``: only when ``FLWR_ENABLE_EVENT_LOG=1`` at start (its plugin exists
  only then);
- ``NodeAuthMiddleware`` (the SuperNode authentication): every request but the ServerApp's
  (ServerAppIo, under ``/v1/runtime/``; Flower's middleware authenticates only paths under
  ``/v1/fleet/``, and passes every other request on untouched). Every Fleet request from a
  SuperNode still goes through it, unchanged.

The error translation and the protobuf translation stay on every request, and the SuperNode
authentication on every Fleet request: their own ``dispatch`` code, unchanged, but on Fleet and
ServerAppIo requests run by :class:`DirectDispatch` (the rest of the app called directly and its
one response handed back whole) instead of ``BaseHTTPMiddleware``'s task group and streams; the
Control API keeps the stock machinery. If Flower's middleware list is not exactly the one this was
written for (:data:`EXPECTED`), nothing is changed and a warning is logged;
``tests/test_flower_superlink.py`` fails loudly then, checks that each gated middleware passes on
what the gate skips, and runs Flower's real chain stock and as changed here on the same requests
(success, a streamed result, bad input, failing handlers, an unsigned Fleet request) to show the
same answers, so a new Flower is read before the pin moves.

With the SuperLink's state in memory (Flower's default ``--database``), small Fleet and
ServerAppIo requests (a body of at most :data:`INLINE_BODY_LIMIT` bytes: polls, pulls, confirms,
small objects) also run their handler, its plain (synchronous) dependencies and the SuperNode's
signature check on the event loop (:class:`InlineHandlers`), not each in a worker thread of its
own: FastAPI hands every synchronous dependency, Flower's protobuf route every synchronous handler
and its SuperNode authentication the signature check to a thread (``run_in_threadpool``, four or
five hand-offs per request, about a fifth of the SuperLink's CPU per request measured with
``py-spy``); these handlers only read and write the in-memory state under its locks and return.
A larger request (an object push that is hashed) and every Control API request keep the worker
threads. :func:`install_inline_handlers` replaces ``run_in_threadpool`` in exactly the modules that
call it for these requests (:data:`INLINE_MODULES`), and only if each still names Starlette's own;
``tests/test_flower_superlink_inline.py`` pins that and runs Flower's real app both ways.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

EXPECTED = (
    "ControlSensitiveResponseMiddleware",
    "BaseHTTPMiddleware",  # dispatch=http_error_translator
    "ControlAuthenticationMiddleware",
    "ControlLicenseMiddleware",
    "ProtobufTranslationMiddleware",
    "RuntimeTracingMiddleware",
    "ControlEventLogMiddleware",
    "NodeAuthMiddleware",
    "FleetEventLogMiddleware",
)
"""Flower 1.41's SuperLink middleware, outermost first (the classes' names)."""


def _never(path: str) -> bool:
    return False


SERVERAPPIO = "/v1/runtime/"
"""The path prefix of Flower 1.41's ServerAppIo API (the ServerApp's requests)."""


def _not_serverappio(path: str) -> bool:
    return not path.startswith(SERVERAPPIO)


def gates() -> dict[str, Callable[[str], bool]]:
    """Middleware class name -> the paths it must see (the others skip it), for the seven that pass
    every other request on (module docstring); the two with a setting are gated only when it is off.
    The Control ones use Flower's own test of a Control path, the one they make before doing
    anything (looked up once, here, at start)."""
    from flwr.superlink.routers.control.middlewares import _is_control_path as control

    out: dict[str, Callable[[str], bool]] = {
        "ControlSensitiveResponseMiddleware": control,
        "ControlAuthenticationMiddleware": control,
        "ControlLicenseMiddleware": control,
        "ControlEventLogMiddleware": control,
        "NodeAuthMiddleware": _not_serverappio,
    }
    if os.getenv("FLWR_TRACING_ENABLED") != "1":
        out["RuntimeTracingMiddleware"] = _never
    if os.getenv("FLWR_ENABLE_EVENT_LOG") != "1":
        out["FleetEventLogMiddleware"] = _never
    return out


class PathGate:
    """A plain ASGI middleware: an HTTP request whose path ``applies`` rejects goes straight to
    ``app``; every other request (and every non-HTTP scope) through ``inner(app, **kwargs)``."""

    def __init__(self, app: Any, inner: type, applies: Callable[[str], bool], **kwargs: Any):
        self.app = app
        self.inner = inner(app, **kwargs)
        self.applies = applies

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and not self.applies(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        await self.inner(scope, receive, send)


async def collect(app: Any, scope: dict, receive: Any) -> tuple[dict | None, bytes]:
    """Run the ASGI ``app`` on ``scope`` and ``receive`` and keep its answer instead of sending it:
    its ``http.response.start`` message (None if it sent none) and its whole body."""
    start: dict | None = None
    chunks: list[bytes] = []

    async def keep(message: dict) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, keep)
    return start, b"".join(chunks)


DIRECT = ("BaseHTTPMiddleware", "ProtobufTranslationMiddleware", "NodeAuthMiddleware")
"""The middlewares (of :data:`EXPECTED`) that do work on Fleet or ServerAppIo requests, whose
``dispatch`` :class:`DirectDispatch` runs there without Starlette's streaming machinery."""


class DirectDispatch:
    """A plain ASGI host for a Starlette ``BaseHTTPMiddleware``'s ``dispatch`` on unary requests:
    the same ``dispatch(request, call_next)`` (Flower's code, unchanged), with a ``call_next`` that
    runs the rest of the app directly and hands back its response whole, instead of through a task
    group, memory streams and a streaming response per layer (``BaseHTTPMiddleware.__call__``:
    most of each layer's ~0.18 ms of CPU per request).

    Used on the paths ``stock`` rejects (Fleet and ServerAppIo: Flower's protobuf routes, whose
    handlers each return one protobuf message; a streamed result is built by the protobuf
    translation's own ``dispatch`` after ``call_next``, and sent as it comes). Every other request
    (the Control API, whose routes stream, and any non-HTTP scope) goes through the stock
    middleware ``middleware(app, **kwargs)``. As with ``BaseHTTPMiddleware``: the body is readable
    by ``dispatch`` and then again by the app; an exception the app raises comes out of
    ``call_next``; the request state is shared (``scope["state"]``)."""

    def __init__(self, app: Any, middleware: type, stock: Callable[[str], bool], **kwargs: Any):
        self.app = app
        self.inner = middleware(app, **kwargs)
        self.dispatch = self.inner.dispatch_func
        self.stock = stock
        from starlette.requests import Request
        from starlette.responses import Response

        self.request, self.response = Request, Response  # looked up once, not per request

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or self.stock(str(scope.get("path", ""))):
            await self.inner(scope, receive, send)
            return
        request = self.request(scope, receive)
        replayed = False

        async def replay() -> dict:
            # the body once more if ``dispatch`` read it (Starlette's Request keeps it as ``_body``,
            # as BaseHTTPMiddleware's own cached request relies on), else straight from the client
            nonlocal replayed
            if replayed or not hasattr(request, "_body"):
                return await receive()
            replayed = True
            return {"type": "http.request", "body": request._body, "more_body": False}

        async def call_next(_request: Any) -> Any:
            start, body = await collect(self.app, scope, replay)
            if start is None:
                raise RuntimeError("No response returned.")
            response = self.response(body, status_code=start["status"])
            response.raw_headers = list(start["headers"])
            return response

        response = await self.dispatch(request, call_next)
        await response(scope, receive, send)


def gated(middleware: list) -> list:
    """Flower's middleware list with the layers of :func:`gates` wrapped in :class:`PathGate` and
    those of :data:`DIRECT` run by :class:`DirectDispatch` outside the Control API; the list
    unchanged (and a warning) if its classes are not :data:`EXPECTED` (after any extension
    middleware Flower puts first)."""
    from flwr.superlink.routers.control.middlewares import _is_control_path as control
    from starlette.middleware import Middleware

    names = tuple(m.cls.__name__ for m in middleware)
    if names[-len(EXPECTED) :] != EXPECTED:
        log.warning("hybridfl: Flower's SuperLink middleware is not the one expected; none is gated: %s", names)
        return middleware
    skip = gates()
    out = []
    for m in middleware:
        name = m.cls.__name__
        applies = skip.get(name)
        if m.args or (applies is None and name not in DIRECT):
            out.append(m)
            continue
        inner, kwargs = m.cls, dict(m.kwargs)
        if name in DIRECT:
            inner, kwargs = DirectDispatch, {"middleware": m.cls, "stock": control, **kwargs}
        if applies is None:
            out.append(Middleware(inner, **kwargs))
        else:
            out.append(Middleware(PathGate, inner=inner, applies=applies, **kwargs))
    return out


INLINE_BODY_LIMIT = 64 * 1024
"""Largest request body (bytes, from ``content-length``) whose handler :class:`InlineHandlers` runs
on the event loop."""

_inline = contextvars.ContextVar("hybridfl_inline_handler", default=False)

INLINE_PREFIXES = ("/v1/fleet/", SERVERAPPIO)
"""The paths whose small requests run inline: the Fleet API (SuperNodes) and ServerAppIo (the
ServerApp)."""


class InlineHandlers:
    """A plain ASGI layer that marks (a context variable of this request's task only) each small
    ``POST`` to the Fleet API or ServerAppIo: a ``content-length`` of at most ``limit`` bytes, under
    :data:`INLINE_PREFIXES`. Marked requests run their synchronous dependencies and handler on the
    event loop (:func:`run_inline_when_marked`); every other request as before."""

    def __init__(self, app: Any, limit: int = INLINE_BODY_LIMIT):
        self.app = app
        self.limit = int(limit)

    def marks(self, scope: dict) -> bool:
        """Whether ``scope`` (an ASGI scope) is a request to run inline."""
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return False
        if not str(scope.get("path", "")).startswith(INLINE_PREFIXES):
            return False
        sizes = [v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"]
        return len(sizes) == 1 and sizes[0].isdigit() and int(sizes[0]) <= self.limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not self.marks(scope):
            await self.app(scope, receive, send)
            return
        token = _inline.set(True)
        try:
            await self.app(scope, receive, send)
        finally:
            _inline.reset(token)


def run_inline_when_marked(original: Callable) -> Callable:
    """Starlette's ``run_in_threadpool`` (``original``) that calls ``func`` on the event loop
    instead when this request is marked by :class:`InlineHandlers`."""

    async def run_in_threadpool(func: Callable, *args: Any, **kwargs: Any) -> Any:
        if _inline.get():
            return func(*args, **kwargs)
        return await original(func, *args, **kwargs)

    run_in_threadpool.hybridfl_inline = True  # type: ignore[attr-defined]
    return run_in_threadpool


INLINE_MODULES = (
    "fastapi.dependencies.utils",
    "flwr.supercore.protobuf.routing",
    "flwr.superlink.routers.fleet.node_auth",
)
"""The modules whose ``run_in_threadpool`` runs the Fleet and ServerAppIo routes' synchronous
dependencies (FastAPI's ``solve_dependencies``), handlers (Flower's ``ProtobufRoute``) and the
SuperNode's signature check (Flower's ``NodeAuthMiddleware``)."""


def install_inline_handlers() -> bool:
    """Replace ``run_in_threadpool`` in :data:`INLINE_MODULES` by :func:`run_inline_when_marked`,
    once; nothing (and a warning) unless each still names Starlette's own. Returns whether the
    handlers of marked requests now run inline."""
    import importlib

    from starlette.concurrency import run_in_threadpool

    modules = [importlib.import_module(name) for name in INLINE_MODULES]
    found = [getattr(m, "run_in_threadpool", None) for m in modules]
    if all(getattr(f, "hybridfl_inline", False) for f in found):
        return True
    if any(f is not run_in_threadpool for f in found):
        log.warning("hybridfl: FastAPI or Flower no longer hand handlers to run_in_threadpool as expected; none inline")
        return False
    for m in modules:
        m.run_in_threadpool = run_inline_when_marked(run_in_threadpool)
    return True


FLEET_POLL = "/v1/fleet/pull-messages"
"""A SuperNode's poll for its next message (Flower 1.41's Fleet API)."""

SERVERAPPIO_POLL = SERVERAPPIO + "pull-messages"
"""The ServerApp's poll for replies (Flower 1.41's ServerAppIo API)."""

HOLD_SECONDS = 0.5
"""Longest time (seconds) :class:`HeldPolls` holds a poll that finds nothing."""

WAKES = {SERVERAPPIO_POLL: FLEET_POLL, FLEET_POLL: SERVERAPPIO_POLL}
"""A poll arriving on the key's path wakes the polls held on the value's path (:class:`HeldPolls`),
if its side pushed since (:data:`PUSHES`)."""

PUSHES = {
    SERVERAPPIO + "push-messages": FLEET_POLL,
    SERVERAPPIO + "push-object": FLEET_POLL,
    "/v1/fleet/push-messages": SERVERAPPIO_POLL,
    "/v1/fleet/push-object": SERVERAPPIO_POLL,
}
"""A push on the key's path is news for the polls held on the value's path."""


def _empty_poll(path: str, start: dict | None, body: bytes) -> bool:
    """Whether a poll's captured response is a successful one that lists no message."""
    if start is None or start.get("status") != 200:
        return False
    if path == FLEET_POLL:
        from flwr.proto.fleet_pb2 import PullMessagesResponse as Response
    else:
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse as Response
    try:
        return len(Response.FromString(body).messages_list) == 0
    except Exception:  # not a protobuf answer: sent on as it is
        return False


class HeldPolls:
    """A plain ASGI layer that holds a poll which finds nothing (long polling), instead of
    answering at once and letting the poller sleep and ask again.

    A ``POST`` to :data:`FLEET_POLL` (a SuperNode asking for its next message) or
    :data:`SERVERAPPIO_POLL` (the ServerApp asking for replies) runs the rest of the app; if the
    answer is a success listing no message, the request waits (a coroutine on the event loop,
    no thread) until another poll arrives that can mean there is something new, or ``hold``
    seconds have passed, and the rest of the app is run again on the same request: its answer
    then is what a poll sent at that moment would get. What can mean something new
    (:data:`WAKES`): the ServerApp polls for replies right after it has pushed its messages and
    all their objects (Flower's ``HttpGrid.push_messages`` returns only then), so its poll wakes
    the SuperNodes' held polls; a SuperNode polls again right after it has pushed a reply and its
    objects (Flower's SuperNode loop), so its poll wakes the ServerApp's held poll. Only requests
    the app accepts count (:meth:`accepted`): an unsigned or unauthorised push or poll wakes nothing,
    so no one outside the federation can make the SuperLink run the held polls again. A poll wakes
    only if its side pushed something (:data:`PUSHES`) since the last wake: idle SuperNodes polling
    again at the end of their holds do not wake the ServerApp, nor the ServerApp's polls for the
    rest of the replies every SuperNode (one wake of the n held polls per exchange, not per reply,
    so an exchange with n SuperNodes runs O(n) polls, not O(n^2)). A poll that
    finds a message, an error, and every other request are answered as before, unchanged. A
    client that disconnects while its poll is held gets nothing, and the app is not run again for
    it (no message is handed out to a client that is gone).

    Why: with polling, a message waits on average half a poll interval at each end of an
    exchange, and every empty poll costs the SuperLink a request (about 1.5 ms of its CPU here);
    the SuperNodes' and the ServerApp's poll intervals keep their meaning as the most time
    between the starts of two polls (:mod:`hybridfl.runtime.flower.supernode`,
    :class:`~hybridfl.runtime.flower.bridge.FlowerTransport`), so they poll again at once after
    a held poll.
    """

    def __init__(self, app: Any, hold: float = HOLD_SECONDS):
        self.app = app
        self.hold = float(hold)
        self.generation = dict.fromkeys(WAKES, 0)
        self.events: dict[str, Any] = {}
        self.news = dict.fromkeys(WAKES, False)  # a push since the last wake, per held path

    def wake(self, path: str) -> None:
        """Run the polls held on ``path`` again."""
        self.generation[path] += 1
        event = self.events.pop(path, None)
        if event is not None:
            event.set()

    def accepted(self, path: str, start: dict | None) -> None:
        """A request on ``path`` was answered with ``start``: a push the app accepted is news for
        the other side's polls; a poll it accepted wakes them if there is news. A request the app
        refuses (no SuperNode signature, no ServerApp token, a bad body) wakes nothing."""
        if start is None or start.get("status") != 200:
            return
        if path in PUSHES:
            self.news[PUSHES[path]] = True
        elif path in WAKES and self.news[WAKES[path]]:
            self.news[WAKES[path]] = False
            self.wake(WAKES[path])

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = str(scope.get("path", "")) if scope.get("type") == "http" and scope.get("method") == "POST" else ""
        if path in PUSHES:

            async def noting(message: dict) -> None:
                if message["type"] == "http.response.start":
                    self.accepted(path, message)
                await send(message)

            await self.app(scope, receive, noting)
            return
        if path not in WAKES or self.hold <= 0:
            await self.app(scope, receive, send)
            return
        await self._held(path, scope, receive, send)

    async def _held(self, path: str, scope: dict, receive: Any, send: Any) -> None:
        import asyncio

        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold
        gone: Any = None
        waiting: Any = None
        try:
            first = True
            while True:
                seen = self.generation[path]
                start, answer = await self._run(dict(scope), body)
                if first:  # the poll is accepted (authenticated): it may wake the other side
                    first = False
                    self.accepted(path, start)
                left = deadline - loop.time()
                if left <= 0 or not _empty_poll(path, start, answer):
                    break
                if seen != self.generation[path]:
                    continue  # woken while the app ran: look again at once
                event = self.events.setdefault(path, asyncio.Event())
                gone = gone or asyncio.ensure_future(receive())
                waiting = asyncio.ensure_future(event.wait())
                done, _ = await asyncio.wait({gone, waiting}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if gone in done:
                    return
        finally:
            for task in (gone, waiting):
                if task is not None:
                    task.cancel()
        if start is None:
            raise RuntimeError("No response returned.")
        await send(start)
        await send({"type": "http.response.body", "body": answer, "more_body": False})

    async def _run(self, scope: dict, body: bytes) -> tuple[dict | None, bytes]:
        """The rest of the app on this request (its body replayed): its start message and body."""
        import asyncio

        sent = False

        async def replay() -> dict:
            nonlocal sent
            if sent:  # as a connection's: nothing more until it closes (the app cancels the wait)
                await asyncio.Event().wait()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await collect(self.app, scope, replay)


def in_memory(args: list[str]) -> bool:
    """Whether a ``flower-superlink`` started with ``args`` keeps its state in memory (no
    ``--database``, or Flower's in-memory name)."""
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME

    for i, a in enumerate(args):
        if a == "--database":
            return i + 1 < len(args) and args[i + 1] == FLWR_IN_MEMORY_DB_NAME
        if a.startswith("--database="):
            return a.split("=", 1)[1] == FLWR_IN_MEMORY_DB_NAME
    return True


def install(inline: bool = False) -> None:
    """Gate this process's SuperLink middleware (``flwr.superlink.main._get_middleware``, read by
    its ``create_app`` at start), once, with the polls held (:class:`HeldPolls`) and verified
    SuperNode signatures remembered (:func:`~hybridfl.runtime.flower.signing.remember_verified`);
    ``inline``: also run small Fleet and ServerAppIo requests' handlers on the event loop
    (:class:`InlineHandlers`, :func:`install_inline_handlers`)."""
    import flwr.superlink.main as link
    from starlette.middleware import Middleware

    from hybridfl.runtime.flower.signing import install_remember_verified

    original = link._get_middleware
    if getattr(original, "hybridfl_gated", False):
        return
    inline = inline and install_inline_handlers()
    install_remember_verified()

    def get_middleware() -> list:
        out = gated(original())
        out = [Middleware(InlineHandlers), *out] if inline else out
        return [Middleware(HeldPolls), *out]

    get_middleware.hybridfl_gated = True  # type: ignore[attr-defined]
    link._get_middleware = get_middleware


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-superlink`` with ``argv`` (default ``sys.argv[1:]``) after :func:`install`
    (with the handlers of small requests inline when its state is in memory)."""
    args = list(sys.argv[1:] if argv is None else argv)
    install(inline=in_memory(args))
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *args]
    flower_superlink()


if __name__ == "__main__":
    main()
