"""Export a trained model (:func:`hybridfl.inference.load_model`) as an ONNX graph.

``hybridfl export-onnx --model RUN/model --out model.onnx [--client ID] [--blocks a,b]`` is the
command line; :func:`export_onnx` the function. Needs the ``onnx`` extra
(``pip install 'hybridfl[onnx]'``: onnx, and onnxruntime to run the graph).

The graph:

- **inputs**: one float32 input per block the model scores, named as the block, shape
  ``(batch, *block_shape)`` with a dynamic batch axis, holding the block's *encoded* features:
  the table's columns in the block's order, a categorical column one-hot over its levels
  (``model.json``'s ``encoding``; :func:`onnx_inputs` does this for a DataFrame). The
  standardisation of ``model.json`` (``(x - mean) / std`` per feature, the training statistics)
  is **baked into the graph**, computed in the dtype the training data was (float32, or float64
  for a federation's prepared clients, cast back to float32 as in training): do not apply it
  again. ``standardize=False`` exports the graph without it (inputs then are the standardised
  features, as :meth:`~hybridfl.inference.predictors.HybridFLModel._input_blocks` gives them).
- **output**: the model's raw output, the same values as the predictor's ``raw``:
  ``logits`` ``(batch, C)`` float32 for HyFEM (softmax gives ``predict_proba``), ``logits``
  ``(batch,)`` float32 for FedBCD (``P(classes[1]) = sigmoid``), ``margin`` ``(batch,)``
  float64 for a linear model (``+1`` where ``margin >= 0``; sigmoid for the logistic loss).
- **metadata** (``metadata_props``): ``format`` (``hybridfl-onnx``), ``format_version``,
  ``algorithm``, ``kind``, ``model`` (``global``, ``blocks``: the server model cut to some blocks,
  or ``client:<id>``), ``blocks`` (the input order, JSON), ``block_shapes``, ``classes`` (JSON,
  class index = position), ``output``, ``standardization`` (``in-graph`` or ``none``),
  ``encoding`` (``model.json``'s, JSON); a linear model adds ``loss`` and ``labels`` (the ``-1``
  and ``+1`` sides).

Exported with torch's TorchScript-based exporter (``torch.onnx.export(..., dynamo=False)``,
opset :data:`OPSET`): torch 2.13's default dynamo exporter needs the onnxscript package, which
the graphs here (linear layers, convolutions, pooling, reshapes) do not need.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.errors import HybridFLError
from hybridfl.inference.modeldir import ModelError

OPSET = 17
"""The ONNX opset of the exported graphs (onnxruntime 1.18 and later run it)."""
ONNX_FORMAT = "hybridfl-onnx"
"""``metadata_props["format"]`` of every exported graph."""
ONNX_FORMAT_VERSION = 1
"""``metadata_props["format_version"]``: the layout of inputs, output and metadata described above."""
INSTALL_HINT = "pip install 'hybridfl[onnx]'"


def require_onnx() -> Any:
    """The ``onnx`` module.

    Raises:
        HybridFLError: onnx is not installed (one sentence naming the extra).
    """
    try:
        import onnx
    except ImportError:
        raise HybridFLError(f"ONNX export needs the onnx package, which is not installed: {INSTALL_HINT}.") from None
    return onnx


def _standardizer(model: Any, names: Sequence[str], standardize: bool) -> Any:
    """A module applying the model's standardisation to the blocks ``names`` (inputs in that order)."""
    import torch
    from torch import nn

    class Standardize(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.steps: list[tuple[int, str, str | None]] = []
            for i, b in enumerate(names):
                spec = model.encoding.block(b)
                if not standardize or b not in model.scale:
                    self.steps.append((i, b, None))
                    continue
                dt = torch.float32 if spec.scale == "float32" else torch.float64
                mean, std = model.scale[b]
                key = f"b{i}"
                self.register_buffer(f"{key}_mean", torch.tensor(np.asarray(mean), dtype=dt).reshape(spec.shape))
                self.register_buffer(f"{key}_std", torch.tensor(np.asarray(std), dtype=dt).reshape(spec.shape))
                self.steps.append((i, b, key))

        def forward(self, xs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
            out = {}
            for i, b, key in self.steps:
                x = xs[i]
                if key is not None:
                    mean, std = getattr(self, f"{key}_mean"), getattr(self, f"{key}_std")
                    x = ((x.to(mean.dtype) - mean) / std).to(torch.float32)
                out[b] = x
            return out

    return Standardize()


def _graph(model: Any, blocks: Sequence[str] | None, client: str | None, standardize: bool) -> tuple[Any, list, str]:
    """``(torch module taking one tensor per input block, input block names, output name)``."""
    import torch
    from torch import nn

    kind = model.kind
    if client is not None and kind != "hyfem":
        raise ModelError(f"a client's own model is HyFEM's; this is a {kind} model (leave out --client).")
    if blocks is not None:
        if kind != "hyfem":
            raise ModelError(f"a {kind} model scores every block; choosing blocks is HyFEM's local inference.")
        if client is not None:
            raise ModelError("give a client (its own model, on its blocks) or blocks (the server model cut), not both.")
        blocks = [str(b).strip() for b in blocks]
        unknown = [b for b in blocks if b not in model.blocks]
        if unknown:
            raise ModelError(f"the model has no block {unknown[0]!r} (blocks: {', '.join(model.blocks)}).")
        if not blocks:
            raise ModelError("no block chosen: name one or more of the model's blocks.")

    if kind == "hyfem":
        net = model.model_for(blocks, client)  # ModelError for an unknown client
        names = list(net.blocks)
        out_name = "logits"

        def core(x: dict[str, torch.Tensor]) -> torch.Tensor:
            return net(x)

    elif kind == "fedbcd":
        names = list(model.blocks)
        out_name = "logits"
        parties, bottoms, top = model.parties, model.bottoms, model.top

        def core(x: dict[str, torch.Tensor]) -> torch.Tensor:
            hs = []
            for pid, bs in parties:  # party_input: one block as is, several flattened and concatenated
                inp = x[bs[0]] if len(bs) == 1 else torch.cat([x[b].reshape(x[b].shape[0], -1) for b in bs], dim=1)
                hs.append(bottoms[pid](inp))
            return top(hs)

    else:  # linear: z = concat_b flatten(x_b) @ w + b in float64, as decision_function
        names = list(model.blocks)
        out_name = "margin"
        w = torch.from_numpy(np.concatenate([model.w[b] for b in names]).astype(np.float64)).reshape(-1, 1)
        b0 = torch.tensor([model.intercept], dtype=torch.float64)

        def core(x: dict[str, torch.Tensor]) -> torch.Tensor:
            flat = torch.cat([x[b].reshape(x[b].shape[0], -1) for b in names], dim=1).to(torch.float64)
            return (flat @ w).reshape(-1) + b0

    scale = _standardizer(model, names, standardize)

    class Graph(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = scale
            if kind == "hyfem":
                self.net = net
            elif kind == "fedbcd":
                self.bottoms = nn.ModuleList([bottoms[pid] for pid, _ in parties])
                self.top = top

        def forward(self, *xs: torch.Tensor) -> torch.Tensor:
            return core(self.scale(xs))

    while out_name in names:  # a block named like the output
        out_name += "_"
    return Graph().eval(), names, out_name


def _trace(module: Any, names: Sequence[str], out_name: str, shapes: Mapping[str, Sequence[int]]) -> bytes:
    """The ONNX bytes of ``module`` traced on a dummy batch of 2 (TorchScript exporter, opset
    :data:`OPSET`, a dynamic batch axis on every input and the output)."""
    import torch

    dummy = tuple(torch.zeros((2, *shapes[b]), dtype=torch.float32) for b in names)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        # the TorchScript exporter's deprecation notice, and tracer notes on the fixed image sizes
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            dummy,
            buf,
            dynamo=False,
            opset_version=OPSET,
            input_names=list(names),
            output_names=[out_name],
            dynamic_axes={n: {0: "batch"} for n in [*names, out_name]},
            do_constant_folding=True,
        )
    return buf.getvalue()


def export_onnx(
    model: Any,
    path: str | Path,
    blocks: Sequence[str] | None = None,
    client: str | None = None,
    standardize: bool = True,
) -> Path:
    """Write ``model`` (a loaded model, or a model directory) as an ONNX graph to ``path``.

    Which model: the global one (HyFEM's server model over every block, FedBCD's joint model of
    every party's bottom and the label party's top, the linear model); for HyFEM, ``blocks``
    gives the server model cut to those blocks (local inference, HyFEM Remark 2) and ``client``
    that client's own model on its blocks. The graph's inputs are the blocks' encoded, **not
    standardised** features (the standardisation of ``model.json`` is part of the graph; with
    ``standardize=False`` it is not, and the inputs must be standardised first), float32,
    ``(batch, *block_shape)``; its output is the predictor's ``raw`` (see the module docs, which
    also list the metadata). The file is written atomically.

    Returns:
        ``path``.

    Raises:
        HybridFLError: the onnx package is missing (names ``pip install 'hybridfl[onnx]'``).
        ModelError: a model directory that does not load, ``client`` or ``blocks`` for a model
            without them, an unknown client or block (one sentence each).
    """
    onnx = require_onnx()

    from hybridfl.files import atomic_write
    from hybridfl.inference import load_model

    if isinstance(model, (str, Path)):
        model = load_model(model)
    module, names, out_name = _graph(model, blocks, client, standardize)
    shapes = model.encoding.block_shapes
    graph = onnx.load_from_string(_trace(module, names, out_name, shapes))
    which = f"client:{client}" if client is not None else ("global" if names == model.blocks else "blocks")
    meta = {
        "format": ONNX_FORMAT,
        "format_version": str(ONNX_FORMAT_VERSION),
        "algorithm": model.algorithm,
        "kind": model.kind,
        "model": which,
        "blocks": json.dumps(names),
        "block_shapes": json.dumps({b: list(shapes[b]) for b in names}),
        "classes": json.dumps([str(c) for c in model.classes_]),
        "output": out_name,
        "standardization": "in-graph" if standardize else "none",
        "encoding": model.encoding.model_dump_json(exclude_none=True),
    }
    if model.kind == "linear":
        meta["loss"] = model.loss
        meta["labels"] = json.dumps(model.labels)
    for k, v in meta.items():
        graph.metadata_props.add(key=k, value=v)
    graph.producer_name = "hybridfl"
    graph.doc_string = (
        f"hybridfl {model.kind} model ({model.algorithm}, {which}): inputs {', '.join(names)} are the blocks' "
        f"encoded features ({'standardised in the graph' if standardize else 'standardise them first'}); "
        f"output {out_name!r} is the model's raw output."
    )
    onnx.checker.check_model(graph)
    path = Path(path)
    atomic_write(path, graph.SerializeToString())
    return path


def onnx_inputs(model: Any, frame: Any, blocks: Sequence[str] | None = None, where: str = "table") -> dict:
    """The graph inputs of a DataFrame's rows: block -> ``(n, *shape)`` float32 encoded features
    (one-hot categorical columns, the columns in the block's order), **not** standardised, for the
    blocks ``blocks`` (default: every block of the model).

    Raises:
        DataError: a missing column, a value that is not a number, an unseen category (one sentence).
    """
    from hybridfl.data.encoding import encode_frame

    enc = model.encoding.model_copy(
        update={"blocks": [b.model_copy(update={"scale": "none"}) for b in model.encoding.blocks]}
    )
    return encode_frame(frame, enc, {}, list(blocks) if blocks is not None else None, where)
