"""One organisation's part of a model, kept in its own client directory (``<client>/model/``).

After ``run --federation`` every organisation keeps only what federated prediction
(:mod:`hybridfl.inference.federated`) needs from it: the weights of the units (blocks; FedBCD: its
party) it holds, and, for a label holder, the model's head (the linear intercept; HyFEM's
``b1``, ``W2``, ``b2``; FedBCD's top bias). The directory has the model directory's format
(:mod:`hybridfl.inference.modeldir`: ``model.json`` + ``model.safetensors``, hashes checked) with a
``part`` section naming the organisation, its units and whether it holds the head; the public
encoding (every block's columns and standardisation, as in the federation schema) comes along.
:func:`~hybridfl.inference.load_model` refuses a part: it is not a model one can score with alone.

Tensors: ``unit.<i>.w`` (linear: ``w_b``), ``unit.<i>.extractor.*`` and ``unit.<i>.w1`` (HyFEM:
``h_b`` and ``W1[:, cols_b]``), ``unit.<i>.bottom.*`` (FedBCD: the party's bottom model), ``i``
the unit's position in ``part.units``; ``head.intercept``, ``head.b1``/``head.W2``/``head.b2`` or
``head.bias``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.errors import PredictionError
from hybridfl.inference.modeldir import ModelError, ModelParts, read_model_dir, write_model_dir


@dataclass
class OrgPart:
    """What one organisation holds of a model for federated prediction.

    Attributes:
        kind: the model kind (``linear``, ``hyfem``, ``fedbcd``).
        units: the units it can contribute, in global order (block names; FedBCD: party IDs).
        unit_blocks: unit -> its blocks.
        width: the width of a part (1; HyFEM: the server classifier's hidden width ``H``).
        weights: unit -> what computing its part needs (``w_b``; ``(extractor, W1[:, cols_b])``;
            a FedBCD bottom model).
        head: the receiver's shared parameters (``None`` for the others).
    """

    kind: str
    units: list[str]
    unit_blocks: dict[str, list[str]]
    width: int
    weights: dict[str, Any]
    head: dict[str, Any] | None = None

    def contributions(self, xs: Mapping[str, np.ndarray], unit: str, rows: np.ndarray) -> np.ndarray:
        """``(len(rows), width)`` float64: the part of ``unit`` on the rows ``rows`` of the
        organisation's encoded blocks ``xs``."""
        import torch

        if self.kind == "linear":
            b = self.unit_blocks[unit][0]
            x = xs[b][rows].reshape(len(rows), -1).astype(np.float64)
            return (x @ self.weights[unit])[:, None]
        if self.kind == "hyfem":
            b = self.unit_blocks[unit][0]
            extractor, w1 = self.weights[unit]
            with torch.inference_mode():
                h = extractor(torch.from_numpy(np.ascontiguousarray(xs[b][rows]))).numpy().astype(np.float64)
            return h @ w1.T
        from hybridfl.algorithms.fedbcd.inputs import party_input
        from hybridfl.data.dataset import HybridDataset

        blocks = self.unit_blocks[unit]
        sub = {b: xs[b][rows] for b in blocks}
        ds = HybridDataset._trusted("x", np.arange(len(rows)).astype(str), np.zeros(len(rows), np.int64), sub, [])
        with torch.inference_mode():
            return self.weights[unit](torch.from_numpy(party_input(ds, blocks))).numpy().astype(np.float64)

    def apply_head(self, s: np.ndarray) -> np.ndarray:
        """The model's raw output from the sums ``S`` ``(n, width)``: margins ``(n,)`` (linear),
        logits ``(n, C)`` (HyFEM) or ``(n,)`` (FedBCD)."""
        h = self.head or {}
        if self.kind == "linear":
            return s[:, 0] + h["intercept"]
        if self.kind == "fedbcd":
            return s[:, 0] + h["bias"]
        a = np.maximum(s + h["b1"], 0.0)
        return a @ h["W2"].T + h["b2"]


def model_units(model: Any) -> dict[str, list[str]]:
    """The units of a loaded model, in global order: unit -> its blocks (a block each for linear
    and HyFEM models; a FedBCD party's blocks).

    Raises:
        PredictionError: a FedBCD model whose top is not a sum (``top: concat``).
    """
    if model.kind == "fedbcd":
        from hybridfl.models.towers import SumTop

        if not isinstance(model.top, SumTop):
            raise PredictionError(
                "federated prediction needs FedBCD's top to be a sum of the parties' outputs (top: party_slice or "
                "model: linear); this model's top layer takes every party's representation (top: concat)."
            )
        return {pid: list(blocks) for pid, blocks in model.parties}
    return {b: [b] for b in model.blocks}


def org_part(model: Any, blocks: Sequence[str], receiver: bool) -> OrgPart:
    """The part of ``model`` an organisation holding ``blocks`` keeps (see :class:`OrgPart`): the
    units all of whose blocks it holds, and the head if it is the receiver."""
    units = model_units(model)
    held = set(blocks)
    mine = [u for u, bl in units.items() if set(bl) <= held]
    weights: dict[str, Any] = {}
    head: dict[str, Any] | None = None
    if model.kind == "linear":
        weights = {u: model.w[u].astype(np.float64) for u in mine}
        width = 1
        head = {"intercept": float(model.intercept)} if receiver else None
    elif model.kind == "hyfem":
        from hybridfl.models.hybrid import block_columns

        g = model.global_model
        w1 = g.classifier.fc1.weight.detach().numpy().astype(np.float64)
        width = int(w1.shape[0])
        for u in mine:
            cols = block_columns([u], model.blocks, model.extractor_dim)
            weights[u] = (g.extractors[u], w1[:, cols].copy())
        if receiver:
            c = g.classifier
            head = {
                "b1": c.fc1.bias.detach().numpy().astype(np.float64),
                "W2": c.fc2.weight.detach().numpy().astype(np.float64),
                "b2": c.fc2.bias.detach().numpy().astype(np.float64),
            }
    else:
        weights = {u: model.bottoms[u] for u in mine}
        width = 1
        if receiver:
            bias = model.top.bias
            head = {"bias": float(bias.detach().numpy()[0]) if bias is not None else 0.0}
    return OrgPart(model.kind, mine, {u: units[u] for u in mine}, width, weights, head)


def _state(module: Any, prefix: str) -> dict[str, np.ndarray]:
    return {prefix + k: v.detach().cpu().numpy().astype(np.float32) for k, v in module.state_dict().items()}


def write_org_part(out: str | Path, model: Any, org: str, blocks: Sequence[str], head: bool) -> Path:
    """Write organisation ``org``'s part of the loaded ``model`` (the units all of whose blocks are
    in ``blocks``; the head if ``head``) to the directory ``out``."""
    part = org_part(model, blocks, head)
    tensors: dict[str, np.ndarray] = {}
    for i, u in enumerate(part.units):
        w = part.weights[u]
        if part.kind == "linear":
            tensors[f"unit.{i}.w"] = np.asarray(w, dtype=np.float64)
        elif part.kind == "hyfem":
            tensors.update(_state(w[0], f"unit.{i}.extractor."))
            tensors[f"unit.{i}.w1"] = np.asarray(w[1], dtype=np.float64)
        else:
            tensors.update(_state(w, f"unit.{i}.bottom."))
    for k, v in (part.head or {}).items():
        tensors[f"head.{k}"] = np.atleast_1d(np.asarray(v, dtype=np.float64))
    scale_dtype = next((b.scale for b in model.encoding.blocks if b.scale != "none"), "float64")
    return write_part(
        out,
        ModelParts(model.kind, tensors, dict(model.manifest.model)),
        (model.encoding, model.scale, scale_dtype),
        model.algorithm,
        model.manifest.dataset,
        {"organisation": org, "units": list(part.units), "head": bool(head), "width": int(part.width)},
    )


def write_part(
    out: str | Path, parts: ModelParts, encoding: tuple[Any, Any, str], algorithm: str, dataset: str, info: dict
) -> Path:
    """Write an organisation's part directory from its tensors (``unit.<i>.*``, ``head.*``, module
    docs) and model settings ``parts``, the public ``encoding`` ``(Encoding, block -> (mean, std),
    scale dtype)`` and ``info`` (``organisation``, ``units``, ``head``, ``width``).

    Raises:
        ModelError: a tensor that is not finite.
    """
    enc, scale, dtype = encoding
    return write_model_dir(out, parts, enc, scale, algorithm, dataset, {}, dtype, part=info)


@dataclass
class LoadedPart:
    """An organisation's part read back (:func:`load_org_part`).

    Attributes:
        organisation: its name.
        part: what federated prediction computes with (:class:`~hybridfl.inference.federated.OrgPart`).
        encoding, scale: the public encoding and standardisation.
        kind: the model kind.
        all_units: every unit of the model, global order (block names; FedBCD: party IDs).
        head_model: an object with the model's ``outputs(raw)`` (labels and scores from the raw
            output), for the receiver.
    """

    organisation: str
    part: OrgPart
    encoding: Any
    scale: dict[str, tuple[np.ndarray, np.ndarray]]
    kind: str
    all_units: list[str]
    head_model: Any

    def outputs(self, raw: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The model's predictions and score columns from the raw output (receiver side)."""
        return self.head_model.outputs(raw)


def _tensor(t: Mapping[str, np.ndarray], k: str, shape: tuple[int, ...] | None, where: str) -> np.ndarray:
    if k not in t:
        raise ModelError(f"{where}: the weight file has no tensor {k!r}.")
    if shape is not None and tuple(t[k].shape) != shape:
        raise ModelError(f"{where}: tensor {k!r} has shape {tuple(t[k].shape)}, expected {shape}.")
    return t[k]


def load_org_part(path: str | Path) -> LoadedPart:
    """Read and check an organisation's part (``<client>/model/``).

    Raises:
        ModelError: not a part, or a part whose tensors do not fit its settings (one sentence).
    """
    import torch

    from hybridfl.inference.predictors import PREDICTORS, fedbcd_bottoms, hyfem_extractors, load_module

    manifest, tensors = read_model_dir(path)
    where = f"model part {str(path)!r}"
    info = manifest.part
    if info is None:
        raise ModelError(f"{str(path)!r} is a whole model, not an organisation's part (use --model).")
    meta, enc = manifest.model, manifest.encoding
    shapes = enc.block_shapes
    kind = manifest.kind
    units = [str(u) for u in info.get("units", [])]
    head_model = PREDICTORS[kind].for_outputs(manifest)
    if kind == "fedbcd":
        parties = {str(p["id"]): [str(b) for b in p["blocks"]] for p in meta.get("parties", [])}
        all_units = list(parties)
    else:
        parties = {b: [b] for b in enc.block_names}
        all_units = enc.block_names
    if any(u not in parties for u in units):
        raise ModelError(f"{where}: it names a unit the model does not have.")
    weights: dict[str, Any] = {}
    width = int(info.get("width", 1))
    with torch.random.fork_rng(devices=[]):
        for i, u in enumerate(units):
            if kind == "linear":
                weights[u] = _tensor(tensors, f"unit.{i}.w", (int(np.prod(shapes[u])),), where).astype(np.float64)
                continue
            if kind == "hyfem":
                factory, e = hyfem_extractors(meta, where)
                extractor = load_module(factory(u, tuple(shapes[u]), e), tensors, f"unit.{i}.extractor.", where)
                weights[u] = (extractor, _tensor(tensors, f"unit.{i}.w1", (width, e), where).astype(np.float64))
            else:
                from hybridfl.algorithms.fedbcd.inputs import party_shape

                factory, out_dim = fedbcd_bottoms(meta, where)
                bottom = factory(all_units.index(u), party_shape(shapes, parties[u]), out_dim)
                weights[u] = load_module(bottom, tensors, f"unit.{i}.bottom.", where)
    head = None
    if info.get("head"):
        if kind == "linear":
            head = {"intercept": float(_tensor(tensors, "head.intercept", (1,), where)[0])}
        elif kind == "fedbcd":
            head = {"bias": float(_tensor(tensors, "head.bias", (1,), where)[0])}
        else:
            C = len(enc.classes)
            head = {
                "b1": _tensor(tensors, "head.b1", (width,), where),
                "W2": _tensor(tensors, "head.W2", (C, width), where),
                "b2": _tensor(tensors, "head.b2", (C,), where),
            }
    scale = {}
    for b in enc.blocks:
        if b.scale != "none":
            scale[b.name] = (tensors[f"scale.{b.name}.mean"], tensors[f"scale.{b.name}.std"])
    part = OrgPart(kind, units, {u: parties[u] for u in units}, width, weights, head)
    return LoadedPart(str(info.get("organisation", "")), part, enc, scale, kind, all_units, head_model)
