"""Bad-input corpus: malformed configs, data files and partitions. Each one makes `hybridfl run`
exit with status 2 and print one sentence naming the problem and where, with nothing written to
the output directory. Runs the CLI entry point in-process (test_cli.py covers real processes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridfl.cli import main as cli_main
from tests.conftest import DATA

TABLE = "dataset: {{name: table, path: {p}, label_column: y, id_column: id, blocks: {{x: [a], z: [b]}}, test_fraction: 0.5}}\npartition: {{kind: iid, num_clients: 2}}\nalgorithm: {{name: hyfem, rounds: 1, local_steps: 1, baselines: false}}\n"
GOOD_ROWS = "".join(f"r{i},{i},{i % 3},{i % 2}\n" for i in range(12))


def _csv(d: Path, body: str, name: str = "d.csv") -> Path:
    p = d / name
    p.write_text(body)
    return p


def _partition_file(d: Path, clients: list[dict], name: str) -> Path:
    p = d / name
    p.write_text(json.dumps({"clients": clients}))
    return p


def _mfeat_with(d: Path, partition: str) -> str:
    return f"dataset: {{name: mfeat, data_dir: {DATA / 'mfeat'}}}\npartition: {partition}\nalgorithm: {{name: hyfem, rounds: 1, local_steps: 1, baselines: false}}\n"


def case_files(d: Path) -> dict[str, tuple[str, str, list[str]]]:
    """name -> (config file name, config text, expected words in the message)."""
    digits_ids = [f"digits-{i:04d}" for i in range(5)]
    return {
        "empty config file": ("c.yaml", "", ["is empty"]),
        "config is a list": ("c.yaml", "- a\n- b\n", ["must be a mapping"]),
        "config syntax error": ("c.toml", "seed = [1,\n", ["not valid TOML"]),
        "wrong type in config": ("c.yaml", "algorithm: {name: hyfem, rounds: ten}\n", ["'algorithm.rounds'"]),
        "unknown config key": (
            "c.yaml",
            "partition: {kind: iid, clients_n: 3}\n",
            ["'partition.clients_n'", "not a known setting"],
        ),
        "unknown dataset": ("c.yaml", "dataset: {name: cifar}\n", ["'dataset.name'"]),
        "negative learning rate": ("c.yaml", "algorithm: {name: hyfem, lr: -1}\n", ["'algorithm.lr'"]),
        "empty data file": ("c.yaml", TABLE.format(p=_csv(d, "", "empty.csv")), ["empty.csv", "is empty"]),
        "header only": ("c.yaml", TABLE.format(p=_csv(d, "id,a,b,y\n", "hdr.csv")), ["hdr.csv", "no data rows"]),
        "wrong delimiter": (
            "c.yaml",
            TABLE.format(p=_csv(d, "id;a;b;y\n" + GOOD_ROWS.replace(",", ";"), "semi.csv")),
            ["label column 'y' is not in semi.csv"],
        ),
        "non-numeric feature": (
            "c.yaml",
            TABLE.format(p=_csv(d, "id,a,b,y\n" + GOOD_ROWS + "r99,7,seven,1\n", "txt.csv")),
            ["column 'b'", "non-numeric value 'seven'", "row 13"],
        ),
        "NaN in a feature": (
            "c.yaml",
            TABLE.format(p=_csv(d, "id,a,b,y\n" + GOOD_ROWS + "r99,,1,1\n", "nan.csv")),
            ["column 'a'", "missing (NaN) value at row 13"],
        ),
        "inf in a feature": (
            "c.yaml",
            TABLE.format(p=_csv(d, "id,a,b,y\n" + GOOD_ROWS + "r99,inf,1,1\n", "inf.csv")),
            ["column 'a'", "infinite value at row 13"],
        ),
        "empty label": (
            "c.yaml",
            TABLE.format(p=_csv(d, "id,a,b,y\n" + GOOD_ROWS + "r99,1,1,\n", "lab.csv")),
            ["label column 'y'", "empty at row 13"],
        ),
        "duplicate sample IDs": (
            "c.yaml",
            TABLE.format(p=_csv(d, "id,a,b,y\n" + GOOD_ROWS + "r3,1,1,1\n", "dup.csv")),
            ["sample ID 'r3' occurs more than once"],
        ),
        "missing data directory": (
            "c.yaml",
            f"dataset: {{name: mnist, data_dir: {d / 'nomnist'}}}\n",
            ["nomnist' does not exist"],
        ),
        "missing data file": ("c.yaml", f"dataset: {{name: mfeat, data_dir: {d}}}\n", ["mfeat-fou", "is missing"]),
        "truncated IDX file": (
            "c.yaml",
            f"dataset: {{name: mnist, data_dir: {_idx_dir(d)}}}\n",
            ["size does not match its IDX header"],
        ),
        "unknown block name": (
            "c.yaml",
            _mfeat_with(d, "{kind: class_block, clients: [{classes: [0, 1], blocks: [fou, colour]}]}"),
            ["unknown block 'colour'"],
        ),
        "class out of range": (
            "c.yaml",
            _mfeat_with(d, "{kind: class_block, clients: [{classes: [0, 12], blocks: [fou]}]}"),
            ["class 12", "outside [0, 9]"],
        ),
        "client with no samples": (
            "c.yaml",
            f"partition: {{kind: file, path: {_partition_file(d, [{'client_id': 'a', 'sample_ids': digits_ids, 'blocks': ['top_left']}, {'client_id': 'b', 'sample_ids': [], 'blocks': ['top_left']}], 'p1.json')}}}\n",
            ["client 'b' holds no samples"],
        ),
        "partition IDs not in the data": (
            "c.yaml",
            f"partition: {{kind: file, path: {_partition_file(d, [{'client_id': 'a', 'sample_ids': ['digits-0000', 'train-77'], 'blocks': ['top_left']}], 'p2.json')}}}\n",
            ["client 'a'", "'train-77'"],
        ),
        "partition file not JSON": (
            "c.yaml",
            f"partition: {{kind: file, path: {_csv(d, '{nope', 'bad.json')}}}\n",
            ["bad.json", "not valid JSON"],
        ),
        "missing label column": (
            "c.yaml",
            TABLE.format(p=_csv(d, "id,a,b,label\n" + GOOD_ROWS, "nolab.csv")),
            ["label column 'y' is not in nolab.csv"],
        ),
        "too many clients": (
            "c.yaml",
            "partition: {kind: grid, sample_groups: 2, block_groups: 9}\n",
            ["9 block groups", "only 4 blocks"],
        ),
        "invalid YAML": ("c.yaml", "a: [1,\n", ["is not valid YAML"]),
        "unknown algorithm": ("c.yaml", "algorithm: {name: magic}\n", ["unknown algorithm 'magic'"]),
        "unknown top-level key": ("c.yaml", "foo: 1\n", ["'foo'", "not a known setting"]),
        "seed not an integer": ("c.yaml", "seed: many\n", ["'seed'", "valid integer"]),
        "zero rounds": ("c.yaml", "algorithm: {name: hyfem, rounds: 0}\n", ["'algorithm.rounds'"]),
        "lambda zero": ("c.yaml", "algorithm: {name: hyfdca, lambda: 0}\n", ["'algorithm.lambda'", "greater than 0"]),
        "participation above one": (
            "c.yaml",
            "algorithm: {name: hyfdca, participation: 1.5}\n",
            ["'algorithm.participation'"],
        ),
        "unknown encryption scheme": (
            "c.yaml",
            "algorithm: {name: hyfdca, encryption: rsa}\n",
            ["'algorithm.encryption'", "'paillier' or 'ckks'"],
        ),
        "failure rate one": ("c.yaml", "algorithm: {name: hyfdca, failure_rate: 1.0}\n", ["'algorithm.failure_rate'"]),
        "Paillier key too small in config": (
            "c.yaml",
            "algorithm: {name: hyfdca, encryption: paillier, paillier_bits: 100}\n",
            ["'algorithm.paillier_bits'"],
        ),
        "unknown partition kind": ("c.yaml", "partition: {kind: magic}\n", ["'partition.kind'"]),
        "a setting of another partition kind": (
            "c.yaml",
            "partition: {kind: grid, sample_groups: 2, block_groups: 2, alpha: 0.3}\n",
            ["'partition.alpha'", "does not apply to partition kind 'grid'"],
        ),
        "a drawing setting with explicit clients": (
            "c.yaml",
            "partition: {kind: class_block, num_clients: 2, clients: [{classes: [0, 1], blocks: [top_left]}]}\n",
            ["'partition.num_clients'", "explicit clients", "'class_block'"],
        ),
        "zero sample groups": (
            "c.yaml",
            "partition: {kind: grid, sample_groups: 0, block_groups: 2}\n",
            ["'partition.sample_groups'"],
        ),
        "multiclass labels for the hinge loss": (
            "c.yaml",
            "algorithm: {name: hyfdca, rounds: 1}\n",
            ["needs binary labels", "positive_classes"],
        ),
        "positive class out of range": (
            "c.yaml",
            "algorithm: {name: hyfdca, positive_classes: [0, 11]}\n",
            ["positive class 11", "outside"],
        ),
        "FedBCD without one label party": (
            "c.yaml",
            "partition: {kind: grid, sample_groups: 2, block_groups: 2}\nalgorithm: {name: fedbcd}\n",
            ["FedBCD needs exactly one label party"],
        ),
        "FedBCD zero local steps": (
            "c.yaml",
            "algorithm: {name: fedbcd, local_steps: 0}\n",
            ["'algorithm.local_steps'"],
        ),
    }


def _idx_dir(d: Path) -> Path:
    p = d / "badmnist"
    p.mkdir(exist_ok=True)
    for stem, dims in (
        ("train-images-idx3-ubyte", (3, 28, 28)),
        ("train-labels-idx1-ubyte", (3,)),
        ("t10k-images-idx3-ubyte", (2, 28, 28)),
        ("t10k-labels-idx1-ubyte", (2,)),
    ):
        header = bytes([0, 0, 8, len(dims)]) + b"".join(int(n).to_bytes(4, "big") for n in dims)
        body = np.zeros(int(np.prod(dims)) - 1, dtype=np.uint8).tobytes()  # 1 byte short
        (p / stem).write_bytes(header + body)
    return p


def _names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return list(case_files(Path(d)).keys())


@pytest.mark.parametrize("name", _names())
def test_bad_input(name, tmp_path, monkeypatch, capsys):
    fname, text, needles = case_files(tmp_path)[name]
    cfg = tmp_path / fname
    cfg.write_text(text)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["hybridfl", "run", "--config", str(cfg), "--out", str(out), "--quiet"])
    with pytest.raises(SystemExit) as e:
        cli_main.main()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in err
    assert not out.exists()  # nothing half-written


def test_corpus_is_large_enough():
    """Issue 15: at least 40 cases in all, malformed messages and hostile payloads included."""
    assert len(_names()) >= 30
    assert len(_names()) + len(MESSAGE_CASES) >= 40


# -- malformed messages and hostile payloads: the receiver raises one sentence (a HybridFLError
# naming the field, no data) and keeps its state (nothing lost)


def _hyfdca_client():
    from hybridfl.algorithms.hyfdca import HyFDCAConfig
    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.loaders import load_digits
    from hybridfl.data.partitioners import GridPartitioner
    from hybridfl.runtime.simulation import build_federation

    split = load_digits(seed=0)
    split = DatasetSplit(split.train.take(np.arange(60)), split.test.take(np.arange(20)))
    part = GridPartitioner(2, 2, 1, 0).partition(split.train)
    cfg = HyFDCAConfig(lam=0.1, rounds=2, positive_classes=[0, 1, 2, 3, 4], reference=False, eval_every=0)
    fed = build_federation("hyfdca", split, part, cfg)
    fed.setup()
    fed.server.run_round(1, fed.transport)
    return fed


def _server_msg(kind, payload, rnd=2):
    from hybridfl.runtime.messages import SERVER, Message, decode, encode

    def make(fed):
        cid = fed.transport.client_ids[0]
        return cid, decode(encode(Message(kind, SERVER, cid, rnd, payload(fed, cid))))

    return make


def _peers(fed, cid):
    return [c for c in fed.transport.client_ids if c != cid]


MESSAGE_CASES = {
    "w of the wrong shape": (_server_msg("hyfdca.ip", lambda f, c: {"w": np.zeros(1)}), "'w' of shape (1,)"),
    "w with NaN": (_server_msg("hyfdca.ip", lambda f, c: {"w": np.full(f.clients[c].X.shape[1], np.nan)}), "NaN"),
    "w as integers": (
        _server_msg("hyfdca.ip", lambda f, c: {"w": np.zeros(f.clients[c].X.shape[1], dtype=np.int64)}),
        "'w' of dtype int64",
    ),
    "an unexpected key": (
        _server_msg("hyfdca.ip", lambda f, c: {"w": np.zeros(f.clients[c].X.shape[1]), "x": 1}),
        "'x' not expected",
    ),
    "no inner products": (_server_msg("hyfdca.dual", lambda f, c: {"ip": []}), "'ip' holding 0 items"),
    "alpha sent to a block-mode client": (
        _server_msg("hyfdca.primal", lambda f, c: {"alpha": [b"x"], "commit": True}),
        "'alpha' not expected",
    ),
    "secure aggregation tag reused": (
        _server_msg("hyfdca.primal", lambda f, c: {"commit": True, "tag": 1, "peers": _peers(f, c), "acked": True}),
        "reuse secure-aggregation tag 1",
    ),
    # round 1 already ended with its unmasking round (double masking): a second unmask is out of
    # the protocol's order whatever it asks (the secagg checks themselves: tests/test_secagg.py)
    "unmasking a client outside the exchange": (
        _server_msg(
            "hyfdca.unmask",
            lambda f, c: {"tag": f.server.sa_tag, "dropped": ["mallory"], "survivors": [], "shares": []},
            rnd=1,
        ),
        "does not put it after 'unmask' in the same round",
    ),
    "unmasking an old exchange": (
        _server_msg(
            "hyfdca.unmask", lambda f, c: {"tag": 0, "dropped": _peers(f, c)[:1], "survivors": [], "shares": []}, rnd=1
        ),
        "does not put it after 'unmask' in the same round",
    ),
    "acked not a bool": (
        _server_msg("hyfdca.primal", lambda f, c: {"commit": True, "tag": 9, "peers": _peers(f, c), "acked": 3}),
        "'acked' missing or not a bool",
    ),
    "unknown message kind": (_server_msg("hyfdca.steal", lambda f, c: {}), "unknown message kind 'hyfdca.steal'"),
    "truncated message bytes": ("codec", "truncated"),
    "trailing garbage after a message": ("codec", "trailing"),
    "random bytes as a message": ("codec", "the message"),
}


def _codec_bytes(name: str) -> bytes:
    from hybridfl.runtime.messages import Message, encode

    good = encode(Message("k", "a", "b", 1, {"x": np.arange(8.0)}))
    return {
        "truncated message bytes": good[:-9],
        "trailing garbage after a message": good + b"\x00garbage",
        "random bytes as a message": bytes(np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8)),
    }[name]


@pytest.mark.parametrize("name", sorted(MESSAGE_CASES))
def test_hostile_message(name):
    from hybridfl.errors import HybridFLError
    from hybridfl.runtime.messages import decode

    make, needle = MESSAGE_CASES[name]
    if make == "codec":
        with pytest.raises(HybridFLError) as e:
            decode(_codec_bytes(name))
    else:
        fed = _hyfdca_client()
        cid, msg = make(fed)
        client = fed.clients[cid]
        before = client.get_state()
        with pytest.raises(HybridFLError) as e:
            client.handle(msg)
        after = client.get_state()
        assert before.keys() == after.keys()
        for k in before:  # nothing lost or changed but the protocol state, which records the stop
            if k == "protocol":
                continue
            a, b = before[k], after[k]
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, k
        assert client.protocol.stopped  # fails closed: every later message is refused
    text = str(e.value)
    assert "\n" not in text and text.endswith(".") and needle in text, text
    assert "Traceback" not in text


def test_strict_mode_turns_unheld_blocks_into_errors(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "partition: {kind: class_block, clients: [{classes: [0,1,2,3,4,5,6,7,8,9], blocks: [top_left, top_right]}]}\nalgorithm: {name: hyfem, rounds: 1, local_steps: 1, baselines: false}\n"
    )
    monkeypatch.setattr(
        sys, "argv", ["hybridfl", "run", "--config", str(cfg), "--out", str(tmp_path / "o"), "--quiet", "--strict"]
    )
    with pytest.raises(SystemExit) as e:
        cli_main.main()
    assert e.value.code == 2
    assert "block 'bottom_left' is held by no client (strict mode" in capsys.readouterr().err
