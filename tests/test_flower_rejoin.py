"""A SuperNode killed and restarted rejoins and the run completes (the reliability issue).

What Flower 1.41 does (its source; measured with ``test_loopback_supernode_killed_and_restarted``):
a SuperNode process registers a fresh key pair and so gets a *new* node ID when it is started
again; the SuperLink keeps listing the killed node online until its heartbeat expires (2 x 30 s)
and then answers every message to it with a ``NODE_UNAVAILABLE`` error; ``context.state`` lived in
the killed SuperNode's memory. Our runtime re-identifies nodes by the client they hold, re-sends
the unanswered message to the new node, and the ClientApp continues from its state file.

- Without processes (fast): :class:`FakeGrid` plays the SuperLink and runs the real ClientApp
  handler for each node, kills a node when a given message reaches it (before or after it handled
  it) and restarts it under a new ID; HyFDCA's ``w`` equals the uninterrupted simulation.
- With processes: a real SuperLink + 2 SuperNodes, HyFEM, one SuperNode SIGKILLed during round 2
  and started again; the metrics equal the in-process simulation (about 70-95 s here).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem
from hybridfl.errors import HybridFLError
from hybridfl.runtime.flower.bridge import MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE, unpack_seq
from hybridfl.runtime.flower.clientapp import STATE_DIR, query
from hybridfl.runtime.flower.node import HELLO, SETUP, StaleMessage, run_server, serve
from hybridfl.runtime.messages import SERVER, decode, encode
from hybridfl.runtime.messages import Message as HMessage
from hybridfl.runtime.simulation import single_threaded
from tests.test_flower import (
    FEDBCD,
    HYFDCA,
    HYFEM,
    _fedbcd_reference,
    _fedbcd_setup,
    _hyfdca_reference,
    _no_leftovers,
    _setup,
    _strip,
)

CLIENT_APP_RAISED_EXCEPTION = 2  # flwr.common.constant.ErrorCode

# the kill points below count messages of the plaintext alignment (PSI adds three setup exchanges)
HYFDCA3 = {**HYFDCA, "rounds": 3, "alignment": "plaintext"}


class FakeGrid:
    """The ServerApp's view of a SuperLink (``get_node_ids``, ``push_messages``,
    ``pull_messages``) whose SuperNodes run the real ClientApp handler in this process.

    ``kill_at = (client index, sequence number, "before" | "after")``: the node holding that client
    dies when that message reaches it, before handling it or after (state file written, reply
    lost). A dead node loses its ``context.state``; it stays listed online for ``stale`` more node
    listings, after which messages to it are answered with Flower's NODE_UNAVAILABLE error (its
    heartbeat expired); ``restart_after`` listings after the kill it is started again with the same
    node config under a new node ID (None: never).

    ``lose = {(client index, round)}``: that node handles every message of that round (its state
    is saved) but none of its replies leaves it: the simulation's failure (``fail_at``) played
    through the real ClientApp and the FlowerTransport's deadline (evaluation messages, which the
    simulation sends outside its failure model, still get their replies).

    ``slow = {(client index, sequence number)}``: the first pull of that message finds no reply (the
    server waits and looks at the node list). A ClientApp that raises is answered with an error
    reply, as Flower does.

    ``unfinished = {(client index, sequence number)}``: that node handles the message (its state is
    saved) but its reply's upload never finishes: the pull gets Flower's MESSAGE_UNAVAILABLE error
    (the SuperLink's object-push session expired)."""

    def __init__(self, dirs, kill_at=None, stale=3, restart_after=2, run_id=7, lose=(), slow=(), unfinished=()):
        self.dirs = list(dirs)
        self.unfinished = set(unfinished)
        self.lose = set(lose)
        self.slow = set(slow)
        self.kill_at = kill_at
        self.stale = stale
        self.restart_after = restart_after
        self.run_id = run_id
        self.alive: dict[int, tuple[int, Context]] = {}
        self.dead: dict[int, int] = {}  # node -> listings left before the SuperLink reports it offline
        self.msgs: dict[str, Message] = {}
        self.answered: set[str] = set()
        self.pending_restart: list[list[int]] = []  # [client index, listings left]
        self.next = 1000
        self.killed: list[int] = []
        self.started: list[int] = []
        self.on_restart = None
        for i in range(len(self.dirs)):
            self.start(i)

    def start(self, i: int) -> int:
        nid = self.next
        self.next += 1
        ctx = Context(
            run_id=self.run_id,
            node_id=nid,
            node_config={"data-dir": str(self.dirs[i])},
            state=RecordDict(),
            run_config={},
        )
        self.alive[nid] = (i, ctx)
        self.started.append(nid)
        return nid

    def kill(self, nid: int) -> None:
        i, _ = self.alive.pop(nid)
        self.dead[nid] = self.stale
        self.killed.append(nid)
        if self.restart_after is not None:
            self.pending_restart.append([i, self.restart_after])

    def get_node_ids(self):
        for p in list(self.pending_restart):
            p[1] -= 1
            if p[1] <= 0:
                self.pending_restart.remove(p)
                if self.on_restart:
                    self.on_restart(p[0])
                self.start(p[0])
        listed = [n for n, left in self.dead.items() if left > 0]
        for n in listed:
            self.dead[n] -= 1
        return [*self.alive, *listed]

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            if m.metadata.dst_node_id not in self.alive and m.metadata.dst_node_id not in self.dead:
                ids.append("")
                continue
            mid = f"m{self.next}"
            self.next += 1
            m.metadata.__dict__["_message_id"] = mid
            self.msgs[mid] = m
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        out = []
        for mid in ids:
            if mid in self.answered:
                continue
            m = self.msgs[mid]
            dst = m.metadata.dst_node_id
            if dst in self.alive:
                i, ctx = self.alive[dst]
                _, seq = unpack_seq(m.content)
                if (i, seq) in self.slow:  # its first pull finds no reply yet (the server waits, looks for nodes)
                    self.slow.discard((i, seq))
                    continue
                if self.kill_at is not None and self.kill_at[:2] == (i, seq):
                    if self.kill_at[2] == "after":
                        query(m, ctx)  # handled and saved; the reply never leaves the node
                    self.kill_at = None
                    self.kill(dst)
                    continue
                if (i, seq) in self.unfinished:  # handled and saved; its reply's objects never reach the SuperLink
                    self.unfinished.discard((i, seq))
                    query(m, ctx)
                    out.append(
                        Message(Error(MESSAGE_UNAVAILABLE, "Reply message objects are unavailable."), reply_to=m)
                    )
                    self.answered.add(mid)
                    continue
                lost = (i, int(m.metadata.group_id)) in self.lose
                if lost and not decode(unpack_seq(m.content)[0]).kind.endswith(".evaluate"):
                    query(m, ctx)  # handled and saved; the reply never leaves the node
                    self.answered.add(mid)
                    continue
                try:
                    out.append(query(m, ctx))
                except Exception as e:  # what Flower does with a ClientApp that raises: an error reply
                    out.append(Message(Error(CLIENT_APP_RAISED_EXCEPTION, f"{type(e).__name__}: {e}"), reply_to=m))
                self.answered.add(mid)
            elif dst in self.dead and self.dead[dst] <= 0:
                out.append(Message(Error(NODE_UNAVAILABLE, "Error: Node Unavailable"), reply_to=m))
                self.answered.add(mid)
        return out


@pytest.fixture
def run_id(monkeypatch):
    monkeypatch.setattr(TaskIdentity, "_run_id", 7)  # what Flower sets in a ServerApp process
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    return 7


@pytest.fixture(scope="module")
def hyfdca_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hyfdca")
    prep, dirs, server_dir = _setup(tmp, HYFDCA3)
    w_ref, log_ref = _hyfdca_reference(prep, HYFDCA3)
    return dirs, server_dir, w_ref, log_ref


def _clean_state(dirs):
    import shutil

    for d in dirs:
        shutil.rmtree(d / STATE_DIR, ignore_errors=True)


# HyFDCA: message 1-3 are the setup exchanges, then 3 per round (ip, dual, primal)
@pytest.mark.parametrize(
    "kill_at,stale,restart_after",
    [
        ((1, 5, "before"), 5, 2),  # dies on receiving round 1's dual message; back before the SuperLink notices
        ((2, 7, "after"), 1, 6),  # dies after handling round 2's ip message, before its reply left; Flower reports
        # the node unavailable first, then it comes back; the re-sent message gets the saved reply
        ((0, 1, "before"), 2, 2),  # dies on the algorithm's first message (right after the hello)
    ],
)
def test_killed_node_rejoins_and_w_equals_simulation(tmp_path, run_id, hyfdca_setup, kill_at, stale, restart_after):
    dirs, server_dir, w_ref, log_ref = hyfdca_setup
    _clean_state(dirs)
    grid = FakeGrid(dirs, kill_at, stale, restart_after)
    summary = run_server(grid, server_dir, tmp_path / "res", poll_interval=0, reply_timeout=30, node_check=0)
    assert len(grid.killed) == 1 and len(grid.started) == 4
    w = np.load(tmp_path / "res" / "final.npz")["w"]
    np.testing.assert_allclose(w, w_ref, rtol=1e-9, atol=1e-12)
    # the ServerApp leaves the model directory (the export's encoding in server.json): its weights
    # are w cut per block, the intercept block's weight last
    from hybridfl.inference import load_model

    model = load_model(tmp_path / "res" / "model")
    np.testing.assert_array_equal(np.concatenate([model.w[b] for b in model.blocks] + [[model.intercept]]), w)
    # the algorithm's messages are counted once; the re-sent one only in Flower's bytes
    assert summary["messages_total"] == log_ref.messages_total
    assert summary["retried_messages"] == 1
    (rj,) = summary["rejoins"]
    i, seq, when = kill_at
    assert rj["client"] == f"client-{i}" and rj["old_node"] == grid.killed[0] and rj["node"] == grid.started[-1]
    assert rj["state_seq"] == (seq if when == "after" else seq - 1) and rj["acked_seq"] == seq - 1 and rj["resent"] == 1
    assert summary["nodes"][f"client-{i}"] == grid.started[-1]
    assert json.loads((tmp_path / "res" / "progress.json").read_text())["round"] == 3


def test_a_reply_that_never_finished_uploading_is_asked_for_again(tmp_path, run_id, hyfdca_setup):
    """A node handles round 1's dual message (its state saved) but its reply's objects never reach
    the SuperLink (Flower's MESSAGE_UNAVAILABLE, as when a SuperNode dies or stalls mid-upload): the
    server sends the same message again, the ClientApp answers it with its saved reply, and the run
    equals the simulation: no client counted as failed, no reply missing."""
    dirs, server_dir, w_ref, log_ref = hyfdca_setup
    _clean_state(dirs)
    grid = FakeGrid(dirs, unfinished={(1, 5)})
    summary = run_server(grid, server_dir, tmp_path / "res", poll_interval=0, reply_timeout=30, node_check=0)
    assert not grid.unfinished
    np.testing.assert_allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref, rtol=1e-9, atol=1e-12)
    assert summary["messages_total"] == log_ref.messages_total and summary["retried_messages"] == 1
    # (the federated prediction after training needs an in-memory SuperNode, which this grid is not)
    assert [b for b in summary["bad_replies"] if not b["kind"].startswith("predict.")] == []
    assert summary["abandoned_messages"] == [] and summary["rejoins"] == []


def test_a_node_that_always_claims_an_unfinished_upload_is_asked_once_and_the_run_goes_on(
    tmp_path, run_id, hyfdca_setup
):
    """Adversary: client-1's SuperNode answers round 1's dual message, every time it gets it, with
    Flower's MESSAGE_UNAVAILABLE error instead of a reply (a node may push an error reply of any
    code). The server asks again exactly once, then counts the second error as the client's bad
    reply (missing, one strike) and finishes the run: no loop of re-sends, no stop."""
    dirs, server_dir, w_ref, _ = hyfdca_setup
    _clean_state(dirs)
    delivered: list[str] = []

    class Claims(FakeGrid):
        def pull_messages(self, ids):
            out, rest = [], []
            for mid in ids:
                m = self.msgs[mid]
                holder = self.alive.get(m.metadata.dst_node_id, (None, None))[0]
                if mid not in self.answered and holder == 1 and unpack_seq(m.content)[1] == 5:
                    delivered.append(mid)
                    self.answered.add(mid)
                    out.append(
                        Message(Error(MESSAGE_UNAVAILABLE, "Reply message objects are unavailable."), reply_to=m)
                    )
                else:
                    rest.append(mid)
            return out + super().pull_messages(rest)

    grid = Claims(dirs)
    summary = run_server(grid, server_dir, tmp_path / "res", poll_interval=0, reply_timeout=30, node_check=0)
    assert len(delivered) == 2 and summary["retried_messages"] == 1
    bad = [b for b in summary["bad_replies"] if not b["kind"].startswith("predict.")]
    assert [(b["client"], b["round"]) for b in bad] == [("client-1", 1)] and "Flower error 3" in bad[0]["why"]
    assert json.loads((tmp_path / "res" / "progress.json").read_text())["round"] == 3
    assert not np.allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref)


def test_node_that_never_comes_back_is_given_up(tmp_path, run_id, hyfdca_setup):
    """The transport contract: a client whose node died and never came back is missing from the
    replies after ``reply_timeout`` (named, with the reason, in ``abandoned_messages``); the run
    goes on under the algorithm's missing-reply policy instead of failing."""
    dirs, server_dir, w_ref, _ = hyfdca_setup
    _clean_state(dirs)
    grid = FakeGrid(dirs, (1, 4, "before"), stale=1, restart_after=None)
    summary = run_server(grid, server_dir, tmp_path / "res", poll_interval=0.01, reply_timeout=0.3, node_check=0)
    ab = summary["abandoned_messages"]
    assert ab and {a["client"] for a in ab} == {"client-1"} and ab[0]["seq"] == 4
    assert "its node 1001 went offline (Flower: node unavailable); no node holding it came back" in ab[-1]["why"]
    assert summary["rounds"] == 3 and summary["rejoins"] == []
    assert not np.allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref)


def test_impostor_nodes_are_refused_and_the_run_goes_on(tmp_path, run_id, hyfdca_setup):
    """Adversary: nodes that reach the SuperLink and claim client-1's name with a copy of its data
    but not its ``client_key.pem`` (one from the start, one appearing mid-run as if client-1's node
    had restarted), and a node whose ClientApp fails on the hello. None is mapped to a client, none
    receives the run's setup (config, layout, seed) or an algorithm message, and ``w`` equals the
    simulation's."""
    import shutil

    from hybridfl.privacy.credentials import CLIENT_KEY_FILE, new_client_key

    dirs, server_dir, w_ref, _ = hyfdca_setup
    _clean_state(dirs)
    impostor = tmp_path / "client-1"
    shutil.copytree(dirs[1], impostor, ignore=shutil.ignore_patterns(CLIENT_KEY_FILE, STATE_DIR))
    new_client_key(impostor)
    # the reply to client-0's message #5 is slow, so the server looks for new nodes then
    grid = FakeGrid([*dirs, impostor, impostor, tmp_path / "missing"], slow={(0, 5)})
    grid.alive.pop(grid.started[4])  # the second impostor appears during the run
    grid.pending_restart.append([4, 2])
    summary = run_server(grid, server_dir, tmp_path / "res", poll_interval=0, reply_timeout=30, node_check=0)
    np.testing.assert_allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref, rtol=1e-9, atol=1e-12)
    assert summary["nodes"] == {f"client-{i}": grid.started[i] for i in range(3)}
    assert summary["rejoins"] == []
    refused = {int(n): why for n, why in summary["refused_nodes"].items()}
    late_node = grid.started[-1]
    assert len(grid.started) == 7 and late_node not in grid.started[:6]
    assert set(refused) == {grid.started[3], grid.started[5], late_node}
    for n in (grid.started[3], late_node):
        assert "claims client 'client-1' without a valid proof" in refused[n]
    assert "ClientApp failed" in refused[grid.started[5]]
    got = {m.metadata.dst_node_id for m in grid.msgs.values() if decode(unpack_seq(m.content)[0]).kind != HELLO}
    assert got == set(grid.started[:3])  # no algorithm message (and no setup) ever went to a refused node
    # what an unproven node learns: the session and its nonce, not the config, layout or seed
    # (before: the hello carried all of them to every node that connected)
    for m in grid.msgs.values():
        h = decode(unpack_seq(m.content)[0])
        if h.kind == HELLO:
            assert set(h.payload) == {"session", "nonce"}, sorted(h.payload)
        elif h.kind == SETUP:
            assert m.metadata.dst_node_id in grid.started[:3] and {"config", "layout", "seed"} <= set(h.payload)


def _rows(history):
    """Metrics rows without wall times, with NaN made comparable (JSON round trip of the server's history)."""
    return json.loads(json.dumps(_strip(history)))


def test_fedbcd_over_the_flower_transport_reports_auc_and_stops_at_target(tmp_path, run_id):
    """Over the FlowerTransport and the real ClientApp (fake SuperLink): FedBCD reports the same
    per-round test AUC as the simulation (evaluated through ``fedbcd.evaluate`` messages on both
    sides) and stops at the first round whose AUC reaches ``target_auc``, as the simulation does."""
    split, part, _, cfg0 = _fedbcd_setup(tmp_path / "probe", {**FEDBCD, "rounds": 30})
    full, _ = _fedbcd_reference(split, part, cfg0)
    target = round(float(np.quantile([r["auc"] for r in full], 0.5)), 6)
    first = next(r["round"] for r in full if r["auc"] >= target)
    assert 1 < first < 30
    algo = {**FEDBCD, "rounds": 30, "target_auc": target, "stop_at_target": True}
    split, part, dirs, cfg = _fedbcd_setup(tmp_path, algo)
    ref, _ = _fedbcd_reference(split, part, cfg, dirs=dirs)  # the export's roster: the same signed setup bytes
    summary = run_server(
        FakeGrid(dirs),
        tmp_path / "export" / "server",
        tmp_path / "res",
        poll_interval=0,
        reply_timeout=30,
        node_check=0,
    )
    hist = json.loads((tmp_path / "res" / "history.json").read_text())
    assert len(hist) == len(ref) == first and summary["rounds"] == first and summary["stopped_early"]
    assert [r["auc"] for r in hist] == [r["auc"] for r in ref]
    assert _rows(hist) == _rows(ref)
    assert summary["rounds_to_target"] == first and (tmp_path / "res" / "auc.png").is_file()


def test_fedbcd_skip_and_undo_over_the_flower_transport_equal_simulation(tmp_path, run_id):
    """Party 2's replies of round 2 never arrive (its node handled the messages): the
    FlowerTransport gives up after ``reply_timeout`` and returns the replies that arrived, the
    coordinator skips the round and every party undoes it, exactly as in the simulation with the
    same failure."""
    split, part, dirs, cfg = _fedbcd_setup(tmp_path, FEDBCD)
    ref, fed = _fedbcd_reference(split, part, cfg, fail_at=[(2, part.clients[2].client_id)], dirs=dirs)
    assert fed.server.skipped == [(2, [part.clients[2].client_id])]
    summary = run_server(
        FakeGrid(dirs, lose={(2, 2)}),
        tmp_path / "export" / "server",
        tmp_path / "res",
        poll_interval=0,
        reply_timeout=0.3,
        node_check=0,
    )
    hist = json.loads((tmp_path / "res" / "history.json").read_text())
    assert summary["skipped_rounds"] == 1 and summary["skipped"] == [
        {"round": 2, "missing": [part.clients[2].client_id]}
    ]
    assert {a["client"] for a in summary["abandoned_messages"]} == {part.clients[2].client_id}
    assert _rows(hist) == _rows(ref)


@pytest.mark.parametrize("mode", ["block", "segment", "segment-masked", "segment-step_average"])
def test_hyfdca_commit_over_the_flower_transport_equals_simulation(tmp_path, run_id, mode):
    """Client 1's replies of round 2 never arrive: over the FlowerTransport the server adds only
    the dual changes that arrived and tells client 1 not to commit its own (block mode) or drops
    the segment's pass (segment mode, with the inner products encrypted or masked); ``w`` equals
    the simulation with the same failure."""
    masked = {"segment_inner_products": "masked"} if mode == "segment-masked" else {}
    masked.update({"output": "step_average"} if mode == "segment-step_average" else {})
    mode = mode.removesuffix("-masked").removesuffix("-step_average")
    algo = {**HYFDCA, "dual_mode": mode, "rounds": 4, **({"batch_size": 64, **masked} if mode == "segment" else {})}
    if mode == "segment":  # PSI's setup over the transport runs in the block case; the same holder sets here
        algo["alignment"] = "plaintext"
    prep, dirs, server_dir = _setup(tmp_path, algo)
    w_ok, _ = _hyfdca_reference(prep, algo)
    w_ref, log_ref = _hyfdca_reference(prep, algo, fail_at=[(2, "client-1")])
    assert not np.allclose(w_ok, w_ref)
    summary = run_server(
        FakeGrid(dirs, lose={(1, 2)}), server_dir, tmp_path / "res", poll_interval=0, reply_timeout=0.3, node_check=0
    )
    np.testing.assert_allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref, rtol=1e-9, atol=1e-12)
    hist = json.loads((tmp_path / "res" / "history.json").read_text())
    assert [r["failed"] for r in hist] == [0, 1, 0, 0]
    assert summary["messages_total"] == log_ref.messages_total  # the lost replies are counted on neither side


def test_node_back_without_its_state_stops_the_run(tmp_path, run_id, hyfdca_setup):
    """A node that comes back without the state of messages the server already has replies to
    (its state directory wiped) cannot continue exactly: the run stops with one sentence."""
    dirs, server_dir, _, _ = hyfdca_setup
    _clean_state(dirs)
    grid = FakeGrid(dirs, (1, 5, "before"), stale=5, restart_after=2)
    grid.on_restart = lambda i: _clean_state([dirs[i]])
    with pytest.raises(
        HybridFLError,
        match=r"client 'client-1' came back as node \d+ with its saved state after message #0.*state directory was lost",
    ):
        run_server(grid, server_dir, None, poll_interval=0, reply_timeout=30, node_check=0)


def test_node_back_without_its_state_before_any_reply_gets_the_setup_again(tmp_path, run_id, hyfdca_setup):
    """A node that dies on its first algorithm message and comes back without its state directory
    has answered nothing yet: the server sends the proven node the setup again, re-sends the
    message, and ``w`` equals the simulation."""
    dirs, server_dir, w_ref, _ = hyfdca_setup
    _clean_state(dirs)
    grid = FakeGrid(dirs, (0, 1, "before"), stale=2, restart_after=2)
    grid.on_restart = lambda i: _clean_state([dirs[i]])
    summary = run_server(grid, server_dir, tmp_path / "res", poll_interval=0, reply_timeout=30, node_check=0)
    np.testing.assert_allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref, rtol=1e-9, atol=1e-12)
    (rj,) = summary["rejoins"]
    assert rj["client"] == "client-0" and rj["state_seq"] == 0 and rj["node"] == grid.started[-1]
    setups = [m for m in grid.msgs.values() if decode(unpack_seq(m.content)[0]).kind == SETUP]
    assert [m.metadata.dst_node_id for m in setups].count(grid.started[-1]) == 1


def test_serve_answers_a_resent_message_once(tmp_path, hyfdca_setup):
    """The ClientApp side without Flower: a message re-sent with the same number gets the saved
    reply and leaves the state alone; a number out of sequence is refused; the hello of the same
    run says how far it got, another run's hello changes nothing, and its setup starts afresh."""
    dirs, server_dir, _, _ = hyfdca_setup
    from hybridfl.runtime.flower.node import algorithm_from

    _, cfg, seed = algorithm_from(server_dir)
    d = str(dirs[0])
    setup = {"algorithm": "hyfdca", "config": cfg.model_dump_json(), "seed": seed, "session": "s1"}
    hello = {"session": "s1", "nonce": b"n" * 32}
    store: dict = {}
    r = decode(serve(encode(HMessage(HELLO, SERVER, "node-1", 0, hello)), None, d, store))
    assert r.payload["client_id"] == "client-0" and r.payload["seq"] == 0 and not r.payload["ready"]
    r = decode(serve(encode(HMessage(SETUP, SERVER, "client-0", 0, setup)), None, d, store))
    assert r.payload["client_id"] == "client-0" and r.payload["seq"] == 0
    m1 = encode(HMessage("hyfdca.hello", SERVER, "client-0", 0, {"run": b"r" * 32}))
    first = serve(m1, 1, d, store)
    state = dict(store)
    assert serve(m1, 1, d, store) == first and dict(store) == state  # re-sent: same reply, state untouched
    with pytest.raises(RuntimeError, match=r"got message #3 but its saved state is after message #1"):
        serve(encode(HMessage("hyfdca.x", SERVER, "client-0", 1, {})), 3, d, store)
    with pytest.raises(RuntimeError, match=r"got message #3 but its saved state is after message #1"):
        serve(encode(HMessage("hyfdca.x", SERVER, "client-0", 1, {})), 3, d, store, acked=2)  # #2 was answered?
    with pytest.raises(StaleMessage):
        serve(encode(HMessage("hyfdca.x", SERVER, "client-0", 1, {})), 0, d, store, acked=0)
    assert dict(store) == state
    r = decode(serve(encode(HMessage(HELLO, SERVER, "node-2", 0, hello)), None, d, store))
    assert r.payload["seq"] == 1 and r.payload["ready"] and dict(store) == state  # the same run: resumed
    r = decode(serve(encode(HMessage(SETUP, SERVER, "client-0", 0, setup)), None, d, store))
    assert r.payload["seq"] == 1 and dict(store) == state  # its setup again: still resumed
    r = decode(serve(encode(HMessage(HELLO, SERVER, "node-2", 0, {**hello, "session": "s2"})), None, d, store))
    assert r.payload["seq"] == 0 and not r.payload["ready"] and dict(store) == state  # a hello changes nothing
    r = decode(serve(encode(HMessage(SETUP, SERVER, "client-0", 0, {**setup, "session": "s2"})), None, d, store))
    assert r.payload["seq"] == 0 and "reply" not in store  # another run's setup: afresh


def test_clientapp_state_file_survives_the_supernode(tmp_path, run_id, hyfdca_setup):
    """``context.state`` dies with the SuperNode; the state file in the node's state directory
    (mode 0600) does not, and a hello of a new run removes the files of earlier runs."""
    dirs, server_dir, _, _ = hyfdca_setup
    _clean_state(dirs)
    grid = FakeGrid(dirs[:1])
    from hybridfl.runtime.flower.node import algorithm_from

    _, cfg, seed = algorithm_from(server_dir)
    hello = {"session": "s1", "nonce": b"n" * 32}
    setup = {"algorithm": "hyfdca", "config": cfg.model_dump_json(), "seed": seed, "session": "s1"}
    from hybridfl.runtime.flower.bridge import pack

    def send(nid, raw, seq=None):
        m = Message(pack(raw, seq), dst_node_id=nid, message_type="query.hybridfl", group_id="0")
        (mid,) = grid.push_messages([m])
        (r,) = grid.pull_messages([mid])
        return decode(r.content["hybridfl"]["msg"])

    nid = grid.started[0]
    send(nid, encode(HMessage(HELLO, SERVER, "n", 0, hello)))
    send(nid, encode(HMessage(SETUP, SERVER, "client-0", 0, setup)))
    send(nid, encode(HMessage("hyfdca.hello", SERVER, "client-0", 0, {"run": b"r" * 32})), 1)
    f = dirs[0] / STATE_DIR / "run-7.state"
    assert f.is_file() and (f.stat().st_mode & 0o777) == 0o600
    stale = dirs[0] / STATE_DIR / "run-3.state"
    stale.write_bytes(f.read_bytes())
    grid.kill(nid)
    nid2 = grid.start(0)
    assert send(nid2, encode(HMessage(HELLO, SERVER, "n", 0, hello))).payload["seq"] == 1
    assert not stale.exists()


def test_the_state_file_is_encrypted_at_rest(tmp_path, run_id, hyfdca_setup):
    """Adversary: someone who reads (or copies, or edits) the node's state directory but not its
    client directory. The file holds none of the state in the clear (before: the setup, the
    session and the client's state, secrets included, were readable in it); it decrypts only with
    the key in ``<data-dir>/node_state.key`` (mode 0600), only under its own name, and not after a
    byte changed."""
    from hybridfl.runtime.flower.clientapp import STATE_KEY_FILE, read_state, state_key
    from hybridfl.runtime.flower.node import algorithm_from

    dirs, server_dir, _, _ = hyfdca_setup
    _clean_state(dirs)
    (dirs[0] / STATE_KEY_FILE).unlink(missing_ok=True)
    grid = FakeGrid(dirs[:1])
    _, cfg, seed = algorithm_from(server_dir)
    session = "session-" + "7" * 24
    setup = {"algorithm": "hyfdca", "config": cfg.model_dump_json(), "seed": seed, "session": session}
    from hybridfl.runtime.flower.bridge import pack

    for raw, seq in (
        (encode(HMessage(HELLO, SERVER, "n", 0, {"session": session, "nonce": b"n" * 32})), None),
        (encode(HMessage(SETUP, SERVER, "client-0", 0, setup)), None),
        (encode(HMessage("hyfdca.hello", SERVER, "client-0", 0, {"run": b"r" * 32})), 1),
    ):
        (mid,) = grid.push_messages(
            [Message(pack(raw, seq), dst_node_id=grid.started[0], message_type="query.hybridfl", group_id="0")]
        )
        grid.pull_messages([mid])
    f = dirs[0] / STATE_DIR / "run-7.state"
    raw = f.read_bytes()
    key_file = dirs[0] / STATE_KEY_FILE
    assert key_file.is_file() and (key_file.stat().st_mode & 0o777) == 0o600
    key = state_key({"data-dir": str(dirs[0])})
    state = read_state(f, key)
    assert session.encode() in state["setup"] and "state" in state  # what the file holds, decrypted
    for secret in (session.encode(), cfg.model_dump_json().encode()[:40], state["state"][-64:], b"hyfdca"):
        assert secret not in raw
    moved = f.with_name("run-8.state")
    moved.write_bytes(raw)
    with pytest.raises(ValueError, match="does not decrypt"):
        read_state(moved, key)
    flipped = bytearray(raw)
    flipped[-20] ^= 1
    f.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="does not decrypt"):
        read_state(f, key)
    with pytest.raises(ValueError, match="does not decrypt"):
        read_state(moved, bytes(32))
    _clean_state(dirs)


# -------------------------------------------------------------------------------------------
def test_loopback_supernode_killed_and_restarted(tmp_path):
    """The issue's test: a real SuperLink + 2 SuperNodes on 127.0.0.1 (TLS), HyFEM for 2 rounds;
    when round 1 is done and SuperNode 1 has received its round-2 message, the SuperNode is
    SIGKILLed with its process group and started again with the same command and node config.
    The run completes both rounds with metrics equal to the uninterrupted in-process simulation
    (the killed node's message is re-sent to its new node ID, its client continues from the
    state file). Every process group is gone afterwards."""
    from hybridfl.runtime.flower.local import LocalFederation

    # 400 local steps: the victim's round-2 fit takes about a second, so the kill (within ~0.1 s of
    # the SuperNode logging its receipt) lands while it computes, not while it uploads its reply (a
    # node dying mid-upload is waited for until Flower's object-push session expires, 180 s)
    algo = {**HYFEM, "rounds": 2, "local_steps": 400}
    prep, dirs, server_dir = _setup(tmp_path, algo, num_clients=2)
    with single_threaded():
        ref = run_hyfem(prep.split, prep.partition, HyFEMConfig(**{k: v for k, v in algo.items() if k != "name"}), 3)
    # auth=False: with Flower's SuperNode authentication a restarted node keeps its node ID and may
    # join only after the SuperLink marked the killed one offline (up to 60 s); the rejoin with a
    # new node ID, and its proof at the hello, are what this test is about
    fed = LocalFederation(dirs, fast=True, work_dir=tmp_path / "fed", start_timeout=120, tls=True, auth=False)
    res = tmp_path / "res"
    pids = []
    t0 = time.monotonic()
    try:
        fed.start()
        run = fed.start_run(
            {"server-dir": str(server_dir), "out-dir": str(res), "reply-timeout": 240, "node-check": 0.5}
        )
        pids = [p.pid for _, p in fed.procs]
        victim_log = fed.work_dir / "supernode-1.log"
        deadline = time.monotonic() + 300
        while not (res / "progress.json").is_file():  # round 1 done
            assert run.poll() is None, "the run ended before round 1 was done"
            assert time.monotonic() < deadline, "round 1 did not finish in time"
            time.sleep(0.1)
        while "ROUND 2]" not in victim_log.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.05)  # its round-2 message reached it: it dies with the message in hand
        old = fed.node_proc(1)
        fed.kill_node(1)
        t_kill, wall_kill = time.monotonic(), time.time()
        assert old.poll() is not None
        new = fed.restart_node(1)
        pids.append(new.pid)
        fed.finish_run(run, timeout=300)
        t_done = time.monotonic()
    except BaseException:
        print(fed.logs(40))
        raise
    finally:
        fed.stop()
    _no_leftovers(fed, pids)
    hist = json.loads((res / "history.json").read_text())
    summary = json.loads((res / "summary.json").read_text())
    print(
        f"\nkill {t_kill - t0:.1f} s after start; client-1 remapped {summary['rejoins'][0]['time'] - wall_kill:.1f} s "
        f"after the kill; run done {t_done - t_kill:.1f} s after the kill; rejoins {summary['rejoins']}"
    )
    assert len(hist) == 2
    assert _strip(hist) == _strip(ref.history)
    assert summary["messages_total"] == ref.summary["messages_total"]
    assert summary["bytes_total"] == ref.summary["bytes_total"]
    (rj,) = summary["rejoins"]
    assert rj["client"] == "client-1" and rj["node"] != rj["old_node"] and rj["acked_seq"] == 2  # properties, fit 1
    assert rj["state_seq"] in (2, 3) and rj["resent"] == 1 and summary["retried_messages"] == 1
    assert summary["nodes"]["client-1"] == rj["node"]
    # Flower gave the restarted SuperNode a new ID (both IDs are in its log)
    ids = [
        ln.split("SuperNode ID:")[1].strip()
        for ln in (fed.work_dir / "supernode-1.log").read_text().splitlines()
        if "SuperNode ID:" in ln
    ]
    assert len(ids) == 2 and ids[0] != ids[1] and int(ids[1]) == rj["node"]
    fed.close()


def test_hostile_hello_replies_are_refused_one_by_one(run_id):
    """Every way a hello reply can be wrong is refused by name, maps nothing and changes nothing:
    bytes that are not our codec, no hybridfl record, another kind, no or a non-string client name,
    a client not in the run, no proof, a proof of the wrong length, a proof for another nonce or
    another session; and, for a restarted node claiming a client during the run, a non-integer
    ``seq``. A valid proof is accepted."""
    import os

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from hybridfl.privacy.credentials import hello_proof
    from hybridfl.runtime.flower.bridge import FlowerTransport, pack

    key = Ed25519PrivateKey.generate()
    pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    t = FlowerTransport(grid=None)
    t.hello, t.credentials = {"session": "s1"}, {"client-0": pub}

    def reply(nid: int, content: RecordDict) -> Message:
        probe = Message(pack(b""), dst_node_id=nid, message_type="query.hybridfl", group_id="0")
        probe.metadata.__dict__["_message_id"] = f"probe-{nid}"
        return Message(content, reply_to=probe)

    def hello(nid: int, **payload) -> Message:
        return reply(nid, pack(encode(HMessage(HELLO, "client-0", SERVER, 0, payload))))

    nonce = {n: os.urandom(32) for n in range(1, 20)}
    t._nonces = dict(nonce)
    good = lambda n, **kw: hello_proof(key, kw.get("session", "s1"), kw.get("nonce", nonce[n]), "client-0")  # noqa: E731
    cases = {
        1: (reply(1, pack(b"\x00\x00\x00\x09not json!")), "does not parse"),
        2: (reply(2, RecordDict({})), "does not parse"),
        3: (
            reply(3, pack(encode(HMessage("hyfdca.x", "client-0", SERVER, 0, {"client_id": "client-0"})))),
            "not a hello",
        ),
        4: (hello(4), "not a hello naming a client"),
        5: (hello(5, client_id=7, proof=good(5)), "not a hello naming a client"),
        6: (hello(6, client_id="client-9", proof=good(6)), "not in this run"),
        7: (hello(7, client_id="client-0"), "without a valid proof"),
        8: (hello(8, client_id="client-0", proof=good(8)[:63]), "without a valid proof"),
        9: (hello(9, client_id="client-0", proof=good(9, nonce=nonce[10])), "without a valid proof"),
        10: (hello(10, client_id="client-0", proof=good(10, session="s0")), "without a valid proof"),
    }
    found: dict = {}
    t._found = found
    for nid, (r, why) in cases.items():
        t._on_hello(nid, r)
        assert why in t.refused[nid], (nid, t.refused[nid])
    assert found == {}
    t._on_hello(11, hello(11, client_id="client-0", proof=good(11), seq=0))
    assert list(found) == [11]  # the one valid reply
    # during the run: a restarted node with a valid proof but a non-integer seq is not remapped
    t._found = None
    t.attach({"client-0": 11})
    t._on_hello(12, hello(12, client_id="client-0", proof=good(12), seq="0"))
    assert "no integer 'seq'" in t.refused[12] and t.nodes == {"client-0": 11} and t.rejoins == []
