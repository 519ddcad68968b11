"""The model directory a run leaves: ``model.json`` (the manifest) and ``model.safetensors``.

Layout::

    model/
      model.json           format, version, algorithm, kind (linear | hyfem | fedbcd), the
                           encoding (blocks and their columns in order, category levels, ID and
                           label columns, classes), the kind's settings, the run's metrics, and
                           the SHA-256 of every weight file
      model.safetensors    the weights (and the standardisation means and stds,
                           ``scale.<block>.mean`` / ``scale.<block>.std``), safetensors: no pickle

:func:`write_model_dir` writes it into a temporary directory beside the target and renames it, so
a reader sees the old model or the new one, never a mixture. :func:`read_model_dir` refuses, with
one sentence, anything it did not write: a missing or extra file, a link, a hash that does not
match, an unknown format or kind, a manifest that does not validate, a tensor of another dtype or
shape (checked by the kind's predictor), a value that is not finite.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridfl.data.encoding import Encoding
from hybridfl.errors import HybridFLError
from hybridfl.files import atomic_write

MODEL_FORMAT = "hybridfl-model"
"""The ``format`` of every manifest."""
MODEL_VERSION = 1
"""The manifest version this hybridfl writes and reads."""
MANIFEST = "model.json"
"""The manifest's file name."""
WEIGHTS = "model.safetensors"
"""The weight file's name."""
MAX_MANIFEST_BYTES = 64 * 2**20
"""Largest manifest read (a manifest holds no weights; encodings of many categories stay far below)."""
KINDS = ("linear", "hyfem", "fedbcd")
"""The model kinds: a linear model over all blocks (HyFDCA, hybrid FedAvg), HyFEM's hybrid model
(per-block extractors and a classifier), FedBCD's party models with the label party's top."""


class ModelError(HybridFLError):
    """A model directory that cannot be used (missing, changed, foreign or malformed), or input
    the model cannot score: one sentence."""


@dataclass
class ModelParts:
    """What an algorithm exports at the end of a run (its spec's ``export_model``).

    Attributes:
        kind: one of :data:`KINDS`.
        tensors: name -> array (the kind's predictor says which names and shapes).
        meta: the kind's settings (JSON-able), e.g. the loss of a linear model.
    """

    kind: str
    tensors: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)


class Manifest(BaseModel):
    """``model.json`` (see the module docs); every field is checked when a model is loaded."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["hybridfl-model"]
    format_version: int
    algorithm: str = Field(min_length=1)
    kind: Literal["linear", "hyfem", "fedbcd"]
    dataset: str = ""
    encoding: Encoding
    model: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, str] = Field(min_length=1)
    part: dict[str, Any] | None = None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _finite(v: Any) -> Any:
    """JSON-able copy of ``v``: numpy scalars as Python numbers, non-finite floats as ``None``."""
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if np.isfinite(v) else None
    return v if isinstance(v, (str, type(None))) else str(v)


def _tensors(
    parts: ModelParts, encoding: Encoding, scale: Mapping[str, tuple[np.ndarray, np.ndarray]], scale_dtype: str
) -> tuple[dict[str, np.ndarray], list]:
    """The model's tensors plus ``scale.<block>.mean``/``.std`` of the standardised blocks, and
    the encoding's blocks with their ``scale`` set (:func:`write_model_dir`).

    Raises:
        ModelError: a tensor that is not finite.
    """
    tensors: dict[str, np.ndarray] = {}
    for k, v in parts.tensors.items():
        a = np.ascontiguousarray(v)
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ModelError(f"the model's tensor {k!r} holds a value that is not finite: the run diverged.")
        tensors[k] = a
    blocks = []
    for b in encoding.blocks:
        if b.name in scale:
            mean, std = scale[b.name]
            tensors[f"scale.{b.name}.mean"] = np.ascontiguousarray(
                mean, dtype=np.float32 if scale_dtype == "float32" else np.float64
            )
            tensors[f"scale.{b.name}.std"] = np.ascontiguousarray(std, dtype=tensors[f"scale.{b.name}.mean"].dtype)
            blocks.append(b.model_copy(update={"scale": scale_dtype}))
        else:
            blocks.append(b.model_copy(update={"scale": "none"}))
    return tensors, blocks


def _replace_dir(out: Path, weights: bytes, manifest: Manifest) -> None:
    """Write ``out`` (the weights and the manifest) in a temporary directory next to it, then put
    it in place of an earlier one as a whole.

    Raises:
        ModelError: ``out`` is a file or a symbolic link (nothing is written).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        atomic_write(stage / WEIGHTS, weights)
        atomic_write(stage / MANIFEST, json.dumps(manifest.model_dump(mode="json", exclude_none=True), indent=1))
        os.chmod(stage, 0o755)
        if out.is_symlink() or out.is_file():
            raise ModelError(f"model path {str(out)!r} exists and is not a directory: nothing was written.")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            os.rename(stage, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_model_dir(
    out: str | Path,
    parts: ModelParts,
    encoding: Encoding,
    scale: Mapping[str, tuple[np.ndarray, np.ndarray]],
    algorithm: str,
    dataset: str = "",
    metrics: Mapping[str, Any] | None = None,
    scale_dtype: str = "float32",
    part: Mapping[str, Any] | None = None,
) -> Path:
    """Write the model directory ``out`` (replacing an earlier one as a whole).

    Args:
        parts: the exported model.
        encoding: the training data's encoding (its blocks' ``scale`` is set here from ``scale``).
        scale: block -> ``(mean, std)`` of the blocks standardised in training.
        algorithm: the algorithm's name.
        metrics: the run's headline metrics, recorded as they were reported.
        scale_dtype: the dtype the standardisation was computed in (``float32`` for a simulated
            split, ``float64`` for prepared clients).
        part: for one organisation's part (:mod:`hybridfl.inference.parts`): its name, units and
            whether it holds the head.

    Returns:
        ``out`` as a path.

    Raises:
        ModelError: a tensor that is not finite, or a kind that is not known.
    """
    if parts.kind not in KINDS:
        raise ModelError(f"model kind {parts.kind!r} is not one of {', '.join(KINDS)}.")
    from safetensors.numpy import save

    tensors, blocks = _tensors(parts, encoding, scale, scale_dtype)
    enc = encoding.model_copy(update={"blocks": blocks})
    weights = save(tensors, metadata={"format": MODEL_FORMAT})
    manifest = Manifest(
        format=MODEL_FORMAT,
        format_version=MODEL_VERSION,
        algorithm=algorithm,
        kind=parts.kind,  # type: ignore[arg-type]
        dataset=dataset,
        encoding=enc,
        model=_finite(parts.meta),
        metrics=_finite(dict(metrics or {})),
        files={WEIGHTS: _sha256(weights)},
        part=_finite(dict(part)) if part is not None else None,
    )
    out = Path(out)
    _replace_dir(out, weights, manifest)
    return out


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "(top level)"
    return f"{where}: {err['msg']}"


def read_model_dir(path: str | Path) -> tuple[Manifest, dict[str, np.ndarray]]:
    """Read and check a model directory: ``(manifest, tensors)``.

    Raises:
        ModelError: a missing directory or file, a link, an extra file, a manifest that is not
            JSON or does not validate, an unknown format, version or kind, a weight file whose
            SHA-256 is not the manifest's, or one safetensors cannot read (one sentence each).
    """
    d = Path(path).expanduser()
    if not d.exists():
        raise ModelError(f"model directory {str(d)!r} does not exist.")
    if not d.is_dir():
        raise ModelError(f"model path {str(d)!r} is not a directory (give the run's model/ directory).")
    m = d / MANIFEST
    if m.is_symlink() or not m.is_file():
        raise ModelError(f"{str(d)!r} holds no {MANIFEST}: it is not a hybridfl model directory.")
    if m.stat().st_size > MAX_MANIFEST_BYTES:
        raise ModelError(
            f"{MANIFEST} in {str(d)!r} is larger than {MAX_MANIFEST_BYTES} bytes: not a hybridfl manifest."
        )
    try:
        raw = json.loads(m.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelError(f"{MANIFEST} in {str(d)!r} is not valid JSON.") from None
    if not isinstance(raw, dict) or raw.get("format") != MODEL_FORMAT:
        raise ModelError(f"{MANIFEST} in {str(d)!r} is not a hybridfl model manifest (format is not {MODEL_FORMAT!r}).")
    if raw.get("format_version") != MODEL_VERSION:
        raise ModelError(
            f"model format version {raw.get('format_version')!r} in {str(d)!r} is not supported "
            f"(this hybridfl reads version {MODEL_VERSION})."
        )
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        raise ModelError(f"{MANIFEST} in {str(d)!r} is invalid: {_first(e)}.") from None
    if set(manifest.files) != {WEIGHTS}:
        raise ModelError(f"{MANIFEST} in {str(d)!r} lists other weight files than {WEIGHTS}.")
    extra = sorted(p.name for p in d.iterdir() if p.name not in (MANIFEST, WEIGHTS))
    if extra:
        raise ModelError(f"model directory {str(d)!r} holds a file the manifest does not list ({extra[0]!r}).")
    w = d / WEIGHTS
    if w.is_symlink() or not w.is_file():
        raise ModelError(f"weight file {WEIGHTS} of {str(d)!r} is missing (or a link).")
    data = w.read_bytes()
    if _sha256(data) != manifest.files[WEIGHTS]:
        raise ModelError(
            f"weight file {WEIGHTS} of {str(d)!r} does not match the SHA-256 in {MANIFEST}: it was changed or replaced."
        )
    from safetensors.numpy import load

    try:
        tensors = load(data)
    except Exception:  # safetensors raises its own error types
        raise ModelError(f"weight file {WEIGHTS} of {str(d)!r} is not a readable safetensors file.") from None
    for k, v in tensors.items():
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            raise ModelError(f"tensor {k!r} of {str(d)!r} holds a value that is not finite.")
    return manifest, tensors
