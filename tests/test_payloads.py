"""Received payloads are untrusted (issue 15, item 5): every reply is checked by the server and every
server message by the client before use. A bad reply is rejected naming the client and the field
and then treated as missing (the algorithm's missing-reply policy, exactly as a ``fail_at``
failure); a bad setup reply stops the setup; a client refuses a bad message with a
:class:`~hybridfl.runtime.validate.PayloadError`.

The corrupting clients below wrap the real client objects: they answer as the real client does and
then change one reply of a given round and kind."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest

from hybridfl.algorithms.fedbcd import FedBCDConfig, PartyMissingError
from hybridfl.config import default_config, parse_config
from hybridfl.data import VerticalPartitioner
from hybridfl.errors import ProtocolError
from hybridfl.experiment import prepare
from hybridfl.runtime.messages import SERVER, Message
from hybridfl.runtime.simulation import build_federation
from hybridfl.runtime.validate import PayloadError
from tests.test_fedbcd_reliability import synthetic


class Corrupt:
    """A client that answers like ``inner`` but passes its reply to ``message`` of round ``rnd`` and
    kind ``kind`` through ``change`` (which edits the payload in place)."""

    def __init__(self, inner, rnd: int, kind: str, change: Callable[[dict], None]):
        self.inner, self.rnd, self.kind, self.change = inner, rnd, kind, change

    def handle(self, msg: Message) -> Message:
        reply = self.inner.handle(msg)
        if msg.round == self.rnd and msg.kind == self.kind:
            self.change(reply.payload)
        return reply

    def get_state(self):
        return self.inner.get_state()

    def set_state(self, state) -> None:
        self.inner.set_state(state)


def corrupt(fed, cid: str, rnd: int, kind: str, change: Callable[[dict], None]) -> None:
    """Put a :class:`Corrupt` wrapper around client ``cid`` of ``fed`` (clients and transport)."""
    wrapped = Corrupt(fed.clients[cid], rnd, kind, change)
    fed.clients[cid] = wrapped
    fed.transport.clients[cid] = wrapped


def run_rounds(fed, rounds: int) -> list[dict]:
    fed.setup()
    return [fed.server.run_round(r, fed.transport) for r in range(1, rounds + 1)]


def same_server(a, b) -> None:
    (arr_a, meta_a), (arr_b, meta_b) = a.server.get_state(), b.server.get_state()
    assert arr_a.keys() == arr_b.keys()
    for k in arr_a:
        np.testing.assert_array_equal(arr_a[k], arr_b[k], err_msg=k)
    assert meta_a == meta_b


def without_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]


# ------------------------------------------------------------------ HyFEM


def _hyfem(fail_at=()):
    data = default_config().model_dump(mode="json")
    data["algorithm"].update(rounds=3, local_steps=3, baselines=False)
    prep = prepare(parse_config(data))
    return build_federation("hyfem", prep.split, prep.partition, prep.algorithm, prep.config.seed, fail_at=fail_at)


def _hyfem_bad_reply_is_a_failure(change, field, caplog):
    ref = _hyfem()
    cid = list(ref.clients)[1]
    ref = _hyfem(fail_at=[(2, cid)])
    expected = run_rounds(ref, 3)
    fed = _hyfem()
    corrupt(fed, cid, 2, "hyfem.fit", change)
    with caplog.at_level(logging.WARNING):
        got = run_rounds(fed, 3)
    assert got == expected  # round 2: clients_answered one less, exactly as with the failure
    assert got[1]["clients_answered"] == len(fed.clients) - 1
    same_server(fed, ref)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{cid!r} sent 'hyfem.fit' with {field!r}" in w for w in warned), warned


def test_hyfem_negative_sample_count_is_dropped_like_a_failure(caplog):
    """n_samples = -10**9 in round 2 (before: used as an averaging weight)."""
    _hyfem_bad_reply_is_a_failure(lambda p: p.update(n_samples=-(10**9)), "n_samples", caplog)


def test_hyfem_wrong_classifier_shape_is_dropped_like_a_failure(caplog):
    """A classifier array of another shape (before: a broadcast error or a KeyError in matching)."""

    def change(p):
        p["clf.fc2.weight"] = np.zeros((p["clf.fc2.weight"].shape[0], p["clf.fc2.weight"].shape[1] + 1), np.float32)

    _hyfem_bad_reply_is_a_failure(change, "clf.fc2.weight", caplog)


def test_hyfem_class_counts_not_summing_to_n_samples_stop_the_setup():
    fed = _hyfem()
    cid = list(fed.clients)[0]

    def change(p):
        p["class_counts"] = p["class_counts"].copy()
        p["class_counts"][0] += 1

    corrupt(fed, cid, 0, "hyfem.properties", change)
    with pytest.raises(ProtocolError) as e:
        fed.setup()
    msg = str(e.value)
    assert msg.startswith(f"{cid!r} sent 'hyfem.properties' with 'class_counts' summing to") and "n_samples" in msg
    assert msg.endswith(".") and msg.count(". ") == 0


def _fit_message(edit: Callable[[dict], None]):
    fed = _hyfem()
    fed.setup()
    cid = list(fed.clients)[0]
    msg = fed.server.fit_message(cid, 1)
    edit(msg.payload)
    return fed.clients[cid], msg


def _first_ext(p: dict) -> str:
    return next(k for k in p if k.startswith("ext."))


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda p: p.pop(_first_ext(p)), "ext."),
        (lambda p: p.update({_first_ext(p): p[_first_ext(p)][:-1]}), "ext."),
        (lambda p: p.update({"clf.fc1.bias": np.zeros(p["clf.fc1.bias"].size + 1, np.float32)}), "clf.fc1.bias"),
        (lambda p: p["clf.fc2.bias"].__setitem__(0, np.nan), "clf.fc2.bias"),
        (lambda p: p.update(lr=-0.1), "lr"),
        (lambda p: p.update(lr=float("nan")), "lr"),
        (lambda p: p.pop("lr"), "lr"),
        (lambda p: p.update(local_steps=0), "local_steps"),
    ],
    ids=[
        "missing extractor",
        "extractor shape",
        "classifier shape",
        "NaN classifier",
        "lr",
        "NaN lr",
        "missing lr",
        "local_steps",
    ],
)
def test_hyfem_client_refuses_a_bad_fit_message(edit, field):
    client, msg = _fit_message(edit)
    with pytest.raises(PayloadError) as e:
        client.handle(msg)
    assert e.value.field.startswith(field) and e.value.sender == SERVER and e.value.kind == "hyfem.fit"


def test_hyfem_client_accepts_the_server_message():
    client, msg = _fit_message(lambda p: None)
    assert client.handle(msg).payload["n_samples"] >= 1


# ------------------------------------------------------------------ FedBCD


def _fedbcd(cfg, fail_at=()):
    split = synthetic()
    part = VerticalPartitioner(parties=[[b] for b in split.train.block_names], label_party=1).partition(split.train)
    return build_federation("fedbcd", split, part, cfg, 0, fail_at=fail_at)


def _parties(fed) -> dict:
    return {cid: getattr(p, "inner", p).state_dict() for cid, p in fed.clients.items()}


def _wrong_h_next(p):
    p["h_next"] = np.zeros((p["h_next"].shape[0], p["h_next"].shape[1] + 1), np.float32)


@pytest.mark.parametrize("variant", ["p", "s"])
def test_fedbcd_wrong_h_next_shape_skips_the_round_like_a_missing_reply(variant, caplog):
    cfg = FedBCDConfig(variant=variant, local_steps=2, rounds=4, batch_size=40)
    ref = _fedbcd(cfg, fail_at=[(2, "party-2")])
    expected = run_rounds(ref, 4)
    fed = _fedbcd(cfg)
    corrupt(fed, "party-2", 2, "fedbcd.party_step", _wrong_h_next)
    with caplog.at_level(logging.WARNING):
        got = run_rounds(fed, 4)
    assert got == expected and got[1]["skipped"] == 1 and got[1]["missing"] == "party-2"
    assert fed.server.skipped == ref.server.skipped == [(2, ["party-2"])]
    a, b = _parties(fed), _parties(ref)
    assert a.keys() == b.keys()
    for cid in a:
        assert a[cid].keys() == b[cid].keys()
        for k in a[cid]:
            np.testing.assert_array_equal(a[cid][k], b[cid][k], err_msg=f"{cid} {k}")
    np.testing.assert_array_equal(fed.server.batch, ref.server.batch)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'party-2' sent 'fedbcd.party_step' with 'h_next' of shape" in w for w in warned), warned


def test_fedbcd_wrong_h_next_shape_stops_the_run_with_the_error_policy():
    fed = _fedbcd(FedBCDConfig(variant="p", local_steps=2, rounds=4, batch_size=40, on_missing_party="error"))
    corrupt(fed, "party-2", 2, "fedbcd.party_step", _wrong_h_next)
    with pytest.raises(PartyMissingError, match=r"party 'party-2' sent no valid reply in round 2"):
        run_rounds(fed, 4)


@pytest.mark.parametrize(
    "batch",
    [[0, 300], [-1, 3], [4, 4], [0.0, 1.0]],
    ids=["past the end", "negative", "repeated", "float"],
)
def test_fedbcd_party_refuses_bad_batch_positions(batch):
    fed = _fedbcd(FedBCDConfig(variant="p", rounds=1))
    fed.setup()
    party = fed.clients["party-0"]
    before = party.get_state()
    with pytest.raises(PayloadError) as e:
        party.handle(Message("fedbcd.forward", SERVER, "party-0", 1, {"batch": np.array(batch)}))
    assert e.value.field == "batch"
    party.set_state(before)  # the refusal stopped it for the run (fail closed): from the state before
    ok = party.handle(Message("fedbcd.forward", SERVER, "party-0", 1, {"batch": np.array([0, 299])}))
    assert ok.payload["h"].shape[0] == 2


def test_fedbcd_party_refuses_a_gradient_of_the_wrong_shape():
    fed = _fedbcd(FedBCDConfig(variant="p", rounds=1))
    fed.setup()
    party = fed.clients["party-0"]
    party.handle(Message("fedbcd.forward", SERVER, "party-0", 1, {"batch": np.array([0, 1, 2])}))
    step = {"local_steps": 1, "lr": 0.1, "mu": 0.0, "l2": 0.0, "next_batch": np.array([3, 4, 5])}
    with pytest.raises(PayloadError) as e:
        party.handle(Message("fedbcd.party_step", SERVER, "party-0", 1, {"grad": np.zeros((2, party.out_dim)), **step}))
    assert e.value.field == "grad"


# ------------------------------------------------------------------ hybrid FedAvg


def _fedavg(fail_at=()):
    prep = prepare(
        parse_config(
            {
                "seed": 0,
                "dataset": {"name": "digits"},
                "partition": {"kind": "grid", "sample_groups": 2, "block_groups": 2},
                "algorithm": {
                    "name": "hybrid_fedavg",
                    "rounds": 3,
                    "loss": "logistic",
                    "positive_classes": [0, 1, 2, 3, 4],
                },
            }
        )
    )
    return build_federation(
        "hybrid_fedavg", prep.split, prep.partition, prep.algorithm, prep.config.seed, fail_at=fail_at
    )


def test_hybrid_fedavg_wrong_w_shape_is_dropped_like_a_failure(caplog):
    """``w`` of shape (1,) (before: broadcast silently over the client's features)."""
    cid = list(_fedavg().clients)[1]
    ref = _fedavg(fail_at=[(2, cid)])
    expected = run_rounds(ref, 3)
    fed = _fedavg()
    corrupt(fed, cid, 2, "fedavg.fit", lambda p: p.update(w=np.ones(1)))
    with caplog.at_level(logging.WARNING):
        got = run_rounds(fed, 3)
    assert without_seconds(got) == without_seconds(expected) and got[1]["failed"] == 1
    np.testing.assert_array_equal(fed.server.w, ref.server.w)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{cid!r} sent 'fedavg.fit' with 'w' of shape (1,)" in w for w in warned), warned


def test_hybrid_fedavg_client_refuses_a_bad_fit_message():
    fed = _fedavg()
    fed.setup()
    cid = list(fed.clients)[0]
    d = int(fed.server.feat[cid].size)
    good = {"w": np.zeros(d), "lr": 0.1, "lam": 0.01, "loss": "logistic", "local_steps": 2, "batch_size": 8}
    before = fed.clients[cid].get_state()
    assert fed.clients[cid].handle(Message("fedavg.fit", SERVER, cid, 1, good)).payload["w"].shape == (d,)
    for field, value in [("w", np.zeros(1)), ("batch_size", 0), ("local_steps", 1.5), ("lr", float("inf"))]:
        fed.clients[cid].set_state(before)  # a refusal stops the client for the run: each from here
        with pytest.raises(PayloadError) as e:
            fed.clients[cid].handle(Message("fedavg.fit", SERVER, cid, 1, {**good, field: value}))
        assert e.value.field == field
    with pytest.raises(ProtocolError, match="has stopped taking part in this run after refusing 'fedavg.fit'"):
        fed.clients[cid].handle(Message("fedavg.fit", SERVER, cid, 2, good))  # fail closed
