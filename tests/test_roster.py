"""The roster (hybridfl.privacy.roster): ``federation assemble`` writes it with every
organisation's credential key and prints the fingerprints; ``hybridfl client roster`` installs it
in an organisation's own directory only if it lists that client's own key (else one sentence,
exit 2, nothing written); ``export-clients`` writes it into every client directory, and a client
built from such a directory signs its PSI blobs (the deployment path)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridfl.algorithms.fedbcd import FedBCDConfig
from hybridfl.algorithms.fedbcd.spec import build_client as fedbcd_client
from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.algorithms.hyfdca.spec import build_client as hyfdca_client
from hybridfl.data import DatasetSplit, HybridDataset
from hybridfl.data.export import export_clients, load_client_dir
from hybridfl.data.partition import ClientShard, Partition
from hybridfl.privacy.roster import ROSTER_FILE, Roster, fingerprint
from tests.test_malicious_psi import _ids
from tests.test_prepare import BANK, SHOP, prepare_tables, run_cli, schema_file  # noqa: F401 (fixture)


def test_assemble_writes_the_roster_and_each_organisation_installs_it(tmp_path, schema_file, monkeypatch, capsys):  # noqa: F811
    dirs = prepare_tables(tmp_path, schema_file, monkeypatch, capsys, {"bank": BANK, "shop": SHOP})
    server = tmp_path / "server"
    args = ["federation", "assemble", "--schema", str(schema_file), "--out", str(server)]
    code, out, err = run_cli(
        monkeypatch, capsys, *args, *(a for d in dirs for a in ("--client", str(d / "client.json")))
    )
    assert code == 0, err
    roster = Roster.load(server / ROSTER_FILE)
    keys = {d.name: json.loads((d / "client.json").read_text())["auth_public_key"] for d in dirs}
    assert dict(roster.keys) == keys and roster.labels == ("bank",)
    assert all(fingerprint(k) in out for k in keys.values())
    code, out, err = run_cli(
        monkeypatch, capsys, "client", "roster", "--client", str(dirs[1]), "--roster", str(server / ROSTER_FILE)
    )
    assert code == 0, err
    assert (dirs[1] / ROSTER_FILE).read_text() == roster.to_json() and fingerprint(keys["bank"]) in out
    # a roster where the server put a key of its own for the shop: the shop refuses to install it
    forged = tmp_path / "forged.json"
    forged.write_text(Roster.from_keys({**keys, "shop": "ab" * 32}, "t", ["bank"]).to_json())
    code, out, err = run_cli(monkeypatch, capsys, "client", "roster", "--client", str(dirs[1]), "--roster", str(forged))
    assert code == 2 and "does not list client 'shop'" in err and len(err.strip().splitlines()) == 1, err
    assert (dirs[1] / ROSTER_FILE).read_text() == roster.to_json()  # unchanged
    code, out, err = run_cli(
        monkeypatch, capsys, "client", "roster", "--client", str(dirs[0]), "--roster", str(dirs[0] / "client.json")
    )
    assert code == 2 and "not a hybridfl roster" in err and not (dirs[0] / ROSTER_FILE).exists(), err


def test_export_writes_the_roster_and_clients_built_from_it_sign(tmp_path):

    ids = _ids("customer", range(30))
    blocks = {"b0": np.ones((30, 2), np.float32), "b1": np.ones((30, 2), np.float32)}
    y = np.tile([0, 1], 15)
    test = HybridDataset("t", _ids("test", range(2)), y[:2], {k: v[:2] for k, v in blocks.items()}, ["n", "p"])
    split = DatasetSplit(HybridDataset("t", ids, y, blocks, ["n", "p"]), test)
    part = Partition([ClientShard("a", ids, ("b0",)), ClientShard("b", ids[5:], ("b1",), has_labels=False)])
    dirs = export_clients(split, part, tmp_path / "x")
    rosters = [Roster.load(d / ROSTER_FILE) for d in dirs]
    assert rosters[0] == rosters[1] and set(rosters[0].keys) == {"a", "b"} and rosters[0].labels == ("a",)
    cds = [load_client_dir(d) for d in dirs]
    cfg = HyFDCAConfig(positive_classes=[1], encryption="none")
    assert hyfdca_client(cds[0], cfg, 0).peer_auth.roster == rosters[0]
    layout = [("a", ["b0"], True), ("b", ["b1"], False)]
    assert fedbcd_client(cds[1], FedBCDConfig(model="linear"), 0, layout).peer_auth.roster.labels == ("a",)
    (dirs[0] / ROSTER_FILE).unlink()  # no roster: nothing signed (as before rosters existed)
    assert hyfdca_client(load_client_dir(dirs[0]), cfg, 0).peer_auth is None


def test_a_client_with_a_roster_refuses_a_threshold_below_its_majority(tmp_path):
    """The secure-aggregation threshold is the client's own (against a malicious server that would
    lower it to 2 and then name one peer): with a roster of ``m`` clients a config threshold below
    ``majority(m)`` is refused in one sentence when the client is built (before any message); 0 (a
    majority) and larger ones are taken; without a roster (a client made in memory) it is as given."""
    from hybridfl.algorithms.hyfdca.spec import build_client as hyfdca_client
    from hybridfl.errors import EncryptionPolicyError
    from hybridfl.privacy.roster import in_memory_auths
    from hybridfl.privacy.secagg import own_threshold

    auths = in_memory_auths([f"c{i}" for i in range(5)])  # majority of 5: 3
    assert [own_threshold(t, "c0", auths["c0"]) for t in (0, 3, 5)] == [0, 3, 5]
    assert own_threshold(2, "c0", None) == 2
    with pytest.raises(
        EncryptionPolicyError,
        match=r"refuses a secure-aggregation threshold of 2: .* majority of its roster's 5 clients \(3\)",
    ):
        own_threshold(2, "c0", auths["c0"])
    rng = np.random.default_rng(0)
    ids = _ids("tr", range(12))
    y = rng.integers(0, 2, 12)
    blocks = {f"b{j}": rng.normal(size=(12, 2)) for j in range(5)}
    test = HybridDataset("t", _ids("test", range(2)), y[:2], {k: v[:2] for k, v in blocks.items()}, ["n", "p"])
    split = DatasetSplit(HybridDataset("t", ids, y, blocks, ["n", "p"]), test)
    part = Partition([ClientShard(f"c{j}", ids, (f"b{j}",)) for j in range(5)])
    dirs = export_clients(split, part, tmp_path / "x")
    cd = load_client_dir(dirs[0])
    with pytest.raises(EncryptionPolicyError, match="refuses a secure-aggregation threshold of 2"):
        hyfdca_client(cd, HyFDCAConfig(positive_classes=[1], encryption="none", secagg_threshold=2), 0)
    assert hyfdca_client(cd, HyFDCAConfig(positive_classes=[1], encryption="none"), 0).secagg_threshold == 0
