"""A hostile FedBCD coordinator against the real parties (issue 28, "What to build": a
client-side protocol state machine for each algorithm). After an honest setup and round 1, the
coordinator's honest round-2 messages are recorded, every party's state is put back to before
round 2, and the attacks replay them out of order, twice, or under another round number. Each
refusal stops the party for the run: every later message, honest ones included, is refused with
the same sentence, and the stop survives a rebuild from the party's state (Flower rebuilds a party
for every message).

Checked against the code before this work (commit 023471e): the four attack tests failed there
(the repeated ``party_step`` was answered twice, the round number going back and the ``forward``
after the round's step were answered, and nothing stopped); the positive control failed only for
want of ``party.protocol``.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybridfl.algorithms.fedbcd import FedBCDConfig
from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import Message
from tests.test_fedbcd import build, run_rounds, synthetic, vertical

STOPPED = "has stopped taking part in this run after refusing"


def _federation():
    """A FedBCD-p federation of three parties (``party-1`` holds the labels), nothing sent yet."""
    split = synthetic(n=120, seed=4, n_test=40)
    cfg = FedBCDConfig(variant="p", local_steps=2, rounds=3, batch_size=20, lr=0.3)
    return build(split, vertical(split, k=3, label_party=1), cfg, seed=0)


@pytest.fixture(scope="module")
def recorded():
    """The federation after round 1, every party's state before round 2, and the messages of
    the honest round 2 (and its evaluation) in the order each party got them."""
    server, parties, transport = _federation()
    run_rounds(server, transport, 1)
    before = {k: p.get_state() for k, p in parties.items()}
    seen: dict[str, list[Message]] = {k: [] for k in parties}
    for k, p in parties.items():
        p.handle = lambda m, f=p.handle, k=k: (seen[k].append(m), f(m))[1]
    server.run_round(2, transport)
    server.evaluate(2, transport.send_and_receive)
    for p in parties.values():
        del p.handle  # the class's handle again
    return parties, before, seen


def _fresh(recorded, who: str):
    """Party ``who`` with its state before round 2, and its honest messages of round 2."""
    parties, before, seen = recorded
    party = parties[who]
    party.set_state(before[who])
    return party, seen[who]


def _as_round(msg: Message, rnd: int) -> Message:
    return Message(msg.kind, msg.sender, msg.receiver, rnd, dict(msg.payload))


def _refused_for_good(party, first: Message, later: list[Message], match: str) -> str:
    """``first`` is refused (``match``); then every message of ``later`` is refused with one and
    the same sentence naming ``first``. Returns that sentence."""
    with pytest.raises(ProtocolError, match=match):
        party.handle(first)
    said = set()
    for m in later:
        with pytest.raises(ProtocolError) as e:
            party.handle(m)
        said.add(str(e.value))
    (sentence,) = said
    assert STOPPED in sentence and f"{first.kind!r} of round {first.round}" in sentence
    return sentence


def test_honest_round_two_is_answered_from_the_state_before_it(recorded):
    """Positive control: the recorded messages are valid (each party answers them in order)."""
    for who in ("party-0", "party-1"):
        party, msgs = _fresh(recorded, who)
        kinds = [m.kind for m in msgs]
        assert kinds[-1] == "fedbcd.evaluate" and len(kinds) >= 2
        for m in msgs:
            party.handle(m)
        assert party.protocol.stopped == ""


def test_an_out_of_order_message_stops_the_party(recorded):
    """A passive party gets its round-2 ``party_step``, then a ``forward`` of the same round (the
    protocol puts ``forward`` only before the round's step); then its honest evaluation and a
    round-3 step are refused alike. The label party gets ``fedbcd.properties`` in round 2."""
    party, msgs = _fresh(recorded, "party-0")
    step = next(m for m in msgs if m.kind == "fedbcd.party_step")
    party.handle(step)
    forward = Message("fedbcd.forward", step.sender, step.receiver, 2, {"batch": step.payload["next_batch"]})
    later = [m for m in msgs if m.kind == "fedbcd.evaluate"] + [_as_round(step, 3)]
    _refused_for_good(party, forward, later, "does not put it after 'fedbcd.party_step' in the same round")
    label, lmsgs = _fresh(recorded, "party-1")
    props = Message("fedbcd.properties", lmsgs[0].sender, "party-1", 2, {})
    _refused_for_good(label, props, lmsgs, "a setup message outside round 0")


def test_a_repeated_request_stops_the_party(recorded):
    """The same ``party_step`` twice (a second local update on one exchange) and the same
    ``fedbcd.label`` beyond one per party of the run: the repeat is refused, then everything."""
    party, msgs = _fresh(recorded, "party-0")
    step = next(m for m in msgs if m.kind == "fedbcd.party_step")
    party.handle(step)
    params = [t.detach().clone() for t in party.bottom.parameters()]
    _refused_for_good(party, step, msgs + [_as_round(step, 3)], "each request is answered once")
    assert all(np.array_equal(a.numpy(), b.detach().numpy()) for a, b in zip(params, party.bottom.parameters()))
    label, lmsgs = _fresh(recorded, "party-1")
    lab = next(m for m in lmsgs if m.kind == "fedbcd.label")
    for _ in range(3):  # three parties: at most three label exchanges a round (FedBCD-s)
        label.handle(lab)
    _refused_for_good(label, lab, [_as_round(lab, 3)], "each request is answered once")


def test_a_round_number_lie_stops_the_party(recorded):
    """After answering round 2 the passive party gets the round-2 step again saying round 1 (a
    round number that goes back); refused, then its next honest message too."""
    party, msgs = _fresh(recorded, "party-0")
    step = next(m for m in msgs if m.kind == "fedbcd.party_step")
    party.handle(step)
    _refused_for_good(party, _as_round(step, 1), [_as_round(step, 3)], "the round number goes back")


def test_the_stop_survives_a_rebuild(recorded):
    """A stopped party's state, restored into a party built anew (as a Flower node does for
    every message), still refuses an honest message with the same sentence; ``failed_state``
    (what the node keeps when a message fails) is the stop alone."""
    party, msgs = _fresh(recorded, "party-0")
    step = next(m for m in msgs if m.kind == "fedbcd.party_step")
    party.handle(step)
    _refused_for_good(party, _as_round(step, 1), [_as_round(step, 3)], "the round number goes back")
    state = party.get_state()
    assert set(party.failed_state()) == {"protocol"}
    assert np.array_equal(party.failed_state()["protocol"], state["protocol"])
    with pytest.raises(ProtocolError, match=STOPPED) as e1:
        party.handle(step)
    rebuilt = _federation()[1]["party-0"]
    rebuilt.set_state(state)
    with pytest.raises(ProtocolError, match=STOPPED) as e2:
        rebuilt.handle(step)
    assert str(e1.value) == str(e2.value)
