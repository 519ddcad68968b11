"""FedBCD's computing steps of a party (FedSGD Alg. 1, FedBCD Alg. 2-3, eq. (9), (15)):
:class:`PartyStepsMixin`, the mini-batch forward pass, the passive party's local steps with the
stale ``dL/dH_k`` and the label party's loss, gradients and local steps, plus the update rules
(``sgd``, ``adam``) they share; and the party's part of an evaluation (``fedbcd.evaluate``).

The message checks of :class:`~hybridfl.algorithms.fedbcd.party.FedBCDParty` apply (see
:mod:`hybridfl.algorithms.fedbcd.party`); a bad message is refused with a
:class:`~hybridfl.runtime.validate.PayloadError` before anything changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from hybridfl.errors import ProtocolError
from hybridfl.runtime.messages import Message
from hybridfl.runtime.validate import PayloadError, array, integer, number, only_keys, strings


def _params(*modules: nn.Module) -> list[nn.Parameter]:
    return [p for m in modules for p in m.parameters()]


@torch.no_grad()
def _full_gradient(
    p: nn.Parameter, i: int, l2: float, mu: float, anchor: Sequence[torch.Tensor] | None
) -> torch.Tensor:
    """``grad + l2 theta + mu (theta - theta^{r0})`` of parameter ``p`` (the ``i``-th; paper (9), (15))."""
    g = torch.zeros_like(p) if p.grad is None else p.grad
    if l2:
        g = g + l2 * p
    if mu and anchor is not None:
        g = g + mu * (p - anchor[i])
    return g


@torch.no_grad()
def _sgd_update(
    params: Sequence[nn.Parameter], lr: float, l2: float, mu: float, anchor: Sequence[torch.Tensor] | None
) -> None:
    """``theta <- theta - lr (grad + l2 theta + mu (theta - theta^{r0}))`` (paper (9), (15))."""
    for i, p in enumerate(params):
        p.sub_(lr * _full_gradient(p, i, l2, mu, anchor))
        p.grad = None


OPTIMIZERS = ("sgd", "adam")
"""The local update rules a step message may name (``optimizer``; absent: ``sgd``)."""


def _optimizer(msg: Message) -> str:
    """The checked ``optimizer`` of a step message: ``sgd`` (also when absent) or ``adam``.

    Raises:
        PayloadError: another value.
    """
    v = msg.payload.get("optimizer", "sgd")
    if not isinstance(v, str) or v not in OPTIMIZERS:
        raise PayloadError(msg, "optimizer", f"not one of {', '.join(OPTIMIZERS)}")
    return v


def _step_settings(msg: Message, min_steps: int = 1) -> tuple[int, float, float, float]:
    """The checked ``(local_steps, lr, mu, l2)`` of a step message: ``local_steps`` an integer >=
    ``min_steps``, ``lr`` finite > 0, ``mu`` and ``l2`` finite >= 0 (``lr``, ``mu``, ``l2`` are
    not read, and returned as 0, when ``local_steps`` is 0).

    Raises:
        PayloadError: the first problem found.
    """
    q = integer(msg, "local_steps", low=min_steps)
    if q == 0:
        return 0, 0.0, 0.0, 0.0
    lr = number(msg, "lr")
    if lr <= 0:
        raise PayloadError(msg, "lr", "not positive")
    return q, lr, number(msg, "mu", low=0.0), number(msg, "l2", low=0.0)


class PartyStepsMixin:
    """The training and evaluation steps of :class:`~hybridfl.algorithms.fedbcd.party.FedBCDParty`
    (its ``fedbcd.forward``, ``fedbcd.party_step``, ``fedbcd.label`` and ``fedbcd.evaluate``
    answers, and :meth:`embed` and :meth:`top_logits` for inference).

    It uses the party's attributes (set by its constructor and its alignment): ``party_id``,
    ``device``, ``x``, ``rows``, ``batch``, ``bottom``, ``out_dim``, ``is_label``, and for the label
    party ``top``, ``y``, ``party_order``, ``others``, ``in_dims``; the Adam state ``_adam``; the
    test set ``test_x``, ``test_y``, ``n_test``; and its methods ``check_batch``, ``_tensor``,
    ``_numpy``.
    """

    party_id: str
    device: torch.device
    x: torch.Tensor
    y: torch.Tensor
    rows: np.ndarray | None
    batch: np.ndarray | None
    bottom: nn.Module
    top: nn.Module
    out_dim: int
    is_label: bool
    party_order: list[str]
    others: dict[str, torch.Tensor]
    in_dims: Mapping[str, int] | None
    _adam: torch.optim.Adam | None
    test_x: np.ndarray | None
    test_y: np.ndarray | None
    n_test: int

    def _x(self, batch: np.ndarray) -> torch.Tensor:
        if self.rows is None:
            raise ProtocolError(f"FedBCD party {self.party_id!r} got a training message before fedbcd.align.")
        return self.x[torch.from_numpy(self.rows[batch]).to(self.device)]

    def _current(self) -> np.ndarray:
        if self.batch is None:
            raise ProtocolError(f"FedBCD party {self.party_id!r} got a step without a current mini-batch.")
        return self.batch

    @torch.no_grad()
    def forward(self, batch: np.ndarray) -> np.ndarray:
        """``H_k`` of the batch (aligned positions ``(B,)``): ``(B, r_k)`` float32 (paper eq. (2)).

        Raises:
            ProtocolError: before ``align``.
        """
        return self._numpy(self.bottom(self._x(batch)))

    def party_step(self, msg: Message) -> Message:
        """Passive party: ``Q`` local steps with the stale ``dL/dH_k`` (FedSGD Alg. 1 line 6 for
        Q = 1, FedBCD Alg. 2 lines 5-8, Alg. 3 lines 5-7, eq. (15)), then ``H_k`` of the next batch.

        With ``curv`` (``local_gradient: taylor``) the gradient of local step ``q`` is refreshed
        with the party's fresh output: ``grad + curv * (H_k^(q) - H_k^(0))`` (first-order Taylor
        expansion of ``dL/dH_k`` around the exchanged ``H_k^(0)``, the output at the start of the
        steps, which is the ``H_k`` the label party used; as the reference code's
        ``VFLHostModel._compute_common_gradient`` refreshes its gradient); step 0 is unchanged.

        Payload: ``grad`` ``(B, r_k)``, optional ``curv`` ``(B, r_k)``, ``local_steps``, ``lr``,
        ``mu``, ``l2``, optional ``optimizer``, ``next_batch`` ``(B,)`` and ``return_current``. Reply: ``h_next``
        ``(B, r_k)`` and, with ``return_current`` (FedBCD-s), ``h`` ``(B, r_k)`` on the current
        batch after the update.

        Raises:
            ProtocolError: no current batch, or before ``align``.
            PayloadError: a malformed message (``grad`` not a finite float ``(B, r_k)``, ``curv``
                not a finite float ``(B, r_k)`` >= 0, a bad ``next_batch`` or step setting);
                nothing is changed.
        """
        p = msg.payload
        batch = self._current()
        g = array(msg, "grad", (len(batch), self.out_dim), kinds="f")
        c = array(msg, "curv", (len(batch), self.out_dim), kinds="f") if "curv" in p else None
        if c is not None and c.size and float(np.min(c)) < 0:
            raise PayloadError(msg, "curv", "holding a negative value")
        Q, lr, mu, l2 = _step_settings(msg)
        opt = _optimizer(msg)
        nxt = self.check_batch(msg, "next_batch") if "next_batch" in p else None
        grad = self._tensor(g)
        curv = None if c is None else self._tensor(c)
        x = self._x(batch)
        params = _params(self.bottom)
        anchor = [t.detach().clone() for t in params] if mu else None
        h0: torch.Tensor | None = None
        for _ in range(Q):
            h = self.bottom(x)
            g_q = grad
            if curv is not None:
                h0 = h.detach() if h0 is None else h0
                g_q = grad + curv * (h.detach() - h0)
            # d/dtheta sum_i <H_k,i(theta), dL/dH_k,i> = grad of the loss w.r.t. theta_k at the given dL/dH_k
            (h * g_q).sum().backward()
            self._update(opt, params, lr, l2, mu, anchor)
        out: dict = {}
        if p.get("return_current"):
            out["h"] = self.forward(batch)
        if nxt is not None:
            self.batch = nxt
            out["h_next"] = self.forward(self.batch)
        return msg.reply(**out)

    def _own_params(self) -> list[nn.Parameter]:
        """The parameters the party updates: its bottom model (label party: and its top model)."""
        return _params(self.bottom, self.top) if self.is_label else _params(self.bottom)

    def _update(
        self,
        opt: str,
        params: Sequence[nn.Parameter],
        lr: float,
        l2: float,
        mu: float,
        anchor: Sequence[torch.Tensor] | None,
    ) -> None:
        """One local update of ``params`` (:meth:`_own_params`) from their ``.grad`` (the loss
        gradient; ``None`` counts as 0), with ``g = grad + l2 theta + mu (theta - theta^{r0})``:
        ``sgd``: ``theta <- theta - lr g`` (paper (9), (15)); ``adam``: one
        :class:`torch.optim.Adam` step of step size ``lr`` on ``g`` (the moments persist across
        rounds, see :class:`~hybridfl.algorithms.fedbcd.config.FedBCDConfig`). Clears ``.grad``."""
        if opt == "sgd":
            _sgd_update(params, lr, l2, mu, anchor)
            return
        if self._adam is None:
            self._adam = torch.optim.Adam(self._own_params(), lr=lr, foreach=False)
        with torch.no_grad():
            for i, prm in enumerate(params):
                prm.grad = _full_gradient(prm, i, l2, mu, anchor)
        for group in self._adam.param_groups:
            group["lr"] = lr
        self._adam.step()
        for prm in params:
            prm.grad = None

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        hs = [self.others[j] if j != self.party_id else self.bottom(x) for j in self.party_order]
        return self.top(hs)

    def label_step(self, msg: Message) -> Message:
        """Label party: take the new ``H_j`` of the batch; return ``dL/dH_j`` for the parties in
        ``grads_for`` at the current point; then ``Q`` local steps on its bottom and top models
        with the others' ``H_j`` fixed (FedBCD Alg. 2 lines 5-8 with exact local loss, eq. (15)).

        With ``curvature`` (``local_gradient: taylor``) it also returns ``curv.<j>``
        ``(B, r_j)``: the diagonal ``d^2 L / dH_j,i^2 = sigmoid'(z_i) (dz_i/dH_j,i)^2 / B``
        (Gauss-Newton; exact for a top model linear in ``H_j`` such as
        :class:`~hybridfl.models.towers.SumTop`, where ``dz_i/dH_j,i`` = 1).

        Payload: optional ``batch`` ``(B,)`` (a new batch), ``h.<j>`` ``(B, r_j)``, ``grads_for``,
        optional ``curvature``, ``local_steps`` and (if > 0) ``lr``, ``mu``, ``l2``, optional ``optimizer``. Reply:
        ``loss`` (mean logistic loss of the batch before the local steps), ``grad.<j>``
        ``(B, r_j)`` and, with ``curvature``, ``curv.<j>`` ``(B, r_j)``.

        Raises:
            ProtocolError: no current batch, before ``align``, or no ``H_j`` of a party.
            PayloadError: a malformed message (a bad ``batch``, an ``h.<j>`` not a finite float
                ``(B, r_j)``, ``grads_for`` naming an unknown party, a bad step setting); nothing
                is changed.
        """
        p = msg.payload
        new_batch = self.check_batch(msg, "batch") if "batch" in p else None
        B = len(new_batch) if new_batch is not None else len(self._current())
        others = [j for j in self.party_order if j != self.party_id]
        width = self.in_dims or {}
        hs = {j: array(msg, f"h.{j}", (B, width.get(j)), kinds="f") for j in others if f"h.{j}" in p}
        want = strings(msg, "grads_for", allowed=others) if "grads_for" in p else []
        curvature = p.get("curvature", False)
        if not isinstance(curvature, (bool, np.bool_)):
            raise PayloadError(msg, "curvature", "not a bool")
        Q, lr, mu, l2 = _step_settings(msg, min_steps=0) if "local_steps" in p else (0, 0.0, 0.0, 0.0)
        opt = _optimizer(msg) if Q else "sgd"
        if new_batch is not None:
            self.batch = new_batch
            self.others = {}
        batch = self._current()
        for j, h in hs.items():
            self.others[j] = self._tensor(h)
        absent = [j for j in self.party_order if j != self.party_id and j not in self.others]
        if absent:
            raise ProtocolError(f"FedBCD label party {self.party_id!r} has no H of party {absent[0]!r} for its batch.")
        x = self._x(batch)
        y = self.y[torch.from_numpy(self.rows[batch]).to(self.device)]  # type: ignore[index]
        out: dict = {}
        for j in want:
            self.others[j].requires_grad_(True)
        logits = self._logits(x)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
        out["loss"] = float(loss.detach())
        params = _params(self.bottom, self.top)
        if want:
            hw = [self.others[j] for j in want]
            if curvature:  # dz_i/dH_j,i (the logits of different samples do not mix)
                dz = torch.autograd.grad(logits.sum(), hw, retain_graph=True)
                s2 = torch.sigmoid(logits.detach()) * (1 - torch.sigmoid(logits.detach())) / len(batch)
                for j, d in zip(want, dz):
                    out[f"curv.{j}"] = self._numpy(s2.reshape(-1, 1) * d.detach() ** 2)
            grads = torch.autograd.grad(loss, hw + (params if Q else []), allow_unused=True)
            for j, g in zip(want, grads[: len(want)]):
                out[f"grad.{j}"] = self._numpy(g)
                self.others[j] = self.others[j].detach()
            own = grads[len(want) :]
        else:
            own = torch.autograd.grad(loss, params, allow_unused=True) if Q else ()
        if Q:
            anchor = [t.detach().clone() for t in params] if mu else None
            for q in range(Q):
                if q > 0:
                    loss_q = nn.functional.binary_cross_entropy_with_logits(self._logits(x), y)
                    own = torch.autograd.grad(loss_q, params, allow_unused=True)
                for prm, g in zip(params, own):
                    prm.grad = g
                self._update(opt, params, lr, l2, mu, anchor)
        return msg.reply(**out)

    # ------------------------------------------------------------------ evaluation and inference
    def evaluate(self, msg: Message) -> Message:
        """``fedbcd.evaluate``: the party's part of the joint prediction on test rows ``rows``
        ``(n,)`` (positions in the test set every party holds in the same order).

        A passive party replies ``h`` ``(n, r_k)`` float32 (:meth:`embed` of its test blocks). The
        label party takes ``h.<j>`` ``(n, r_j)`` of every other party, adds its own, computes the
        logits with its top model and replies ``auc`` (``sklearn.metrics.roc_auc_score``) and
        ``accuracy`` (logit > 0 means class 1), or ``auc`` = ``accuracy`` = NaN and ``diverged`` = 1
        when a logit is not finite. Logits and labels never leave the label party. The party's
        state (parameters, batch, round snapshot) is left as it was.

        Raises:
            ProtocolError: the party holds no test set, a row outside it, or (label party) no
                ``H`` of a party.
            PayloadError: ``rows`` is not an integer array ``(n,)``, a key nobody sends is present,
                or (label party) an ``h.<j>`` is not a float array ``(n, r_j)`` (NaN is allowed: a
                diverged party's ``H`` gives ``diverged`` = 1).
        """
        if self.test_x is None or (self.is_label and self.test_y is None):
            raise ProtocolError(f"FedBCD party {self.party_id!r} holds no test set to evaluate on.")
        others = [j for j in self.party_order if j != self.party_id] if self.is_label else []
        only_keys(msg, ("rows", *(f"h.{j}" for j in others)))
        rows = array(msg, "rows", (None,), kinds="iu").astype(np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_test):
            raise ProtocolError(
                f"FedBCD party {self.party_id!r} was asked for test row {int(rows.max())} but holds {self.n_test} test samples."
            )
        h = self.embed(self.test_x[rows])
        if not self.is_label:
            return msg.reply(h=h)
        absent = [j for j in others if f"h.{j}" not in msg.payload]
        if absent:
            raise ProtocolError(f"FedBCD label party {self.party_id!r} got no test H of party {absent[0]!r}.")
        width = self.in_dims or {}
        hs = {j: array(msg, f"h.{j}", (rows.size, width.get(j)), kinds="f", finite=False) for j in others}
        hs[self.party_id] = h
        z = self.top_logits(hs)
        y = self.test_y[rows]  # type: ignore[index]
        if not np.isfinite(z).all():  # diverged (too large a step size or Q): no AUC
            return msg.reply(auc=float("nan"), accuracy=float("nan"), diverged=1.0)
        from sklearn.metrics import roc_auc_score

        return msg.reply(auc=float(roc_auc_score(y, z)), accuracy=float(np.mean((z > 0).astype(np.int64) == y)))

    @torch.no_grad()
    def embed(self, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        """``H_k`` of arbitrary inputs ``(n, *input_shape)`` -> ``(n, r_k)`` float32, in eval
        mode, ``batch_size`` samples at a time (evaluation)."""
        self.bottom.eval()
        out = [self._numpy(self.bottom(self._tensor(x[s : s + batch_size]))) for s in range(0, len(x), batch_size)]
        self.bottom.train()
        return np.concatenate(out) if out else np.zeros((0, self.out_dim), np.float32)

    @torch.no_grad()
    def top_logits(self, hs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Label party: logits ``(n,)`` from every party's ``H_j`` ``(n, r_j)`` (evaluation).

        Raises:
            KeyError: ``hs`` lacks a party.
        """
        return self.top([self._tensor(hs[j]) for j in self.party_order]).cpu().numpy()
