"""Export a partition as one directory per client, and load such a directory.

A deployment runs each client on its own machine with only its own data. :func:`export_clients`
turns a simulated set-up (a training split plus a :class:`Partition`) into exactly that::

    OUT/
      manifest.json            dataset name, classes, block schema, client names, seed
      server/                  what the server may hold: the public schema and (optionally) the
        server.json            test set, for server-side evaluation like Flower's evaluate_fn
        test/ ...              (same layout as a client directory, all blocks, with labels)
      client-0/                one directory per client (named by its client ID)
        client.json            client_id, index in the partition, has_labels, n_samples, schema
        blocks.json            the client's blocks: name -> file and per-sample shape
        sample_ids.npy         (n_m,) sample IDs (str)
        block-<k>.npz          one file per held block: array ``x`` of shape (n_m, *block_shape)
        labels.npy             (n_m,) int64 class indices, only if the client holds labels; -1 marks
                               an unlabelled row (``client prepare`` of a table with empty label cells)

:func:`load_client_dir` reads a client directory back into a :class:`ClientData` whose
``data.subset``-equivalent dataset equals ``split.train.subset(sample_ids, blocks)`` bit for bit
(float32 features, same sample order), so a deployed run sees the same data as the simulation.

**Unlabelled rows.** A client holding labels trains on its labelled rows only: the loader leaves
the rows whose ``labels.npy`` entry is -1 out of ``ClientData.data`` (they stay in the directory;
``ClientData.unlabelled`` counts them). Every algorithm gets the same rule; which clients must hold
labels at all is each algorithm's (:attr:`hybridfl.algorithms.spec.AlgorithmSpec.labels`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.errors import DataError
from hybridfl.files import atomic_write

FORMAT_VERSION = 1
SECRET_FILE = "he_secret.key"
"""A client directory's shared HE key pair (written by ``hybridfl he-keys``; never in ``server/``)."""
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_CLIENT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")  # a path component: no leading dot, no '..'
DIR_MODE = 0o700
"""Permission bits of every directory an export creates (owner only: it holds a client's data)."""
FILE_MODE = 0o600
"""Permission bits of every file an export writes (owner only)."""


def _write_npy(path: Path, a: np.ndarray) -> None:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    atomic_write(path, buf.getvalue(), mode=FILE_MODE)


def _write_npz(path: Path, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write(path, buf.getvalue(), mode=FILE_MODE)


@dataclass
class ClientData:
    """One client's exported data, read back from its directory.

    Attributes:
        client_id: the client's name.
        index: its position in the exported partition (algorithms seed clients by it).
        data: its samples restricted to its blocks; ``y`` is all zeros when ``has_labels`` is
            false (the labels were not exported and must not be read).
        has_labels: whether the client holds the labels of its samples.
        block_shapes: the public block schema: every block name -> per-sample shape, global order.
        classes: class names (public schema).
        meta: the rest of ``client.json``.
        path: the directory it was read from (other node-local files live there, e.g. HE keys);
            ``None`` for a client the simulation made in memory.
        secrets: material the client shares with the other clients but never with the server
            (``he_secret``: HyFDCA's HE key pair, from the directory's ``he_secret.key``).
        test: its blocks of the test samples (labels only if ``has_labels``), for algorithms whose
            evaluation needs every party (FedBCD); ``None`` otherwise.
        unlabelled: the rows of its directory without a label, left out of ``data`` (a client
            holding labels trains on its labelled rows only).
    """

    client_id: str
    index: int
    data: HybridDataset
    has_labels: bool
    block_shapes: dict[str, tuple[int, ...]]
    classes: list[str]
    meta: dict = field(default_factory=dict)
    path: Path | None = None
    secrets: dict[str, bytes] = field(default_factory=dict, repr=False)
    test: HybridDataset | None = None
    unlabelled: int = 0

    @property
    def n_classes(self) -> int:
        """The number of classes ``C`` of the federation's schema."""
        return len(self.classes)


@dataclass
class ServerData:
    """What an exported ``server/`` directory holds: the public schema, client names, and
    optionally the test set (all blocks, with labels) for server-side evaluation."""

    block_shapes: dict[str, tuple[int, ...]]
    classes: list[str]
    client_ids: list[str]
    test: HybridDataset | None
    meta: dict = field(default_factory=dict)

    @property
    def n_classes(self) -> int:
        """The number of classes ``C`` of the federation's schema."""
        return len(self.classes)

    @property
    def layout(self) -> list[tuple[str, list[str], bool]]:
        """The public structure ``[(client_id, blocks, has_labels)]`` in partition order."""
        blocks = self.meta.get("client_blocks", {})
        labels = self.meta.get("client_labels", {})
        return [(c, [str(b) for b in blocks.get(c, [])], bool(labels.get(c, True))) for c in self.client_ids]


def _write_dataset_dir(path: Path, ds: HybridDataset, with_labels: bool, labels: np.ndarray | None = None) -> dict:
    """Write ``ds`` as a data directory; ``labels`` (with -1 for unlabelled rows) replaces ``ds.y``."""
    path.mkdir(mode=DIR_MODE)
    _write_npy(path / "sample_ids.npy", np.asarray(ds.ids).astype(str))
    entries = []
    for k, (b, x) in enumerate(ds.blocks.items()):
        fname = f"block-{k}-{_SAFE.sub('_', b)}.npz"
        _write_npz(path / fname, x=np.ascontiguousarray(x, dtype=np.float32))
        entries.append({"name": b, "file": fname, "shape": list(x.shape[1:])})
    atomic_write(path / "blocks.json", json.dumps({"blocks": entries}, indent=1), mode=FILE_MODE)
    if with_labels:
        _write_npy(path / "labels.npy", (ds.y if labels is None else labels).astype(np.int64))
    return {"n_samples": ds.n_samples, "blocks": [e["name"] for e in entries]}


def _read_dataset_dir(path: Path, name: str, classes: list[str], with_labels: bool) -> tuple[HybridDataset, int]:
    """The data directory's labelled rows (all rows without labels) and the number of rows left out."""
    for f in ("sample_ids.npy", "blocks.json"):
        if not (path / f).is_file():
            raise DataError(f"data directory {str(path)!r} has no {f} (write it with `hybridfl export-clients`).")
    ids = np.load(path / "sample_ids.npy", allow_pickle=False).astype(str)
    try:
        entries = json.loads((path / "blocks.json").read_text())["blocks"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise DataError(f"{str(path / 'blocks.json')!r} is not a valid block list.") from None
    blocks: dict[str, np.ndarray] = {}
    for e in entries:
        f = path / str(e["file"])
        if not f.is_file():
            raise DataError(
                f"data directory {str(path)!r} lists block {e['name']!r} but its file {e['file']!r} is missing."
            )
        with np.load(f, allow_pickle=False) as z:
            x = z["x"]
        if tuple(x.shape[1:]) != tuple(e["shape"]):
            raise DataError(
                f"block {e['name']!r} in {str(path)!r} has shape {tuple(x.shape[1:])}, blocks.json says {tuple(e['shape'])}."
            )
        blocks[str(e["name"])] = x
    if with_labels:
        if not (path / "labels.npy").is_file():
            raise DataError(f"data directory {str(path)!r} should hold labels but has no labels.npy.")
        y = np.load(path / "labels.npy", allow_pickle=False)
        if y.shape == ids.shape and np.issubdtype(y.dtype, np.integer) and (y == -1).any():
            keep = y != -1  # unlabelled rows: kept in the directory, not trained on
            if not keep.any():
                raise DataError(f"data directory {str(path)!r} holds labels.npy without any label.")
            ids, y, blocks = ids[keep], y[keep], {b: x[keep] for b, x in blocks.items()}
            return HybridDataset(name=name, ids=ids, y=y, blocks=blocks, classes=classes), int((~keep).sum())
    else:
        y = np.zeros(ids.shape[0], dtype=np.int64)
    return HybridDataset(name=name, ids=ids, y=y, blocks=blocks, classes=classes), 0


def _check_client_names(ids: Sequence[str]) -> None:
    """Every client name is a safe directory name, not ``server``, and differs from the others in
    more than case.

    Raises:
        DataError: the first name that is not.
    """
    bad = [c for c in ids if not _CLIENT_NAME.fullmatch(c) or c.lower() == "server"]
    if bad:
        raise DataError(
            f"client name {bad[0]!r} cannot be a directory name (use letters, digits, '_', '.', '-', at most 128, "
            "not starting with '.'; not 'server')."
        )
    folded = [c.lower() for c in ids]
    same = [c for i, c in enumerate(ids) if folded.index(c.lower()) != i]
    if same:
        raise DataError(f"client name {same[0]!r} differs from another client's name only in case.")


def _write_client(d: Path, i: int, c: ClientShard, split: DatasetSplit, common: dict, client_test: bool) -> str:
    """Client ``c``'s directory ``d`` (:func:`export_clients`, the ``i``-th client): its data, a new
    credential, its test blocks (``client_test``) and ``client.json``; returns its public key."""
    from hybridfl.privacy.credentials import PUBLIC_KEY_FIELD, new_client_key

    local = split.train.subset(c.sample_ids, c.blocks)
    info = _write_dataset_dir(d, local, with_labels=c.has_labels)
    meta = {**common, "client_id": c.client_id, "index": i, "has_labels": bool(c.has_labels), **info}
    if split.encoding is not None:  # its own copy of the public encoding, for its part of a model
        from hybridfl.data.encoding import encoding_meta

        meta["encoding"] = encoding_meta(split.encoding, split.scale, "float32")
    key = meta[PUBLIC_KEY_FIELD] = new_client_key(d)  # its proof of identity at the hello
    if client_test:
        _write_dataset_dir(d / "test", split.test.subset(None, c.blocks), with_labels=c.has_labels)
    atomic_write(d / "client.json", json.dumps(meta, indent=1), mode=FILE_MODE)
    return key


def export_clients(
    split: DatasetSplit,
    partition: Partition,
    out_dir: str | Path,
    seed: int = 0,
    include_test: bool = True,
    run_config: dict | None = None,
    client_test: bool = False,
) -> list[Path]:
    """Write one directory per client (and ``server/``) under ``out_dir``; return the client dirs.

    Args:
        split: the training data the partition refers to, and the test set.
        partition: who holds what (validated against ``split.train`` first).
        out_dir: created (mode 0700) if missing; an existing directory must be empty, so two
            exports never mix. Every directory the export creates is mode 0700 and every file it
            writes mode 0600 (a client's data is for its owner only).
        seed: the run seed, recorded in the manifest.
        include_test: write the test set into ``server/test`` for server-side evaluation.
        run_config: optional run config (JSON-able dict) recorded in ``server/server.json``.
        client_test: also write each client's blocks of the test set into ``<client>/test``
            (labels only for a client holding labels): for algorithms whose evaluation needs every
            party (FedBCD).

    Raises:
        PartitionError: the partition does not fit the data.
        DataError: ``out_dir`` exists and is not an empty directory, or a client name is not a
            safe directory name (nothing is written then).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"export path {str(out)!r} exists and is not a directory.")
    partition.validate(split.train)
    train = split.train
    schema = {b: list(s) for b, s in train.block_shapes.items()}
    ids = [c.client_id for c in partition.clients]
    _check_client_names(ids)
    if out.is_dir() and any(out.iterdir()):
        raise DataError(
            f"export directory {str(out)!r} is not empty: export into a new or empty directory so two exports never mix."
        )
    out.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    common = {"format": FORMAT_VERSION, "dataset": train.name, "classes": list(train.classes), "block_shapes": schema}
    dirs, keys = [], {}
    for i, c in enumerate(partition.clients):
        d = out / c.client_id
        keys[c.client_id] = _write_client(d, i, c, split, common, client_test)
        dirs.append(d)
    srv = out / "server"
    srv.mkdir(mode=DIR_MODE)
    smeta = {
        **common,
        "client_ids": ids,
        "seed": int(seed),
        "has_test": bool(include_test),
        # public structure (no sample IDs): which block names each client holds, labels yes/no
        "client_blocks": {c.client_id: list(c.blocks) for c in partition.clients},
        "client_labels": {c.client_id: bool(c.has_labels) for c in partition.clients},
        "client_keys": keys,  # public Ed25519 keys: the server checks each node's hello against them
    }
    from hybridfl.privacy.roster import ROSTER_FILE, roster_from_server_meta

    roster = roster_from_server_meta(smeta)  # every client's key, in every client directory (signed PSI keys)
    for d in dirs:
        atomic_write(d / ROSTER_FILE, roster.to_json(), mode=FILE_MODE)
    if run_config is not None:
        smeta["run_config"] = run_config
    if split.encoding is not None:  # so the server can leave a model directory (hybridfl.inference)
        from hybridfl.data.encoding import encoding_meta

        smeta["encoding"] = encoding_meta(split.encoding, split.scale, "float32")
    if include_test:
        _write_dataset_dir(srv / "test", split.test, with_labels=True)
    atomic_write(srv / "server.json", json.dumps(smeta, indent=1), mode=FILE_MODE)
    atomic_write(
        out / "manifest.json",
        json.dumps({**common, "client_ids": ids, "seed": int(seed), "description": partition.description}, indent=1),
        mode=FILE_MODE,
    )
    return dirs


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise DataError(f"{what} {str(path.parent)!r} has no {path.name} (write it with `hybridfl export-clients`).")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{str(path)!r} is not valid JSON (line {e.lineno}).") from None


def load_client_dir(path: str | Path) -> ClientData:
    """Read one client directory written by :func:`export_clients` (with its ``test/`` blocks as
    ``ClientData.test`` when the export wrote them, ``client_test``).

    Raises:
        DataError: the directory is missing, or a file in it is missing or inconsistent.
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DataError(f"client data directory {str(p)!r} does not exist.")
    meta = _read_json(p / "client.json", "client data directory")
    if meta.get("unfilled"):
        raise DataError(
            f"client directory {str(p)!r} has {int(meta['unfilled'])} missing cells that the federation's means fill, "
            "and its schema had none yet: prepare it again with the schema `hybridfl federation stats` writes."
        )
    try:
        classes = [str(c) for c in meta["classes"]]
        schema = {str(b): tuple(int(v) for v in s) for b, s in meta["block_shapes"].items()}
        data, unlabelled = _read_dataset_dir(p, str(meta["dataset"]), classes, bool(meta["has_labels"]))
        has_test = (p / "test" / "blocks.json").is_file()  # written with client_test
        test = _read_dataset_dir(p / "test", data.name, classes, bool(meta["has_labels"]))[0] if has_test else None
        secrets = {"he_secret": (p / SECRET_FILE).read_bytes()} if (p / SECRET_FILE).is_file() else {}
        out = ClientData(
            str(meta["client_id"]),
            int(meta["index"]),
            data,
            bool(meta["has_labels"]),
            schema,
            classes,
            meta,
            p,
            secrets,
            test,
            unlabelled,
        )
    except KeyError as e:
        raise DataError(f"{str(p / 'client.json')!r} is missing the field {e}.") from None
    unknown = [b for b in data.block_names if b not in schema]
    if unknown:
        raise DataError(f"client directory {str(p)!r} holds block {unknown[0]!r}, which is not in its schema.")
    if data.n_samples + unlabelled != int(meta.get("n_samples", data.n_samples + unlabelled)):
        raise DataError(
            f"client directory {str(p)!r} holds {data.n_samples + unlabelled} samples, client.json says {meta['n_samples']}."
        )
    return out


def load_server_dir(path: str | Path) -> ServerData:
    """Read the ``server/`` directory written by :func:`export_clients`.

    Raises:
        DataError: the directory or its ``server.json`` is missing or inconsistent.
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        raise DataError(f"server directory {str(p)!r} does not exist.")
    meta = _read_json(p / "server.json", "server directory")
    try:
        classes = [str(c) for c in meta["classes"]]
        schema = {str(b): tuple(int(v) for v in s) for b, s in meta["block_shapes"].items()}
        test = _read_dataset_dir(p / "test", str(meta["dataset"]), classes, True)[0] if meta.get("has_test") else None
        return ServerData(schema, classes, [str(c) for c in meta["client_ids"]], test, meta)
    except KeyError as e:
        raise DataError(f"{str(p / 'server.json')!r} is missing the field {e}.") from None
