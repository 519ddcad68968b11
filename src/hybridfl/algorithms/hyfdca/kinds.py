"""HyFDCA's message kinds, defined once (HyFDCA paper, Alg. 1-5, with our private alignment,
secure aggregation and segment mode); the client's handler table (:mod:`.client`) is keyed by
them."""

from __future__ import annotations

HELLO = "hyfdca.hello"
"""Setup: a client's blocks, sample count and keys (its IDs, or with ``alignment: psi`` its PSI offer)."""
PSI_SERVE = "hyfdca.psi_serve"
"""Setup, ``alignment: psi``: answer the other clients' PSI requests (:mod:`.align`)."""
PSI_RESULT = "hyfdca.psi_result"
"""Setup, ``alignment: psi``: the intersections with the other clients (:mod:`.align`)."""
PSI_TAGS = "hyfdca.psi_tags"
"""Setup, ``alignment: psi``: the order tags of the shared samples (:mod:`.align`)."""
INIT = "hyfdca.init"
"""Setup: the segment layout and the run's constants."""
NORMS = "hyfdca.norms"
"""Setup: the encrypted squared norms of every sample (and, segment mode, Gram matrices)."""
IP = "hyfdca.ip"
"""A round: the encrypted inner products (Alg. 1 SecureInnerProduct)."""
DUAL = "hyfdca.dual"
"""A round: the local dual method's encrypted dual changes (Alg. 1 LocalDualMethod)."""
PRIMAL = "hyfdca.primal"
"""A round: the client's share of ``X^T alpha`` (Alg. 1 PrimalAggregation; segment mode: only when a
pass was not added, its closing sweeps carrying the shares otherwise)."""
SEGSTART = "hyfdca.segstart"
"""A round, segment mode: start a segment pass."""
SWEEP = "hyfdca.sweep"
"""A round, segment mode: one sweep of a segment's exact steps (a client's last one of a pass,
``close``, also carries its PrimalAggregation share)."""
UNMASK = "hyfdca.unmask"
"""Secure aggregation: the masks of the clients that dropped out of a round."""

SETUP_KINDS = (HELLO, PSI_SERVE, PSI_RESULT, PSI_TAGS, INIT, NORMS)
"""The setup messages (before the rounds)."""
ROUND_KINDS = (NORMS, SEGSTART, SWEEP, IP, DUAL, PRIMAL, UNMASK)
"""The messages that need the setup's constants (``hyfdca.init`` first)."""
