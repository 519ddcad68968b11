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

from hybridfl.inference.federated import OrgPart, org_part
from hybridfl.inference.modeldir import ModelError, ModelParts, read_model_dir, write_model_dir


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
    meta = dict(model.manifest.model)
    info = {"organisation": org, "units": list(part.units), "head": bool(head), "width": int(part.width)}
    scale_dtype = next((b.scale for b in model.encoding.blocks if b.scale != "none"), "float64")
    parts = ModelParts(model.kind, tensors, meta)
    return write_model_dir(
        out, parts, model.encoding, model.scale, model.algorithm, model.manifest.dataset, {}, scale_dtype, part=info
    )


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

    from hybridfl.inference.predictors import PREDICTORS

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
            prefix = f"unit.{i}.extractor." if kind == "hyfem" else f"unit.{i}.bottom."
            if kind == "hyfem":
                from hybridfl.models.hybrid import default_extractor

                e = int(meta["extractor_dim"])
                module = default_extractor(str(meta["extractor"]))(u, tuple(shapes[u]), e)
            else:
                from hybridfl.algorithms.fedbcd.inputs import party_shape
                from hybridfl.models.towers import bottom_factory

                factory = bottom_factory(
                    str(meta["model"]),
                    int(meta["representation_dim"]),
                    int(meta["hidden"]),
                    int(meta["channels"]),
                    str(meta["top"]),
                )
                out_dim = 1 if meta["model"] == "linear" else int(meta["representation_dim"])
                module = factory(all_units.index(u), party_shape(shapes, parties[u]), out_dim)
            sd = {
                k[len(prefix) :]: torch.from_numpy(np.array(v, dtype=np.float32))
                for k, v in tensors.items()
                if k.startswith(prefix)
            }
            try:
                module.load_state_dict(sd, strict=True)
            except RuntimeError:
                raise ModelError(
                    f"{where}: the weights of unit {u!r} do not fit the model the manifest describes."
                ) from None
            module.eval()
            if kind == "hyfem":
                e = int(meta["extractor_dim"])
                weights[u] = (module, _tensor(tensors, f"unit.{i}.w1", (width, e), where).astype(np.float64))
            else:
                weights[u] = module
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
