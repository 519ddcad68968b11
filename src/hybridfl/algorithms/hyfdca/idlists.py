"""Sample-ID lists of the plaintext alignment (``alignment: plaintext``, the paper's setting):
clients whose lists are equal share one list object, so that the server's layout
(:func:`~hybridfl.algorithms.hyfdca.align.plaintext_segments`,
:meth:`~hybridfl.algorithms.hyfdca.server.HyFDCAServer.setup`) passes once over each distinct
list: a grid partition's clients of one sample group hold the same samples in the same order
(on MNIST's 3 x 3 grid, three distinct lists of 20,000 IDs for nine clients)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def shared_lists(holdings: Mapping[str, Sequence[str]]) -> dict[str, Sequence[str]]:
    """``holdings`` (client -> its sample IDs) with each client's IDs replaced by the first earlier
    client's object when the two are equal, item by item in order (a grid's clients of one sample
    group hold the same samples): the plaintext alignment then passes once over each distinct list.
    A list differs from another at its first unequal item, so the checks cost little."""
    out: dict[str, Sequence[str]] = {}
    distinct: list[Sequence[str]] = []
    for c, ids in holdings.items():
        for other in distinct:
            if len(other) == len(ids) and _equal(other, ids):
                out[c] = other
                break
        else:
            distinct.append(ids)
            out[c] = ids
    return out


def _equal(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether two ID sequences (lists or arrays) are equal item by item, as strings."""
    if isinstance(a, list) and isinstance(b, list):
        return a == b
    return bool(np.array_equal(np.asarray(a).astype(str), np.asarray(b).astype(str)))
