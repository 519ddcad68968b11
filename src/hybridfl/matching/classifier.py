"""HyFEM classifier matching: merge client classifiers of different input sets into one server
classifier (HyFEM Alg. 1 line 8, Alg. 3, Appendix A.2).

Each client ``m`` holds a one-hidden-layer classifier over its own input columns
(``W1_m`` ``(H_m, D_m)``, ``b1_m`` ``(H_m,)``, ``W2_m`` ``(C, H_m)``, ``b2_m`` ``(C,)``); its input
columns sit at known server columns (``Pi_m,1 = P_m``). The server classifier has ``L`` hidden
neurons over all ``D0`` input columns. The unknown part of ``Pi_m`` is the assignment of each
client hidden neuron to a distinct server neuron (or to a new one), found by the Hungarian
method on a PFNM or Euclidean cost (:mod:`hybridfl.matching.neurons`). The output layer is not
matched (its rows are the classes, the same everywhere); its columns follow the hidden neurons.

Procedure (:func:`match_classifiers`):

1. start from the previous assignments (``Pi_m^t``); a client without one is matched greedily;
2. up to ``P`` sweeps: in a random client order, remove client ``m'``, build the server neurons
   from the other clients (Alg. 3 line 5), and re-assign ``m'`` by the Hungarian method (line
   7-8); a sweep in which no assignment changes is a fixed point and ends the sweeps early;
3. the server classifier is the ``p_m``-weighted average, per entry, over the clients whose
   matched weights cover that entry (the closed form of (11), Alg. 3 line 9); server neurons no
   client is matched to are dropped; the width never exceeds ``max_width``.

An entry covered by nobody (a server neuron's input columns of blocks that none of the clients
matched to it holds) is where ``sum_m p_m Pi_m^T Pi_m`` of Alg. 3 line 9 is singular. With
``uncovered="zero"`` (default, the paper's) it is 0: ``Pi_m^T w_m`` pads zeros where a client
lacks features (``P_m^T v_m``, HyFEM Appendix A, eq. (14)), so the numerator is 0 there and the
pseudo-inverse gives 0. With ``uncovered="previous"`` (ours; the default of earlier versions) it keeps its
previous value, i.e. the random initialisation for a column nobody ever covered. Neurons reserved
for absent clients keep their previous values in both modes.

``cost="index"`` is not matching: every client keeps its previous assignment (a client without
one takes server neurons ``0 .. H_m - 1``) and the server averages entry by entry, as FedAvg
would (the "plain index-wise averaging" baseline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hybridfl.matching.neurons import assign, euclidean_cost, pfnm_cost


@dataclass
class ClientClassifier:
    """A client's classifier with its input columns in server coordinates.

    Attributes:
        W1: ``(H_m, D_m)``; b1: ``(H_m,)``; W2: ``(C, H_m)``; b2: ``(C,)``.
        columns: ``(D_m,)`` server input column of each client input column (``P_m``).
        weight: aggregation weight ``p_m`` (> 0), e.g. the client's sample count.
        assignment: ``(H_m,)`` previous server neuron of each hidden neuron (``Pi_m^t``), or None.
        class_counts: ``(C,)`` samples per class at the client (optional, used with
            ``output_weighting="class"`` and for PFNM's output-layer precision).
    """

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    columns: np.ndarray
    weight: float
    assignment: np.ndarray | None = None
    class_counts: np.ndarray | None = None

    @property
    def width(self) -> int:
        """The client's hidden width ``H_m`` (rows of ``W1``)."""
        return int(self.W1.shape[0])


@dataclass
class ServerClassifier:
    """The server classifier: ``W1`` ``(L, D0)``, ``b1`` ``(L,)``, ``W2`` ``(C, L)``, ``b2`` ``(C,)``."""

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray

    @property
    def width(self) -> int:
        """The server's hidden width ``L`` (rows of ``W1``)."""
        return int(self.W1.shape[0])

    def client_view(self, assignment: np.ndarray, columns: np.ndarray) -> dict[str, np.ndarray]:
        """``Pi_m w_0``: the rows/columns of the server classifier at a client's matched
        positions, as classifier arrays ``fc1.weight``, ``fc1.bias``, ``fc2.weight``, ``fc2.bias``."""
        return {
            "fc1.weight": self.W1[np.ix_(assignment, columns)].astype(np.float32),
            "fc1.bias": self.b1[assignment].astype(np.float32),
            "fc2.weight": self.W2[:, assignment].astype(np.float32),
            "fc2.bias": self.b2.astype(np.float32),
        }


@dataclass
class MatchingConfig:
    """Matching hyperparameters.

    Attributes:
        cost: ``"pfnm"``, ``"euclidean"``, or ``"index"`` (no matching: index-wise averaging with
            the previous assignments, a baseline).
        sweeps: number of sweeps ``P`` over the clients.
        sigma, sigma0, gamma: PFNM hyperparameters (reference defaults 1, 1, 1; FedMA uses gamma 7).
        new_penalty: Euclidean cost of opening a new neuron (``None``: the median squared norm of
            the client's neuron vectors).
        max_width: cap on the server hidden width (``None``: no cap).
        output_weighting: ``"samples"`` (HyFEM Alg. 3 line 9: ``p_m`` for every entry) or ``"class"`` (output
            row ``c`` weighted by the client's sample count of class ``c``; clients without class
            ``c`` do not cover it).
        uncovered: value of a server entry no client covers: ``"zero"`` (HyFEM Appendix A's zero
            padding ``P_m^T v_m``, the pseudo-inverse in Alg. 3 line 9; default) or
            ``"previous"`` (keep the previous value, e.g. the random initialisation).
    """

    cost: str = "pfnm"
    sweeps: int = 3
    sigma: float = 1.0
    sigma0: float = 1.0
    gamma: float = 1.0
    new_penalty: float | None = None
    max_width: int | None = None
    output_weighting: str = "samples"
    uncovered: str = "zero"

    def __post_init__(self) -> None:
        if self.cost not in ("pfnm", "euclidean", "index"):
            raise ValueError(f"matching cost must be 'pfnm', 'euclidean' or 'index', got {self.cost!r}")
        if self.uncovered not in ("zero", "previous"):
            raise ValueError(f"uncovered must be 'zero' or 'previous', got {self.uncovered!r}")
        if self.output_weighting not in ("samples", "class"):
            raise ValueError(f"output_weighting must be 'samples' or 'class', got {self.output_weighting!r}")
        if self.sweeps < 0:
            raise ValueError(f"matching sweeps must be >= 0, got {self.sweeps}")


@dataclass
class MatchingResult:
    """The new server classifier, each client's new assignment, and ``index``: the new position
    of every previous server neuron (``-1`` if it was dropped), to remap clients that did not
    take part in this round."""

    server: ServerClassifier
    assignments: list[np.ndarray]
    stats: dict = field(default_factory=dict)
    index: np.ndarray | None = None


class _Pool:
    """Running sums over clients' matched neurons, per server neuron id (grows on demand)."""

    def __init__(self, D: int):
        self.D = D
        self.natural = np.zeros((0, D))
        self.prec = np.zeros((0, D))
        self.count = np.zeros(0, dtype=np.int64)

    def ensure(self, n: int) -> None:
        if n > self.count.size:
            extra = n - self.count.size
            self.natural = np.vstack([self.natural, np.zeros((extra, self.D))])
            self.prec = np.vstack([self.prec, np.zeros((extra, self.D))])
            self.count = np.concatenate([self.count, np.zeros(extra, dtype=np.int64)])

    def add(self, ids: np.ndarray, sv: np.ndarray, prec: np.ndarray, sign: int) -> None:
        self.ensure(int(ids.max()) + 1 if ids.size else 0)
        self.natural[ids] += sign * sv
        self.prec[ids] += sign * prec[None, :]
        self.count[ids] += sign


def _vectors(c: ClientClassifier, D0: int, C: int) -> tuple[np.ndarray, np.ndarray]:
    """Neuron vectors ``(H_m, D0 + 1 + C)`` in server coordinates and the coverage mask ``(D,)``."""
    H = c.width
    V = np.zeros((H, D0 + 1 + C))
    V[:, c.columns] = c.W1
    V[:, D0] = c.b1
    V[:, D0 + 1 :] = c.W2.T
    mask = np.zeros(D0 + 1 + C)
    mask[c.columns] = 1.0
    mask[D0:] = 1.0
    return V, mask


def uncovered_share(width: int, n_inputs: int, views: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Share of the ``(width, n_inputs)`` server ``W1`` entries that no client's view covers.

    Args:
        views: per client ``(assignment, columns)``: its hidden neurons' server rows and its input
            columns (``Pi_m``, ``P_m``).

    Returns:
        A fraction in ``[0, 1]`` (0 for an empty ``W1``): the entries whose value the option
        :attr:`MatchingConfig.uncovered` decides.
    """
    if width * n_inputs == 0:
        return 0.0
    cov = np.zeros((width, n_inputs), dtype=bool)
    for a, cols in views:
        cov[np.ix_(np.asarray(a, dtype=np.int64), np.asarray(cols, dtype=np.int64))] = True
    return float(1.0 - cov.mean())


def _client_vectors(
    clients: list[ClientClassifier], D0: int, C: int, config: MatchingConfig
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's neuron vectors ``(H_m, D)`` and precisions ``(D,)`` (``1 / sigma`` where it
    covers; with ``cost="pfnm"`` and class counts, PFNM's output-layer precision: the client's
    share of each class, as the reference code)."""
    vecs, precs = [], []
    total = sum(np.asarray(k.class_counts, dtype=float) for k in clients if k.class_counts is not None)
    for c in clients:
        V, mask = _vectors(c, D0, C)
        prec = mask / config.sigma
        if c.class_counts is not None and config.cost == "pfnm":
            # PFNM's output-layer precision: the client's share of each class (reference code)
            share = np.divide(np.asarray(c.class_counts, float), total, out=np.zeros(C), where=total > 0)
            prec[D0 + 1 :] = share / config.sigma
        vecs.append(V)
        precs.append(prec)
    return vecs, precs


def _valid_assignment(c: ClientClassifier, width: int) -> np.ndarray | None:
    """``c.assignment`` as int64 if it is one distinct previous server neuron per hidden neuron
    (in ``[0, width)``), else ``None`` (the client is matched afresh)."""
    a = c.assignment
    ok = a is not None and a.shape == (c.width,) and np.unique(a).size == a.size and a.min() >= 0 and a.max() < width
    return np.asarray(a, dtype=np.int64) if ok else None


class _Matcher:
    """The state of the sweeps of :func:`match_classifiers` (steps 1-2 of the module docstring):
    the pool of matched neurons, every client's assignment and the next new neuron id."""

    def __init__(
        self,
        clients: list[ClientClassifier],
        previous: ServerClassifier,
        config: MatchingConfig,
        kept: np.ndarray,
    ):
        D0, C = previous.W1.shape[1], previous.W2.shape[0]
        self.clients, self.config, self.kept = clients, config, kept
        self.D = D0 + 1 + C
        self.vecs, self.precs = _client_vectors(clients, D0, C, config)
        self.pool = _Pool(self.D)
        self.pool.ensure(previous.width)
        self.next_id = previous.width
        self.assignments: list[np.ndarray | None] = [_valid_assignment(c, previous.width) for c in clients]
        for m, a in enumerate(self.assignments):
            if a is not None:
                self.pool.add(a, self._natural(m), self.precs[m], +1)

    def _natural(self, m: int) -> np.ndarray:
        return self.vecs[m] * self.precs[m][None, :]

    def _candidates(self, J: int) -> tuple[np.ndarray, int]:
        """The server neurons a client of ``J`` hidden neurons may join and how many new ones it
        may open (within ``max_width``)."""
        cap, kept = self.config.max_width, self.kept
        cand = np.flatnonzero(self.pool.count > 0)
        alive = np.union1d(cand, kept).size
        room = J if cap is None else max(cap - alive, 0)
        max_new = min(J, room)
        if cand.size + max_new < J:
            # the cap is filled by neurons reserved for absent clients (partial participation):
            # this client may share some of them (their values are then averaged with its own)
            # rather than open neurons past max_width
            extra = np.setdiff1d(kept, cand)[: J - cand.size - max_new]
            cand = np.union1d(cand, extra)
        if cand.size + max_new < J:  # cannot happen when cap >= J, kept as a guard
            max_new = J - cand.size
        return cand, max_new

    def _cost(self, m: int, cand: np.ndarray, max_new: int) -> np.ndarray:
        """Client ``m``'s cost against the candidates and ``max_new`` new neurons (PFNM or Euclidean)."""
        config, pool = self.config, self.pool
        if config.cost == "pfnm":
            return pfnm_cost(
                self.vecs[m],
                self.precs[m],
                pool.natural[cand],
                pool.prec[cand] + 1.0 / config.sigma0,
                np.maximum(pool.count[cand], 1),  # a shared reserved neuron counts its absent holder
                len(self.clients),
                sigma0=config.sigma0,
                gamma=config.gamma,
                max_new=max_new,
            )
        mask = (self.precs[m] > 0).astype(float)
        mean = np.divide(
            pool.natural[cand], pool.prec[cand], out=np.zeros((cand.size, self.D)), where=pool.prec[cand] > 0
        )
        pen = config.new_penalty
        if pen is None:
            pen = float(np.median((self.vecs[m] ** 2).sum(1)))
        return euclidean_cost(
            self.vecs[m], mask, mean, new_penalty=pen, server_mask=pool.prec[cand] > 0, max_new=max_new
        )

    def rematch(self, m: int) -> bool:
        """Re-assign client m against the others; return whether its assignment changed."""
        pool, old = self.pool, self.assignments[m]
        if old is not None:
            pool.add(old, self._natural(m), self.precs[m], -1)
        J = self.clients[m].width
        cand, max_new = self._candidates(J)
        cols = assign(self._cost(m, cand, max_new))
        ids = np.empty(J, dtype=np.int64)
        for j, col in enumerate(cols):
            if col < cand.size:
                ids[j] = cand[col]
            elif old is not None and pool.count[old[j]] == 0 and old[j] not in self.kept:
                ids[j] = old[j]  # its own neuron, which no other client holds: keep the id
            else:
                ids[j] = self.next_id
                self.next_id += 1
        self.assignments[m] = ids
        pool.add(ids, self._natural(m), self.precs[m], +1)
        return old is None or not np.array_equal(old, ids)

    def run(self, rng: np.random.Generator) -> int:
        """Assign every client (steps 1-2); returns the number of sweeps done.

        Raises:
            ValueError: ``cost="index"`` needs a server wider than ``max_width``.
        """
        config, clients, cap = self.config, self.clients, self.config.max_width
        if config.cost == "index":
            # no matching: keep the previous assignments; a client without one takes 0 .. H_m - 1
            for m, a in enumerate(self.assignments):
                if a is None:
                    self.assignments[m] = np.arange(clients[m].width, dtype=np.int64)
                    self.next_id = max(self.next_id, clients[m].width)
            if cap is not None and self.next_id > cap:
                raise ValueError(f"max_width {cap} is smaller than the index-wise server width {self.next_id}")
        # clients without a valid previous assignment: largest first, as PFNM initialises
        for m in sorted((m for m, a in enumerate(self.assignments) if a is None), key=lambda m: -clients[m].width):
            self.rematch(m)
        sweeps_done = 0
        for _ in range(config.sweeps if config.cost != "index" else 0):
            sweeps_done += 1
            changed = [self.rematch(int(m)) for m in rng.permutation(len(clients))]
            if not any(changed):
                # nobody moved: every client's assignment is optimal given the unchanged others, so
                # further sweeps (in any order) return the same assignments
                break
        return sweeps_done


def _kept_neurons(reserved: list[np.ndarray] | None, previous: ServerClassifier) -> np.ndarray:
    """The previous server neurons held by absent clients (sorted, distinct).

    Raises:
        ValueError: one outside the previous server classifier.
    """
    kept = (
        np.unique(np.concatenate([np.asarray(r, dtype=np.int64) for r in reserved]))
        if reserved
        else np.zeros(0, np.int64)
    )
    if kept.size and (kept.min() < 0 or kept.max() >= previous.width):
        raise ValueError("a reserved assignment points outside the previous server classifier")
    return kept


def _average(
    clients: list[ClientClassifier],
    assignments: list[np.ndarray],
    used: np.ndarray,
    index: np.ndarray,
    kept: np.ndarray,
    previous: ServerClassifier,
    config: MatchingConfig,
) -> tuple[ServerClassifier, float]:
    """Step 3, the closed form of (11): the ``p_m``-weighted average per covered entry of the
    ``used`` server neurons (``index`` maps an id to its row); returns the server classifier and
    the share of ``W1`` entries nobody covers (reserved neurons excluded)."""
    D0, C, L = previous.W1.shape[1], previous.W2.shape[0], used.size
    old = used < previous.width
    W1 = np.zeros((L, D0))
    b1 = np.zeros(L)
    W2 = np.zeros((C, L))
    W1[old] = previous.W1[used[old]]
    b1[old] = previous.b1[used[old]]
    W2[:, old] = previous.W2[:, used[old]]
    b2 = previous.b2.astype(np.float64).copy()
    sW1, nW1 = np.zeros((L, D0)), np.zeros((L, D0))
    sb1, nb1 = np.zeros(L), np.zeros(L)
    sW2, nW2 = np.zeros((C, L)), np.zeros((C, L))
    sb2, nb2 = np.zeros(C), np.zeros(C)
    for c, a in zip(clients, assignments):
        rows = index[a]
        p = float(c.weight)
        if config.output_weighting == "class" and c.class_counts is not None:
            pc = np.asarray(c.class_counts, dtype=float)
        else:
            pc = np.full(C, p)
        sW1[np.ix_(rows, c.columns)] += p * c.W1
        nW1[np.ix_(rows, c.columns)] += p
        sb1[rows] += p * c.b1
        nb1[rows] += p
        sW2[:, rows] += pc[:, None] * c.W2
        nW2[:, rows] += pc[:, None]
        sb2 += pc * c.b2
        nb2 += pc
    keep = np.isin(used, kept)  # neurons reserved for absent clients keep uncovered entries
    uncovered = float(((nW1 == 0) & ~keep[:, None]).mean()) if nW1.size else 0.0
    for s, n, out, held in (
        (sW1, nW1, W1, keep[:, None]),
        (sb1, nb1, b1, keep),
        (sW2, nW2, W2, keep[None, :]),
        (sb2, nb2, b2, np.zeros(C, bool)),
    ):
        cov = n > 0
        out[cov] = s[cov] / n[cov]
        if config.uncovered == "zero":
            out[~cov & ~held] = 0.0  # Alg. 3 line 9 with P_m^T zero padding (Appendix A, eq. (14))
    server = ServerClassifier(
        W1.astype(np.float32), b1.astype(np.float32), W2.astype(np.float32), b2.astype(np.float32)
    )
    return server, uncovered


def match_classifiers(
    clients: list[ClientClassifier],
    previous: ServerClassifier,
    config: MatchingConfig,
    rng: np.random.Generator,
    reserved: list[np.ndarray] | None = None,
) -> MatchingResult:
    """Match the clients' hidden neurons to server neurons and average (see module docstring).

    Args:
        clients: the client classifiers after their local steps, with previous assignments.
        previous: the server classifier of the previous round (``w_0^t``).
        config: matching hyperparameters.
        rng: randomness for the sweep order.
        reserved: assignments (previous server neuron indices) of clients that did not answer
            this round: their neurons are kept (not matched, not updated) so they can continue.

    Returns:
        The new server classifier ``w_0^{t+1}`` and each client's assignment ``Pi_m^{t+1}``
        (indices into the new server's hidden neurons).

    Raises:
        ValueError: if ``max_width`` is smaller than a client's hidden width.
    """
    cap = config.max_width
    for c in clients:
        if cap is not None and c.width > cap:
            raise ValueError(f"max_width {cap} is smaller than a client's hidden width {c.width}")
    kept = _kept_neurons(reserved, previous)
    matcher = _Matcher(clients, previous, config, kept)
    sweeps_done = matcher.run(rng)
    assignments = [a for a in matcher.assignments if a is not None]  # every client has one after run
    used = np.unique(np.concatenate(assignments + [kept]))
    if cap is not None and used.size > cap:  # cannot happen: rematch keeps the width <= cap
        raise AssertionError("server width exceeds max_width")
    L = used.size
    index = -np.ones(max(matcher.next_id, previous.width), dtype=np.int64)
    index[used] = np.arange(L)
    old = used < previous.width
    server, uncovered = _average(clients, assignments, used, index, kept, previous, config)
    new_assign = [index[a] for a in assignments]
    moved = 0
    for c, a in zip(clients, assignments):
        prev = c.assignment
        moved += int(np.sum(a != prev)) if prev is not None and np.shape(prev) == a.shape else c.width
    stats = {
        "sweeps": sweeps_done,
        "server_width": L,
        "new_neurons": int((~old).sum()),
        "dropped_neurons": int(previous.width - old.sum()),
        "reassigned": moved,
        "uncovered_share": uncovered,
    }
    return MatchingResult(server, new_assign, stats, index[: previous.width].copy())
