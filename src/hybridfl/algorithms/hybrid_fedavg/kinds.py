"""Hybrid FedAvg's message kinds, defined once for the client (:mod:`.client`) and the server
(:mod:`.server`); the baseline of HyFDCA Sec. 5."""

from __future__ import annotations

HELLO = "fedavg.hello"
"""Setup: a client's block names and sample count."""
FIT = "fedavg.fit"
"""A round: the server's ``w`` on the client's features in, its locally trained ``w`` out."""
