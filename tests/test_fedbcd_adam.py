"""FedBCD with ``optimizer: adam`` (issue 16): FedBCD-s (Alg. 3), FedBCD-p (Alg. 2) and
FedPBCD-p (eq. (15)) against an independent reference written here (the paper's schedule on
copies of the initial models, torch autograd for the gradients, Adam written out from Kingma & Ba
Alg. 1 with one moment pair and one step count per party), and a skipped round undone with
Adam's state (the run equals the run without that round)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from hybridfl.algorithms.fedbcd import FedBCDConfig, party_input
from hybridfl.runtime.simulation import build_federation
from tests.test_fedbcd import params_of, record_batches, run_rounds, synthetic, vertical


class ReferenceAdam:
    """Adam (Kingma & Ba 2015, Alg. 1; betas 0.9 / 0.999, eps 1e-8) on a list of tensors, one
    step count for all of them (every parameter of a party takes every step of that party)."""

    def __init__(self, params: list[torch.Tensor], b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
        self.params, self.b1, self.b2, self.eps = params, b1, b2, eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], lr: float) -> None:
        self.t += 1
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m.mul_(self.b1).add_((1 - self.b1) * g)
            v.mul_(self.b2).add_((1 - self.b2) * g * g)
            m_hat = m / (1 - self.b1**self.t)
            v_hat = v / (1 - self.b2**self.t)
            p.sub_(lr * m_hat / (v_hat.sqrt() + self.eps))


def reference(split, part, cfg, bottoms, top, batches):
    """FedBCD-s (Alg. 3), FedBCD-p (Alg. 2) or FedPBCD-p (eq. (15)) with every party's local
    update an Adam step on its full local gradient ``g + l2 theta + mu (theta - theta^{r0})``.

    ``bottoms``: party -> a copy of its initial bottom model (updated in place); ``top``: a copy of
    the label party's initial top model. Per round ``t`` on batch ``S``:

    - ``s``: each passive party ``k`` in order gets ``dL/dH_k`` at the current parameters of
      everybody (the parties before it already updated this round) and takes ``Q`` steps on
      ``<H_k(theta_k), dL/dH_k>``; then the label party takes ``Q`` steps on the exact loss with
      the passive parties' fresh ``H_j``;
    - ``p``/``prox``: every ``dL/dH_k`` and the label party's fixed ``H_j`` come from the
      parameters at the start of the round; then every party takes its ``Q`` steps.
    """
    order = [c.client_id for c in part.clients]
    lab = next(c.client_id for c in part.clients if c.has_labels)
    passive = [k for k in order if k != lab]
    xs = {c.client_id: torch.from_numpy(party_input(split.train, list(c.blocks))) for c in part.clients}
    y = torch.from_numpy(split.train.y.astype(np.float32))
    own = {k: list(bottoms[k].parameters()) + (list(top.parameters()) if k == lab else []) for k in order}
    adam = {k: ReferenceAdam(own[k]) for k in order}
    mu, l2 = float(cfg.mu or 0.0), cfg.l2

    def full(k, grads, anchor):
        return [g + l2 * p + mu * (p - a) for p, g, a in zip(own[k], grads, anchor)]

    def dloss_dh(k, S):
        with torch.no_grad():
            hs = {j: bottoms[j](xs[j][S]) for j in order}
        hk = hs[k].clone().requires_grad_(True)
        hs[k] = hk
        loss = nn.functional.binary_cross_entropy_with_logits(top([hs[j] for j in order]), y[S])
        return torch.autograd.grad(loss, hk)[0]

    def passive_steps(k, S, g, lr):
        anchor = [p.detach().clone() for p in own[k]]
        for _ in range(cfg.Q):
            obj = (bottoms[k](xs[k][S]) * g).sum()
            adam[k].step(full(k, torch.autograd.grad(obj, own[k]), anchor), lr)

    def label_steps(S, fixed, lr):
        anchor = [p.detach().clone() for p in own[lab]]
        for _ in range(cfg.Q):
            hs = [fixed[j] if j != lab else bottoms[lab](xs[lab][S]) for j in order]
            loss = nn.functional.binary_cross_entropy_with_logits(top(hs), y[S])
            adam[lab].step(full(lab, torch.autograd.grad(loss, own[lab]), anchor), lr)

    for t, b in enumerate(batches[: cfg.rounds]):
        S = torch.from_numpy(b)  # aligned order = dataset order in these tests
        lr = cfg.step_size(t)
        if cfg.variant == "s":
            for k in passive:
                passive_steps(k, S, dloss_dh(k, S), lr)
            with torch.no_grad():
                fixed = {j: bottoms[j](xs[j][S]) for j in passive}
        else:
            grads = {k: dloss_dh(k, S) for k in passive}
            with torch.no_grad():
                fixed = {j: bottoms[j](xs[j][S]) for j in passive}
            for k in passive:
                passive_steps(k, S, grads[k], lr)
        label_steps(S, fixed, lr)
    return [p.detach() for k in order for p in own[k]]


@pytest.mark.parametrize(
    "variant,Q,k,label_party,top,lr_decay",
    [
        ("s", 3, 3, 1, "party_slice", "none"),
        ("s", 2, 2, 0, "party_slice", "sqrt"),
        ("s", 3, 3, 2, "concat", "none"),
        ("p", 3, 3, 1, "party_slice", "none"),
        ("prox", 2, 3, 1, "party_slice", "sqrt"),
    ],
)
def test_adam_fedbcd_matches_reference(variant, Q, k, label_party, top, lr_decay):
    """FedBCD-s / -p / FedPBCD-p with ``optimizer: adam`` on MLP towers (2-3 parties, the label
    party first, in the middle or last) equal the reference to 1e-6 after 8 rounds: each party's
    Adam sees its own local gradients in Alg. 3's (or Alg. 2's) order, counts one step per local
    step (8 x Q in all), and keeps its moments across rounds."""
    split = synthetic(n=240, seed=3)
    part = vertical(split, k=k, label_party=label_party)
    order = [c.client_id for c in part.clients]
    cfg = FedBCDConfig(
        variant=variant,
        local_steps=Q,
        rounds=8,
        batch_size=40,
        lr=0.02,
        lr_decay=lr_decay,
        l2=0.01,
        mu=0.2 if variant == "prox" else None,
        model="mlp",
        representation_dim=4,
        hidden=6,
        top=top,
        optimizer="adam",
    )
    fed = build_federation("fedbcd", split, part, cfg, seed=6)
    server, parties, transport = fed.server, fed.clients, fed.transport
    lab = next(c.client_id for c in part.clients if c.has_labels)
    bottoms = {cid: copy.deepcopy(parties[cid].bottom) for cid in order}
    top_model = copy.deepcopy(parties[lab].top)
    batches = record_batches(server)
    run_rounds(server, transport, cfg.rounds)
    ref = reference(split, part, cfg, bottoms, top_model, batches)
    fed_params = params_of(parties, order)
    assert len(fed_params) == len(ref)
    moved = 0.0
    init = params_of(build_federation("fedbcd", split, part, cfg, seed=6).clients, order)
    for a, b, c in zip(fed_params, ref, init):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        moved = max(moved, float((a - c).abs().max()))
    assert moved > 0.05  # 8 x Q Adam steps of 0.02 moved the parameters
    # every party counted one Adam step per local step
    for p in parties.values():
        steps = {float(v[0]) for key, v in p.get_state().items() if key.startswith("adam.") and key.endswith(".step")}
        assert steps == {float(cfg.rounds * Q)}


@pytest.mark.parametrize("variant", ["s", "p"])
def test_adam_skipped_round_is_undone_with_the_optimizer_state(variant):
    """A skipped round is undone everywhere, Adam's moments and step counts included: with a
    constant step size and the coordinator's batch sampler rolled back, 7 rounds with round 3
    skipped (a passive party's reply lost after the label party and the other parties stepped)
    end with the models and Adam states of 6 rounds without a failure."""
    split = synthetic(seed=4)
    part = vertical(split)
    cfg = FedBCDConfig(
        variant=variant,
        local_steps=2,
        rounds=7,
        batch_size=30,
        lr=0.01,
        lr_decay="none",
        model="mlp",
        representation_dim=4,
        hidden=8,
        optimizer="adam",
    )
    last_passive = [c.client_id for c in part.clients if not c.has_labels][-1]
    failed = build_federation("fedbcd", split, part, cfg, seed=7, fail_at=[(3, last_passive)])
    failed.run()
    assert [r for r, _ in failed.server.skipped] == [3]
    clean = build_federation("fedbcd", split, part, cfg.model_copy(update={"rounds": 6}), seed=7)
    clean.run()
    for cid, p in clean.clients.items():
        a = p.state_dict()
        b = failed.clients[cid].state_dict()
        assert a.keys() == b.keys() and any(k.startswith("adam.") for k in a)
        for key in a:
            np.testing.assert_allclose(b[key], a[key], rtol=1e-6, atol=1e-7, err_msg=key)
