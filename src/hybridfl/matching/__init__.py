"""Matching: Hungarian neuron matching of classifiers (HyFEM Alg. 3, PFNM cost)."""

from hybridfl.matching.classifier import (
    ClientClassifier,
    MatchingConfig,
    MatchingResult,
    ServerClassifier,
    match_classifiers,
    uncovered_share,
)
from hybridfl.matching.neurons import assign, euclidean_cost, pfnm_cost

__all__ = [
    "ClientClassifier",
    "MatchingConfig",
    "MatchingResult",
    "ServerClassifier",
    "assign",
    "euclidean_cost",
    "match_classifiers",
    "pfnm_cost",
    "uncovered_share",
]
