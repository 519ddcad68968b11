"""Partitioners: turn a dataset into a :class:`Partition`, reproducibly with a seed.

Each partitioner is a small object with a ``partition(ds) -> Partition`` method (in the spirit of
flwr-datasets' ``Partitioner``); constructing one checks its parameters and raises
:class:`PartitionError` with one sentence for bad values.

=========================  =================================================================
horizontal                 :class:`IIDPartitioner`, :class:`DirichletPartitioner` (alpha over
                           labels), :class:`ClassPartitioner` (pathological: k classes each)
vertical                   :class:`VerticalPartitioner` (blocks to parties, one label party)
hybrid                     :class:`ClassBlockPartitioner` (each client: classes x blocks, HyFEM
                           Tables 2-4), :class:`GridPartitioner` (sample groups x block groups,
                           HyFDCA Fig. 2)
=========================  =================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hybridfl.data.dataset import HybridDataset
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import PartitionError


def _name(i: int) -> str:
    return f"client-{i}"


def _check_count(what: str, n: int, lo: int = 1) -> int:
    if not isinstance(n, (int, np.integer)) or n < lo:
        raise PartitionError(f"{what} must be an integer >= {lo}, got {n!r}.")
    return int(n)


def _check_blocks(ds: HybridDataset, blocks: Sequence[str], where: str) -> tuple[str, ...]:
    for b in blocks:
        if b not in ds.blocks:
            raise PartitionError(
                f"{where} names unknown block {b!r} (dataset {ds.name!r} has: {', '.join(ds.block_names)})."
            )
    order = {b: i for i, b in enumerate(ds.block_names)}
    return tuple(sorted(set(blocks), key=order.__getitem__))


def _split_evenly(ids: np.ndarray, parts: int) -> list[np.ndarray]:
    return [np.sort(a) for a in np.array_split(ids, parts)]


# ------------------------------------------------------------------------------- horizontal


@dataclass
class IIDPartitioner:
    """Horizontal: samples shuffled and split evenly into ``num_clients`` shards, all blocks."""

    num_clients: int
    seed: int = 0

    def __post_init__(self) -> None:
        _check_count("num_clients", self.num_clients)

    def partition(self, ds: HybridDataset) -> Partition:
        """Deal the shuffled samples of ``ds`` into ``num_clients`` even shards (``client-<i>``).

        Raises:
            PartitionError: more clients than samples.
        """
        if self.num_clients > ds.n_samples:
            raise PartitionError(f"{self.num_clients} clients but only {ds.n_samples} samples.")
        rng = np.random.default_rng(self.seed)
        perm = ds.ids[rng.permutation(ds.n_samples)]
        shards = _split_evenly(perm, self.num_clients)
        clients = [ClientShard(_name(i), s, tuple(ds.block_names)) for i, s in enumerate(shards)]
        return Partition(clients, f"horizontal IID, {self.num_clients} clients", {"kind": "iid", "seed": self.seed})


@dataclass
class DirichletPartitioner:
    """Horizontal non-IID: per class, shares across clients drawn from Dirichlet(alpha).

    Smaller ``alpha`` means more skew. Redraws (up to 100 times) until every client has at least
    ``min_samples`` samples.
    """

    num_clients: int
    alpha: float = 0.5
    seed: int = 0
    min_samples: int = 1

    def __post_init__(self) -> None:
        _check_count("num_clients", self.num_clients)
        if not self.alpha > 0:
            raise PartitionError(f"Dirichlet alpha must be > 0, got {self.alpha!r}.")

    def partition(self, ds: HybridDataset) -> Partition:
        """Split each class of ``ds`` over ``num_clients`` clients by Dirichlet(alpha) shares, all blocks.

        Raises:
            PartitionError: 100 draws could not give every client ``min_samples`` samples.
        """
        rng = np.random.default_rng(self.seed)
        for _ in range(100):
            buckets: list[list[str]] = [[] for _ in range(self.num_clients)]
            for k in range(ds.n_classes):
                ids = ds.ids[ds.y == k]
                ids = ids[rng.permutation(ids.size)]
                share = rng.dirichlet(np.full(self.num_clients, self.alpha))
                cuts = (np.cumsum(share)[:-1] * ids.size).astype(int)
                for i, part in enumerate(np.split(ids, cuts)):
                    buckets[i].extend(part.tolist())
            if min(len(b) for b in buckets) >= self.min_samples:
                clients = [
                    ClientShard(_name(i), np.sort(np.array(b)), tuple(ds.block_names)) for i, b in enumerate(buckets)
                ]
                return Partition(
                    clients,
                    f"horizontal Dirichlet(alpha={self.alpha}), {self.num_clients} clients",
                    {"kind": "dirichlet", "alpha": self.alpha, "seed": self.seed},
                )
        raise PartitionError(
            f"Dirichlet(alpha={self.alpha}) could not give each of {self.num_clients} clients {self.min_samples} samples in 100 draws."
        )


@dataclass
class ClassPartitioner:
    """Horizontal pathological non-IID: each client holds ``classes_per_client`` classes.

    Classes are dealt round-robin over a seeded permutation so that every class is held when
    ``num_clients * classes_per_client >= C``; the samples of a class are split evenly among the
    clients that hold it.
    """

    num_clients: int
    classes_per_client: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        _check_count("num_clients", self.num_clients)
        _check_count("classes_per_client", self.classes_per_client)

    def partition(self, ds: HybridDataset) -> Partition:
        """Give each client ``classes_per_client`` classes of ``ds`` (all blocks); the owned
        classes are recorded in ``meta["owned_classes"]``.

        Raises:
            PartitionError: ``classes_per_client`` exceeds the number of classes.
        """
        if self.classes_per_client > ds.n_classes:
            raise PartitionError(f"classes_per_client={self.classes_per_client} exceeds the {ds.n_classes} classes.")
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(ds.n_classes)
        owned = [
            [int(order[(i * self.classes_per_client + j) % ds.n_classes]) for j in range(self.classes_per_client)]
            for i in range(self.num_clients)
        ]
        buckets: list[list[str]] = [[] for _ in range(self.num_clients)]
        for k in range(ds.n_classes):
            holders = [i for i in range(self.num_clients) if k in owned[i]]
            if not holders:
                continue
            ids = ds.ids[ds.y == k]
            for i, part in zip(holders, _split_evenly(ids[rng.permutation(ids.size)], len(holders))):
                buckets[i].extend(part.tolist())
        clients = [ClientShard(_name(i), np.sort(np.array(b)), tuple(ds.block_names)) for i, b in enumerate(buckets)]
        return Partition(
            clients,
            f"horizontal by class, {self.classes_per_client} classes per client, {self.num_clients} clients",
            {"kind": "by_class", "owned_classes": owned, "seed": self.seed},
        )


# ------------------------------------------------------------------------------- vertical


@dataclass
class VerticalPartitioner:
    """Vertical: every party holds all samples; blocks are dealt to parties; one label party.

    Args:
        parties: either an explicit list of block lists (one per party), or ``None`` to deal the
            blocks in global order to ``num_parties`` parties as evenly as possible.
        label_party: index of the party that holds the labels.
    """

    num_parties: int = 2
    parties: list[list[str]] | None = None
    label_party: int = 0

    def __post_init__(self) -> None:
        if self.parties is None:
            _check_count("num_parties", self.num_parties, lo=1)
        else:
            self.num_parties = len(self.parties)
        if not 0 <= self.label_party < self.num_parties:
            raise PartitionError(f"label_party {self.label_party} is not one of the {self.num_parties} parties.")

    def partition(self, ds: HybridDataset) -> Partition:
        """One ``party-<i>`` per block group, each with every sample of ``ds``; only
        ``label_party`` has labels.

        Raises:
            PartitionError: more parties than blocks, or a party names an unknown block.
        """
        if self.parties is None:
            if self.num_parties > len(ds.block_names):
                raise PartitionError(
                    f"{self.num_parties} parties but dataset {ds.name!r} has only {len(ds.block_names)} blocks."
                )
            groups = [list(g) for g in np.array_split(np.array(ds.block_names), self.num_parties)]
        else:
            groups = self.parties
        clients = []
        for i, g in enumerate(groups):
            clients.append(
                ClientShard(
                    f"party-{i}", ds.ids.copy(), _check_blocks(ds, g, f"party {i}"), has_labels=(i == self.label_party)
                )
            )
        return Partition(
            clients,
            f"vertical, {len(groups)} parties, labels at party-{self.label_party}",
            {"kind": "vertical", "label_party": self.label_party},
        )


# ------------------------------------------------------------------------------- hybrid


@dataclass
class ClientSpec:
    """One client of a classes x blocks partition: the classes it takes and the blocks it holds."""

    classes: list[int]
    blocks: list[str]


@dataclass
class ClassBlockPartitioner:
    """Hybrid: each client gets a list of classes and a list of blocks (HyFEM Tables 2-4).

    Either give ``clients`` explicitly, or let the partitioner draw them with ``num_clients``,
    ``classes_per_client`` (an int or an inclusive ``(low, high)`` range) and
    ``blocks_per_client``. Drawn assignments are redrawn (up to 5000 times) until every class and
    every block is held by someone, every (class, block) cell is held by at least
    ``min_cell_coverage`` clients and, if ``no_full_client``, no client holds all classes or all
    blocks. ``min_cell_coverage=1`` gives partitions like HyFEM Table 4, where every class is seen
    with every block by some client; with 0 a class may be seen by one client through few blocks.

    Args:
        overlap: ``"full"``: a client takes *all* training samples of its classes, so clients that
            share a class share those samples (possibly with other blocks), as in HyFEM Table 2;
            ``"split"``: the samples of a class are split evenly among the clients holding it.
    """

    clients: list[ClientSpec] | None = None
    num_clients: int = 6
    classes_per_client: int | tuple[int, int] = (5, 7)
    blocks_per_client: int | tuple[int, int] = 3
    overlap: str = "full"
    no_full_client: bool = True
    min_cell_coverage: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.min_cell_coverage < 0:
            raise PartitionError(f"min_cell_coverage must be >= 0, got {self.min_cell_coverage}.")
        if self.overlap not in ("full", "split"):
            raise PartitionError(f"overlap must be 'full' or 'split', got {self.overlap!r}.")
        if self.clients is None:
            _check_count("num_clients", self.num_clients)
        else:
            self.clients = [c if isinstance(c, ClientSpec) else ClientSpec(**c) for c in self.clients]
            if not self.clients:
                raise PartitionError("the classes x blocks partition lists no clients.")

    @staticmethod
    def _range(v: int | tuple[int, int] | Sequence[int]) -> tuple[int, int]:
        if isinstance(v, (int, np.integer)):
            return int(v), int(v)
        lo, hi = v
        return int(lo), int(hi)

    def _draw(self, ds: HybridDataset, rng: np.random.Generator) -> list[ClientSpec]:
        clo, chi = self._range(self.classes_per_client)
        blo, bhi = self._range(self.blocks_per_client)
        C, B = ds.n_classes, len(ds.block_names)
        if not (1 <= clo <= chi <= C):
            raise PartitionError(f"classes_per_client {self.classes_per_client} does not fit the {C} classes.")
        if not (1 <= blo <= bhi <= B):
            raise PartitionError(f"blocks_per_client {self.blocks_per_client} does not fit the {B} blocks.")
        for _ in range(5000):
            specs = []
            for _i in range(self.num_clients):
                nc = int(rng.integers(clo, chi + 1))
                nb = int(rng.integers(blo, bhi + 1))
                cls = sorted(rng.choice(C, nc, replace=False).tolist())
                blk = sorted(rng.choice(B, nb, replace=False).tolist())
                specs.append(ClientSpec(cls, [ds.block_names[j] for j in blk]))
            if {k for s in specs for k in s.classes} != set(range(C)):
                continue
            if {b for s in specs for b in s.blocks} != set(ds.block_names):
                continue
            if (
                self.no_full_client
                and any(len(s.classes) == C or len(s.blocks) == B for s in specs)
                and (chi < C and bhi < B)
            ):
                continue
            if self.min_cell_coverage:
                cells = np.zeros((C, B), dtype=int)
                for s in specs:
                    cells[np.ix_(s.classes, [ds.block_names.index(b) for b in s.blocks])] += 1
                if cells.min() < self.min_cell_coverage:
                    continue
            return specs
        raise PartitionError(
            f"could not draw a classes x blocks partition of {self.num_clients} clients that covers every class and block"
            f"{f' with every cell held {self.min_cell_coverage} times' if self.min_cell_coverage else ''} in 5000 draws; widen the ranges or add clients."
        )

    def partition(self, ds: HybridDataset) -> Partition:
        """Each client the samples of its classes (all of them, or an even share with
        ``overlap="split"``) with its blocks (HyFEM Tables 2-4); the assignment is in ``meta``.

        Raises:
            PartitionError: a client names a class or block ``ds`` lacks, the drawn ranges do not
                fit ``ds``, or no drawn assignment met the coverage conditions in 5000 draws.
        """
        rng = np.random.default_rng(self.seed)
        specs = self.clients if self.clients is not None else self._draw(ds, rng)
        for i, s in enumerate(specs):
            for k in s.classes:
                if not (isinstance(k, (int, np.integer)) and 0 <= k < ds.n_classes):
                    raise PartitionError(f"client {i} names class {k!r}, outside [0, {ds.n_classes - 1}].")
        holders = {k: [i for i, s in enumerate(specs) if k in s.classes] for k in range(ds.n_classes)}
        buckets: list[list[np.ndarray]] = [[] for _ in specs]  # row positions, no ID strings until the end
        for k, hs in holders.items():
            rows = np.flatnonzero(ds.y == k)
            if not hs:
                continue
            if self.overlap == "full":
                for i in hs:
                    buckets[i].append(rows)
            else:
                for i, part in zip(hs, _split_evenly(rows[rng.permutation(rows.size)], len(hs))):
                    buckets[i].append(part)
        clients = [
            ClientShard(
                _name(i),
                ds.sorted_ids(np.concatenate(b) if b else np.zeros(0, dtype=np.int64)),
                _check_blocks(ds, s.blocks, f"client {i}"),
            )
            for i, (s, b) in enumerate(zip(specs, buckets))
        ]
        return Partition(
            clients,
            f"hybrid classes x blocks, {len(specs)} clients, overlap={self.overlap}",
            {
                "kind": "class_block",
                "clients": [{"classes": [int(k) for k in s.classes], "blocks": list(s.blocks)} for s in specs],
                "overlap": self.overlap,
                "seed": self.seed,
            },
        )


@dataclass
class GridPartitioner:
    """Hybrid grid (HyFDCA Fig. 2): ``sample_groups`` x ``block_groups`` cells, one client each.

    Samples are shuffled with ``seed`` and split into ``sample_groups`` groups; blocks (in global
    order) into ``block_groups`` contiguous groups. Client ``(s, f)`` holds sample group ``s`` with
    block group ``f``, so every (sample, block) cell is held by exactly one client. With
    ``replicas > 1`` each cell is replicated: ``replicas`` clients hold the same samples and blocks.
    """

    sample_groups: int = 3
    block_groups: int = 3
    replicas: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        _check_count("sample_groups", self.sample_groups)
        _check_count("block_groups", self.block_groups)
        _check_count("replicas", self.replicas)

    def partition(self, ds: HybridDataset) -> Partition:
        """The grid of ``ds`` (HyFDCA Fig. 2): clients ``client-s<s>-f<f>`` (``-r<r>`` with replicas).

        Raises:
            PartitionError: more block groups than blocks, or more sample groups than samples.
        """
        if self.block_groups > len(ds.block_names):
            raise PartitionError(
                f"{self.block_groups} block groups but dataset {ds.name!r} has only {len(ds.block_names)} blocks."
            )
        if self.sample_groups > ds.n_samples:
            raise PartitionError(f"{self.sample_groups} sample groups but only {ds.n_samples} samples.")
        rng = np.random.default_rng(self.seed)
        perm = ds.ids[rng.permutation(ds.n_samples)]
        sgroups = _split_evenly(perm, self.sample_groups)
        bgroups = [tuple(g) for g in np.array_split(np.array(ds.block_names), self.block_groups)]
        clients = []
        for s, ids in enumerate(sgroups):
            for f, blocks in enumerate(bgroups):
                for r in range(self.replicas):
                    suffix = f"-r{r}" if self.replicas > 1 else ""
                    clients.append(ClientShard(f"client-s{s}-f{f}{suffix}", ids, tuple(str(b) for b in blocks)))
        return Partition(
            clients,
            f"hybrid grid, {self.sample_groups} sample groups x {self.block_groups} block groups",
            {
                "kind": "grid",
                "sample_groups": self.sample_groups,
                "block_groups": self.block_groups,
                "replicas": self.replicas,
                "seed": self.seed,
            },
        )
