"""Models: feature extractors per block and the one-hidden-layer classifier."""

from hybridfl.models.hybrid import (
    Classifier,
    CNNExtractor,
    ExtractorFactory,
    HybridModel,
    MLPExtractor,
    block_columns,
    default_extractor,
    predict,
)

__all__ = [
    "CNNExtractor",
    "Classifier",
    "ExtractorFactory",
    "HybridModel",
    "MLPExtractor",
    "block_columns",
    "default_extractor",
    "predict",
]
