"""Batched clients (simulation only, ``batched_clients: true``): the clients of a round train as one
batched model.

HyFEM's clients are independent within a round (HyFEM Alg. 1 lines 3-6: every client takes ``Q``
SGD steps from the model it received), so in the in-process simulation they can take their ``Q``
steps together. Per step, every block's extractor runs once, ``vmap``-ed over the stacked
parameters of the clients holding that block (:func:`torch.func.stack_module_state`,
:func:`torch.func.functional_call`), each client's features are concatenated in its block order,
and every classifier shape (number of blocks) runs ``vmap``-ed over its clients; the built-in MLP
extractors and classifiers are batched matrix products (:func:`torch.baddbmm`) instead. The gradient
(autograd) of the sum of the clients' losses is, slice by slice, each client's own gradient, and SGD (with momentum and HyFEM-Prox's proximal terms) updates every slice
with the same formula as :class:`torch.optim.SGD`. Every client draws its own mini-batches from its
own generator in the same order as alone, so the result equals the sequential simulation up to
floating-point rounding (the batched convolutions and matrix products sum in another order; see
``tests/test_hyfem_units.py``).

How it plugs in: before the round's messages go out, :func:`prefit` (called by
:meth:`~hybridfl.algorithms.hyfem.server.HyFEMServer.run_round` when the transport holds the client
objects, i.e. in process) trains the clients and leaves each its trained model and mean loss with a
digest of the message it trained on; the client's :meth:`~HyFEMClient.fit` then checks the message
as always and, if the digest matches, replies with that model instead of training again. Over
Flower (no client objects) nothing changes.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, stack_module_state, vmap

from hybridfl.algorithms.hyfem.kinds import FIT
from hybridfl.models.hybrid import Classifier, MLPExtractor
from hybridfl.runtime.messages import Message, unpack_arrays
from hybridfl.runtime.validate import PayloadError

_NUMBERS = ("local_steps", "lr", "mu1", "mu2")


def fit_digest(msg: Message) -> bytes:
    """A digest of everything in a ``hyfem.fit`` message that the local training depends on: the
    round, the model arrays (name, dtype, shape, bytes) and ``local_steps``, ``lr``, ``mu1``,
    ``mu2``."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((msg.round, msg.receiver, tuple(float(msg.payload[k]) for k in _NUMBERS))).encode())
    for k in sorted(msg.payload):
        v = msg.payload[k]
        if isinstance(v, np.ndarray) and (k.startswith("ext.") or k.startswith("clf.")):
            h.update(f"{k}|{v.dtype.str}|{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
    return h.digest()


def prefit(clients: Mapping[str, Any], messages: Sequence[Message]) -> int:
    """Train the clients of ``messages`` together, group by group (same batch size, device and
    message settings ``local_steps``, ``lr``, ``mu1``, ``mu2``): in each step every block's
    extractor runs batched over the clients holding that block, and every classifier batched over
    the clients with as many blocks (the same shape). A group of one client is left to the client
    itself, as is a message the client would refuse (:meth:`HyFEMClient.check_fit`: it refuses it
    when it arrives) and a model with buffers (e.g. batch-norm statistics).

    Returns:
        The number of clients trained here.
    """
    from hybridfl.algorithms.hyfem.client import HyFEMClient

    groups: dict[tuple, list[tuple[HyFEMClient, Message]]] = {}
    for msg in messages:
        c = clients.get(msg.receiver)
        if not isinstance(c, HyFEMClient) or msg.kind != FIT or any(True for _ in c.model.buffers()):
            continue  # models with buffers (e.g. batch norm statistics) train on their own
        try:
            c.check_fit(msg)
        except PayloadError:
            continue
        p = msg.payload
        key = (
            c.trainer.batch_size,
            c.trainer.momentum,
            str(c.trainer.device),
            int(p["local_steps"]),
            float(p["lr"]),
            float(p["mu1"]),
            float(p["mu2"]),
        )
        groups.setdefault(key, []).append((c, msg))
    done = 0
    for key, members in groups.items():
        if len(members) < 2:
            continue
        _train_group(members, steps=key[3], lr=key[4], mu1=key[5], mu2=key[6])
        done += len(members)
    return done


def _batched_forward(base: torch.nn.Module, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``base`` applied slice by slice: parameters ``p`` (name -> ``(K, *shape)``) and inputs ``x``
    ``(K, batch, ...)`` -> ``(K, batch, out)``. The built-in MLP extractor and classifier are batched
    matrix products (:func:`torch.baddbmm`); any other module is ``vmap`` of
    :func:`~torch.func.functional_call`."""
    if isinstance(base, MLPExtractor):
        h = x.reshape(x.shape[0], x.shape[1], -1)
        return torch.relu(torch.baddbmm(p["net.0.bias"].unsqueeze(1), h, p["net.0.weight"].transpose(1, 2)))
    if isinstance(base, Classifier):
        h = torch.relu(torch.baddbmm(p["fc1.bias"].unsqueeze(1), x, p["fc1.weight"].transpose(1, 2)))
        return torch.baddbmm(p["fc2.bias"].unsqueeze(1), h, p["fc2.weight"].transpose(1, 2))
    return vmap(lambda q, xb: functional_call(base, q, (xb,)))(p, x)


def _stack(modules: Sequence[torch.nn.Module]) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A parameter-less (meta) copy of ``modules[0]`` and its parameters stacked over ``modules``:
    name -> ``(len(modules), *shape)``."""
    params, _ = stack_module_state(list(modules))
    return copy.deepcopy(modules[0]).to("meta"), {k: v.detach().clone() for k, v in params.items()}


def _train_group(members: list, steps: int, lr: float, mu1: float, mu2: float) -> None:
    """``steps`` SGD steps of every client in ``members`` (``(client, message)`` pairs) together;
    leaves each client its trained weights and ``_prefit = (digest, mean loss)``.

    One step: block ``b``'s extractor is ``vmap``-ed over the clients holding ``b`` (their stacked
    parameters, their own mini-batches), each client's features are concatenated in its block
    order, the classifiers are ``vmap``-ed over the clients with as many blocks, and the gradient of
    the sum of the clients' losses (each client's mean cross-entropy plus its proximal terms) with
    respect to all stacked parameters is, slice by slice, each client's own gradient."""
    for c, msg in members:  # load the received weights, exactly as HyFEMClient.fit does
        for b in c.blocks:
            c.model.load_extractor_arrays(b, unpack_arrays(f"ext.{b}.", msg.payload))
        c.model.load_classifier_arrays(unpack_arrays("clf.", msg.payload))
        c.model.train()
    group = _Group(members, mu1, mu2)
    totals = group.train(int(steps), lr)
    group.write_back()
    for i, (c, msg) in enumerate(members):
        c._prefit = (fit_digest(msg), totals[i] / max(int(steps), 1))


def _sub(prefix: str, tensors: dict) -> dict:
    """The entries of ``tensors`` under ``prefix``, without it."""
    n = len(prefix)
    return {k[n:]: v for k, v in tensors.items() if k.startswith(prefix)}


class _Group:
    """Clients of one model shape trained as one batched model (:func:`_train_group`): their
    stacked parameters (``ext|<block>|<name>`` over the holders of a block, ``clf|<width>|<name>``
    over the clients with as many blocks), the anchors of the proximal terms and their ``mu``."""

    def __init__(self, members: list, mu1: float, mu2: float):
        self.members = members
        self.trainers = [c.trainer for c, _ in members]
        self.holders: dict[str, list[int]] = {}
        for i, (c, _) in enumerate(members):
            for b in c.blocks:
                self.holders.setdefault(b, []).append(i)
        self.widths: dict[int, list[int]] = {}
        for i, (c, _) in enumerate(members):
            self.widths.setdefault(len(c.blocks), []).append(i)
        self.bases: dict[str, torch.nn.Module] = {}
        self.params: dict[str, torch.Tensor] = {}  # "ext|<block>|<name>" and "clf|<width>|<name>", stacked
        for b, idx in self.holders.items():
            base, p = _stack([members[i][0].model.extractors[b] for i in idx])
            self.bases[f"ext|{b}"] = base
            self.params.update({f"ext|{b}|{k}": v for k, v in p.items()})
        for w, idx in self.widths.items():
            base, p = _stack([members[i][0].model.classifier for i in idx])
            self.bases[f"clf|{w}"] = base
            self.params.update({f"clf|{w}|{k}": v for k, v in p.items()})
        self.anchors = {k: v.clone() for k, v in self.params.items()}
        self.mus = {k: (mu1 if k.startswith("ext|") else mu2) for k in self.params}

    def total(self, p: dict, xs: dict, ys: list) -> tuple[torch.Tensor, torch.Tensor]:
        """The sum of the clients' objectives at parameters ``p`` on their batches ``xs`` (block
        -> ``(holders, batch, ...)``) and labels ``ys``, and each client's mean cross-entropy."""
        members = self.members
        feats: list[dict[str, torch.Tensor]] = [{} for _ in members]
        for b, idx in self.holders.items():
            out = _batched_forward(self.bases[f"ext|{b}"], _sub(f"ext|{b}|", p), xs[b])
            for j, i in enumerate(idx):
                feats[i][b] = out[j]
        losses: list[Any] = [None] * len(members)
        for w, idx in self.widths.items():
            v = torch.stack([torch.cat([feats[i][b] for b in members[i][0].blocks], dim=1) for i in idx])
            logits = _batched_forward(self.bases[f"clf|{w}"], _sub(f"clf|{w}|", p), v)
            for j, i in enumerate(idx):
                losses[i] = torch.nn.functional.cross_entropy(logits[j], ys[i])
        ce = torch.stack(losses)
        reg = 0.0
        for k, mu in self.mus.items():  # HyFEM-Prox: (mu/2) ||p - anchor||^2 for every client's slice
            if mu:
                reg = reg + 0.5 * mu * ((p[k] - self.anchors[k]) ** 2).sum()
        return ce.sum() + reg, ce.detach()

    def step(self, p: dict, xs: dict, ys: list) -> tuple[dict, tuple[torch.Tensor, torch.Tensor]]:
        """Gradients (autograd through the batched forward) and ``(objective, losses)``."""
        leaves = {k: v.requires_grad_(True) for k, v in p.items()}
        obj, losses = self.total(leaves, xs, ys)
        grads = torch.autograd.grad(obj, list(leaves.values()))
        for v in leaves.values():
            v.requires_grad_(False)
        return dict(zip(leaves, grads)), (obj.detach(), losses)

    def batches(self) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """Each client's own mini-batch, drawn as ``LocalTrainer.steps`` draws it: block ->
        ``(holders, batch, ...)`` inputs and the clients' labels."""
        xs: dict[str, list[torch.Tensor]] = {b: [] for b in self.holders}
        ys = []
        for i, t in enumerate(self.trainers):
            idx = torch.randint(t.n, (t.batch_size,), generator=t.gen).to(t.device)
            at = idx if t.rows is None else t.rows[idx]
            for b in self.members[i][0].blocks:
                xs[b].append(t.x[b][at])
            ys.append(t.y[idx])
        return {b: torch.stack(v) for b, v in xs.items()}, ys

    def train(self, steps: int, lr: float) -> list[float]:
        """``steps`` SGD steps of step size ``lr`` (the clients' momentum); each client's summed loss."""
        momentum = self.trainers[0].momentum
        bufs: dict[str, torch.Tensor] | None = None
        totals = [0.0] * len(self.members)
        for _ in range(steps):
            grads, (_, losses) = self.step(self.params, *self.batches())
            for i, v in enumerate(losses.tolist()):
                totals[i] += float(v)
            with torch.no_grad():  # torch.optim.SGD's update (dampening 0, no Nesterov, no weight decay)
                if momentum:
                    if bufs is None:
                        bufs = {k: g.clone() for k, g in grads.items()}
                    else:
                        for k, g in grads.items():
                            bufs[k].mul_(momentum).add_(g)
                    upd = bufs
                else:
                    upd = grads
                for k in self.params:
                    self.params[k].add_(upd[k], alpha=-lr)
        return totals

    @torch.no_grad()
    def write_back(self) -> None:
        """Each client's slices back into its model."""
        for b, idx in self.holders.items():
            for j, i in enumerate(idx):
                for k, q in self.members[i][0].model.extractors[b].named_parameters():
                    q.copy_(self.params[f"ext|{b}|{k}"][j])
        for w, idx in self.widths.items():
            for j, i in enumerate(idx):
                for k, q in self.members[i][0].model.classifier.named_parameters():
                    q.copy_(self.params[f"clf|{w}|{k}"][j])
