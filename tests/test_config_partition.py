"""The partition config: one pydantic model per ``kind``, each with only its own settings. A setting
of another kind is refused in one sentence naming the setting and the kind (also through the CLI);
every kind builds the same partition as its partitioner with the same seed; a ``config.json``
written when one model held every kind's settings still resumes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridfl.config import PARTITION_KINDS, parse_config, run_dir_config
from hybridfl.data import (
    ClassBlockPartitioner,
    ClassPartitioner,
    DirichletPartitioner,
    GridPartitioner,
    IIDPartitioner,
    VerticalPartitioner,
    load_digits,
)
from hybridfl.data.from_config import build_partition
from hybridfl.errors import ConfigError

REFUSED = {
    "grid with alpha": ({"kind": "grid", "alpha": 0.3}, "alpha", "does not apply to partition kind 'grid'"),
    "grid with num_clients": ({"kind": "grid", "num_clients": 4}, "num_clients", "kind 'grid'"),
    "iid with alpha": ({"kind": "iid", "alpha": 0.3}, "alpha", "does not apply to partition kind 'iid'"),
    "by_class with a range": ({"kind": "by_class", "classes_per_client": [5, 7]}, "classes_per_client", "integer"),
    "vertical with overlap": ({"kind": "vertical", "overlap": "split"}, "overlap", "kind 'vertical'"),
    "file with num_clients": ({"kind": "file", "path": "p.json", "num_clients": 2}, "num_clients", "kind 'file'"),
    "explicit clients and num_clients": (
        {"kind": "class_block", "clients": [{"classes": [0], "blocks": ["top_left"]}], "num_clients": 2},
        "num_clients",
        "explicit clients, which are not drawn (partition kind 'class_block')",
    ),
    "explicit parties and num_clients": (
        {"kind": "vertical", "parties": [["top_left"]], "num_clients": 2},
        "num_clients",
        "explicit parties (partition kind 'vertical')",
    ),
    "an empty client list": ({"kind": "class_block", "clients": []}, "clients", "at least 1 item"),
    "an unknown setting": ({"kind": "dirichlet", "clients_n": 2}, "clients_n", "not a known setting"),
    "an unknown kind": ({"kind": "magic"}, "kind", "must be one of class_block, grid"),
    "file without a path": ({"kind": "file"}, "path", "Field required"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_setting_that_does_not_apply_is_refused_by_name(name):
    part, field, words = REFUSED[name]
    with pytest.raises(ConfigError) as e:
        parse_config({"partition": part}, where="c.yaml")
    msg = str(e.value)
    assert f"'partition.{field}' in c.yaml" in msg and words in msg, msg
    assert msg.count(". ") == 0 and "\n" not in msg  # one sentence


def test_each_kind_has_only_its_own_settings():
    own = {k: set(m.model_fields) - {"kind"} for k, m in PARTITION_KINDS.items()}
    assert own["grid"] == {"sample_groups", "block_groups", "replicas"}
    assert own["iid"] == {"num_clients"}
    assert own["dirichlet"] == {"num_clients", "alpha"}
    assert own["by_class"] == {"num_clients", "classes_per_client"}
    assert own["vertical"] == {"num_clients", "parties", "label_party"}
    assert own["file"] == {"path"}


def test_kind_defaults_to_class_block_and_a_dump_parses_back():
    cfg = parse_config({"partition": {"num_clients": 4}})
    assert cfg.partition.kind == "class_block" and cfg.partition.num_clients == 4
    for part in (
        {"kind": "grid", "replicas": 2},
        {"kind": "class_block", "clients": [{"classes": [0, 1], "blocks": ["top_left"]}]},
        {"kind": "vertical", "parties": [["top_left"], ["top_right"]], "label_party": 1},
    ):
        cfg = parse_config({"partition": part})
        dumped = cfg.model_dump(mode="json")["partition"]
        assert set(dumped) <= set(PARTITION_KINDS[part["kind"]].model_fields)
        assert parse_config({"partition": dumped}).partition == cfg.partition
    # explicit clients or parties: the drawing settings they do not use are not written
    assert "num_clients" not in dumped


@pytest.fixture(scope="module")
def digits():
    return load_digits("quadrants", 2, True, 0.25, 0).train


SAME = {
    "class_block": (
        {"kind": "class_block", "num_clients": 5, "overlap": "split", "min_cell_coverage": 1},
        lambda s: ClassBlockPartitioner(num_clients=5, overlap="split", min_cell_coverage=1, seed=s),
    ),
    "grid": ({"kind": "grid", "sample_groups": 2, "replicas": 2}, lambda s: GridPartitioner(2, 3, 2, s)),
    "iid": ({"kind": "iid", "num_clients": 4}, lambda s: IIDPartitioner(4, s)),
    "dirichlet": ({"kind": "dirichlet", "num_clients": 4, "alpha": 0.3}, lambda s: DirichletPartitioner(4, 0.3, s)),
    # by_class's default is the 5 classes it took from the former shared default range (5, 7)
    "by_class": ({"kind": "by_class", "num_clients": 4}, lambda s: ClassPartitioner(4, 5, s)),
    "vertical": ({"kind": "vertical", "num_clients": 2, "label_party": 1}, lambda s: VerticalPartitioner(2, None, 1)),
}


@pytest.mark.parametrize("kind", list(SAME))
@pytest.mark.parametrize("seed", [0, 7])
def test_every_kind_builds_its_partitioners_partition(digits, kind, seed):
    part, partitioner = SAME[kind]
    got = build_partition(parse_config({"partition": part}).partition, digits, seed)
    want = partitioner(seed).partition(digits)
    assert [(c.client_id, c.blocks, c.has_labels) for c in got.clients] == [
        (c.client_id, c.blocks, c.has_labels) for c in want.clients
    ]
    for a, b in zip(got.clients, want.clients):
        np.testing.assert_array_equal(a.sample_ids, b.sample_ids)


def test_a_config_json_with_every_kinds_settings_resumes_with_its_own(tmp_path, digits):
    """The form every run wrote before: all 15 settings with their values, used or not."""
    old = {
        "kind": "by_class",
        "num_clients": 4,
        "clients": None,
        "classes_per_client": [5, 7],
        "blocks_per_client": 3,
        "overlap": "full",
        "min_cell_coverage": 0,
        "alpha": 0.5,
        "sample_groups": 3,
        "block_groups": 3,
        "replicas": 1,
        "parties": None,
        "label_party": 0,
        "path": None,
    }
    (tmp_path / "config.json").write_text(json.dumps({"seed": 3, "partition": old, "algorithm": {"name": "hyfem"}}))
    cfg = run_dir_config(tmp_path)
    assert cfg.partition.model_dump() == {"kind": "by_class", "num_clients": 4, "classes_per_client": 5}
    got = build_partition(cfg.partition, digits, 3)
    want = ClassPartitioner(4, 5, 3).partition(digits)  # what the former config built: the range's first
    for a, b in zip(got.clients, want.clients, strict=True):
        np.testing.assert_array_equal(a.sample_ids, b.sample_ids)
