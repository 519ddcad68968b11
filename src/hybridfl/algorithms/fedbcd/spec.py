"""FedBCD's :class:`~hybridfl.algorithms.spec.AlgorithmSpec` (``algorithm: fedbcd``) and
:func:`run_fedbcd`, the in-process run.

The one build path, used by the simulation and by every Flower SuperNode alike:
:func:`build_client` replays the models' initialisation from the public layout
(``torch.manual_seed(seed)``, one bottom model per party in partition order from the public block
shapes, then the top model) and keeps its own party's bottom (and, for the label party, the top);
:func:`build_server` is the data-less :class:`FedBCDCoordinator`.

Metrics per evaluated round, through the protocol (``fedbcd.evaluate``, see
:mod:`hybridfl.algorithms.fedbcd`; each party holds its blocks of the test samples, only the label
party their labels): ``auc`` (test ROC AUC, ``sklearn.metrics.roc_auc_score``), ``accuracy``
(logit > 0 means class 1), plus the round's mini-batch ``train_loss`` and step size ``lr``; a
diverged model (non-finite logits) has ``diverged`` = 1 and NaN metrics and stops the run.
``eval_subset`` evaluates on a fixed random subset of the test set (the same rows every round).
The summary has the final ``auc``/``accuracy``, ``best_auc`` and, when ``target_auc`` is set,
``rounds_to_target`` (the first *evaluated* round whose test AUC reaches it, ``None`` if none did;
with ``eval_every`` > 1 it is a multiple of ``eval_every`` unless ``eval_dense_from`` switched to
evaluating every round once the AUC reached that value). With ``failure_rate`` > 0 it also has
``client_failures`` (failed (round, party) draws), ``skipped_rounds`` and ``skipped`` (each skipped
round with the parties whose reply was missing); a skipped round's metrics row has ``skipped`` = 1
and ``missing``.

Checkpoint and resume (:func:`hybridfl.runtime.simulation.simulate`): the coordinator's batch,
``H_k``, batch sampler state, pending undos and skipped rounds; every party's parameters, current
batch, stored ``H_j`` and round snapshot; torch's global random state; the transport's log and
failure draws; the metrics history. A resumed run (build, setup, restore) ends with the same
models and metrics as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridfl.algorithms.fedbcd.config import FedBCDConfig
from hybridfl.algorithms.fedbcd.coordinator import FedBCDCoordinator
from hybridfl.algorithms.fedbcd.inputs import check_inputs, party_input, party_shape
from hybridfl.algorithms.fedbcd.party import FedBCDParty
from hybridfl.algorithms.spec import AlgorithmSpec, EvalContext, LabelRule, ReportContext, register
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.export import ClientData, ServerData
from hybridfl.data.partition import Partition
from hybridfl.errors import PartitionError, UnknownBlockError
from hybridfl.inference.modeldir import ModelParts
from hybridfl.models.device import resolve_device
from hybridfl.models.towers import SlicedTower, TowerFactory, bottom_factory, make_top
from hybridfl.privacy.roster import peer_auth_of
from hybridfl.runtime.loop import finite

TopFactory = Callable[[list[int]], torch.nn.Module]
"""``top_factory(out_dims) -> nn.Module``: a top model over the parties' ``H_k`` widths, party order."""


def _own_blocks(cd: ClientData, layout: Sequence[Sequence[Any]]) -> tuple[list[str], list[str]]:
    """The layout's party order and the client's own blocks in the layout's order.

    Raises:
        PartitionError: the client is not in the layout or holds other blocks than it says.
        UnknownBlockError: a block of the layout or of the client is not in the schema.
    """
    order = [str(e[0]) for e in layout]
    if cd.client_id not in order:
        raise PartitionError(f"client {cd.client_id!r} is not in the run's party layout ({', '.join(order)}).")
    for cid, blocks, _ in layout:
        for b in blocks:
            if b not in cd.block_shapes:
                raise UnknownBlockError(str(cid), str(b))
    for b in cd.data.block_names:
        if b not in cd.block_shapes:
            raise UnknownBlockError(cd.client_id, b)
    own = [str(b) for b in layout[order.index(cd.client_id)][1]]
    if sorted(own) != sorted(cd.data.block_names):
        raise PartitionError(
            f"client {cd.client_id!r} holds blocks {', '.join(cd.data.block_names)}, the run's layout says {', '.join(own)}."
        )
    return order, own


def _bottom_models(
    cd: ClientData,
    cfg: FedBCDConfig,
    seed: int,
    layout: Sequence[Sequence[Any]],
    tower_factory: TowerFactory | None,
    top_factory: TopFactory | None,
) -> tuple[dict[str, torch.nn.Module], dict[str, tuple[int, ...]]]:
    """Every party's bottom model and input shape, party -> ..., initialised in layout order after
    ``torch.manual_seed(seed)`` (as :func:`build_client` describes)."""
    layout_top = "concat" if top_factory is not None else cfg.top
    factory = tower_factory or bottom_factory(cfg.model, cfg.representation_dim, cfg.hidden, cfg.channels, layout_top)
    out_dim = 1 if cfg.model == "linear" else int(cfg.representation_dim)
    torch.manual_seed(seed)
    bottoms, shapes = {}, {}
    for i, (cid, blocks, _) in enumerate(layout):
        shapes[str(cid)] = party_shape(cd.block_shapes, [str(b) for b in blocks])
        bottoms[str(cid)] = factory(i, shapes[str(cid)], out_dim)
        if tower_factory is not None and layout_top == "party_slice" and cfg.model != "linear":
            with torch.no_grad():
                width = int(bottoms[str(cid)](torch.zeros((1, *shapes[str(cid)]))).shape[1])
            bottoms[str(cid)] = SlicedTower(bottoms[str(cid)], width)
    return bottoms, shapes


def build_client(
    cd: ClientData,
    cfg: FedBCDConfig,
    seed: int,
    layout: Sequence[Sequence[Any]],
    tower_factory: TowerFactory | None = None,
    top_factory: TopFactory | None = None,
) -> FedBCDParty:
    """One party from its own data and the public layout ``[(client_id, blocks, has_labels)]``.

    Replays the initialisation of every party's model: ``torch.manual_seed(seed)``, one bottom
    model per layout entry in layout order (input shape from the public block schema, see
    :func:`~hybridfl.algorithms.fedbcd.inputs.party_shape`), then -- for the label party -- the
    top model; keeps its own. Every party, in the simulation or on its own SuperNode, so starts
    from the same weights. Its input is its blocks in the layout's order (training and, if
    ``cd.test`` is set, test samples).

    The top layer's layout is ``cfg.top`` (:class:`FedBCDConfig`): the built-in ``cnn``/``mlp``
    towers of width ``representation_dim`` are wrapped in their party's slice of the top layer
    (:class:`~hybridfl.models.towers.SlicedTower`, ``party_slice``) or not (``concat``); a custom
    ``tower_factory`` (called with ``out_dim`` = ``representation_dim``, 1 for ``linear``) is
    wrapped likewise with ``party_slice`` unless a ``top_factory`` is given (which then takes the
    towers' outputs as they are). The models and the party's data live on ``cfg.device``
    (:func:`~hybridfl.models.device.resolve_device`; initialised on the CPU, then moved, so the
    initial weights do not depend on the device).

    Raises:
        PartitionError: the client is not in the layout, holds other blocks than the layout
            says, or its input has another shape than the schema gives.
        UnknownBlockError: a block of the layout or of the client is not in the schema.
    """
    order, own = _own_blocks(cd, layout)
    device = resolve_device(cfg.device)
    bottoms, shapes = _bottom_models(cd, cfg, seed, layout, tower_factory, top_factory)
    x = party_input(cd.data, own)
    if tuple(x.shape[1:]) != shapes[cd.client_id]:
        raise PartitionError(
            f"client {cd.client_id!r} holds input of shape {tuple(x.shape[1:])}, the schema says {shapes[cd.client_id]}."
        )
    test_x = party_input(cd.test, own) if cd.test is not None else None
    auth = peer_auth_of(cd.client_id, cd.path)  # a roster in its directory: signed PSI request and answers
    if not cd.has_labels:
        return FedBCDParty(
            cd.client_id, cd.data.ids, x, bottoms[cd.client_id], own, test_x=test_x, device=device, peer_auth=auth
        )
    with torch.no_grad():
        dims = [int(bottoms[c](torch.zeros((1, *shapes[c]))).shape[1]) for c in order]
    top = top_factory(dims) if top_factory is not None else make_top(cfg.model, dims, cfg.top, cfg.fit_intercept)
    return FedBCDParty(
        cd.client_id,
        cd.data.ids,
        x,
        bottoms[cd.client_id],
        own,
        labels=cd.data.y,
        top=top,
        party_order=order,
        test_x=test_x,
        test_y=cd.test.y if cd.test is not None else None,
        peer_auth=auth,
        device=device,
        in_dims=dict(zip(order, dims)),
    )


def build_server(sd: ServerData, cfg: FedBCDConfig, seed: int, hello: dict) -> FedBCDCoordinator:
    """The coordinator (it needs no data: roles, IDs and test set size come from the parties)."""
    return FedBCDCoordinator(cfg, seed)


def evaluate(ctx: EvalContext) -> dict[str, float]:
    """``auc``, ``accuracy`` (and ``diverged``) of the joint model after round ``ctx.round``,
    through ``fedbcd.evaluate`` messages (:meth:`FedBCDCoordinator.evaluate`); ``{}`` when a
    reply is missing."""
    return ctx.server.evaluate(ctx.round, ctx.exchange)


def rounds_to_target(history: list[dict], cfg: FedBCDConfig) -> int | None:
    """The first round whose evaluated test AUC is ``>= target_auc`` (``None``: no target, or
    not reached)."""
    if cfg.target_auc is None:
        return None
    return next((int(r["round"]) for r in history if "auc" in r and r["auc"] >= cfg.target_auc), None)


def should_stop(history: list[dict], cfg: FedBCDConfig) -> bool:
    """Stop after the last row of ``history``: the model diverged (``diverged`` or a non-finite
    ``train_loss``), or ``stop_at_target`` and an evaluated AUC reached ``target_auc``."""
    if not history:
        return False
    last = history[-1]
    if last.get("diverged") or not finite(last.get("train_loss", 0.0)):
        return True
    return bool(cfg.stop_at_target and rounds_to_target(history, cfg) is not None)


def eval_due(rnd: int, history: list[dict], cfg: FedBCDConfig) -> bool:
    """Evaluate round ``rnd`` although ``eval_every`` does not say so: an earlier row's test AUC
    reached ``eval_dense_from`` (dense evaluation near the target)."""
    t = cfg.eval_dense_from
    return t is not None and any("auc" in r and r["auc"] >= t for r in history)


def report(ctx: ReportContext) -> tuple[dict, list]:
    """FedBCD's summary keys (variant, method, local_steps, mu, parties, label_party, model, auc,
    accuracy, best_auc, diverged, target_auc, rounds_to_target, eval_samples, failure_rate,
    on_missing_party, skipped_rounds, skipped) and its final table rows."""
    cfg: FedBCDConfig = ctx.config
    server: FedBCDCoordinator = ctx.server
    history = ctx.history
    final = history[-1] if history else {}
    aucs = [r["auc"] for r in history if "auc" in r and np.isfinite(r["auc"])]
    rtt = rounds_to_target(history, cfg)
    K = len(server.parties) or ctx.n_clients
    summary = {
        "variant": cfg.variant,
        "method": cfg.label(),
        "local_steps": cfg.Q,
        "mu": cfg.mu,
        "parties": K,
        "label_party": server.label_party,
        "model": cfg.model,
        "auc": final.get("auc"),
        "accuracy": final.get("accuracy"),
        "best_auc": max(aucs, default=float("nan")),
        "diverged": bool(final.get("diverged", 0.0)) or not finite(final.get("train_loss", 0.0)),
        "target_auc": cfg.target_auc,
        "rounds_to_target": rtt,
        "eval_samples": int(server.eval_rows().size),
        "failure_rate": cfg.failure_rate,
        "on_missing_party": cfg.on_missing_party,
        "skipped_rounds": len(server.skipped),
        "skipped": [{"round": r, "missing": m} for r, m in server.skipped],
    }
    mu = f", mu={cfg.mu:g}" if cfg.mu else ""
    rows: list[list] = [
        [f"{cfg.label()} (Q={cfg.Q}{mu}, K={K}): test AUC", final.get("auc"), "percent"],
        ["test accuracy", final.get("accuracy"), "percent"],
        ["best test AUC", max(aucs, default=None), "percent"],
    ]
    if cfg.target_auc is not None:
        rows.append([f"rounds to test AUC {100 * cfg.target_auc:g} %", rtt, "plain"])
    if cfg.failure_rate or server.skipped:
        rows.append(["rounds skipped (a party's reply missing)", len(server.skipped), "plain"])
    return summary, rows


def plot_auc(history: list[dict[str, float]], cfg: FedBCDConfig, path: Path, title: str = "") -> Path:
    """Test AUC (%) vs communication round, with the target as a dashed line; a PNG written
    atomically to ``path``."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hybridfl.files import atomic_write

    h = [r for r in history if "auc" in r]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([r["round"] for r in h], [100 * r["auc"] for r in h], "o-", ms=3, label=f"{cfg.label()} Q={cfg.Q}")
    if cfg.target_auc is not None:
        ax.axhline(100 * cfg.target_auc, ls="--", color="gray", label=f"target {100 * cfg.target_auc:g} %")
    ax.set_xlabel("communication round")
    ax.set_ylabel("test AUC (%)")
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return path


def plots(history: list[dict], cfg: FedBCDConfig, title: str) -> list[Callable[[Path], Path]]:
    """The extra plot of a FedBCD run: ``auc.png`` (:func:`plot_auc`) in the output directory, when
    a round has an AUC (none without a test set: no empty plot)."""

    def write(out: Path) -> Path | None:
        if not any("auc" in r for r in history):
            return None
        return plot_auc(history, cfg, Path(out) / "auc.png", title)

    return [write]


def export_model(server: FedBCDCoordinator, clients: Any, cfg: FedBCDConfig) -> ModelParts | None:
    """Every party's bottom model (``party.<i>.*``, ``i`` its place in the top model's order) and
    the label party's top model (``top.*``: the bias ``b`` of FedBCD eq. (2), or the whole last
    layer with ``top: concat``), as :class:`~hybridfl.inference.predictors.FedBCDModel` loads
    them. Needs the parties themselves (``None`` without them: over Flower each party keeps its own)."""
    if not clients:
        return None
    label = next((p for p in clients.values() if p.is_label), None)
    if label is None:
        return None
    tensors: dict[str, np.ndarray] = {}
    parties = []
    for i, pid in enumerate(label.party_order):
        party = clients[pid]
        tensors.update(
            {
                f"party.{i}.{k}": v.detach().cpu().numpy().astype(np.float32)
                for k, v in party.bottom.state_dict().items()
            }
        )
        parties.append({"id": pid, "blocks": list(party.blocks)})
    tensors.update({f"top.{k}": v.detach().cpu().numpy().astype(np.float32) for k, v in label.top.state_dict().items()})
    return ModelParts("fedbcd", tensors, _model_meta(cfg, parties, label.party_id))


def _model_meta(cfg: FedBCDConfig, parties: list[dict], label_party: str) -> dict:
    return {
        "model": cfg.model,
        "top": cfg.top,
        "representation_dim": int(cfg.representation_dim),
        "hidden": int(cfg.hidden),
        "channels": int(cfg.channels),
        "fit_intercept": bool(cfg.fit_intercept),
        "parties": parties,
        "label_party": label_party,
    }


def export_part(
    party: FedBCDParty, cfg: FedBCDConfig, layout: Sequence[Sequence[Any]]
) -> tuple[ModelParts, dict] | None:
    """One party's part of the model from its own state (over Flower the server never holds a
    bottom model): its bottom model ``unit.0.bottom.*`` and, for the label party, the top's bias
    ``head.bias`` (FedBCD eq. (2): ``logit = sum_k H_k + b``), with the model settings of
    :func:`export_model` (the parties from the public ``layout``). ``None`` when the top is not a
    sum (``top: concat`` with a non-linear model): federated prediction needs a summed top."""
    if not (cfg.model == "linear" or cfg.top == "party_slice"):
        return None
    tensors = {
        f"unit.0.bottom.{k}": v.detach().cpu().numpy().astype(np.float32) for k, v in party.bottom.state_dict().items()
    }
    if party.is_label:
        bias = getattr(party.top, "bias", None)
        tensors["head.bias"] = np.atleast_1d(np.asarray(float(bias.detach().cpu()[0]) if bias is not None else 0.0))
    parties = [{"id": str(c), "blocks": [str(b) for b in blocks]} for c, blocks, _ in layout]
    label_party = next((str(c) for c, _, lab in layout if lab), "")
    info = {"organisation": party.party_id, "units": [party.party_id], "head": bool(party.is_label), "width": 1}
    return ModelParts("fedbcd", tensors, _model_meta(cfg, parties, label_party)), info


SPEC = register(
    AlgorithmSpec(
        name="fedbcd",
        config_model=FedBCDConfig,
        description="FedSGD / FedBCD-p / FedBCD-s / FedPBCD-p: vertical FL with K parties and one label party",
        build_server=build_server,
        build_client=build_client,
        check=check_inputs,
        labels=LabelRule("FedBCD", "one"),  # the label party; samples it holds no label for are not trained on
        evaluate=evaluate,
        report=report,
        should_stop=should_stop,
        eval_due=eval_due,
        plots=plots,
        clients_hold_test=True,
        export_model=export_model,
        export_part=export_part,
    )
)
"""FedBCD's recipe, registered as ``fedbcd``."""


def fedbcd_spec(tower_factory: TowerFactory | None = None, top_factory: TopFactory | None = None) -> AlgorithmSpec:
    """:data:`SPEC` with plug-in models: ``tower_factory(party_index, input_shape, out_dim)``
    replaces the built-in bottom models, ``top_factory(out_dims)`` the top model (see
    :mod:`hybridfl.models.towers`). Not registered (a deployment builds the built-in models)."""
    if tower_factory is None and top_factory is None:
        return SPEC
    build = functools.partial(build_client, tower_factory=tower_factory, top_factory=top_factory)
    # plug-in models cannot be rebuilt from a model directory: no export
    return dataclasses.replace(SPEC, build_client=build, export_model=None, export_part=None)


def run_fedbcd(
    split: DatasetSplit,
    partition: Partition,
    cfg: FedBCDConfig,
    seed: int = 0,
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
    tower_factory: TowerFactory | None = None,
    recorder: Callable[[bytes], None] | None = None,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    fail_at: Any = (),
):
    """FedSGD / FedBCD in process for ``cfg.rounds`` rounds (or until ``target_auc`` with
    ``stop_at_target``, or divergence): :func:`hybridfl.runtime.simulation.simulate` of
    :func:`fedbcd_spec` ``(tower_factory)``.

    Args:
        progress: called after every round with ``(round, rounds, metrics_row)``.
        recorder: receives the raw bytes of every message (audits), evaluation messages included.
        checkpoint: file to write the run's state to after every round (atomically).
        resume: continue from ``checkpoint`` (written by an interrupted run with the same config
            and seed) after its last completed round; the result equals an uninterrupted run's.
        fail_at: explicit ``(round, party)`` failures (replies lost) besides ``failure_rate``.

    Returns:
        A :class:`~hybridfl.runtime.simulation.RunResult` (summary, history, log, ``auc.png``).

    Raises:
        HybridFLError: an input problem (:func:`~hybridfl.algorithms.fedbcd.inputs.check_inputs`),
            ``resume`` without a checkpoint of this run.
        PartyMissingError: a party's reply is missing and ``on_missing_party`` is ``error``.
    """
    from hybridfl.runtime.simulation import simulate

    spec = fedbcd_spec(tower_factory)
    return simulate(spec, split, partition, cfg, seed, progress, recorder, checkpoint, resume, fail_at=fail_at)
