"""A FedBCD party's own view of the protocol (against a malicious coordinator):
:func:`party_protocol` builds its :class:`~hybridfl.runtime.failclosed.OrderedProtocol` from the
order of FedBCD's messages (:mod:`hybridfl.algorithms.fedbcd`; FedBCD paper Alg. 1-3 with our
private alignment and evaluation).

**Setup** (round 0, each step once, in order): ``fedbcd.properties``, then the label party's
``psi_request`` and ``psi_result`` or a passive party's ``psi_serve`` and ``align``.

**A round** (round ``>= 1``, numbers never going back):

- passive party: [``forward``] (only while the coordinator has no ``H_k`` yet: the first round,
  or after skipped ones), ``party_step`` (one per round in every variant, FedBCD-s included);
- label party: ``label``, at most once per party of the run (FedBCD-s: one exchange per passive
  party, then its own steps; the others: one);
- then, in either role, [``undo``] (the coordinator skipped the round) and [``evaluate``] (after
  the round, its number).

``evaluate`` may also come once in round 0, after the setup (the untrained model's metrics).
A message the coordinator gave up on may never reach the party (Flower), so a round may start at
any of these steps, but no step is repeated or taken back. Any refusal stops the party for the
run (:class:`~hybridfl.runtime.failclosed.FailClosed`).
"""

from __future__ import annotations

from hybridfl.algorithms.fedbcd.kinds import (
    ALIGN,
    EVALUATE,
    FORWARD,
    LABEL,
    PARTY_STEP,
    PROPERTIES,
    PSI_REQUEST,
    PSI_RESULT,
    PSI_SERVE,
    UNDO,
)
from hybridfl.runtime.failclosed import OrderedProtocol

LABEL_SETUP = (PROPERTIES, PSI_REQUEST, PSI_RESULT)
"""The label party's setup steps, in order."""
PASSIVE_SETUP = (PROPERTIES, PSI_SERVE, ALIGN)
"""A passive party's setup steps, in order."""


def party_protocol(party_id: str, is_label: bool, n_parties: int) -> OrderedProtocol:
    """The protocol state of party ``party_id`` (module docstring).

    Args:
        party_id: its name (in the refusal sentences).
        is_label: whether it is the label party.
        n_parties: the parties of the run (the label party's ``label`` messages per round).
    """
    who = f"FedBCD party {party_id!r}"
    tail = {UNDO: (EVALUATE,), EVALUATE: ()}
    if is_label:
        after = {LABEL: (LABEL, UNDO, EVALUATE), **tail}
        limit = {LABEL: max(1, n_parties)}
        return OrderedProtocol(who, LABEL_SETUP, (LABEL, UNDO, EVALUATE), after, limit, at_setup=(EVALUATE,))
    after = {FORWARD: (PARTY_STEP, UNDO, EVALUATE), PARTY_STEP: (UNDO, EVALUATE), **tail}
    return OrderedProtocol(who, PASSIVE_SETUP, (FORWARD, PARTY_STEP, UNDO, EVALUATE), after, at_setup=(EVALUATE,))
