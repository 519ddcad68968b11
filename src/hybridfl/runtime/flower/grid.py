"""The ServerApp's pull of replies, with the replies' objects pulled in parallel.

Flower 1.41's ``HttpGrid.pull_messages`` asks the SuperLink which replies are ready (one
``PullMessages`` request) and then, one reply after another, pulls each reply's objects (a Flower
message is three objects: the message, its ``RecordDict`` and our ``ConfigRecord``; two requests
at a time) and confirms it (one more request). With ``n`` replies ready that is about ``3 n``
request round trips one after the other, on the path of every exchange (measured here: about 14 ms
per reply with 3 SuperNodes).

:func:`pull_replies` makes the same requests, with the same checks and the same results, but works
on the ready replies at the same time (one task per reply on a thread pool), so an exchange waits
about 3 round trips instead of ``3 n``. Its per-reply step (:func:`_pull_one`) is Flower's loop
body, written against the names of ``flwr.superlink.grid.http_grid`` (so the ServerApp's faster
object retries, :func:`hybridfl.runtime.flower.serverapp.fast_object_retries`, apply here too).
``tests/test_flower_grid.py`` fails when Flower's ``HttpGrid.pull_messages`` is not the one this
was written from (:data:`PULL_MESSAGES_SHA256`), so a new Flower is read before the pin moves; any
other grid (in memory, a future Flower) is pulled with its own ``pull_messages``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PULL_MESSAGES_SHA256 = "67a5266a5a2ed51557437a15ef4c8844f46576bc5bb6b0753d2a2f6230a3aa83"
"""SHA-256 of the source of Flower 1.41's ``HttpGrid.pull_messages`` (what :func:`_pull_one`
mirrors)."""


@functools.cache
def flower_pull_source_digest() -> str:
    """SHA-256 of the installed Flower's ``HttpGrid.pull_messages`` source (read once)."""
    from flwr.superlink.grid.http_grid import HttpGrid

    return hashlib.sha256(inspect.getsource(HttpGrid.pull_messages).encode()).hexdigest()


def parallel_ok(grid: Any) -> bool:
    """Whether :func:`pull_replies` may pull ``grid``'s replies itself: Flower's own ``HttpGrid``
    (not a subclass), whose ``pull_messages`` is the one mirrored."""
    try:
        from flwr.superlink.grid.http_grid import HttpGrid
    except ImportError:  # pragma: no cover - another Flower
        return False
    return type(grid) is HttpGrid and flower_pull_source_digest() == PULL_MESSAGES_SHA256


def pull_replies(grid: Any, message_ids: Iterable[str], pool: ThreadPoolExecutor | None) -> list:
    """The replies to ``message_ids`` that are ready (Flower ``Message`` objects, in the SuperLink's
    order; an error message for a reply whose objects cannot be pulled, as Flower does), each
    confirmed as received. With ``pool`` and a :func:`parallel_ok` grid, the replies' objects are
    pulled and confirmed in parallel on ``pool``; otherwise ``grid.pull_messages``.

    Raises:
        httpx.HTTPStatusError: as ``HttpGrid.pull_messages`` (a reply too large is logged and
            nothing returned, as there).
    """
    if pool is None or not parallel_ok(grid):
        return list(grid.pull_messages(message_ids))
    import httpx
    from flwr.superlink.grid import http_grid as hg

    run_id = grid._run.run_id
    try:
        res = grid._runtime_client.PullMessages(hg.PullAppMessagesRequest(message_ids=message_ids))
        pairs = list(zip(res.messages_list, res.message_object_trees, strict=True))
        if len(pairs) < 2:
            return [_pull_one(grid, run_id, p, t) for p, t in pairs]
        return list(pool.map(lambda pt: _pull_one(grid, run_id, *pt), pairs))
    except httpx.HTTPStatusError as e:
        if e.response.status_code == httpx.codes.REQUEST_ENTITY_TOO_LARGE:
            hg.log(hg.ERROR, hg.ERROR_MESSAGE_PULL_MESSAGES_PAYLOAD_TOO_LARGE)
            return []
        raise


def _pull_one(grid: Any, run_id: int, msg_proto: Any, msg_tree: Any) -> Any:
    """One ready reply: ``HttpGrid.pull_messages``'s loop body (pull the objects of its tree; an
    error message if they cannot be pulled; else confirm it and inflate it)."""
    from flwr.superlink.grid import http_grid as hg

    msg_id = msg_proto.metadata.message_id
    try:
        contents = hg.pull_objects(
            object_ids=[tree.object_id for tree in hg.iterate_object_tree(msg_tree)],
            pull_object_fn=hg.make_pull_object_fn_protobuf(
                pull_object_protobuf=grid._runtime_client.PullObject, node=grid.node, run_id=run_id
            ),
        )
    except hg.ObjectPullError as e:
        return hg.make_message(
            metadata=hg.Metadata(
                run_id=run_id,
                message_id="",
                src_node_id=grid.node.node_id,
                dst_node_id=grid.node.node_id,
                message_type=hg.SYSTEM_MESSAGE_TYPE,
                group_id="",
                ttl=0,
                reply_to_message_id=msg_proto.metadata.reply_to_message_id,
                created_at=hg.now().timestamp(),
            ),
            error=hg.Error(
                code=hg.ErrorCode.MESSAGE_UNAVAILABLE,
                reason=(
                    "Reply message objects are unavailable. The sender may not have completed the upload "
                    f"before the object-push session expired. {e}"
                ),
            ),
        )
    grid._runtime_client.ConfirmMessageReceived(
        hg.ConfirmMessageReceivedRequest(node=grid.node, run_id=run_id, message_object_id=msg_id)
    )
    message = hg.inflate_object_from_contents(msg_id, contents)
    message.metadata.__dict__["_message_id"] = msg_id
    return message


def pace(pulled: float, interval: float) -> None:
    """Sleep until ``interval`` seconds after ``pulled`` (``time.monotonic()`` as the last pull
    started): polls start at most every ``interval`` seconds, and at once after a pull the
    SuperLink held until there was news or its hold ran out (``superlink.HeldPolls``)."""
    time.sleep(max(0.0, interval - (time.monotonic() - pulled)))
