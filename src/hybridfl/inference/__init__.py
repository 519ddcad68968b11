"""Use a trained model: the model directory a run leaves, and scoring new rows with it.

- :mod:`hybridfl.inference.modeldir`: ``model/`` = ``model.json`` (manifest: algorithm, encoding,
  settings, SHA-256 of the weights) + ``model.safetensors``; written atomically, checked on load.
- :mod:`hybridfl.inference.predictors`: the loaded models (linear, HyFEM, FedBCD) with
  ``predict``, ``predict_proba`` and ``decision_function``.
- :mod:`hybridfl.inference.onnx`: ``export_onnx``, the model as an ONNX graph (the ``onnx`` extra).

``hybridfl predict --model DIR --table new.csv --out predictions.csv`` is the command line
(and ``hybridfl export-onnx --model DIR --out model.onnx``).
"""

from __future__ import annotations

from pathlib import Path

from hybridfl.inference.modeldir import ModelError, ModelParts, read_model_dir, write_model_dir


def load_model(path: str | Path):
    """Load the model directory ``path`` (a run's ``model/``) and return its predictor: a
    :class:`~hybridfl.inference.predictors.LinearModel`,
    :class:`~hybridfl.inference.predictors.HyFEMModel` or
    :class:`~hybridfl.inference.predictors.FedBCDModel`, each with ``predict``,
    ``predict_proba``, ``classes_`` and ``blocks``, taking a DataFrame with the training table's
    columns or a dict block -> raw ``(n, *shape)`` features.

    Raises:
        ModelError: a missing, changed, foreign or malformed model directory (one sentence).
    """
    from hybridfl.inference.predictors import PREDICTORS

    manifest, tensors = read_model_dir(path)
    if manifest.part is not None:
        raise ModelError(
            f"{str(path)!r} is organisation {manifest.part.get('organisation')!r}'s part of a model, not a whole "
            "model: score with hybridfl predict --federation (each organisation's part from its client directory)."
        )
    return PREDICTORS[manifest.kind](manifest, tensors, path)


__all__ = ["ModelError", "ModelParts", "load_model", "read_model_dir", "write_model_dir"]
