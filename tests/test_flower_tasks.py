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


def _node(trained, tmp_path, warm=True):
    """A fresh run on census's node (a copy of its directory): ``ask(payload, kind)`` sends it a
    task message and returns the decoded reply; ``warm`` keeps the organisation in memory."""
    dirs, cfg, layout = trained
    census = shutil.copytree(dirs[1], tmp_path / "census")
    store: dict = {}
    node = WarmClient() if warm else None
    _hello(census, store, node, cfg, layout)

    def ask(payload, kind="predict.hello"):
        return decode(client_step(encode(Message(kind, SERVER, "census", 0, payload)), str(census), store, node))

    return ask, census, store, node


STOPPED = "has stopped the after-training tasks of this run after refusing"
EVALUATE = {"task": "evaluate", "to": "bank"}


def test_a_node_answers_prediction_requests_as_the_protocol_allows(trained, tmp_path):
    """Honest requests: without a predict-table in its node config it takes no part in a
    prediction of new rows; it answers an evaluation on its own test rows (not the receiver: no
    row count), at most ``MAX_REQUESTS`` per run."""
    ask, *_ = _node(trained, tmp_path)
    assert ask({"task": "predict", "to": "bank"}).payload == {"absent": True}
    reply = ask(EVALUATE)
    assert "pk" in reply.payload and "n" not in reply.payload
    for _ in range(MAX_REQUESTS - 2):
        ask(EVALUATE)
    with pytest.raises(ProtocolError, match=f"at most {MAX_REQUESTS} prediction requests per run"):
        ask(EVALUATE)


def test_a_process_per_message_answers_no_prediction_request(trained, tmp_path):
    ask, *_ = _node(trained, tmp_path, warm=False)
    with pytest.raises(HybridFLError, match="needs a SuperNode that keeps the organisation in memory"):
        ask(EVALUATE)


def test_a_message_outside_a_request_is_refused(trained, tmp_path):
    ask, *_ = _node(trained, tmp_path)
    with pytest.raises(ProtocolError, match="outside a prediction request"):
        ask({}, "predict.score")


@pytest.mark.parametrize(
    "bad", [{"task": "steal", "to": "bank"}, {"task": "evaluate", "to": "mallory"}, {"task": "evaluate"}]
)
def test_a_bad_task_or_receiver_is_refused(trained, tmp_path, bad):
    ask, *_ = _node(trained, tmp_path)
    with pytest.raises(ProtocolError, match="bad task or receiver"):
        ask(bad)


@pytest.mark.parametrize("first", ["predict.score", "model.part"])
def test_after_a_refusal_the_node_refuses_every_task_of_the_run(trained, tmp_path, first):
    """Fail closed per run: after a refused ``predict.score`` outside a request (or a
    ``model.part`` without its two files), a valid evaluation request, a second one and a valid
    ``model.part`` are refused with one and the same sentence naming the first refusal; the part
    on disk is untouched. A new run (a new session's setup) answers again."""
    ask, census, store, node = _node(trained, tmp_path)
    before = _files(census)
    with pytest.raises(ProtocolError):
        ask({}, "predict.score") if first == "predict.score" else ask({"manifest": b"x"}, MODEL_PART)
    said = set()
    for payload, kind in ((EVALUATE, "predict.hello"), (EVALUATE, "predict.hello"), (before, MODEL_PART)):
        with pytest.raises(ProtocolError, match=STOPPED) as e:
            ask(payload, kind)
        said.add(str(e.value))
    assert len(said) == 1 and f"refusing {first!r}" in said.pop()
    assert _files(census) == before
    dirs, cfg, layout = trained
    setup = {"algorithm": "hyfdca", "config": cfg, "seed": 0, "layout": json.dumps(layout), "session": "s2"}
    client_step(encode(Message(SETUP, SERVER, "node", 0, setup)), str(census), store, node)
    assert "pk" in ask(EVALUATE).payload
