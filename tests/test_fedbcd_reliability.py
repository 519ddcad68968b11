"""FedBCD with missing parties (issue "Reliability"): a round with a missing reply is skipped
(no party's model changes, the round is counted, a warning is logged) or stops the run with one
sentence naming the party and the round (``on_missing_party: error``)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hybridfl.algorithms.fedbcd import FedBCDConfig, PartyMissingError, run_fedbcd
from hybridfl.data import VerticalPartitioner
from hybridfl.data.dataset import DatasetSplit, HybridDataset
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.transport import InProcessTransport


def synthetic(n=300, dims=(5, 4, 3), seed=0, n_test=200) -> DatasetSplit:
    rng = np.random.default_rng(seed)
    out = []
    for part, m in (("train", n), ("test", n_test)):
        xs = {f"b{i}": rng.normal(size=(m, d)).astype(np.float32) for i, d in enumerate(dims)}
        z = sum(x @ np.linspace(-1, 1, x.shape[1]) for x in xs.values())
        y = (z + 0.5 * rng.normal(size=m) > 0).astype(np.int64)
        out.append(HybridDataset("synthetic", [f"{part}-{i}" for i in range(m)], y, xs, ["0", "1"]))
    return DatasetSplit(*out)


def vertical(split, label_party=1):
    return VerticalPartitioner(parties=[[b] for b in split.train.block_names], label_party=label_party).partition(
        split.train
    )


class ForcedFailures(InProcessTransport):
    """Fails exactly the given (round, party) pairs, each in one of three ways:

    - ``lost``: the party receives and handles every message of the round, its replies are lost
      (what :class:`InProcessTransport` simulates);
    - ``crash``: the same, but it crashes after its work: the coordinator's ``fedbcd.undo`` of
      that round never reaches it;
    - ``down``: it receives nothing in that round.
    """

    def __init__(self, base: InProcessTransport, fail: dict[tuple[int, str], str]):
        super().__init__(base.clients, base.recorder)
        self.forced = fail

    def fails(self, rnd, client_id):
        if (rnd, client_id) in self.forced:
            if (rnd, client_id) not in self.failures:
                self.failures.append((rnd, client_id))
            return True
        return False

    def send_and_receive(self, messages):
        messages = list(messages)
        deliver = []
        for m in messages:
            mode = self.forced.get((m.round, m.receiver))
            if mode == "down" or (mode == "crash" and m.kind == "fedbcd.undo"):
                self._cross(m)  # sent (and counted), never handled
            else:
                deliver.append(m)
        return super().send_and_receive(deliver)


def state(parties):
    """Every party's parameters, current batch and stored H_j (copies)."""
    return {cid: {k: v for k, v in p.state_dict().items() if k != "rows"} for cid, p in parties.items()}


def same(a, b):
    return a.keys() == b.keys() and all(
        a[c].keys() == b[c].keys() and all(np.array_equal(a[c][k], b[c][k]) for k in a[c]) for c in a
    )


def run_with(cfg, fail, rounds=6, seed=0, label_party=1):
    """Run ``rounds`` rounds with forced failures; return per round: the row, the parties' state
    before and after, the coordinator's (batch, H_k) before and after, the parties owing an undo."""
    split = synthetic()
    part = vertical(split, label_party)
    fed = build_federation("fedbcd", split, part, cfg, seed)
    server, parties, base = fed.server, fed.clients, fed.transport
    transport = ForcedFailures(base, fail)
    server.setup(transport, transport.client_ids)
    out = []
    for r in range(1, rounds + 1):
        before, owing = state(parties), set(server.undo)
        batch, h = server.batch, dict(server.h)
        row = server.run_round(r, transport)
        out.append((row, before, state(parties), (batch, h), (server.batch, server.h), owing))
    return server, parties, transport, out


# label party = party-1; passive parties party-0 and party-2
CASES = {
    "label party missing": [(2, "party-1")],
    "passive party missing": [(3, "party-2")],
    "first round": [(1, "party-0")],
    "same party twice in a row": [(2, "party-2"), (3, "party-2")],
    "label then passive": [(2, "party-1"), (3, "party-0"), (5, "party-2")],
}
MODES = {"lost": ["lost"], "crash": ["crash"], "down": ["down"], "crash-then-down": ["crash", "down", "down"]}


@pytest.mark.parametrize("variant", ["p", "s"])
@pytest.mark.parametrize("modes", list(MODES))
@pytest.mark.parametrize("case", list(CASES))
def test_skipped_round_changes_no_party(variant, modes, case, caplog):
    cfg = FedBCDConfig(
        variant=variant, local_steps=3, rounds=6, batch_size=40, lr=0.3, model="mlp", representation_dim=3, hidden=6
    )
    fail = {rp: MODES[modes][min(i, len(MODES[modes]) - 1)] for i, rp in enumerate(CASES[case])}
    with caplog.at_level(logging.WARNING, logger="hybridfl.algorithms.fedbcd"):
        server, parties, _, out = run_with(cfg, fail)
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    skipped_rounds = sorted({r for r, _ in fail})
    assert [r for r, _ in server.skipped] == skipped_rounds
    for rnd, (row, before, after, coord_before, coord_after, owing) in enumerate(out, start=1):
        if rnd in skipped_rounds:
            missing = sorted(p for r, p in fail if r == rnd)
            assert row["skipped"] == 1 and row["missing"].split() == missing and "train_loss" not in row
            # every party is back where it was, except a party that crashed and still owes the undo
            # (it gets it with its next message) and one that owed an undo before the round
            # (its state before the round still had a skipped round's work in it)
            crashed = {p for p in missing if fail[(rnd, p)] != "lost"} | owing
            assert same(
                {c: v for c, v in before.items() if c not in crashed},
                {c: v for c, v in after.items() if c not in crashed},
            )
            if modes == "lost":
                assert same(before, after)
            b0, h0 = coord_before
            b1, h1 = coord_after
            assert (b0 is None and b1 is None) or np.array_equal(b0, b1)
            assert h0.keys() == h1.keys() and all(np.array_equal(h0[k], h1[k]) for k in h0)
        else:
            assert "skipped" not in row and np.isfinite(row["train_loss"])
            assert not same(before, after)  # a normal round updates the models
    assert not server.undo  # every undo confirmed by the end (the last round succeeded)
    # every party is where a run without the skipped rounds' work would be: replay the run on
    # fresh objects with the skipped rounds' messages withheld from everybody
    ref = build_federation("fedbcd", synthetic(), vertical(synthetic()), cfg, seed=0)
    ref_server, ref_parties, ref_t = ref.server, ref.clients, ref.transport
    withhold = ForcedFailures(ref_t, {(r, p): "down" for r in skipped_rounds for p in ref_t.client_ids})
    ref_server.setup(withhold, withhold.client_ids)
    for r in range(1, len(out) + 1):
        ref_server.run_round(r, withhold)
    assert same(state(parties), state(ref_parties))
    # the run is the same as one where the skipped rounds' parties never did anything: the
    # coordinator's H_k match what every passive party computes now on the current batch
    for k in server.passive:
        assert np.allclose(server.h[k], parties[k].forward(server.batch), atol=1e-6)
    assert len(warned) == len(skipped_rounds)
    assert all("no reply from party" in w for w in warned)
    if case == "label party missing":
        assert "(the label party)" in warned[0]


@pytest.mark.parametrize("variant", ["p", "s"])
@pytest.mark.parametrize(
    "who,needle",
    [
        ("party-1", "party 'party-1' (the label party) sent no reply in round 2"),
        ("party-2", "party 'party-2' sent no reply in round 2"),
    ],
)
def test_error_policy_names_the_party_and_the_round(variant, who, needle):
    cfg = FedBCDConfig(variant=variant, local_steps=2, rounds=4, batch_size=40, on_missing_party="error")
    with pytest.raises(PartyMissingError) as e:
        run_with(cfg, {(2, who): "lost"}, rounds=4)
    msg = str(e.value)
    assert needle in msg and "on_missing_party: skip" in msg
    assert msg.count(". ") == 0 and msg.endswith(".")  # one sentence


def test_failure_rate_with_skip_completes_counts_and_improves(credit_dir):
    from hybridfl.data import load_credit_default, standardize

    split = standardize(load_credit_default(credit_dir))
    small = DatasetSplit(split.train.take(np.arange(3000)), split.test.take(np.arange(1000)))
    part = VerticalPartitioner(parties=[["demographic"], ["repayment"], ["bill", "payment"]], label_party=1).partition(
        small.train
    )
    cfg = FedBCDConfig(variant="p", local_steps=3, rounds=60, batch_size=64, lr=0.3, failure_rate=0.2, eval_every=20)
    untrained = build_federation("fedbcd", small, part, cfg, seed=0)
    untrained.setup()
    auc0 = untrained.loop().evaluate(0, [])["auc"]  # the joint model before training, whole test set
    res = run_fedbcd(small, part, cfg, seed=0)
    s = res.summary
    skipped = [r for r in res.history if r.get("skipped")]
    assert s["rounds"] == 60 and len(res.history) == 60
    assert s["skipped_rounds"] == len(skipped) == len(s["skipped"]) > 0
    assert s["client_failures"] >= s["skipped_rounds"]
    assert [d["round"] for d in s["skipped"]] == [r["round"] for r in skipped]
    assert all(r["missing"] and "train_loss" not in r for r in skipped)
    assert s["auc"] > max(auc0, 0.5) + 0.1, (auc0, s["auc"])
    assert any(row[0].startswith("rounds skipped") and row[1] == s["skipped_rounds"] for row in s["report"])
    # the same seed fails the same rounds
    again = run_fedbcd(small, part, cfg, seed=0).summary
    assert again["skipped"] == s["skipped"] and again["auc"] == s["auc"]


def test_failure_rate_config():
    assert FedBCDConfig().failure_rate == 0.0 and FedBCDConfig().on_missing_party == "skip"
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError):
            FedBCDConfig(failure_rate=bad)
    with pytest.raises(ValueError):
        FedBCDConfig(on_missing_party="retry")


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_run_from_config_writes_skipped_rounds_or_stops_with_one_sentence(credit_dir, tmp_path, policy):
    """Through the run path of ``hybridfl run``: skip writes results.json with skipped_rounds and
    metrics.csv rows with skipped/missing; error raises a HybridFLError (the CLI prints its one
    sentence and exits with status 2) and writes no results."""
    import csv
    import json

    from hybridfl.config import parse_config
    from hybridfl.errors import HybridFLError
    from hybridfl.experiment import execute, prepare

    data = {
        "seed": 0,
        "dataset": {"name": "credit_default", "data_dir": str(credit_dir)},
        "partition": {
            "kind": "vertical",
            "parties": [["demographic", "bill"], ["repayment", "payment"]],
            "label_party": 1,
        },
        "algorithm": {
            "name": "fedbcd",
            "rounds": 12,
            "batch_size": 64,
            "local_steps": 2,
            "eval_every": 4,
            "eval_subset": 500,
            "failure_rate": 0.3,
            "on_missing_party": policy,
        },
    }
    prep = prepare(parse_config(data))
    if policy == "error":
        with pytest.raises(HybridFLError) as e:
            execute(prep, tmp_path)
        assert isinstance(e.value, PartyMissingError)
        assert "sent no reply in round" in str(e.value) and str(e.value).count(". ") == 0
        assert not (tmp_path / "results.json").exists()
        return
    execute(prep, tmp_path)
    s = json.loads((tmp_path / "results.json").read_text())
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    skipped = [r for r in rows if r["skipped"] == "1"]
    assert s["skipped_rounds"] == len(skipped) == len(s["skipped"]) > 0
    assert all(r["missing"].startswith("party-") and r["train_loss"] == "" for r in skipped)
    assert s["config"]["algorithm"]["on_missing_party"] == "skip" and s["config"]["algorithm"]["failure_rate"] == 0.3
