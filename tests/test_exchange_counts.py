"""Exchanges per round, per algorithm: the formulas of docs/results.md ("Exchanges per round")
against the exchanges the simulation's transport carries (one ``send_and_receive`` call is one
exchange, as over Flower: one message per node, the same algorithm code). Setup (round 0) and the
evaluation transport are not counted."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from hybridfl.runtime.simulation import build_federation


def _counted(name, split, part, cfg, seed=0):
    """Run ``cfg``; return the federation, its exchanges per round (round -> count) and its rows."""
    fed = build_federation(name, split, part, cfg, seed)
    per_round: Counter = Counter()
    send = fed.transport.send_and_receive

    def counting(messages):
        messages = list(messages)
        if messages and messages[0].round > 0:
            per_round[messages[0].round] += 1
        return send(messages)

    fed.transport.send_and_receive = counting
    rows = fed.run(monitor=False)
    return fed, per_round, rows


def _passes(srv, segs) -> list[int]:
    """The sweeps of each segment's pass: ``E * max(1, ceil(f * ceil(n_s / b)))``."""
    cfg = srv.config
    return [
        cfg.local_epochs * max(1, math.ceil(cfg.local_fraction * math.ceil(srv.seg_n[g] / cfg.batch_size)))
        for g in segs
    ]


@pytest.mark.parametrize(
    "settings",
    [
        {"segment_schedule": "sequential"},
        {"segment_schedule": "parallel", "local_fraction": 0.5},
        {"segment_schedule": "sequential", "secure_aggregation": False, "segment_inner_products": "encrypted"},
        {"dual_mode": "block"},
        {"dual_mode": "block", "secure_aggregation": False},
    ],
)
def test_hyfdca_exchanges_per_round(tiny, settings):
    """Segment mode: sequential ``sum_s (1 + sweeps_s)``, parallel ``1 + max_s sweeps_s`` (the
    segment start and the sweeps, the last of which carries the PrimalAggregation shares, with
    secure aggregation a one-shot masked exchange that needs no unmasking); block mode ``3 + u``
    (``u`` = 1 with secure aggregation: the unmasking exchange). (A segment of one holder costs 1:
    ``tests/test_hyfdca_close.py``; the tiny grid has none.)"""
    from hybridfl.algorithms.hyfdca import HyFDCAConfig

    split, part = tiny
    cfg = HyFDCAConfig(rounds=2, batch_size=16, encryption="none", positive_classes=[0, 1, 2, 3, 4], **settings)
    fed, per_round, rows = _counted("hyfdca", split, part, cfg)
    srv = fed.server
    u = int(cfg.secure_aggregation)
    segs = range(len(srv.seg_n))
    if cfg.dual_mode == "block":
        want = 3 + u
    elif cfg.segment_schedule == "sequential":
        want = sum(1 + s for s in _passes(srv, segs))
    else:
        want = 1 + max(_passes(srv, segs))
    assert len(srv.seg_n) == 2  # two segments: the sequential sum and the parallel max differ
    assert per_round == {1: want, 2: want}
    assert [int(r["exchanges"]) for r in rows] == [want, want]


@pytest.mark.parametrize("secure", [False, True])
def test_hyfem_exchanges_per_round(tiny, secure):
    """HyFEM: ``1 + u`` (the fit; with secure aggregation the unmasking exchange)."""
    from hybridfl.algorithms.hyfem import HyFEMConfig

    split, part = tiny
    cfg = HyFEMConfig(rounds=2, local_steps=1, batch_size=16, secure_aggregation=secure)
    _, per_round, _ = _counted("hyfem", split, part, cfg)
    assert per_round == {1: 1 + secure, 2: 1 + secure}


def test_hybrid_fedavg_exchanges_per_round(tiny):
    """Hybrid FedAvg: 1 (the clients' gradient steps on the sent ``w``)."""
    from hybridfl.algorithms.hybrid_fedavg import HybridFedAvgConfig

    split, part = tiny
    _, per_round, _ = _counted(
        "hybrid_fedavg", split, part, HybridFedAvgConfig(rounds=3, positive_classes=[0, 1, 2, 3, 4])
    )
    assert per_round == {1: 1, 2: 1, 3: 1}


@pytest.mark.parametrize("variant", ["p", "s"])
def test_fedbcd_exchanges_per_round(credit_small, variant):
    """FedBCD: parallel variants (sgd, p, prox) 2 (the label party, then every passive party in
    one exchange); FedBCD-s ``2 P + 1`` (each of the ``P`` passive parties in turn with the label
    party, then the label party); round 1 adds the first batch's forward exchange."""
    from hybridfl.algorithms.fedbcd import FedBCDConfig
    from hybridfl.data.partitioners import VerticalPartitioner

    split = credit_small
    part = VerticalPartitioner(3, label_party=0).partition(split.train)
    cfg = FedBCDConfig(variant=variant, rounds=3, local_steps=1, batch_size=16)
    _, per_round, _ = _counted("fedbcd", split, part, cfg)
    passive = 2
    want = 2 if variant == "p" else 2 * passive + 1
    assert per_round == {1: want + 1, 2: want, 3: want}
