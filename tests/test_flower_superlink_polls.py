"""The SuperLink's held polls (:class:`hybridfl.runtime.flower.superlink.HeldPolls`): an empty poll
waits for news instead of being answered at once; what it answers is what the app answers then.

The layer's behaviour is played against a stand-in app whose state the test controls (a poll
finding a message, an empty poll, a wake, a client that leaves, errors, other paths), and once
against Flower's real SuperLink app (a registered SuperNode's empty poll: the same answer as the
stock app, after the hold)."""

from __future__ import annotations

import asyncio
import time

import pytest

from hybridfl.runtime.flower import superlink

FLEET, APPIO = superlink.FLEET_POLL, superlink.SERVERAPPIO_POLL


def _answer(path: str, messages: int) -> bytes:
    from flwr.proto.fleet_pb2 import PullMessagesResponse
    from flwr.proto.message_pb2 import Message
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse

    kind = PullMessagesResponse if path == FLEET else PullAppMessagesResponse
    return kind(messages_list=[Message() for _ in range(messages)]).SerializeToString()


class StandIn:
    """An ASGI app answering a poll with ``messages[path]`` messages (or ``status``), counting runs
    and the request bodies it read."""

    def __init__(self, status: int = 200):
        self.messages = {FLEET: 0, APPIO: 0}
        self.status = status
        self.refused: set[str] = set()  # paths answered 401 (an unsigned or unauthorised request)
        self.runs: list[tuple[str, bytes]] = []

    async def __call__(self, scope, receive, send):
        body = (await receive()).get("body", b"")
        path = scope["path"]
        self.runs.append((path, body))
        answer = _answer(path, self.messages.get(path, 0)) if path in self.messages else b"other"
        status = 401 if path in self.refused else self.status
        await send({"type": "http.response.start", "status": status, "headers": [(b"x-run", b"1")]})
        await send({"type": "http.response.body", "body": answer})


def _scope(path: str) -> dict:
    return {"type": "http", "method": "POST", "path": path, "headers": []}


async def _request(layer, path: str, body: bytes = b"req", leave_after: float | None = None):
    """Send one request through ``layer``: (status, body, seconds), or None when the client left
    after ``leave_after`` seconds without an answer."""
    sent: list[dict] = []
    first = True
    left = asyncio.Event()

    async def receive():
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": body, "more_body": False}
        if leave_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(leave_after)
        left.set()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    t0 = time.monotonic()
    await layer(_scope(path), receive, send)
    if not sent:
        return None
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], sent[1]["body"], time.monotonic() - t0


def test_a_poll_that_finds_a_message_is_answered_at_once_unchanged():
    app = StandIn()
    app.messages[FLEET] = 1
    status, body, seconds = asyncio.run(_request(superlink.HeldPolls(app, hold=5.0), FLEET))
    assert (status, body) == (200, _answer(FLEET, 1)) and seconds < 1.0
    assert app.runs == [(FLEET, b"req")]  # the app read the request's own body, once


def test_an_empty_poll_is_held_and_asked_again_when_the_hold_ends():
    app = StandIn()
    status, body, seconds = asyncio.run(_request(superlink.HeldPolls(app, hold=0.3), APPIO))
    assert (status, body) == (200, _answer(APPIO, 0))
    assert 0.3 <= seconds < 2.0
    assert app.runs == [(APPIO, b"req"), (APPIO, b"req")]  # the app ran again at the end


PUSH = {FLEET: "/v1/fleet/push-object", APPIO: "/v1/runtime/push-object"}  # a side's push


@pytest.mark.parametrize("held, waker", [(FLEET, APPIO), (APPIO, FLEET)])
def test_a_held_poll_is_answered_when_the_other_side_polls_after_a_push(held, waker):
    """The ServerApp polls right after pushing (wakes the SuperNodes' polls); a SuperNode polls right
    after pushing a reply (wakes the ServerApp's poll). A poll of a side that pushed nothing since
    the last wake wakes nothing."""
    app = StandIn()
    layer = superlink.HeldPolls(app, hold=1.0)

    async def scenario():
        poll = asyncio.ensure_future(_request(layer, held))
        await asyncio.sleep(0.1)
        idle = asyncio.ensure_future(_request(layer, waker))  # no push before it: no wake
        await asyncio.sleep(0.1)
        assert not poll.done()
        app.messages[held] = 2  # the news arrives
        await _request(layer, PUSH[waker], b"object")  # the other side pushes it, then polls
        other = asyncio.ensure_future(_request(layer, waker))  # itself held: nothing for it
        return await poll, await other, await idle

    (status, body, seconds), other, idle = asyncio.run(scenario())
    assert (status, body) == (200, _answer(held, 2))
    assert 0.2 <= seconds < 0.8  # answered on the wake, not at the end of its 1 s hold
    assert other[1] == idle[1] == _answer(waker, 0) and min(other[2], idle[2]) >= 1.0
    assert [p for p, _ in app.runs].count(held) == 2  # on arrival and on the one wake


def test_a_poll_woken_without_news_for_it_is_held_on_until_its_hold_ends():
    app = StandIn()
    layer = superlink.HeldPolls(app, hold=0.5)

    async def scenario():
        poll = asyncio.ensure_future(_request(layer, FLEET))
        await asyncio.sleep(0.1)
        await _request(layer, "/v1/fleet/push-object")  # a SuperNode's push: news for the ServerApp only
        await _request(layer, PUSH[APPIO])  # the ServerApp's push, for another node
        other = asyncio.ensure_future(_request(layer, APPIO))  # a wake, but still nothing for this node
        await asyncio.sleep(0.05)
        assert not poll.done()
        await other
        return await poll

    status, body, seconds = asyncio.run(scenario())
    assert (status, body) == (200, _answer(FLEET, 0)) and 0.5 <= seconds < 2.0
    assert [p for p, _ in app.runs].count(FLEET) == 3  # first, on the wake, at the end


@pytest.mark.parametrize("refused", ["push", "poll"])
def test_a_push_or_poll_the_app_refuses_wakes_nothing(refused):
    """Held polls are run again only for requests the app accepted: an unsigned push (or a poll
    without the ServerApp's token) from outside the federation cannot make the SuperLink re-run the
    SuperNodes' held polls."""
    app = StandIn()
    app.refused.add(PUSH[APPIO] if refused == "push" else APPIO)
    layer = superlink.HeldPolls(app, hold=0.5)

    async def scenario():
        polls = [asyncio.ensure_future(_request(layer, FLEET)) for _ in range(5)]
        await asyncio.sleep(0.05)
        pushed = await _request(layer, PUSH[APPIO], b"object")
        polled = await _request(layer, APPIO)
        return pushed, polled, await asyncio.gather(*polls)

    pushed, polled, polls = asyncio.run(scenario())
    assert (pushed[0], polled[0]) == ((401, 200) if refused == "push" else (200, 401))
    assert all(r[2] >= 0.5 for r in polls)
    assert [p for p, _ in app.runs].count(FLEET) == 5 * 2  # on arrival and at the hold's end only


def test_many_held_polls_are_woken_once_per_push_not_per_poll():
    """n held SuperNode polls, the ServerApp polling ten times after one push: the n polls run again
    once (O(n) per exchange, not O(n^2))."""
    app = StandIn()
    layer = superlink.HeldPolls(app, hold=0.6)

    async def scenario():
        polls = [asyncio.ensure_future(_request(layer, FLEET)) for _ in range(20)]
        await asyncio.sleep(0.05)
        await _request(layer, PUSH[APPIO])
        servers = []
        for _ in range(10):
            servers.append(asyncio.ensure_future(_request(layer, APPIO)))
            await asyncio.sleep(0.01)
        await asyncio.gather(*polls, *servers)

    asyncio.run(scenario())
    assert [p for p, _ in app.runs].count(FLEET) == 20 * 3  # on arrival, the one wake, the hold's end


def test_a_client_that_leaves_while_held_gets_nothing_and_the_app_is_not_run_for_it():
    """No message is handed out to a client that is gone."""
    app = StandIn()
    layer = superlink.HeldPolls(app, hold=5.0)

    async def scenario():
        out = await _request(layer, FLEET, leave_after=0.1)
        app.messages[FLEET] = 1
        await _request(layer, PUSH[APPIO])
        other = asyncio.ensure_future(_request(layer, APPIO))  # would wake it
        await asyncio.sleep(0.05)
        other.cancel()
        return out

    assert asyncio.run(scenario()) is None
    assert [p for p, _ in app.runs].count(FLEET) == 1


@pytest.mark.parametrize("status", [401, 500])
def test_errors_and_other_requests_pass_at_once(status):
    app = StandIn(status=status)
    layer = superlink.HeldPolls(app, hold=5.0)
    got = asyncio.run(_request(layer, FLEET))
    assert got[:2] == (status, _answer(FLEET, 0)) and got[2] < 1.0
    ok = StandIn()
    got = asyncio.run(_request(superlink.HeldPolls(ok, hold=5.0), "/v1/fleet/push-object", b"object"))
    assert got[:2] == (200, b"other") and ok.runs == [("/v1/fleet/push-object", b"object")]
    assert superlink._empty_poll(FLEET, {"status": 200}, b"\xff\xff") is False  # not protobuf: sent on


def test_flowers_superlink_answers_an_empty_poll_the_same_after_the_hold(monkeypatch):
    """Flower's real SuperLink app, stock and with :class:`HeldPolls` outermost: a registered
    SuperNode's signed poll with no message waiting gets the same status and body."""
    import flwr.superlink.main as link
    import httpx
    from flwr.proto.fleet_pb2 import (
        PullMessagesRequest,
    )
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
    from starlette.middleware import Middleware

    from tests.test_flower_superlink_inline import _signed, registered_node

    stock = link._get_middleware

    def poll(held: bool) -> tuple[int, bytes, float]:
        if held:
            monkeypatch.setattr(link, "_get_middleware", lambda: [Middleware(superlink.HeldPolls, hold=0.3), *stock()])
        else:
            monkeypatch.setattr(link, "_get_middleware", stock)
        app = link.create_app()
        private, public_key = generate_key_pairs()
        public = public_key_to_bytes(public_key)
        proto = {"content-type": "application/protobuf"}

        async def run():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://superlink") as c:
                node = await registered_node(c, private, public)
                t0 = time.monotonic()
                r = await c.post(
                    FLEET,
                    content=PullMessagesRequest(node=Node(node_id=node)).SerializeToString(),
                    headers=proto | _signed(private, public),
                )
                return r.status_code, r.content, time.monotonic() - t0

        return asyncio.run(run())

    plain, held = poll(False), poll(True)
    assert plain[0] == held[0] == 200
    assert plain[1] == held[1]
    assert held[2] >= 0.3 > plain[2]
