"""The ServerApp's parallel pull of replies (:mod:`hybridfl.runtime.flower.grid`): Flower's
``HttpGrid.pull_messages`` is the one it mirrors (this fails loudly when Flower changes), and
against a SuperLink stand-in serving real Flower messages it returns what Flower's own pull
returns (the same messages, contents and metadata; the same error message for a reply whose
objects are gone) and confirms the same replies. A deployed run over it equals the simulation:
``tests/test_flower.py``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from flwr.app import Message
from flwr.common.serde import message_to_proto
from flwr.proto.message_pb2 import PullObjectResponse
from flwr.proto.runtime_pb2 import PullAppMessagesResponse
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
from flwr.supercore.run import Run
from flwr.superlink.grid.http_grid import HttpGrid

from hybridfl.runtime.flower import grid as fgrid
from hybridfl.runtime.flower.wire import MESSAGE_TYPE, pack


@pytest.fixture(autouse=True)
def _serverapp_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 7)  # what Flower sets in a ServerApp process
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def test_flower_pull_messages_is_the_one_mirrored():
    """If this fails, Flower's ``HttpGrid.pull_messages`` changed: read it, update
    ``grid._pull_one`` to match, then the digest (until then replies are pulled by Flower's own
    code, one after another)."""
    assert fgrid.flower_pull_source_digest() == fgrid.PULL_MESSAGES_SHA256


class StandIn:
    """The Runtime API client of a SuperLink holding ``replies`` (real Flower messages); objects
    listed in ``missing`` are never found."""

    def __init__(self, replies: list[Message], missing: set[str] = frozenset()):
        self.replies = {}
        self.objects = {}
        self.missing = missing
        self.confirmed: list[str] = []
        self.lock = threading.Lock()
        for m in replies:
            m.metadata.__dict__["_message_id"] = m.object_id
            self.replies[m.object_id] = (m, get_object_tree(m))
            self.objects.update({k: v.deflate() for k, v in get_all_nested_objects(m).items()})

    def PullMessages(self, req):
        from flwr.app.message import remove_content_from_message

        out = PullAppMessagesResponse()
        for mid in req.message_ids:
            if mid in self.replies:
                m, tree = self.replies[mid]
                out.messages_list.append(message_to_proto(remove_content_from_message(m)))
                out.message_object_trees.append(tree)
        return out

    def PullObject(self, req):
        if req.object_id in self.missing:
            return PullObjectResponse(object_found=False, object_available=False)
        return PullObjectResponse(object_found=True, object_available=True, object_content=self.objects[req.object_id])

    def ConfirmMessageReceived(self, req):
        with self.lock:
            self.confirmed.append(req.message_object_id)


def _grid(replies: list[Message], missing=frozenset()) -> tuple[HttpGrid, StandIn]:
    g = HttpGrid(token="t")
    g.set_run(Run.create_empty(run_id=7))
    stand_in = StandIn(replies, missing)
    g._client = stand_in  # what HttpGrid's Runtime API calls go to
    return g, stand_in


def _replies(n: int) -> list[Message]:
    out = []
    for i in range(n):
        m = Message(pack(bytes([i]) * (10 + i), seq=i + 1), dst_node_id=0, message_type=MESSAGE_TYPE, group_id="3")
        m.metadata.__dict__["_src_node_id"] = 100 + i
        out.append(m)
    return out


def _view(m: Message) -> tuple:
    md = m.metadata
    content = None if m.has_error() else dict(m.content["hybridfl"])
    error = (m.error.code, m.error.reason) if m.has_error() else None
    return (md.message_id, md.src_node_id, md.reply_to_message_id, md.message_type, md.group_id, content, error)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_the_parallel_pull_returns_what_flower_returns(n):
    replies = _replies(n)
    ids = [m.object_id for m in replies] + ["not-a-reply"]
    g1, s1 = _grid(replies)
    g2, s2 = _grid(replies)
    assert fgrid.parallel_ok(g2)
    with ThreadPoolExecutor(4) as pool:
        ours = fgrid.pull_replies(g2, ids, pool)
    theirs = list(g1.pull_messages(ids))
    assert [_view(m) for m in ours] == [_view(m) for m in theirs]
    assert len(ours) == n and sorted(s2.confirmed) == sorted(s1.confirmed) == sorted(ids[:n])


def test_a_reply_whose_objects_are_gone_is_the_same_error_message(monkeypatch):
    import functools

    import flwr.superlink.grid.http_grid as hg

    monkeypatch.setattr(hg, "pull_objects", functools.partial(hg.pull_objects, max_time=0.2))
    replies = _replies(3)
    gone = {replies[1].content.object_id}
    ids = [m.object_id for m in replies]
    g1, s1 = _grid(replies, gone)
    g2, s2 = _grid(replies, gone)
    with ThreadPoolExecutor(4) as pool:
        ours = fgrid.pull_replies(g2, ids, pool)
    theirs = list(g1.pull_messages(ids))
    assert [m.has_error() for m in ours] == [False, True, False]
    assert [_view(m)[1:] for m in ours] == [_view(m)[1:] for m in theirs]
    assert sorted(s2.confirmed) == sorted(s1.confirmed) == sorted([ids[0], ids[2]])


def test_another_grid_is_pulled_with_its_own_pull(monkeypatch):
    class Other(HttpGrid):
        pass

    g = Other(token="t")
    monkeypatch.setattr(Other, "pull_messages", lambda self, ids: ["own"])
    assert not fgrid.parallel_ok(g)
    with ThreadPoolExecutor(2) as pool:
        assert fgrid.pull_replies(g, ["a", "b"], pool) == ["own"]
