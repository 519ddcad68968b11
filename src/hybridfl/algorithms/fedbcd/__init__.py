"""Vertical FL: FedSGD, FedBCD-p, FedBCD-s and FedPBCD-p (FedBCD paper, Algorithms 1-3, eq. (15)).

``K`` parties (2..8) hold different feature blocks of the same samples, aligned by sample ID;
one of them, the *label party*, also holds the labels. Party ``k`` has a bottom model producing
``H_k`` per sample (linear ``x_k theta_k`` or a neural tower, :mod:`hybridfl.models.towers`);
the label party combines all ``H_k`` with its top model into a logit and computes the logistic
loss.

Top layer (``top``, neural towers): by default each party owns its slice ``w_k`` of the final
logistic layer and sends ``H_k = w_k^T G_k(x_k)``, a single value per sample (``party_slice``:
paper eq. (2) with the tower output in place of ``x_k``, Sec. 6 and Fig. 1a; the reference code's
``VFLHostModel.W``); the label party adds them and the bias, and returns ``dL/dH_k`` of width 1.
``top: concat`` keeps the towers' ``representation_dim``-wide outputs as ``H_k`` and a
:class:`~hybridfl.models.towers.LinearTop` at the label party: the same joint model, ``r_k``
times the bytes of ``H_k`` and ``dL/dH_k``, and different staleness in the local steps (the
passive party's tower sees ``dL/dH_k = (sigmoid(z) - y) w_k / B`` with the label party's ``w_k``
of the exchange instead of updating ``w_k`` itself). The *coordinator* (the ``server`` of the message runtime) holds no data: it relays the
parties' private sample alignment (never seeing an ID), draws the mini-batch positions, relays ``H_k`` to the label party and the
gradients ``dL/dH_k`` back, and sends the step size ``eta_t = eta_0 / sqrt(t + 1)`` (paper Sec. 8;
``t`` = 0-based communication round).

Written once as party-side and coordinator-side steps exchanging :class:`~hybridfl.runtime.messages.Message` objects; every
byte is counted by the transport. Messages (``B`` = batch size, ``r_k`` = width of ``H_k``):

- setup: ``fedbcd.properties`` (each party: its blocks, ``r_k``, whether it has labels, how many
  test samples it holds), then the sample alignment below (``fedbcd.psi_request``,
  ``.psi_serve``, ``.psi_result``, ``.align``);
- ``fedbcd.forward`` (passive party): batch positions ``(B,)`` -> ``h`` ``(B, r_k)``, only before
  the first round: later ``H_k`` of the next batch travel with the reply to ``fedbcd.party_step``;
- ``fedbcd.label`` (label party): batch positions, the ``H_k`` of the passive parties that changed,
  which gradients to return and how many local steps to take -> ``grad.<party>`` ``(B, r_k)``
  (``dL/dH_k`` at the current point, computed *before* the label party's local steps) and the loss;
  with ``local_gradient: taylor`` (payload ``curvature``) also ``curv.<party>`` ``(B, r_k)``;
- ``fedbcd.party_step`` (passive party): ``grad`` ``(B, r_k)`` (and ``curv`` ``(B, r_k)``), ``Q``,
  ``eta_t``, ``mu`` (and ``optimizer`` with ``optimizer: adam``), the next batch -> ``h_next`` ``(B, r_k)`` on the next batch (and, for
  FedBCD-s, ``h`` on the current batch after its update);
- ``fedbcd.evaluate`` (after an evaluated round, carrying its number; outside the round's protocol:
  no snapshot, no undo): to every passive party the test rows to evaluate ``(n,)`` -> ``h``
  ``(n, r_k)`` (its bottom model on its blocks of those test samples); then to the label party the
  rows and every ``h.<k>`` -> ``auc`` and ``accuracy`` of the joint prediction (or ``diverged``).
  Each party holds its blocks of the test samples, only the label party their labels; logits and
  labels never leave it. A missing reply means no metrics for that round.

Sample alignment (private set intersection, :mod:`hybridfl.privacy.psi`; every blob is opaque to the
coordinator, which only relays it, and checked by the party that receives it):

1. ``fedbcd.psi_request`` (label party ``L``): reply ``request``, its IDs blinded with a fresh PSI
   client key, and ``dh``, a fresh X25519 public key;
2. ``fedbcd.psi_serve`` (every passive party ``k``, with ``L``'s ``request`` and ``dh``): ``k``
   acts as PSI server with a fresh key and replies ``setup`` (its IDs, blinded, sorted),
   ``response`` (``L``'s request re-blinded) and its own ``dh``; it keeps the tag key
   ``K_k = SHA-256(X25519(...))`` in its state;
3. ``fedbcd.psi_result`` (``L``, with every ``setup.<k>``, ``response.<k>``, ``dh.<k>``): ``L``
   learns which of its IDs each ``k`` holds; the aligned order is the intersection of all of them
   in ``L``'s own order (as the plaintext alignment had it, so runs are unchanged); it replies
   ``n_aligned`` (0: no common sample, the setup stops) and ``tags.<k>``, the aligned IDs'
   ``HMAC-SHA-256(K_k, id)`` (16 bytes each) in that order;
4. ``fedbcd.align`` (every ``k``, with its ``tags``): ``k`` maps the tags to its rows and replies
   ``n_aligned``, which must equal ``L``'s.

Against an active coordinator: ``psi_request`` carries a fresh ``run`` label and ``L`` replies its
set size ``n``; ``k`` answers one request per run, of exactly ``n`` distinct points. With a roster
in the parties' directories (:mod:`hybridfl.privacy.roster`) ``L`` also signs ``n``, ``dh`` and
its request (``sig``), ``k`` answers only a request the roster's label party signed and signs its
``setup``, ``dh`` and ``response`` (``sig``, relayed as ``sig.<k>``), which ``L`` checks.

The coordinator learns the aligned count ``n`` (and, from the blobs' lengths, each party's number
of IDs), never an ID; a passive party learns the intersection (and ``L``'s number of IDs); ``L``
learns the intersection with each passive party (for two parties: the intersection). This holds
against an honest-but-curious coordinator: one that replaced the X25519 keys could test guessed IDs
against the tags. ``docs/privacy_alignment.md`` has the details; ``tests/test_psi.py`` audits every
message.

No raw feature value and no label appears in any message (checked on the message log by
``tests/test_fedbcd.py``). Note that ``dL/dH_k`` itself is label-dependent (for the logistic loss
its sign is the label's): that is the information FedSGD/FedBCD exchange by design (paper Sec. 6).

Local steps (paper eq. (7), (10), (15)): during its ``Q`` local steps a party recomputes its own
``H_k`` from its own data and keeps everything from the other parties at the value of the last
exchange. The label party recomputes the loss exactly with the stale ``H_{-K}``; a passive party
has neither labels nor ``H_{-k}``, so (``local_gradient: fixed``, the default, paper Alg. 2 with
eq. (5): the label party sends ``g(H_i, y_i)``) it reuses the stale ``dL/dH_k`` it received (as the
public reference code ``yankang18/FedBCD`` does: ``vlr_demo/async_lr.py`` reuses ``d``)
through its recomputed ``H_k``. The local gradient of party ``k`` is ``g_k + lambda theta_k + mu
(theta_k - theta_k^{r0})`` (L2 weight ``lambda``; the proximal term of FedPBCD-p, eq. (15), with
``theta_k^{r0}`` the parameters at the exchange).

For the linear model this makes a passive party's ``Q`` local steps exactly one step of size
``Q * eta_t``: its gradient ``X_k^T g`` does not depend on ``theta_k`` once ``g`` is fixed
(without L2 and proximal term; ``tests/test_fedbcd.py`` shows it). Only the label party, which
recomputes its loss, gains from local steps there; for neural towers the gradient through the
recomputed tower changes from step to step.

``local_gradient: taylor`` refreshes a passive party's gradient with its fresh output, as the
reference code's ``vfl.py`` ``VFLHostModel._compute_common_gradient`` does (its label party sends
the gradient of a second-order Taylor approximation of the logistic loss, affine in ``H``, and
the host adds its fresh ``A_U``). Here the label party also sends ``c_i = sigmoid'(z_i) / B`` (the
curvature of the loss in ``H_k,i`` at the exchange) and the passive party uses
``g_i + c_i (H'_k,i - H_k,i)`` at local step ``q`` (``H'_k`` its output at that step, ``H_k`` the
exchanged one): the first-order Taylor expansion of ``dL/dH_k`` with the others' ``H_j`` stale.
Step 0 is unchanged, so with ``Q = 1`` it equals ``fixed``; it needs ``H_k`` of width 1
(``linear`` or ``top: party_slice``) and adds one ``(B, 1)`` array per passive party and round.

Local update rule (``optimizer``): ``sgd`` (default, paper Alg. 1-3: ``theta_k <- theta_k -
eta_t g_k``) or ``adam`` (:class:`torch.optim.Adam` with step size ``eta_t``, its moments part of
each party's state: the reference code's MNIST-CNN choice, see
:class:`~hybridfl.algorithms.fedbcd.config.FedBCDConfig`).

Variants (one communication round = one exchange on one mini-batch):

- ``sgd``  FedSGD (Alg. 1): one local step per exchange, all parties in parallel;
- ``p``    FedBCD-p (Alg. 2): ``Q`` local steps per exchange, all parties in parallel;
- ``prox`` FedPBCD-p: FedBCD-p with the proximal term ``mu`` (eq. (15));
- ``s``    FedBCD-s (Alg. 3): the passive parties in turn, then the label party, each doing ``Q``
  local steps right after an exchange with the label party (``Exchange({k, K})``), so each sees
  the updates of the parties before it in the same round.

With ``Q = 1`` FedBCD-p is exactly FedSGD, and FedSGD is exactly mini-batch SGD on the joint
model (tested against a centrally trained copy in ``tests/test_fedbcd.py``).

A missing party (``failure_rate`` > 0 in the simulation: a party receives the round's messages and
does its work, but its replies never arrive). Vertical FL cannot form the joint prediction, the
loss or any ``dL/dH_k`` without every party's ``H_k``, so a round in which any reply is missing --
the label party's or a passive party's -- cannot be completed, and ``on_missing_party`` decides:

- ``skip`` (default): the round makes no update for anybody. The coordinator stops the round at
  the first missing reply, keeps its own batch, ``H_k`` and batch sampler state from before the
  round, and sends
  ``fedbcd.undo`` to every party that received a message in the round; each party restores the
  snapshot of its state (parameters, current batch, stored ``H_j``) it took at its first message
  of the round. A party whose ``fedbcd.undo`` reply is lost too gets ``undo`` again in its next
  message (restoring the same snapshot twice is harmless). The round still counts towards
  ``rounds`` and the step-size schedule; its metrics row has ``skipped = 1`` and ``missing`` (the
  parties without a reply, space-separated), no ``train_loss``; a warning is logged; the run's
  summary counts ``skipped_rounds``. The next round works on the mini-batch the skipped one would
  have used. So the models after a run with skipped rounds are those of a run in which nobody
  received any message in those rounds (``tests/test_fedbcd_reliability.py``).
- ``error``: the run stops with :class:`PartyMissingError`, one sentence naming the round and the
  missing party (or parties).

``device`` (``cpu`` default, ``cuda``, ``auto``; :mod:`hybridfl.models.device`): where each party's
models and the tensors made from its data live; messages carry host NumPy arrays either way.

Modules: :mod:`~hybridfl.algorithms.fedbcd.config` (settings), :mod:`~hybridfl.algorithms.fedbcd.party`
(client steps), :mod:`~hybridfl.algorithms.fedbcd.coordinator` (server steps),
:mod:`~hybridfl.algorithms.fedbcd.inputs` (input checks), :mod:`~hybridfl.algorithms.fedbcd.spec`
(the one build path, evaluation, report; :func:`run_fedbcd`).
"""

from hybridfl.algorithms.fedbcd.config import MAX_PARTIES, MIN_PARTIES, FedBCDConfig, PartyMissingError
from hybridfl.algorithms.fedbcd.coordinator import FedBCDCoordinator
from hybridfl.algorithms.fedbcd.inputs import check_inputs, party_input
from hybridfl.algorithms.fedbcd.party import FedBCDParty
from hybridfl.algorithms.fedbcd.spec import SPEC, fedbcd_spec, run_fedbcd

__all__ = [
    "MAX_PARTIES",
    "MIN_PARTIES",
    "SPEC",
    "FedBCDConfig",
    "FedBCDCoordinator",
    "FedBCDParty",
    "PartyMissingError",
    "check_inputs",
    "fedbcd_spec",
    "party_input",
    "run_fedbcd",
]
