"""Handler tables: every algorithm's client answers exactly the message kinds its ``kinds`` module
defines (each through its own entry, no fall-through) and refuses any other kind by name."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from hybridfl.errors import ProtocolError
from hybridfl.runtime.handlers import dispatch
from hybridfl.runtime.messages import SERVER, Message


def _kinds(algorithm: str) -> set[str]:
    """The string constants of ``hybridfl.algorithms.<algorithm>.kinds`` (upper-case names)."""
    mod = importlib.import_module(f"hybridfl.algorithms.{algorithm}.kinds")
    return {v for k, v in vars(mod).items() if k.isupper() and isinstance(v, str)}


def _client(algorithm: str):
    """A client of a small federation of ``algorithm`` (built, not set up)."""
    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.loaders import load_digits
    from hybridfl.data.partitioners import GridPartitioner, VerticalPartitioner
    from hybridfl.runtime.simulation import build_federation

    split = load_digits(seed=0)
    split = DatasetSplit(split.train.take(np.arange(60)), split.test.take(np.arange(20)))
    if algorithm == "fedbcd":  # binary: the digits' parity
        from hybridfl.algorithms.fedbcd import FedBCDConfig
        from hybridfl.data.dataset import HybridDataset

        split = DatasetSplit(
            *(HybridDataset("parity", d.ids, d.y % 2, d.blocks, ["even", "odd"]) for d in (split.train, split.test))
        )
        blocks = split.train.block_names
        part = VerticalPartitioner(parties=[[blocks[0]], [blocks[1]]], label_party=0).partition(split.train)
        cfg = FedBCDConfig(rounds=1, batch_size=16)
    else:
        part = GridPartitioner(2, 2, 1, 0).partition(split.train)
        if algorithm == "hyfem":
            from hybridfl.algorithms.hyfem import HyFEMConfig

            cfg = HyFEMConfig(rounds=1, baselines=False)
        elif algorithm == "hybrid_fedavg":
            from hybridfl.algorithms.hybrid_fedavg import HybridFedAvgConfig

            cfg = HybridFedAvgConfig(rounds=1, positive_classes=[0, 1, 2, 3, 4])
        else:
            from hybridfl.algorithms.hyfdca import HyFDCAConfig

            cfg = HyFDCAConfig(lam=0.1, rounds=1, positive_classes=[0, 1, 2, 3, 4], reference=False, eval_every=0)
    fed = build_federation(algorithm, split, part, cfg)
    return next(iter(fed.clients.values()))


def _table(client) -> dict:
    return client._steps() if hasattr(client, "_steps") else client.handlers()


@pytest.mark.parametrize("algorithm", ["fedbcd", "hyfem", "hybrid_fedavg", "hyfdca"])
def test_each_kind_has_its_own_handler_and_no_other_kind_is_answered(algorithm):
    client = _client(algorithm)
    table = _table(client)
    assert set(table) == _kinds(algorithm)
    steps = [getattr(s, "__func__", s) for s in table.values()]
    assert len(set(steps)) == len(steps), "two kinds share one step: a fall-through in disguise"
    kind = f"{algorithm.replace('hybrid_', '')}.steal"
    with pytest.raises(ProtocolError) as e:
        client.handle(Message(kind, SERVER, "x", 1, {}))
    text = str(e.value)
    assert f"unknown message kind {kind!r}" in text or f"a message of unknown kind {kind!r}" in text, text
    assert "\n" not in text and text.endswith(".")


def test_dispatch_calls_the_kinds_step_and_refuses_another_kind_in_one_sentence():
    seen = []
    table = {"a.one": lambda m: seen.append(m.kind) or m.reply(ok=1)}
    reply = dispatch(table, Message("a.one", SERVER, "c", 0, {}), "client 'c'")
    assert seen == ["a.one"] and reply.payload == {"ok": 1} and reply.receiver == SERVER
    with pytest.raises(ProtocolError, match=r"^client 'c' got a message of unknown kind 'a\.two'\.$"):
        dispatch(table, Message("a.two", SERVER, "c", 0, {}), "client 'c'")
    assert seen == ["a.one"]
