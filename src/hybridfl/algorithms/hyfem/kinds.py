"""HyFEM's message kinds, defined once for the client (:mod:`.client`) and the server
(:mod:`.server`, :mod:`.secure`); HyFEM paper, Alg. 1-2, with our secure aggregation."""

from __future__ import annotations

PROPERTIES = "hyfem.properties"
"""Setup: a client's blocks, sample count, class counts and secure-aggregation public key."""
KEYS = "hyfem.keys"
"""Setup (secure aggregation): the peers' public keys a client masks with."""
FIT = "hyfem.fit"
"""A round: the client's extractors and matched classifier in, its trained model out (Alg. 2)."""
UNMASK = "hyfem.unmask"
"""Secure aggregation: the masks of the clients that dropped out of a round."""
