"""Which clients take part in a round (partial participation).

HyFDCA Assumption 5 (random subsets: a fixed ``fraction`` of the clients, or each client
independently with ``probability``) and Assumption 7 (``cyclic`` groups: client ``i`` takes part
in rounds ``t`` with ``i % groups == (t - 1) % groups``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def select_participants(
    rnd: int,
    ids: Sequence[str],
    participation: float,
    mode: str,
    cyclic_groups: int,
    rng: np.random.Generator,
    minimum: int = 1,
) -> list[str]:
    """The clients of round ``rnd`` (1-based), in the order of ``ids``.

    Args:
        rnd: round number, from 1.
        ids: all client IDs.
        participation: share (``fraction``) or probability (``probability``) of clients, in (0, 1].
        mode: ``"fraction"``, ``"probability"`` or ``"cyclic"``.
        cyclic_groups: number of groups for ``cyclic``.
        rng: draws the random subsets (not used for ``cyclic`` or full participation).
        minimum: the fewest clients of a round (secure aggregation's threshold ``t``:
            its clients refuse a smaller masked exchange); a random round with fewer is topped up
            with clients drawn from the others; at most all of ``ids``.

    Returns:
        At least one client ID (at least ``minimum``, but cyclic groups are as they are: the
        algorithm checks their size).
    """
    if mode == "cyclic":
        return [c for i, c in enumerate(ids) if i % cyclic_groups == (rnd - 1) % cyclic_groups]
    if participation >= 1.0:
        return list(ids)
    minimum = max(1, min(int(minimum), len(ids)))
    if mode == "probability":
        pick = [c for c in ids if rng.random() < participation]
        if not pick:
            pick = [ids[int(rng.integers(len(ids)))]]
        if len(pick) < minimum:
            rest = [i for i, c in enumerate(ids) if c not in pick]
            more = {ids[i] for i in rng.choice(rest, size=minimum - len(pick), replace=False).tolist()}
            pick = [c for c in ids if c in pick or c in more]
        return pick
    k = max(minimum, int(round(participation * len(ids))))
    chosen = set(rng.choice(len(ids), size=k, replace=False).tolist())
    return [c for i, c in enumerate(ids) if i in chosen]
