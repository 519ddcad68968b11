"""A node's after-training steps (``model.part``, ``predict.*``) against a hostile server, without
Flower processes (:func:`hybridfl.runtime.flower.node.client_step` on the node's own directory).

Adversary: the server sends any message it likes. A node keeps only a part that is its own (its
name, its blocks, the head only with labels, its schema's encoding, hashes intact) and an earlier
part survives a refused one; it answers prediction requests only in a long-lived process, with a
task and receiver of the run, at most ``MAX_REQUESTS`` per run. The honest path (parts equal to the
in-process run's, evaluation and prediction over Flower) is ``tests/test_three_organisations.py``.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hybridfl.errors import HybridFLError, ProtocolError
from hybridfl.inference.modeldir import MANIFEST, WEIGHTS
from hybridfl.inference.parts import load_org_part
from hybridfl.runtime.flower.node import HELLO, SETUP, WarmClient, client_step
from hybridfl.runtime.flower.tasks import MAX_REQUESTS, MODEL_PART
from hybridfl.runtime.messages import SERVER, Message, decode, encode
from tests.test_federated_evaluation import _prepare
from tests.test_prepare import run_cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three organisations (HyFDCA, no encryption) after ``run --federation``: their directories
    with their parts, and the run's config and layout for a hello."""
    tmp = tmp_path_factory.mktemp("tasks")
    mp = pytest.MonkeyPatch()
    cap = _Capture()
    schema, dirs, _ = _prepare(tmp, mp, cap, "{name: hyfdca, rounds: 2, encryption: none}")
    code, _, err = run_cli(
        mp, cap, "run", "--federation", str(schema), "--clients", ",".join(map(str, dirs)), "--out", str(tmp / "run")
    )
    mp.undo()
    assert code == 0, err
    cfg = json.loads((tmp / "run" / "config.json").read_text())["algorithm"]
    layout = [[d.name, json.loads((d / "client.json").read_text())["blocks"], True] for d in dirs]
    return dirs, json.dumps(cfg), layout


class _Capture:
    """What ``run_cli`` needs of pytest's ``capsys`` (a module-scoped fixture cannot take it)."""

    def readouterr(self):
        class R:
            out = err = ""

        return R()


def _hello(d, store, warm, cfg: str, layout) -> None:
    """The run's start as a proven node sees it: the hello (session and nonce), then the setup."""
    setup = {"algorithm": "hyfdca", "config": cfg, "seed": 0, "layout": json.dumps(layout), "session": "s1"}
    client_step(
        encode(Message(HELLO, SERVER, "node", 0, {"session": "s1", "nonce": os.urandom(32)})), str(d), store, warm
    )
    client_step(encode(Message(SETUP, SERVER, "node", 0, setup)), str(d), store, warm)


def _files(d) -> dict[str, bytes]:
    return {"manifest": (d / "model" / MANIFEST).read_bytes(), "weights": (d / "model" / WEIGHTS).read_bytes()}


def test_a_node_keeps_only_its_own_part(trained, tmp_path):
    dirs, cfg, layout = trained
    bank, census = (shutil.copytree(d, tmp_path / d.name) for d in dirs[:2])
    before = _files(census)
    store: dict = {}
    _hello(census, store, None, cfg, layout)

    def send(payload):
        return client_step(encode(Message(MODEL_PART, SERVER, "census", 1, payload)), str(census), store)

    with pytest.raises(ProtocolError, match="not its own"):
        send(_files(bank))  # another organisation's part
    changed = dict(before, weights=before["weights"][:-8] + b"\0" * 8)
    with pytest.raises(ProtocolError, match="refused its part of the model"):
        send(changed)  # the hash no longer matches
    with pytest.raises(ProtocolError, match="without its two files"):
        send({"manifest": before["manifest"]})
    assert _files(census) == before  # a refused part leaves the kept one untouched
    shutil.rmtree(census / "model")
    reply = decode(send(before))
    assert reply.payload["written"] is True and _files(census) == before
    assert load_org_part(census / "model").organisation == "census"


def test_a_node_answers_prediction_requests_only_as_the_protocol_allows(trained, tmp_path):
    dirs, cfg, layout = trained
    census = shutil.copytree(dirs[1], tmp_path / "census")
    store: dict = {}
    _hello(census, store, None, cfg, layout)

    def ask(payload, warm, kind="predict.hello"):
        return decode(client_step(encode(Message(kind, SERVER, "census", 0, payload)), str(census), store, warm))

    with pytest.raises(HybridFLError, match="needs a SuperNode that keeps the organisation in memory"):
        ask({"task": "evaluate", "to": "bank"}, None)
    warm = WarmClient()
    _hello(census, store, warm, cfg, layout)
    with pytest.raises(ProtocolError, match="outside a prediction request"):
        ask({}, warm, "predict.score")
    for bad in ({"task": "steal", "to": "bank"}, {"task": "evaluate", "to": "mallory"}, {"task": "evaluate"}):
        with pytest.raises(ProtocolError, match="bad task or receiver"):
            ask(bad, warm)
    # no predict-table in its node config: it takes no part in a prediction of new rows
    assert ask({"task": "predict", "to": "bank"}, warm).payload == {"absent": True}
    reply = ask({"task": "evaluate", "to": "bank"}, warm)  # its own test rows
    assert "pk" in reply.payload and "n" not in reply.payload  # not the receiver: no row count
    for _ in range(MAX_REQUESTS - 5):
        ask({"task": "evaluate", "to": "bank"}, warm)
    with pytest.raises(ProtocolError, match=f"at most {MAX_REQUESTS} prediction requests per run"):
        ask({"task": "evaluate", "to": "bank"}, warm)
