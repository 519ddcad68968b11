"""Loaded models: score new rows with what a run left (:func:`hybridfl.inference.load_model`).

Every model has the scikit-learn style methods ``predict``, ``predict_proba`` and (linear)
``decision_function``, the attributes ``classes_`` (the data's own class labels) and ``blocks``,
and takes either a pandas DataFrame with the training table's columns (encoded and standardised
as in training, :mod:`hybridfl.data.encoding`) or a dict block -> ``(n, *shape)`` array of raw
(not yet standardised) features.

- :class:`LinearModel` (HyFDCA, hybrid FedAvg): ``z = sum_b x_b^T w_b + b`` over every block;
  ``+1`` (the positive class set) where ``z >= 0``, as the training run's accuracy counts it. The
  logistic loss gives ``P(+1) = 1 / (1 + exp(-z))``; hinge and squared give the margin ``z`` only.
- :class:`HyFEMModel`: global inference (the server model, HyFEM eq. (2)-(3), all blocks); with
  only some blocks, local inference: the server model cut to them (HyFEM Remark 2: those blocks'
  extractors and the server classifier's columns of them); or a client's own model
  (``client=...``: the model that client received, on its blocks).
- :class:`FedBCDModel`: every party's bottom model on its blocks and the label party's top
  (FedBCD eq. (2)); ``P(class 1) = sigmoid(logit)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hybridfl.data.encoding import encode_frame, frame_labels, held_blocks, scaled
from hybridfl.inference.modeldir import Manifest, ModelError


def _expect(tensors: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...] | None, where: str) -> np.ndarray:
    if name not in tensors:
        raise ModelError(f"{where}: the weight file has no tensor {name!r}.")
    a = tensors[name]
    if a.dtype.kind != "f":
        raise ModelError(f"{where}: tensor {name!r} is of dtype {a.dtype}, not a float.")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ModelError(f"{where}: tensor {name!r} has shape {tuple(a.shape)}, expected {tuple(shape)}.")
    return a


def load_module(module: Any, tensors: Mapping[str, np.ndarray], prefix: str, where: str) -> Any:
    """Load the tensors under ``prefix`` (the prefix removed) into ``module``, strictly, and put it
    in eval mode.

    Raises:
        ModelError: a missing, extra or mis-shaped parameter (one sentence naming ``prefix``).
    """
    import torch

    sd = {
        k[len(prefix) :]: torch.from_numpy(np.array(v, dtype=np.float32))
        for k, v in tensors.items()
        if k.startswith(prefix)
    }
    try:
        module.load_state_dict(sd, strict=True)
    except RuntimeError:
        raise ModelError(
            f"{where}: the weights under {prefix!r} do not fit the model the manifest describes."
        ) from None
    return module.eval()


def hyfem_extractors(meta: Mapping[str, Any], where: str) -> tuple[Any, int]:
    """``(extractor factory, extractor_dim)`` of HyFEM settings (``extractor``, ``extractor_dim``).

    Raises:
        ModelError: missing settings or an unknown extractor kind.
    """
    from hybridfl.models.hybrid import default_extractor

    try:
        kind, dim = str(meta["extractor"]), int(meta["extractor_dim"])
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"{where}: the HyFEM settings (extractor, extractor_dim) are incomplete.") from None
    if kind not in ("auto", "mlp", "cnn"):
        raise ModelError(f"{where}: extractor {kind!r} is not auto, mlp or cnn.")
    return default_extractor(kind), dim


def fedbcd_bottoms(meta: Mapping[str, Any], where: str) -> tuple[Any, int]:
    """``(bottom factory, out_dim)`` of FedBCD settings (``model``, ``top``, ``representation_dim``,
    ``hidden``, ``channels``; :func:`hybridfl.models.towers.bottom_factory`).

    Raises:
        ModelError: missing settings or an unknown model or top.
    """
    from hybridfl.models.towers import bottom_factory

    try:
        kind, top = str(meta["model"]), str(meta["top"])
        rep, hidden, channels = int(meta["representation_dim"]), int(meta["hidden"]), int(meta["channels"])
    except (KeyError, TypeError, ValueError):
        raise ModelError(
            f"{where}: the FedBCD settings (model, top, representation_dim, ...) are incomplete."
        ) from None
    if kind not in ("linear", "mlp", "cnn") or top not in ("party_slice", "concat"):
        raise ModelError(f"{where}: model {kind!r} or top {top!r} is not known.")
    return bottom_factory(kind, rep, hidden, channels, top), (1 if kind == "linear" else rep)


class HybridFLModel:
    """A model read from a model directory (base class; use :func:`~hybridfl.inference.load_model`).

    Attributes:
        manifest: the checked ``model.json``.
        path: the directory it was read from.
        classes_: ``(C,)`` the class labels (strings), class index = position.
        blocks: the block names in global block order.
        encoding: how table columns become blocks.
        algorithm: the algorithm that trained it.
    """

    kind = ""

    @classmethod
    def for_outputs(cls, manifest: Manifest) -> HybridFLModel:
        """An object with only what :meth:`outputs` needs (the classes, a linear model's loss and
        positive classes), for a receiver that holds a part of the model, not its weights."""
        m = object.__new__(cls)
        m.manifest, m.encoding = manifest, manifest.encoding
        m.classes_ = np.asarray(manifest.encoding.classes, dtype=object)
        m.blocks = manifest.encoding.block_names
        return m

    def __init__(self, manifest: Manifest, tensors: Mapping[str, np.ndarray], path: str | Path = ""):
        self.manifest = manifest
        self.path = Path(path)
        self.encoding = manifest.encoding
        self.algorithm = manifest.algorithm
        self.classes_ = np.asarray(self.encoding.classes, dtype=object)
        self.blocks = self.encoding.block_names
        self._where = f"model {str(self.path)!r}"
        self.scale: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for b in self.encoding.blocks:
            if b.scale == "none":
                continue
            dt = np.float32 if b.scale == "float32" else np.float64
            mean = _expect(tensors, f"scale.{b.name}.mean", (b.width,), self._where)
            std = _expect(tensors, f"scale.{b.name}.std", (b.width,), self._where)
            if mean.dtype != dt or std.dtype != dt:
                raise ModelError(f"{self._where}: the standardisation of block {b.name!r} is not {b.scale}.")
            if (std <= 0).any():
                raise ModelError(
                    f"{self._where}: the standardisation of block {b.name!r} has a std that is not positive."
                )
            self.scale[b.name] = (mean, std)

    # ------------------------------------------------------------------ inputs
    def _input_blocks(self, X: Any, need: Sequence[str] | None = None, where: str = "input") -> dict[str, np.ndarray]:
        """Block -> ``(n, *shape)`` float32 standardised features of ``X`` (a DataFrame or a dict
        of raw blocks): ``need`` (default: the blocks ``X`` holds, which must be some)."""
        if isinstance(X, Mapping):
            return self._dict_blocks(X, need, where)
        if not hasattr(X, "columns"):
            raise ModelError(f"{where} must be a pandas DataFrame or a dict block -> array, not {type(X).__name__}.")
        held = held_blocks(X, self.encoding, where)  # none, or a block with some columns: one sentence
        names = list(need) if need is not None else held
        return encode_frame(X, self.encoding, self.scale, names, where)

    def _dict_blocks(self, X: Mapping[str, Any], need: Sequence[str] | None, where: str) -> dict[str, np.ndarray]:
        unknown = [b for b in X if b not in self.blocks]
        if unknown:
            raise ModelError(f"{where} names block {str(unknown[0])!r}, which the model does not have.")
        names = [b for b in self.blocks if b in X] if need is None else list(need)
        if not names:
            raise ModelError(f"{where} holds none of the model's blocks ({', '.join(self.blocks)}).")
        out, n = {}, None
        for b in names:
            if b not in X:
                raise ModelError(f"{where} lacks block {b!r}, which this prediction needs.")
            a = np.asarray(X[b])
            spec = self.encoding.block(b)
            if a.dtype.kind not in "fiub":
                raise ModelError(f"block {b!r} of {where} is of dtype {a.dtype}, not numbers.")
            if a.ndim < 1 or tuple(a.shape[1:]) not in (tuple(spec.shape), (spec.width,)):
                raise ModelError(
                    f"block {b!r} of {where} has per-sample shape {tuple(a.shape[1:])}, the model needs {tuple(spec.shape)}."
                )
            if n is not None and a.shape[0] != n:
                raise ModelError(f"block {b!r} of {where} has {a.shape[0]} rows, another block has {n}.")
            n = a.shape[0]
            flat = a.reshape(n, spec.width)
            if not np.isfinite(flat).all():
                row = int(np.flatnonzero(~np.isfinite(flat).all(axis=1))[0])
                raise ModelError(f"block {b!r} of {where} holds a NaN or infinite value at row {row + 1}.")
            x = scaled(flat, *self.scale[b], spec.scale) if b in self.scale else flat.astype(np.float32)
            out[b] = np.ascontiguousarray(x.reshape(n, *spec.shape))
        if not n:
            raise ModelError(f"{where} has no rows.")
        return out

    # ------------------------------------------------------------------ scoring
    def predict_proba(self, X: Any, **kw: Any) -> np.ndarray:
        """``(n, C)`` class probabilities (columns in :attr:`classes_` order)."""
        raise NotImplementedError

    def raw(self, X: Any, where: str = "input", **kw: Any) -> np.ndarray:
        """The model's raw output on ``X``: margins ``(n,)`` (linear), logits ``(n, C)`` (HyFEM) or
        ``(n,)`` (FedBCD); everything else is derived from it (:meth:`outputs`)."""
        raise NotImplementedError

    def outputs(self, raw: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """``(predictions (n,), score columns)`` from :meth:`raw`: per-class probabilities
        ``p(<class>)``, or the ``margin`` of a linear model without probabilities."""
        raise NotImplementedError

    def metrics(self, raw: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """``accuracy`` (as the training run counts it), ``auc`` where defined, ``n_labelled``
        over the rows with ``y >= 0`` (class indices; ``-1``: no label)."""
        lab = y >= 0
        pred, _ = self.outputs(raw[lab])
        return {"accuracy": float(np.mean(pred == self.classes_[y[lab]])), "n_labelled": int(lab.sum())}

    def predict(self, X: Any, where: str = "input", **kw: Any) -> np.ndarray:
        """``(n,)`` predicted labels (strings of :attr:`classes_`; a linear model over a grouping
        of classes gives ``a|b|...``)."""
        return self.outputs(self.raw(X, where, **kw))[0]

    def score_columns(self, X: Any, where: str = "input", **kw: Any) -> dict[str, np.ndarray]:
        """The score columns ``predict`` writes beside ``prediction`` (:meth:`outputs`)."""
        return self.outputs(self.raw(X, where, **kw))[1]

    def evaluate(self, frame: Any, where: str = "table", **kw: Any) -> dict[str, float]:
        """Metrics on a labelled table (:meth:`metrics`).

        Raises:
            DataError: the table has no label column, or no labelled row.
        """
        from hybridfl.errors import DataError

        y = frame_labels(frame, self.encoding, where)
        if y is None:
            raise DataError(f"{where} has no label column {self.encoding.label_column!r} to evaluate against.")
        if not (y >= 0).any():
            raise DataError(f"{where} has no labelled row to evaluate against.")
        return self.metrics(self.raw(frame, where, **kw), y)


class LinearModel(HybridFLModel):
    """A linear model over every block: ``w.<block>`` ``(width,)`` float64 and ``intercept``
    ``(1,)``; settings ``loss`` (hinge | logistic | squared), ``positive_classes`` (class indices
    that are ``+1``), ``labels`` (the names of ``-1`` and ``+1``)."""

    kind = "linear"

    def __init__(self, manifest: Manifest, tensors: Mapping[str, np.ndarray], path: str | Path = ""):
        super().__init__(manifest, tensors, path)
        meta = manifest.model
        self.loss = str(meta.get("loss", ""))
        if self.loss not in ("hinge", "logistic", "squared"):
            raise ModelError(f"{self._where}: loss {self.loss!r} is not hinge, logistic or squared.")
        pos = meta.get("positive_classes")
        C = len(self.classes_)
        if not isinstance(pos, list) or not pos or not all(isinstance(c, int) and 0 <= c < C for c in pos):
            raise ModelError(f"{self._where}: positive_classes must be class indices in [0, {C}).")
        if len(set(pos)) == C:
            raise ModelError(f"{self._where}: positive_classes lists every class.")
        self.positive = sorted(set(pos))
        self._set_labels()
        self.w = {
            b.name: _expect(tensors, f"w.{b.name}", (b.width,), self._where).astype(np.float64)
            for b in self.encoding.blocks
        }
        self.intercept = float(_expect(tensors, "intercept", (1,), self._where)[0])
        self._check_extra(tensors)

    def _set_labels(self) -> None:
        neg = [c for c in range(len(self.classes_)) if c not in self.positive]
        self.labels = ["|".join(self.classes_[neg]), "|".join(self.classes_[self.positive])]

    @classmethod
    def for_outputs(cls, manifest: Manifest) -> LinearModel:
        """See :meth:`HybridFLModel.for_outputs` (loss, positive classes and their labels too)."""
        m = super().for_outputs(manifest)
        m.loss = str(manifest.model.get("loss", "hinge"))
        m.positive = sorted({int(c) for c in manifest.model.get("positive_classes", [1])})
        m._set_labels()
        return m  # type: ignore[return-value]

    def _check_extra(self, tensors: Mapping[str, np.ndarray]) -> None:
        known = (
            {f"w.{b}" for b in self.blocks}
            | {"intercept"}
            | {f"scale.{b}.{s}" for b in self.scale for s in ("mean", "std")}
        )
        extra = sorted(set(tensors) - known)
        if extra:
            raise ModelError(f"{self._where}: the weight file holds a tensor the model does not use ({extra[0]!r}).")

    def decision_function(self, X: Any, where: str = "input") -> np.ndarray:
        """``(n,)`` float64 margins ``z = x^T w + b`` over every block (features flattened and
        concatenated in block order, as the training run's accuracy computes them)."""
        from hybridfl.algorithms.convex.problem import features
        from hybridfl.data.dataset import HybridDataset

        xs = self._input_blocks(X, self.blocks, where)
        n = next(iter(xs.values())).shape[0]
        ds = HybridDataset._trusted("predict", np.arange(n).astype(str), np.zeros(n, np.int64), xs, list(self.classes_))
        w = np.concatenate([self.w[b] for b in self.blocks])
        return np.asarray(features(ds) @ w).ravel() + self.intercept

    def raw(self, X: Any, where: str = "input", **kw: Any) -> np.ndarray:
        """The margins (:meth:`decision_function`)."""
        return self.decision_function(X, where)

    def predict_proba(self, X: Any, where: str = "input") -> np.ndarray:
        """``(n, 2)``: ``P(-1), P(+1)`` of the logistic loss, ``P(+1) = 1 / (1 + exp(-z))``.

        Raises:
            ModelError: the loss is hinge or squared (margins only: use :meth:`decision_function`).
        """
        if self.loss != "logistic":
            raise ModelError(f"a {self.loss}-loss model gives margins, not probabilities: use decision_function.")
        z = self.decision_function(X, where)
        p = 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, without overflow
        return np.stack([1.0 - p, p], axis=1)

    def outputs(self, raw: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Labels: the positive side's where ``z >= 0``, else the negative side's (a class name for
        binary data; ``a|b|...`` for a grouping of several classes); ``p(<+1 label>)`` for the
        logistic loss, else ``margin``."""
        z = np.asarray(raw)
        pred = np.where(z >= 0, self.labels[1], self.labels[0]).astype(object)
        if self.loss == "logistic":
            return pred, {f"p({self.labels[1]})": 0.5 * (1.0 + np.tanh(0.5 * z))}
        return pred, {"margin": z}

    def metrics(self, raw: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """``accuracy`` of the ``+1``/``-1`` grouping over the labelled rows (as the training run
        counts it), ``auc`` of the margin, ``n_labelled``."""
        from sklearn.metrics import roc_auc_score

        lab = y >= 0
        z = np.asarray(raw)[lab]
        t = np.where(np.isin(y[lab], self.positive), 1.0, -1.0)
        out = {"accuracy": float(np.mean(np.where(z >= 0, 1.0, -1.0) == t)), "n_labelled": int(lab.sum())}
        if len(np.unique(t)) == 2:
            out["auc"] = float(roc_auc_score(t, z))
        return out


class HyFEMModel(HybridFLModel):
    """HyFEM's models: the server model (``global.*``: every block's extractor and the server
    classifier of width ``hidden``) and each client's received model (``client.<i>.*``, ``i`` its
    position in ``clients``). Settings: ``extractor`` (auto | mlp | cnn), ``extractor_dim``,
    ``hidden``, ``clients`` (``[{"id", "blocks", "hidden"}]``)."""

    kind = "hyfem"

    def __init__(self, manifest: Manifest, tensors: Mapping[str, np.ndarray], path: str | Path = ""):
        super().__init__(manifest, tensors, path)
        meta = manifest.model
        try:
            self.extractor = str(meta["extractor"])
            self.extractor_dim = int(meta["extractor_dim"])
            self.hidden = int(meta["hidden"])
            clients = {
                str(v["id"]): (list(map(str, v["blocks"])), int(v["hidden"])) for v in list(meta.get("clients", []))
            }
        except (KeyError, TypeError, ValueError):
            raise ModelError(
                f"{self._where}: the HyFEM settings (extractor, extractor_dim, hidden, clients) are incomplete."
            ) from None
        for cid, (blocks, _) in clients.items():
            if not blocks or any(b not in self.blocks for b in blocks):
                raise ModelError(f"{self._where}: client {cid!r} names a block the model does not have.")
        self.clients = clients
        self._tensors = dict(tensors)
        self.global_model = self._build(self.blocks, self.hidden, "global.")
        self._client_models: dict[str, Any] = {
            cid: self._build(b, h, f"client.{i}.") for i, (cid, (b, h)) in enumerate(clients.items())
        }
        used = {k for k in tensors if k.startswith(("global.", "client.", "scale."))}
        if used != set(tensors):
            extra = sorted(set(tensors) - used)[0]
            raise ModelError(f"{self._where}: the weight file holds a tensor the model does not use ({extra!r}).")

    def _build(self, blocks: Sequence[str], hidden: int, prefix: str) -> Any:
        import torch

        from hybridfl.models.hybrid import HybridModel

        factory, _ = hyfem_extractors(self.manifest.model, self._where)
        with torch.random.fork_rng(devices=[]):
            try:
                m = HybridModel(
                    blocks, self.encoding.block_shapes, len(self.classes_), self.extractor_dim, hidden, factory
                )
            except ValueError as e:
                raise ModelError(f"{self._where}: {e}.") from None
        return load_module(m, self._tensors, prefix, self._where)

    def model_for(self, blocks: Sequence[str] | None = None, client: str | None = None) -> Any:
        """The torch model that scores ``blocks`` (global inference when every block is given,
        else the server model cut to ``blocks``, HyFEM Remark 2), or client ``client``'s model.

        Raises:
            ModelError: an unknown client.
        """
        import torch

        from hybridfl.models.hybrid import HybridModel, block_columns, default_extractor

        if client is not None:
            if client not in self._client_models:
                known = ", ".join(sorted(self._client_models)) or "none"
                raise ModelError(f"the model has no client {client!r} (clients: {known}).")
            return self._client_models[client]
        order = [b for b in self.blocks if b in set(blocks or self.blocks)]
        if order == self.blocks:
            return self.global_model
        cols = torch.from_numpy(block_columns(order, self.blocks, self.extractor_dim))
        with torch.random.fork_rng(devices=[]):
            m = HybridModel(
                order,
                self.encoding.block_shapes,
                len(self.classes_),
                self.extractor_dim,
                self.hidden,
                default_extractor(self.extractor),
            )
        for b in order:
            m.extractors[b].load_state_dict(self.global_model.extractors[b].state_dict())
        g = self.global_model.classifier
        with torch.no_grad():
            m.classifier.fc1.weight.copy_(g.fc1.weight[:, cols])
            m.classifier.fc1.bias.copy_(g.fc1.bias)
            m.classifier.fc2.weight.copy_(g.fc2.weight)
            m.classifier.fc2.bias.copy_(g.fc2.bias)
        m.eval()
        return m

    def _logits(self, X: Any, where: str, client: str | None) -> np.ndarray:
        import torch

        from hybridfl.models.hybrid import EVAL_BATCH

        need = self.clients[client][0] if client is not None and client in self.clients else None
        model = self.model_for(None, client) if client is not None else None
        xs = self._input_blocks(X, need, where)
        if model is None:
            model = self.model_for(list(xs), None)
        n = next(iter(xs.values())).shape[0]
        out = []
        with torch.inference_mode():
            for s in range(0, n, EVAL_BATCH):
                out.append(model({b: torch.from_numpy(xs[b][s : s + EVAL_BATCH]) for b in model.blocks}).numpy())
        return np.concatenate(out).astype(np.float64)

    def raw(self, X: Any, where: str = "input", client: str | None = None) -> np.ndarray:
        """``(n, C)`` logits (global or local inference, see :meth:`model_for`; ``client``: that
        client's model on its blocks)."""
        return self._logits(X, where, client)

    @staticmethod
    def _softmax(z: np.ndarray) -> np.ndarray:
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def outputs(self, raw: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The argmax class of the logits and ``p(<class>)`` (softmax) per class."""
        p = self._softmax(raw)
        return self.classes_[raw.argmax(axis=1)], {f"p({c})": p[:, i] for i, c in enumerate(self.classes_)}

    def predict_proba(self, X: Any, where: str = "input", client: str | None = None) -> np.ndarray:
        """``(n, C)`` softmax of the logits."""
        return self._softmax(self._logits(X, where, client))


class FedBCDModel(HybridFLModel):
    """FedBCD's joint model: each party's bottom model ``party.<i>.*`` (``i`` its position in
    ``parties``) on its blocks, the label
    party's top ``top.*``. Settings: ``model`` (linear | mlp | cnn), ``representation_dim``,
    ``hidden``, ``channels``, ``top`` (party_slice | concat), ``fit_intercept`` (the top's bias), ``parties`` (``[{"id", "blocks"}]``
    in the top model's order)."""

    kind = "fedbcd"

    def __init__(self, manifest: Manifest, tensors: Mapping[str, np.ndarray], path: str | Path = ""):
        import torch

        from hybridfl.algorithms.fedbcd.inputs import party_shape
        from hybridfl.models.towers import make_top

        super().__init__(manifest, tensors, path)
        if len(self.classes_) != 2:
            raise ModelError(f"{self._where}: a FedBCD model has two classes, the manifest lists {len(self.classes_)}.")
        meta = manifest.model
        factory, out_dim = fedbcd_bottoms(meta, self._where)
        try:
            self.parties = [(str(p["id"]), [str(b) for b in p["blocks"]]) for p in meta["parties"]]
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{self._where}: the FedBCD settings (parties) are incomplete.") from None
        covered = [b for _, bs in self.parties for b in bs]
        if not set(covered) <= set(self.blocks) or any(len(set(bs)) != len(bs) or not bs for _, bs in self.parties):
            raise ModelError(f"{self._where}: a party's blocks are not distinct blocks of the model.")
        # a schema block no party holds is not part of the joint model: not needed to score
        self.needed = [b for b in self.blocks if b in set(covered)]
        self.bottoms, dims = {}, []
        with torch.random.fork_rng(devices=[]):
            for i, (pid, blocks) in enumerate(self.parties):
                try:
                    m = factory(i, party_shape(self.encoding.block_shapes, blocks), out_dim)
                except ValueError as e:
                    raise ModelError(f"{self._where}: {e}.") from None
                load_module(m, tensors, f"party.{i}.", self._where)
                with torch.no_grad():
                    shape = party_shape(self.encoding.block_shapes, blocks)
                    dims.append(int(m(torch.zeros((1, *shape))).shape[1]))
                self.bottoms[pid] = m
            self.top = make_top(str(meta["model"]), dims, str(meta["top"]), bool(meta.get("fit_intercept", True)))
        load_module(self.top, tensors, "top.", self._where)
        used = {k for k in tensors if k.startswith(("party.", "top.", "scale."))}
        if used != set(tensors):
            raise ModelError(
                f"{self._where}: the weight file holds a tensor the model does not use ({sorted(set(tensors) - used)[0]!r})."
            )

    def decision_function(self, X: Any, where: str = "input") -> np.ndarray:
        """``(n,)`` logits of the joint model (every block is needed)."""
        import torch

        from hybridfl.algorithms.fedbcd.inputs import party_input
        from hybridfl.data.dataset import HybridDataset

        xs = self._input_blocks(X, self.needed, where)
        n = next(iter(xs.values())).shape[0]
        ds = HybridDataset._trusted("predict", np.arange(n).astype(str), np.zeros(n, np.int64), xs, list(self.classes_))
        inputs = {pid: party_input(ds, blocks) for pid, blocks in self.parties}
        out = []
        with torch.inference_mode():
            for s in range(0, n, 1024):
                hs = [self.bottoms[pid](torch.from_numpy(inputs[pid][s : s + 1024])) for pid, _ in self.parties]
                out.append(self.top(hs).numpy())
        return np.concatenate(out).astype(np.float64)

    def raw(self, X: Any, where: str = "input", **kw: Any) -> np.ndarray:
        """The logits (:meth:`decision_function`)."""
        return self.decision_function(X, where)

    def outputs(self, raw: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Class 1 where the logit is ``> 0`` (as the run's accuracy counts it); ``p(<class>)``."""
        p = 0.5 * (1.0 + np.tanh(0.5 * raw))
        pred = np.where(raw > 0, self.classes_[1], self.classes_[0]).astype(object)
        return pred, {f"p({self.classes_[0]})": 1.0 - p, f"p({self.classes_[1]})": p}

    def predict_proba(self, X: Any, where: str = "input") -> np.ndarray:
        """``(n, 2)``: ``1 - p, p`` with ``p = sigmoid(logit)``."""
        p = 0.5 * (1.0 + np.tanh(0.5 * self.decision_function(X, where)))
        return np.stack([1.0 - p, p], axis=1)

    def metrics(self, raw: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """``accuracy`` (logit > 0 is class 1) and ``auc`` of the logits over the labelled rows."""
        from sklearn.metrics import roc_auc_score

        out = super().metrics(raw, y)
        lab = y >= 0
        if len(np.unique(y[lab])) == 2:
            out["auc"] = float(roc_auc_score(y[lab], raw[lab]))
        return out


PREDICTORS: dict[str, type[HybridFLModel]] = {"linear": LinearModel, "hyfem": HyFEMModel, "fedbcd": FedBCDModel}
"""Model kind -> its predictor class."""
