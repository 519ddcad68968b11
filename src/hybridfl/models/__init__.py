"""Models: feature extractors per block and the one-hidden-layer classifier."""

from hybridfl.models.hybrid import (
    Classifier,
    CNNExtractor,
    ExtractorFactory,
    HybridModel,
    MaxPool2x2,
    MLPExtractor,
    block_columns,
    default_extractor,
    model_device,
    predict,
)

__all__ = [
    "CNNExtractor",
    "Classifier",
    "ExtractorFactory",
    "HybridModel",
    "MLPExtractor",
    "MaxPool2x2",
    "block_columns",
    "default_extractor",
    "model_device",
    "predict",
]
