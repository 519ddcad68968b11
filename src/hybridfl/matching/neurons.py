"""Hungarian matching of hidden neurons: cost matrices and the assignment (HyFEM Alg. 3, eq. (20)).

A *neuron vector* is everything attached to one hidden neuron of a one-hidden-layer classifier,
laid out in server coordinates: its incoming weights (``W1`` row, over the server's classifier
input columns), its bias, and its outgoing weights (``W2`` column), ``D = D0 + 1 + C`` numbers.
A client holds only some input columns (its blocks, ``P_m``); the missing ones get zero precision
so they do not count in the cost (HyFEM eq. (20) compares a client row with the server row seen
through the client's inputs, ``w_{0,l} Pi_{m,l-1}^T``; zero precision is our PFNM form of that).

Two costs (lower is better), each a ``(J, L + J_new)`` matrix for ``J`` client neurons against
``L`` existing server neurons followed by ``J_new`` "new neuron" columns:

- :func:`pfnm_cost`: the Beta-Bernoulli-process MAP objective of PFNM (Yurochkin et al. 2019,
  eq. (9)-(10); the same terms as the public reference code ``matching/pfnm.py``) with
  hyperparameters ``sigma`` (client noise), ``sigma0`` (prior), ``gamma`` (IBP mass), negated so
  that it is minimised.
- :func:`euclidean_cost`: squared Euclidean distance over the coordinates both sides hold, and a
  fixed penalty for opening a new neuron.

:func:`assign` solves the assignment with ``scipy.optimize.linear_sum_assignment`` (Hungarian
method, Kuhn 1955).
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def pfnm_cost(
    vectors: np.ndarray,
    precision: np.ndarray,
    server_natural: np.ndarray,
    server_precision: np.ndarray,
    counts: np.ndarray,
    n_clients: int,
    *,
    sigma0: float = 1.0,
    gamma: float = 1.0,
    max_new: int | None = None,
) -> np.ndarray:
    """PFNM assignment cost (to minimise) of client neurons against server neurons.

    Args:
        vectors: ``(J, D)`` client neuron vectors (zeros where the client holds no column).
        precision: ``(D,)`` client precision per coordinate (``1/sigma``; 0 on missing columns).
        server_natural: ``(L, D)`` natural parameters of the server neurons built from the other
            clients: ``sum_k precision_k * v_k`` over the client neurons matched to each.
        server_precision: ``(L, D)`` ``1/sigma0 + sum_k precision_k`` of those neurons.
        counts: ``(L,)`` how many other clients' neurons each server neuron holds (>= 1).
        n_clients: number of clients ``M`` (the ``J`` of PFNM's popularity term).
        sigma0, gamma: prior variance and IBP mass.
        max_new: number of "new neuron" columns (default ``J``).

    Returns:
        ``(J, L + max_new)`` cost; column ``L + k`` opens the ``(k+1)``-th new neuron.

    Source: PFNM eq. (9)-(10): a match adds
    ``||s v + G_i||^2_{1/(s + S_i)} - ||G_i||^2_{1/S_i} + log(n_i / (M - n_i))`` (counts capped at
    10 as in the reference code), a new neuron
    ``||s v||^2_{1/(s + 1/sigma0)} - 2 log(k) + 2 log(gamma / M)``; the cost is the negative.
    """
    J = vectors.shape[0]
    L = server_natural.shape[0]
    max_new = J if max_new is None else max_new
    sv = vectors * precision[None, :]
    if L:
        a = 1.0 / (precision[None, :] + server_precision)  # (L, D)
        match = (sv**2) @ a.T + 2.0 * sv @ (server_natural * a).T  # (J, L)
        match += ((server_natural**2) * (a - 1.0 / server_precision)).sum(axis=1)[None, :]
        c = np.minimum(counts.astype(np.float64), 10.0)
        match += np.log(c / np.maximum(n_clients - c, 1e-12))[None, :]
    else:
        match = np.zeros((J, 0))
    prior = 1.0 / sigma0
    new_base = ((sv**2) / (prior + precision[None, :])).sum(axis=1)  # (J,)
    k = np.arange(1, max_new + 1)
    new = new_base[:, None] - 2.0 * np.log(k)[None, :] + 2.0 * np.log(gamma / n_clients)
    return -np.hstack([match, new])


def euclidean_cost(
    vectors: np.ndarray,
    mask: np.ndarray,
    server_mean: np.ndarray,
    *,
    new_penalty: float,
    server_mask: np.ndarray | None = None,
    max_new: int | None = None,
) -> np.ndarray:
    """Squared Euclidean cost over the coordinates both sides hold, and ``new_penalty`` for a
    new neuron.

    Args:
        vectors: ``(J, D)`` client neuron vectors.
        mask: ``(D,)`` 1 where the client holds the coordinate, 0 elsewhere.
        server_mean: ``(L, D)`` server neuron vectors built from the other clients.
        new_penalty: cost of opening a new server neuron.
        server_mask: ``(L, D)`` 1 where a server neuron has a value (some other client holds the
            coordinate); default all ones.
        max_new: number of "new neuron" columns (default ``J``).

    Returns:
        ``(J, L + max_new)``: ``sum_d m_d s_id (v_jd - u_id)^2``, rescaled by
        ``sum_d m_d / sum_d m_d s_id`` so that neurons known on fewer shared coordinates are not
        favoured, then ``new_penalty`` columns.
    """
    J = vectors.shape[0]
    max_new = J if max_new is None else max_new
    S = np.ones_like(server_mean) if server_mask is None else server_mask.astype(float)
    v = vectors * mask[None, :]
    u = server_mean * S
    d = (v**2) @ S.T - 2.0 * v @ u.T + (u**2) @ mask  # (J, L)
    overlap = S @ mask  # (L,)
    d = np.maximum(d, 0.0) * (mask.sum() / np.maximum(overlap, 1.0))[None, :]
    return np.hstack([d, np.full((J, max_new), float(new_penalty))])


def assign(cost: np.ndarray) -> np.ndarray:
    """Minimum-cost assignment of every row to a distinct column (Hungarian method).

    Args:
        cost: ``(J, K)`` with ``K >= J``.

    Returns:
        ``(J,)`` int array: the column of each row.

    Raises:
        ValueError: if there are fewer columns than rows or the cost has NaN.
    """
    J, K = cost.shape
    if K < J:
        raise ValueError(f"cannot assign {J} neurons to {K} places")
    if not np.isfinite(cost).all():
        raise ValueError("assignment cost has NaN or infinite entries")
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(J, dtype=np.int64)
    out[rows] = cols
    return out
