"""How each algorithm is deployed: build its server and one client from exported data.

A :class:`Deployable` tells the Flower app, for one algorithm, how to build the *same* server and
client objects the in-process simulation builds (``build_hyfem`` etc.), from what a deployment has:
the server from the public schema of an exported ``server/`` directory, a client from its own
exported directory (:class:`~hybridfl.data.export.ClientData`). It also names the client state that
must survive between two messages: Flower runs one ClientApp process per message, so the client
object is rebuilt for every message and its state restored from ``context.state``.

No algorithm is implemented here: every step is the algorithm's own ``handle``/``setup``/
``run_round``. To add an algorithm, register a :class:`Deployable` with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from hybridfl.data.export import ClientData, ServerData
from hybridfl.errors import ConfigError, PartitionError

StateDict = dict[str, np.ndarray]


@dataclass(frozen=True)
class Deployable:
    """One algorithm's deployment recipe.

    Attributes:
        name: the algorithm name (``algorithm.name`` of a run config).
        config_model: its pydantic config class.
        build_server: ``(server_data, config, seed, hello) -> server`` with ``setup``/``run_round``;
            ``hello`` maps client ID -> the payload of its hello reply (e.g. HE public material).
        build_client: ``(client_data, config, seed, layout) -> client`` with ``handle(msg) -> msg``;
            ``layout`` is the public structure of the export, ``[(client_id, blocks, has_labels)]``
            in partition order (FedBCD replays the model initialisation of every party from it).
        get_state: ``client -> {name: value}`` (codec-encodable values): what must survive until
            the next message.
        set_state: ``(client, state) -> None``: restore it into a freshly built client.
        evaluate: optional ``(server, server_data, round) -> metrics`` on the server's test set.
        hello_payload: optional ``(client_data, config) -> dict`` a client adds to its hello reply.
        final_arrays: optional ``server -> {name: array}`` written to ``final.npz`` after the run.
    """

    name: str
    config_model: type[BaseModel]
    build_server: Callable[[ServerData, Any, int, dict[str, dict]], Any]
    build_client: Callable[[ClientData, Any, int, list], Any]
    get_state: Callable[[Any], StateDict]
    set_state: Callable[[Any, Mapping[str, np.ndarray]], None]
    evaluate: Callable[[Any, ServerData, int], dict[str, float]] | None = None
    hello_payload: Callable[[ClientData, Any], dict] | None = None
    final_arrays: Callable[[Any], dict[str, np.ndarray]] | None = None


_REGISTRY: dict[str, Deployable] = {}


def register(d: Deployable) -> Deployable:
    _REGISTRY[d.name] = d
    return d


def deployable(name: str) -> Deployable:
    """The deployment recipe of an algorithm.

    Raises:
        ConfigError: the algorithm has no Flower deployment (lists those that do).
    """
    _load_builtin(name)
    if name not in _REGISTRY:
        raise ConfigError(f"algorithm {name!r} cannot be deployed on Flower yet (deployable: {', '.join(sorted(_REGISTRY))}).")
    return _REGISTRY[name]


def deployables() -> dict[str, Deployable]:
    _load_builtin()
    return dict(_REGISTRY)


# --------------------------------------------------------------------------------------- HyFEM
def _hyfem() -> Deployable:
    from hybridfl.algorithms.hyfem import HyFEMClient, HyFEMConfig, HyFEMServer
    from hybridfl.models.hybrid import default_extractor

    def build_server(sd: ServerData, cfg: HyFEMConfig, seed: int, hello: dict) -> HyFEMServer:
        return HyFEMServer(sd.block_shapes, sd.n_classes, cfg, seed, default_extractor(cfg.extractor))

    def build_client(cd: ClientData, cfg: HyFEMConfig, seed: int, layout: list) -> HyFEMClient:
        if not cd.has_labels:
            raise PartitionError(f"HyFEM needs labels at every client, but client {cd.client_id!r} has none.")
        # the seeds of hybridfl.algorithms.hyfem_run.build_hyfem: client i gets seed + 1 + i
        return HyFEMClient(cd.client_id, cd.data, cd.block_shapes, cd.n_classes, cfg, seed + 1 + cd.index,
                           default_extractor(cfg.extractor))

    def evaluate(server: HyFEMServer, sd: ServerData, rnd: int) -> dict[str, float]:
        # the server-side metrics of hybridfl.algorithms.hyfem_run.run_hyfem's evaluate
        from hybridfl.algorithms.baselines import accuracy

        if sd.test is None:
            return {}
        row = {"server_accuracy": accuracy(server.model, sd.test)}
        local = {cid: accuracy(server.client_model(cid), sd.test) for cid in server.clients}
        row["client_accuracy_mean"] = float(np.mean(list(local.values())))
        for cid, v in local.items():
            row[f"client_accuracy[{cid}]"] = v
        return row

    return Deployable("hyfem", HyFEMConfig, build_server, build_client,
                      lambda c: c.get_state(), lambda c, s: c.set_state(s), evaluate)


# --------------------------------------------------------------------------------------- HyFDCA
def _hyfdca() -> Deployable:
    from hybridfl.algorithms.convex.problem import features, positive_set, signed_labels
    from hybridfl.algorithms.hyfdca import HyFDCAClient, HyFDCAConfig, HyFDCAServer
    from hybridfl.errors import DataError
    from hybridfl.privacy.he import PlainBackend, server_backend
    from hybridfl.runtime.flower.keys import SECRET_FILE, load_secret

    def _backend(cd: ClientData, cfg: HyFDCAConfig):
        if cfg.encryption == "none":
            return PlainBackend(), b""
        scheme, be, public = load_secret((cd.path or Path(".")) / SECRET_FILE)
        if scheme != cfg.encryption:
            raise DataError(f"client {cd.client_id!r} holds a {scheme} key but the run uses {cfg.encryption} encryption.")
        return be, public

    def hello_payload(cd: ClientData, cfg: HyFDCAConfig) -> dict:
        # only the public material leaves the client; the secret key stays in its directory
        return {"he_scheme": cfg.encryption, "he_public": _backend(cd, cfg)[1]}

    def build_server(sd: ServerData, cfg: HyFDCAConfig, seed: int, hello: dict) -> HyFDCAServer:
        publics = {bytes(h.get("he_public", b"")) for h in hello.values()}
        if len(publics) != 1:
            raise DataError("the clients hold different HE keys (every client needs the same he_secret.key).")
        return HyFDCAServer(sd.block_shapes, cfg, server_backend(cfg.encryption, publics.pop(), cfg.precision_bits), seed)

    def build_client(cd: ClientData, cfg: HyFDCAConfig, seed: int, layout: list) -> HyFDCAClient:
        if not cd.has_labels:
            raise PartitionError(f"client {cd.client_id!r} has no labels, but HyFDCA needs the labels of every sample at its holders.")
        pos = positive_set(cd.data, cfg.positive_classes, cfg.loss, "HyFDCA")
        # the seeds of hybridfl.algorithms.hyfdca_run.build_hyfdca: client i gets seed + 1 + i
        return HyFDCAClient(cd.client_id, cd.data, pos, _backend(cd, cfg)[0], seed + 1 + cd.index, cfg.sparse)

    _ARR = ("alpha", "u", "q", "w", "own_sq")

    def _count(st: Mapping[str, Any], prefix: str) -> int:
        return sum(1 for k in st if k.startswith(prefix))

    def get_state(c: HyFDCAClient) -> dict:
        import json

        # everything HyFDCAClient.init/handle set after construction (its constructor rebuilds the rest)
        st: dict = {k: np.asarray(getattr(c, k)) for k in _ARR if hasattr(c, k)}
        if getattr(c, "pending", None) is not None:  # block-mode duals awaiting the server's commit
            st["pending"] = np.asarray(c.pending)
        if c.params:
            import json

            st["params"] = json.dumps(c.params)
            st["seg_scale"] = np.asarray(c.seg_scale, dtype=np.float64)
            for s, rows in enumerate(c.seg_rows):
                st[f"seg_rows.{s}"] = np.asarray(rows, dtype=np.int64)
                if c.seg_colw[s] is not None:
                    st[f"seg_colw.{s}"] = np.asarray(c.seg_colw[s], dtype=np.float64)
        if c.seg_global:  # segment mode: fixed mini-batches, their Gram matrices, this round's pass
            st["seg_global"] = np.asarray(c.seg_global, dtype=np.int64)
            for s, batches in enumerate(c.seg_batches):
                for m, rows in enumerate(batches):
                    st[f"batch.{s}.{m}"] = np.asarray(rows, dtype=np.int64)
                    if c.gram:
                        st[f"gram.{s}.{m}"] = c.gram[s][m]
            sweep = {str(k): {f: x for f, x in v.items() if f not in ("dw", "delta")} for k, v in c.sweep.items()}  # order, j, seed, sigma
            st["sweep"] = json.dumps(sweep)
            for k, v in c.sweep.items():
                st[f"sweep_dw.{k}"], st[f"sweep_delta.{k}"] = v["dw"], v["delta"]
        return st

    def set_state(c: HyFDCAClient, st: Mapping[str, Any]) -> None:
        import json

        for k in _ARR:
            if k in st:
                setattr(c, k, np.asarray(st[k], dtype=np.float64).copy())
        c.pending = np.asarray(st["pending"], dtype=np.float64).copy() if "pending" in st else None
        if "params" in st:
            c.params = json.loads(str(st["params"]))
            scale = np.asarray(st["seg_scale"], dtype=np.float64)
            c.seg_scale = [float(v) for v in scale]
            c.seg_rows = [np.asarray(st[f"seg_rows.{s}"], dtype=np.int64) for s in range(scale.size)]
            c.seg_colw = [np.asarray(st[f"seg_colw.{s}"]) if f"seg_colw.{s}" in st else None for s in range(scale.size)]
        if "seg_global" in st:
            c.seg_global = [int(g) for g in np.asarray(st["seg_global"])]
            c.seg_batches = [[np.asarray(st[f"batch.{s}.{m}"], dtype=np.int64) for m in range(_count(st, f"batch.{s}."))]
                             for s in range(len(c.seg_global))]
            if "gram.0.0" in st:
                c.gram = [[np.asarray(st[f"gram.{s}.{m}"], dtype=np.float64) for m in range(len(b))] for s, b in enumerate(c.seg_batches)]
            c.sweep = {int(k): {**v, "dw": np.asarray(st[f"sweep_dw.{k}"], dtype=np.float64).copy(),
                                "delta": np.asarray(st[f"sweep_delta.{k}"], dtype=np.float64).copy()}
                       for k, v in json.loads(str(st["sweep"])).items()}

    def evaluate(server: HyFDCAServer, sd: ServerData, rnd: int) -> dict[str, float]:
        # test accuracy of the public output model (hyfdca_run's primal metrics need all training data)
        if sd.test is None:
            return {}
        cfg = server.config
        pos = positive_set(sd.test, cfg.positive_classes, cfg.loss, "HyFDCA")
        z = np.asarray(features(sd.test) @ server.output_w()).ravel()
        return {"accuracy": float(np.mean(np.where(z >= 0, 1.0, -1.0) == signed_labels(sd.test.y, pos)))}

    return Deployable("hyfdca", HyFDCAConfig, build_server, build_client, get_state, set_state, evaluate,
                      hello_payload, lambda s: {"w": np.asarray(s.output_w())})


# --------------------------------------------------------------------------------------- FedBCD
def _fedbcd() -> Deployable:
    import torch

    from hybridfl.algorithms.fedbcd import FedBCDConfig, FedBCDCoordinator, FedBCDParty
    from hybridfl.algorithms.fedbcd_run import party_input
    from hybridfl.models.towers import bottom_factory, bottom_out_dim, make_top

    def build_server(sd: ServerData, cfg: FedBCDConfig, seed: int, hello: dict) -> FedBCDCoordinator:
        return FedBCDCoordinator(cfg, seed)

    def _shape(schema: Mapping[str, tuple[int, ...]], blocks: list[str]) -> tuple[int, ...]:
        # the shape party_input gives: one block as is; several flattened and concatenated
        if len(blocks) == 1:
            return tuple(schema[blocks[0]])
        return (int(sum(int(np.prod(schema[b])) for b in blocks)),)

    def build_client(cd: ClientData, cfg: FedBCDConfig, seed: int, layout: list) -> FedBCDParty:
        # replay hybridfl.algorithms.fedbcd_run.build_fedbcd's initialisation: torch.manual_seed(seed),
        # one bottom per party in partition order (shapes from the public layout), then the top
        order = [str(e[0]) for e in layout]
        if cd.client_id not in order:
            raise PartitionError(f"client {cd.client_id!r} is not in the run's party layout ({', '.join(order)}).")
        factory = bottom_factory(cfg.model, cfg.representation_dim, cfg.hidden, cfg.channels)
        out_dim = bottom_out_dim(cfg.model, cfg.representation_dim)
        torch.manual_seed(seed)
        bottoms, shapes = {}, {}
        for i, (cid, blocks, _) in enumerate(layout):
            shapes[cid] = _shape(cd.block_shapes, list(blocks))
            bottoms[cid] = factory(i, shapes[cid], out_dim)
        x = party_input(cd.data, list(cd.data.block_names))
        if tuple(x.shape[1:]) != shapes[cd.client_id]:
            raise PartitionError(f"client {cd.client_id!r} holds input of shape {tuple(x.shape[1:])}, the layout says {shapes[cd.client_id]}.")
        if not cd.has_labels:
            return FedBCDParty(cd.client_id, cd.data.ids, x, bottoms[cd.client_id], cd.data.block_names)
        with torch.no_grad():
            dims = [int(bottoms[c](torch.zeros((1, *shapes[c]))).shape[1]) for c in order]
        top = make_top(cfg.model, dims)
        return FedBCDParty(cd.client_id, cd.data.ids, x, bottoms[cd.client_id], cd.data.block_names,
                           labels=cd.data.y, top=top, party_order=order)

    return Deployable("fedbcd", FedBCDConfig, build_server, build_client,
                      lambda c: c.state_dict(), lambda c, s: c.load_state_dict(s))


_BUILTIN: dict[str, Callable[[], Deployable]] = {"hyfem": _hyfem, "hyfdca": _hyfdca, "fedbcd": _fedbcd}


def _load_builtin(name: str | None = None) -> None:
    """Build the recipes lazily (a ClientApp process imports only its algorithm's modules)."""
    for n, make in _BUILTIN.items():
        if n not in _REGISTRY and (name is None or n == name):
            register(make())
