"""FedBCD's message kinds, defined once for the party (:mod:`.party`) and the coordinator
(:mod:`.coordinator`); see :mod:`hybridfl.algorithms.fedbcd` for what each carries (FedBCD
paper, Algorithms 1-3, with our private sample alignment and evaluation)."""

from __future__ import annotations

PROPERTIES = "fedbcd.properties"
"""Setup: a party's blocks, ``r_k``, whether it holds labels, its number of test samples."""
PSI_REQUEST = "fedbcd.psi_request"
"""Setup, label party: its blinded IDs and X25519 key."""
PSI_SERVE = "fedbcd.psi_serve"
"""Setup, passive party: its PSI answer to the label party's request."""
PSI_RESULT = "fedbcd.psi_result"
"""Setup, label party: the intersection and the order tags for every passive party."""
ALIGN = "fedbcd.align"
"""Setup, passive party: the order tags mapped to its rows."""
FORWARD = "fedbcd.forward"
"""Passive party: ``H_k`` of a batch (before the first step)."""
LABEL = "fedbcd.label"
"""Label party: the loss and ``dL/dH_j`` of the batch, then its local steps."""
PARTY_STEP = "fedbcd.party_step"
"""Passive party: its local steps with ``dL/dH_k``, then ``H_k`` of the next batch."""
UNDO = "fedbcd.undo"
"""Discard a skipped round (its snapshot is restored)."""
EVALUATE = "fedbcd.evaluate"
"""The evaluation messages (outside the rounds' protocol: never snapshotted nor undone)."""

SETUP_KINDS = (PROPERTIES, PSI_REQUEST, PSI_SERVE, PSI_RESULT, ALIGN)
"""The setup exchanges, in order (see :mod:`hybridfl.algorithms.fedbcd`, "Sample alignment")."""

LABEL_PARTY_SETUP = (PSI_REQUEST, PSI_RESULT)
"""The alignment steps only the label party answers (the passive parties answer the others)."""
