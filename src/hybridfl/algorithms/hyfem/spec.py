"""HyFEM's :class:`~hybridfl.algorithms.spec.AlgorithmSpec`: the one place HyFEM is built.

The simulation (:func:`hybridfl.runtime.simulation.simulate`) and Flower consume :data:`SPEC`
unchanged. Metrics (HyFEM Sec. 4, "In the testing phase"):

- ``server_accuracy`` (global accuracy): the server model on all test samples with all blocks;
- ``client_accuracy_mean`` (local accuracy): each client's model, i.e. what it receives from the
  server (``P_m Theta_0``, ``Pi_m w_0``), on all test samples with only its own blocks, averaged
  over clients (``client_accuracy[<client>]`` each); ``client_accuracy_local_mean`` (simulation
  only, after the last round) is the same for the clients' models right after their ``Q`` local
  steps;
- ``centralized_accuracy``: the server-shaped model trained on all training data for ``T * Q``
  steps; ``centralized_held_accuracy``: the same on only the (sample, block) cells the clients
  hold (unheld blocks zero-padded, HyFEM Appendix A), the best these holdings allow;
  ``standalone_accuracy_mean``: each client alone for ``T * Q`` steps, local inference
  (simulation only, ``baselines: true``).

Which client model: HyFEM's client model (Alg. 1 line 10 output, Sec. 4 "the clients evaluate
their model") is the one after its ``Q`` local steps, ``client_accuracy_local_mean``;
``client_accuracy_mean`` scores the model a client receives (the server cut to its blocks).
The final table reports both, named by what they are.

Plug-in extractors: :func:`spec_with` returns the spec with another extractor factory.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np

from hybridfl.algorithms.hyfem.baselines import (
    accuracy,
    make_model_factory,
    train_centralized,
    train_centralized_held,
    train_standalone,
)
from hybridfl.algorithms.hyfem.client import HyFEMClient
from hybridfl.algorithms.hyfem.config import HyFEMConfig
from hybridfl.algorithms.hyfem.server import HyFEMServer
from hybridfl.algorithms.spec import (
    AlgorithmSpec,
    EvalContext,
    LabelRule,
    ReportContext,
    client_seed,
    no_labels_message,
    register,
)
from hybridfl.data.dataset import DatasetSplit
from hybridfl.data.export import ClientData, ServerData
from hybridfl.data.partition import Partition
from hybridfl.errors import PartitionError
from hybridfl.inference.modeldir import ModelParts
from hybridfl.matching.classifier import uncovered_share
from hybridfl.models.device import resolve_device
from hybridfl.models.hybrid import EVAL_BATCH, ExtractorFactory, default_extractor
from hybridfl.privacy.roster import peer_auth_of
from hybridfl.privacy.secagg import own_threshold

_ACC = "client_accuracy["


def _no_labels(client_id: str) -> PartitionError:
    return PartitionError(no_labels_message("HyFEM", client_id))


def _factory(cfg: HyFEMConfig, extractor_factory: ExtractorFactory | None) -> ExtractorFactory:
    return extractor_factory or default_extractor(cfg.extractor)


def check(split: DatasetSplit, partition: Partition, cfg: HyFEMConfig) -> None:
    """Every client holds labels (HyFEM trains a classifier at every client).

    Raises:
        PartitionError: the first client without labels.
    """
    for c in partition.clients:
        if not c.has_labels:
            raise _no_labels(c.client_id)


def build_server(
    server_data: ServerData,
    cfg: HyFEMConfig,
    seed: int,
    hello: dict | None = None,
    extractor_factory: ExtractorFactory | None = None,
) -> HyFEMServer:
    """The HyFEM server from the public schema (``hello`` is unused: HyFEM asks its clients for
    their properties in :meth:`HyFEMServer.setup`)."""
    return HyFEMServer(server_data.block_shapes, server_data.n_classes, cfg, seed, _factory(cfg, extractor_factory))


def build_client(
    client_data: ClientData,
    cfg: HyFEMConfig,
    seed: int,
    layout: list | None = None,
    extractor_factory: ExtractorFactory | None = None,
) -> HyFEMClient:
    """One HyFEM client from its own data, seeded with :func:`client_seed` of its partition index
    (``layout`` is unused).

    Raises:
        PartitionError: the client holds no labels.
        EncryptionPolicyError: with a roster, a secure-aggregation threshold below its roster's
            majority (:func:`~hybridfl.privacy.secagg.own_threshold`).
    """
    cd = client_data
    if not cd.has_labels:
        raise _no_labels(cd.client_id)
    auth = peer_auth_of(cd.client_id, cd.path)  # a roster in its directory: signed secure-aggregation keys
    if cfg.secure_aggregation:  # its own threshold: the server cannot lower it below the roster's majority
        own_threshold(cfg.secagg_threshold, cd.client_id, auth)
    return HyFEMClient(
        cd.client_id,
        cd.data,
        cd.block_shapes,
        cd.n_classes,
        cfg,
        client_seed(seed, cd.index),
        _factory(cfg, extractor_factory),
        peer_auth=auth,
    )


def _test_rows(n: int, k: int | None) -> np.ndarray | None:
    """A fixed random subset of ``k`` of ``n`` test rows in increasing order (``None``: all rows)."""
    if not k or k >= n:
        return None
    return np.sort(np.random.default_rng(0).permutation(n)[: int(k)])


def _block_features(server: HyFEMServer, test: Any) -> dict[str, Any]:
    """Each block's server extractor output on all test samples, ``(N, e)`` tensors, computed once
    in the batches of ``predict`` (every received model has the server's extractors), on the
    server model's device."""
    import torch

    model = server.model
    dev = next(model.parameters()).device
    model.eval()
    out = {}
    with torch.inference_mode():
        for b in model.blocks:
            x = test.blocks[b]
            out[b] = torch.cat(
                [
                    model.extractors[b](torch.from_numpy(x[s : s + EVAL_BATCH]).to(dev))
                    for s in range(0, len(x), EVAL_BATCH)
                ]
            )
    model.train()
    return out


def _classify(classifier: Any, feats: Any) -> np.ndarray:
    """Class predictions of ``classifier`` (a module, or ``fc1.weight``/``fc1.bias``/``fc2.weight``/
    ``fc2.bias`` tensors applied as the same two linear layers) on ``feats`` ``(N, in_dim)``, batch by batch."""
    import torch
    from torch.nn.functional import linear, relu

    if isinstance(classifier, dict):
        w = classifier
        fn = lambda v: linear(relu(linear(v, w["fc1.weight"], w["fc1.bias"])), w["fc2.weight"], w["fc2.bias"])  # noqa: E731
    else:
        fn = classifier
    with torch.inference_mode():
        return np.concatenate(
            [fn(feats[s : s + EVAL_BATCH]).argmax(dim=1).cpu().numpy() for s in range(0, len(feats), EVAL_BATCH)]
        )


def _received_accuracies(server: HyFEMServer, feats: dict[str, Any], y: np.ndarray, rows: Any) -> dict[str, float]:
    """Accuracy of every client's received model (``P_m Theta_0``, ``Pi_m w_0``) on the cached
    extractor features, each distinct model once: clients with the same blocks, matched neurons
    and columns receive the same model."""
    import torch

    done: dict[tuple, float] = {}
    out: dict[str, float] = {}
    for cid, info in server.clients.items():
        blocks = tuple(info["blocks"])
        assignment = np.asarray(info["assignment"])
        columns = np.asarray(info["columns"])
        key = (blocks, assignment.tobytes(), columns.tobytes())
        if key not in done:
            arrays = server.classifier.client_view(assignment, columns)
            v = torch.cat([feats[b] for b in blocks], dim=1)
            w = {k: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(v.device) for k, a in arrays.items()}
            pred = _classify(w, v if rows is None else v[torch.from_numpy(rows).to(v.device)])
            done[key] = float(np.mean(pred == y))
        out[cid] = done[key]
    return out


def evaluate(ctx: EvalContext) -> dict[str, float]:
    """Test accuracies in ``[0, 1]`` after a round on the server's test set (``{}`` without one):
    ``server_accuracy``, ``client_accuracy_mean`` and ``client_accuracy[<client>]`` of the models
    the clients receive and, after the last round when ``ctx.monitor`` (client ID ->
    :class:`HyFEMClient`) is given, ``client_accuracy_local_mean`` of the clients' models after
    their ``Q`` local steps, over the clients asked in that round (all of them with
    ``fraction_fit: 1``; with sampling, the others' models are those of an earlier round). Each
    local model is a whole model of its own (its own extractors): scoring them every round costs
    several times the training with many clients, so they are scored once, at the end.

    Every block's server extractor runs once on the test set; each distinct received model is then
    only its classifier on those features (the same predictions as the whole model, batch for
    batch). With ``test_subsample: k`` in the config (``0``/absent: all), the per-client metrics
    of rounds before the last use a fixed random subset of ``k`` test samples; the server accuracy
    and the last round always use all of them."""
    test = ctx.server_data.test
    if test is None:
        return {}
    server: HyFEMServer = ctx.server
    final = int(ctx.round) >= int(getattr(ctx.config, "rounds", ctx.round))
    rows = None if final else _test_rows(test.n_samples, getattr(ctx.config, "test_subsample", None))
    y = test.y if rows is None else test.y[rows]
    if hasattr(server, "clients") and hasattr(server, "classifier") and hasattr(server.model, "extractors"):
        feats = _block_features(server, test)
        import torch

        all_feats = torch.cat([feats[b] for b in server.model.blocks], dim=1)
        server_model = server.model
        server_model.eval()
        row = {"server_accuracy": float(np.mean(_classify(server_model.classifier, all_feats) == test.y))}
        server_model.train()
        local = _received_accuracies(server, feats, y, rows)
    else:  # a server without HyFEM's internals: every model on its own
        row = {"server_accuracy": accuracy(server.model, test)}
        sub = test if rows is None else test.take(rows)
        local = {cid: accuracy(server.client_model(cid), sub) for cid in server.clients}
    row["client_accuracy_mean"] = float(np.mean(list(local.values()))) if local else float("nan")
    if ctx.monitor is not None and final:  # the clients' own models: once, at the end (see above)
        trained = set(server.sampled(int(ctx.round))) if hasattr(server, "sampled") else set(ctx.monitor)
        after = {cid: accuracy(c.model, test) for cid, c in ctx.monitor.items() if cid in trained}
        row["client_accuracy_local_mean"] = float(np.mean(list(after.values()))) if after else float("nan")
    for cid, v in local.items():
        row[f"{_ACC}{cid}]"] = v
    return row


def monitor(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFEMConfig,
    seed: int,
    clients: dict[str, HyFEMClient],
    secrets: dict[str, bytes],
) -> dict[str, HyFEMClient]:
    """The simulation's privileged view: the client objects themselves (their models after the
    local steps, for ``client_accuracy_local_mean``)."""
    return clients


def report(ctx: ReportContext) -> tuple[dict[str, Any], list[list]]:
    """HyFEM's summary keys and final table rows.

    Summary: ``variant``, the last evaluation's ``server_accuracy``, ``client_accuracy_mean``
    (received models), ``client_accuracy_local_mean`` (models after the ``Q`` local steps, the
    paper's client models; ``None`` over Flower), ``client_accuracy`` (client -> accuracy of the
    received model), ``local_steps``, ``server_width`` ``H``, ``matching_cost`` and
    ``matching_uncovered`` (the matching options that produced the numbers),
    ``matching_uncovered_share`` (share of the server's ``W1`` entries no client's view covers:
    where ``matching_uncovered`` matters), and
    ``centralized_accuracy``, ``centralized_held_accuracy`` and ``standalone_accuracy_mean`` from
    the baselines (``None`` when they did not run).
    """
    cfg: HyFEMConfig = ctx.config
    last = ctx.history[-1] if ctx.history else {}
    base = ctx.baselines or {}
    s: dict[str, Any] = {
        "variant": cfg.variant,
        "server_accuracy": last.get("server_accuracy"),
        "client_accuracy_mean": last.get("client_accuracy_mean"),
        "client_accuracy_local_mean": last.get("client_accuracy_local_mean"),
        "client_accuracy": {k[len(_ACC) : -1]: v for k, v in last.items() if k.startswith(_ACC)},
        "local_steps": cfg.local_steps,
        "server_width": ctx.server.classifier.width,
        "matching_cost": cfg.matching.cost,
        "matching_uncovered": cfg.matching.uncovered,
        "matching_uncovered_share": uncovered_share(
            ctx.server.classifier.width,
            ctx.server.classifier.W1.shape[1],
            [(i["assignment"], i["columns"]) for i in getattr(ctx.server, "clients", {}).values()],
        ),
        "centralized_accuracy": base.get("centralized_accuracy"),
        "centralized_held_accuracy": base.get("centralized_held_accuracy"),
        "standalone_accuracy_mean": base.get("standalone_accuracy_mean"),
    }
    rows = [
        ["server (global: all test samples, all blocks)", s["server_accuracy"], "percent"],
        [
            "clients, mean, after their Q local steps (paper's client model; own blocks)",
            s["client_accuracy_local_mean"],
            "percent",
        ],
        ["clients, mean, model received from the server (own blocks)", s["client_accuracy_mean"], "percent"],
        ["centralised (all training data, same T*Q budget)", s["centralized_accuracy"], "percent"],
        ["centralised on the cells the clients hold (same budget)", s["centralized_held_accuracy"], "percent"],
        ["stand-alone clients, mean (no communication)", s["standalone_accuracy_mean"], "percent"],
    ]
    return s, rows


def baselines(
    split: DatasetSplit,
    partition: Partition,
    cfg: HyFEMConfig,
    seed: int,
    extractor_factory: ExtractorFactory | None = None,
) -> dict[str, Any]:
    """The centralised and stand-alone baselines (HyFEM Sec. 4) with the federation's budget of
    ``T * Q`` steps and its step-size schedule (``lr_decay``): ``centralized_accuracy``,
    ``centralized_seconds`` (wall time, s), ``centralized_held_accuracy`` (on the cells the clients hold,
    :func:`~hybridfl.algorithms.hyfem.baselines.train_centralized_held`),
    ``standalone_accuracy_mean`` and ``standalone_accuracy`` (client -> accuracy); with
    ``cfg.baselines`` false only the three headline keys, ``None``."""
    if not cfg.baselines:
        return {"centralized_accuracy": None, "centralized_held_accuracy": None, "standalone_accuracy_mean": None}
    make = make_model_factory(
        split, cfg.extractor_dim, cfg.hidden, _factory(cfg, extractor_factory), resolve_device(cfg.device)
    )
    budget = cfg.rounds * cfg.local_steps
    # the federation's step-size schedule (lr_decay), in chunks of Q steps as a client's rounds
    sched = {"lr_at": cfg.lr_at, "round_steps": cfg.local_steps} if cfg.lr_decays else {}
    t0 = time.perf_counter()
    _, cen = train_centralized(split, make, budget, cfg.batch_size, cfg.lr, cfg.momentum, seed, **sched)
    seconds = time.perf_counter() - t0
    _, held = train_centralized_held(
        split, partition, make, budget, cfg.batch_size, cfg.lr, cfg.momentum, seed, **sched
    )
    alone = train_standalone(split, partition, make, budget, cfg.batch_size, cfg.lr, cfg.momentum, seed, **sched)
    return {
        "centralized_seconds": seconds,
        "centralized_accuracy": cen,
        "centralized_held_accuracy": held,
        "standalone_accuracy_mean": float(np.mean(list(alone.values()))),
        "standalone_accuracy": alone,
    }


def _state(module: Any, prefix: str) -> dict[str, np.ndarray]:
    """``prefix + name`` -> float32 array of every entry of ``module``'s state dict (on the host)."""
    return {prefix + k: v.detach().cpu().numpy().astype(np.float32) for k, v in module.state_dict().items()}


def export_model(server: HyFEMServer, clients: Any, cfg: HyFEMConfig) -> ModelParts:
    """The server model (``global.*``: every block's extractor and the server classifier, HyFEM
    eq. (2)-(3)) and the model each client receives (``client.<i>.*``: ``P_m Theta_0`` and
    ``Pi_m w_0``, its blocks; :meth:`HyFEMServer.client_model`), as
    :class:`~hybridfl.inference.predictors.HyFEMModel` loads them."""
    tensors = _state(server.model, "global.")
    entries = []
    for i, cid in enumerate(server.clients):
        m = server.client_model(cid)
        tensors.update(_state(m, f"client.{i}."))
        entries.append({"id": cid, "blocks": list(m.blocks), "hidden": int(m.classifier.fc1.out_features)})
    meta = {
        "extractor": cfg.extractor,
        "extractor_dim": int(cfg.extractor_dim),
        "hidden": int(server.model.classifier.fc1.out_features),
        "clients": entries,
    }
    return ModelParts("hyfem", tensors, meta)


SPEC = register(
    AlgorithmSpec(
        "hyfem",
        HyFEMConfig,
        "HyFEM-Avg / HyFEM-Prox: hybrid FL for deep models with classifier matching",
        build_server=build_server,
        build_client=build_client,
        check=check,
        labels=LabelRule("HyFEM", "every"),  # each client trains its classifier on its labelled rows
        evaluate=evaluate,
        report=report,
        monitor=monitor,
        baselines=baselines,
        export_model=export_model,
    )
)
"""HyFEM's registered recipe (default extractors of ``config.extractor``)."""


def spec_with(extractor_factory: ExtractorFactory | None) -> AlgorithmSpec:
    """HyFEM's spec with plug-in extractors: ``extractor_factory(block, shape, out_dim) ->
    torch.nn.Module`` for the server, the clients and the baselines (:data:`SPEC` itself for
    ``None``). The result is not registered; pass it to the runtime directly."""
    if extractor_factory is None:
        return SPEC
    return dataclasses.replace(
        SPEC,
        build_server=functools.partial(build_server, extractor_factory=extractor_factory),
        build_client=functools.partial(build_client, extractor_factory=extractor_factory),
        baselines=functools.partial(baselines, extractor_factory=extractor_factory),
        export_model=None,  # plug-in extractors cannot be rebuilt from a model directory
    )
