"""One reply policy (``hybridfl.runtime.exchange.answers``) and the in-process transport's bad
replies.

Adversary: one client of the federation (in process: the client object) that answers with a reply
of another kind, under another client's name or to someone other than the server. Before this
work hybrid FedAvg, HyFEM and FedBCD stopped the run with a ProtocolError on a reply of another
kind and HyFDCA ignored it; the in-process transport passed a reply under another name on. Now
every server drops such a reply as missing (logged with the client and the reason) and the run
equals the simulation in which that client fails in that round.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hybridfl.algorithms.fedbcd import FedBCDConfig
from hybridfl.runtime.exchange import answers
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.transport import InProcessTransport
from tests.test_payloads import _fedavg, _fedbcd, _hyfem, run_rounds, without_seconds


def test_answers_keeps_the_first_answer_of_each_asked_client_and_logs_the_rest(caplog):
    sent = [Message("a.fit", SERVER, c, 1) for c in ("c0", "c1", "c2")]
    arrived = [
        Message("a.fit", "c1", SERVER, 1, {"n": 1}),
        Message("a.fit", "c9", SERVER, 1),  # not asked
        Message("a.fit", "c1", SERVER, 1, {"n": 2}),  # a repeat
        Message("a.other", "c2", SERVER, 1),  # another kind
        Message("a.fit", "c0", SERVER, 1),
    ]
    with caplog.at_level(logging.WARNING, "hybridfl.exchange"):
        got = answers(sent, arrived, "test round 1")
    assert [(r.sender, r.payload.get("n")) for r in got] == [("c1", 1), ("c0", None)]
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 3
    assert "'c9' is ignored: its sender was not asked" in msgs[0]
    assert "'c1' is ignored: its sender already answered" in msgs[1]
    assert "'c2' is ignored: it does not answer the 'a.fit' message" in msgs[2]
    assert all(m.startswith("test round 1: ") for m in msgs)


class Echo:
    """A client that answers every message with ``reply(msg)``; counts the messages it got."""

    def __init__(self, reply):
        self.reply, self.got = reply, 0

    def handle(self, msg):
        self.got += 1
        return self.reply(msg)


def test_in_process_a_reply_under_another_name_is_missing_and_three_drop_the_client(caplog):
    good = Echo(lambda m: m.reply(x=1))
    forger = Echo(lambda m: Message(m.kind, "c0", SERVER, m.round, {"x": 666}))  # signs as c0
    misaddressed = Echo(lambda m: Message(m.kind, "c2", "c0", m.round))
    t = InProcessTransport({"c0": good, "c1": forger, "c2": misaddressed})
    with caplog.at_level(logging.WARNING):
        for rnd in (1, 2, 3, 4):
            got = t.send_and_receive([Message("k", SERVER, c, rnd) for c in ("c0", "c1", "c2")])
            assert [(r.sender, r.payload) for r in got] == [("c0", {"x": 1})]
    assert forger.got == misaddressed.got == 3  # dropped after its third bad reply: round 4 skips it
    assert set(t.strikes.dropped) == {"c1", "c2"} and len(t.strikes.events) == 6
    assert "signed 'c0', not 'c1'" in t.strikes.dropped["c1"]
    assert "addressed to 'c0', not 'server'" in t.strikes.dropped["c2"]
    assert "client c1 is dropped for the rest of the run after 3 bad replies" in caplog.text
    state = t.get_state()  # checkpoints keep the strikes
    t2 = InProcessTransport({"c0": good, "c1": forger, "c2": misaddressed})
    t2.set_state(state)
    assert t2.strikes.dropped == t.strikes.dropped


class Rekind:
    """Answers like ``inner`` but gives its replies of round ``rnd`` another kind."""

    def __init__(self, inner, rnd: int):
        self.inner, self.rnd = inner, rnd

    def handle(self, msg):
        r = self.inner.handle(msg)
        if msg.round == self.rnd:
            r.kind = "x.not-an-answer"
        return r

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state):
        self.inner.set_state(state)


def _rekind(fed, cid, rnd):
    fed.clients[cid] = fed.transport.clients[cid] = Rekind(fed.clients[cid], rnd)


@pytest.mark.parametrize("algorithm", ["hybrid_fedavg", "hyfem", "fedbcd"])
def test_a_reply_of_another_kind_is_a_missing_reply(algorithm, caplog):
    """Round 2's replies of one client are of another kind: the run equals the simulation in which
    that client fails in round 2 (before: ProtocolError, the run stopped)."""
    if algorithm == "fedbcd":
        cfg = FedBCDConfig(variant="p", local_steps=2, rounds=3, batch_size=40)
        make, cid = (lambda fail_at=(): _fedbcd(cfg, fail_at)), "party-2"
    else:
        make = _fedavg if algorithm == "hybrid_fedavg" else _hyfem
        cid = list(make().clients)[1]
    ref = make(fail_at=[(2, cid)])
    expected = run_rounds(ref, 3)
    fed = make()
    _rekind(fed, cid, 2)
    with caplog.at_level(logging.WARNING, "hybridfl.exchange"):
        got = run_rounds(fed, 3)
    assert without_seconds(got) == without_seconds(expected)
    assert f"the 'x.not-an-answer' reply from {cid!r} is ignored" in caplog.text
    if algorithm == "hybrid_fedavg":
        assert got[1]["failed"] == 1
        np.testing.assert_array_equal(fed.server.w, ref.server.w)
    if algorithm == "fedbcd":
        assert fed.server.skipped == ref.server.skipped == [(2, [cid])]
