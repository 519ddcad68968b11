"""The warm ClientApp executor (:mod:`hybridfl.runtime.flower.executor`).

- Flower's internal names it (and the fast SuperNode / ServerApp patches) uses exist with the
  signatures it calls: this fails loudly when a Flower release changes them (``flwr<1.42``).
- The warm client step (the client object kept in memory, the state still written to its file)
  equals the simulation, builds each client once per run, and a node killed with its executor
  continues from the state file (the fake SuperLink of ``tests/test_flower_rejoin.py``).
- A real SuperLink + SuperNodes on 127.0.0.1, the executor in the SuperNode's own process
  (``supernode --inline``, the default) and as a process of its own (``--warm``): HyFDCA's ``w``
  equals the simulation, and each SuperNode is one process (inline) or two (itself and the
  executor), no ClientApp process.
- The fast SuperNode's and the ServerApp's poll intervals back off while no message comes.
"""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import io
import json
import zipfile

import numpy as np
import pytest

from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem
from hybridfl.algorithms.spec import deployable
from hybridfl.runtime.flower.clientapp import FileStore, read_state, state_key, state_path
from hybridfl.runtime.flower.executor import CLIENTAPP_REF, FLOWER_NAMES, Executor
from hybridfl.runtime.flower.node import WarmClient, serve
from hybridfl.runtime.messages import decode, encode
from hybridfl.runtime.simulation import single_threaded
from tests.test_flower import HYFDCA, HYFEM, StepTransport, _hyfdca_reference, _setup, _strip, run_steps


# ------------------------------------------------------------------------------ Flower internals
def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_flower_internals_we_use_exist():
    """Every Flower name the executor and the launchers use is there, with the parameters we pass.
    If this fails, Flower changed its internal task protocol: check ``executor.py``,
    ``supernode.py`` and ``serverapp.py`` against the new ``run_clientapp.py`` before raising the pin."""
    from importlib.metadata import version

    v = tuple(int(x) for x in version("flwr").split(".")[:2])
    assert (1, 41) <= v < (1, 42), f"hybridfl's executor is written against flwr 1.41, found {version('flwr')}"
    for module, name in FLOWER_NAMES:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone"
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore.constant import TaskType
    from flwr.supercore.inflatable import inflatable_protobuf_utils as ipu
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree, pull_objects
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supernode.runtime import run_clientapp as rc

    assert TaskType.CLIENT_APP == "flwr-clientapp"
    assert SubStatus.COMPLETED == "completed" and SubStatus.FAILED == "failed"
    assert int(ErrorCode.CLIENT_APP_RAISED_EXCEPTION) == 2
    assert _params(rc.push_message) == ["client", "message", "context"]
    assert _params(rc.push_task_output) == ["client", "context", "sub_status", "details"]
    assert _params(rc.pull_task_input) == ["client"]  # the steps we follow (ours retries objects faster)
    for fn in (pull_and_inflate_object_from_tree, pull_objects):
        assert {"max_tries_per_object", "initial_backoff", "backoff_cap"} <= set(_params(fn))
    assert {"return_type"} <= set(_params(pull_and_inflate_object_from_tree))
    assert _params(ipu.make_pull_object_fn_protobuf)[:3] == ["pull_object_protobuf", "node", "run_id"]
    assert len(_params(ipu.make_confirm_message_received_fn_protobuf)) == 3
    for m in (
        "AcquireTask",
        "PullTaskInput",
        "PullMessages",
        "PullObject",
        "ConfirmMessageReceived",
        "PushMessages",
        "PushObject",
        "PushTaskOutput",
        "SendTaskHeartbeat",
    ):
        assert callable(getattr(RuntimeHttpClient, m, None)), f"RuntimeHttpClient.{m} is gone"
    assert {"server_address", "insecure", "root_certificates", "interceptors", "retry_invoker"} <= set(
        _params(RuntimeHttpClient.from_server_address)
    )
    # the SuperNode in `--isolation process` leaves the tasks to an external executor
    from flwr.common.constant import ISOLATION_MODE_PROCESS

    assert ISOLATION_MODE_PROCESS == "process"
    # the module globals the fast launcher (supernode.py) and the ServerApp (serverapp.py) replace
    import flwr.superlink.grid.http_grid as http_grid
    import flwr.supernode.start_client_internal as sci

    assert sci.pull_objects is pull_objects and http_grid.pull_objects is pull_objects
    assert sci.time.sleep is not None
    # the in-process executor (`supernode --inline`): Flower's Runtime API handlers called with the
    # SuperNode's NodeState (and the task of a token), the keyword the SuperNode passes it by
    from flwr.supercore.servicer.runtime import runtime_handlers as core_handlers
    from flwr.supernode.nodestate import NodeState
    from flwr.supernode.servicer.runtime import runtime_handlers as handlers

    assert _params(handlers.acquire_task) == ["request", "state"]
    for name in (
        "pull_task_input",
        "pull_messages",
        "pull_object",
        "confirm_message_received",
        "push_messages",
        "push_object",
        "push_task_output",
    ):
        assert _params(getattr(handlers, name)) == ["request", "state", "task"], f"runtime_handlers.{name} changed"
    assert _params(core_handlers.send_task_heartbeat) == ["request", "state", "task"]
    assert callable(getattr(NodeState, "get_task_by_token", None)), "NodeState.get_task_by_token is gone"
    assert "state" in _params(sci._pull_and_store_message) and callable(sci._push_messages)
    src = inspect.getsource(sci.start_client_internal)
    assert "_pull_and_store_message(" in src and "state=state" in src and "time.sleep(3)" in src
    # what our app directory tells the executor
    assert (
        CLIENTAPP_REF in (importlib.resources.files("hybridfl.runtime.flower") / "app" / "pyproject.toml").read_text()
    )


# ------------------------------------------------------------------------------ without processes
class WarmStepTransport(StepTransport):
    """:class:`StepTransport` through the warm path: per client a :class:`WarmClient` and a
    :class:`FileStore` backed by its state file, as the executor keeps them."""

    def __init__(self, dirs, run_id=5):
        super().__init__(dirs)
        ctx = {c: {"data-dir": d} for c, d in self.dirs.items()}
        self.paths = {c: state_path(ctx[c], run_id) for c in self.dirs}
        self.keys = {c: state_key(ctx[c]) for c in self.dirs}
        self.stores = {c: FileStore(self.paths[c], self.keys[c]) for c in self.dirs}
        self.warm = {c: WarmClient() for c in self.dirs}

    def step(self, c, raw, seq=None):
        r = serve(raw, seq, self.dirs[c], self.stores[c], None, self.warm[c])
        self.stores[c].save()
        return r

    def send_and_receive(self, messages, log=None):
        log = log or self.log
        out = []
        for m in messages:
            raw = encode(m)
            log.add(m, len(raw))
            back = self.step(m.receiver, raw)
            r = decode(back)
            log.add(r, len(back))
            out.append(r)
        return out


def test_warm_steps_equal_simulation_build_once_and_save_state(tmp_path, monkeypatch):
    import dataclasses

    import hybridfl.runtime.flower.node as node
    import tests.test_flower as tf

    prep, dirs, server_dir = _setup(tmp_path)
    with single_threaded():
        ref = run_hyfem(prep.split, prep.partition, HyFEMConfig(**{k: v for k, v in HYFEM.items() if k != "name"}), 3)
    spec = deployable("hyfem")
    built = []
    counting = dataclasses.replace(spec, build_client=lambda *a: built.append(a[0].client_id) or spec.build_client(*a))
    monkeypatch.setattr(node, "deployable", lambda name: counting)
    t = WarmStepTransport(dirs)
    monkeypatch.setattr(tf, "client_step", lambda raw, d, store: t.step(next(c for c in t.dirs if t.dirs[c] == d), raw))
    _, hist, _ = run_steps(t, server_dir)
    assert _strip(hist) == _strip(ref.history)
    assert t.log.bytes_total == ref.summary["bytes_total"]
    assert sorted(built) == ["client-0", "client-1", "client-2"]  # once per client, not once per message
    for c, p in t.paths.items():  # the file holds what the executor holds: a restart continues from it
        assert read_state(p, t.keys[c]) == dict(t.stores[c]) and (p.stat().st_mode & 0o777) == 0o600
    # the cold path (a process per message) builds the client for every message, with the same results
    monkeypatch.setattr(tf, "client_step", node.client_step)
    built.clear()
    cold = StepTransport(dirs)
    _, hist2, _ = run_steps(cold, server_dir)
    assert _strip(hist2) == _strip(ref.history) and len(built) == ref.summary["messages_total"] // 2


def test_warm_client_is_dropped_when_its_state_changes_or_handle_fails(tmp_path):
    w = WarmClient()
    w.keep("client", b"setup", b"state")
    assert w.get(b"setup", b"state") == "client"
    assert w.get(b"setup", b"other") is None and w.get(b"other", b"state") is None and w.get(b"setup", None) is None
    w.forget()
    assert w.get(b"setup", b"state") is None
    key = bytes(range(32))
    s = FileStore(tmp_path / "run-1.state", key)
    s.save()
    assert not (tmp_path / "run-1.state").exists()  # nothing changed: nothing written
    s["seq"] = b"1"
    s.save()
    assert read_state(tmp_path / "run-1.state", key) == {"seq": b"1"}
    assert FileStore(tmp_path / "run-1.state", key) == s


@pytest.mark.parametrize(
    "kill_at,stale,restart_after",
    [((1, 5, "before"), 5, 2), ((2, 7, "after"), 1, 6)],
)
def test_warm_node_killed_with_its_executor_rejoins(tmp_path, monkeypatch, kill_at, stale, restart_after):
    """The fake SuperLink of ``test_flower_rejoin.py`` with the warm executor's handler on every node:
    a killed node loses its executor's memory (a new node starts a new one), continues from the
    state file, and HyFDCA's ``w`` equals the simulation."""
    from flwr.supercore.task_identity import TaskIdentity

    import tests.test_flower_rejoin as tr
    from hybridfl.runtime.flower.clientapp import answer
    from hybridfl.runtime.flower.executor import _Run
    from hybridfl.runtime.flower.node import run_server

    monkeypatch.setattr(TaskIdentity, "_run_id", 7)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    prep, dirs, server_dir = _setup(tmp_path, tr.HYFDCA3)
    w_ref, log_ref = _hyfdca_reference(prep, tr.HYFDCA3)
    executors: dict[int, _Run] = {}  # node ID -> its executor's run (dies with the node)

    def warm_query(m, ctx):
        run = executors.get(ctx.node_id)
        if run is None:
            run = executors[ctx.node_id] = _Run(state_path(ctx.node_config, ctx.run_id), state_key(ctx.node_config))
        return answer(m, ctx, run.store, run.warm)

    monkeypatch.setattr(tr, "query", warm_query)
    grid = tr.FakeGrid(dirs, kill_at, stale, restart_after)
    summary = run_server(grid, server_dir, tmp_path / "res", poll_interval=0, reply_timeout=30, node_check=0)
    assert len(grid.killed) == 1 and len(grid.started) == 4 and len(executors) == 4
    np.testing.assert_allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref, rtol=1e-9, atol=1e-12)
    assert summary["messages_total"] == log_ref.messages_total and summary["retried_messages"] == 1
    (rj,) = summary["rejoins"]
    i, seq, when = kill_at
    assert rj["client"] == f"client-{i}" and rj["state_seq"] == (seq if when == "after" else seq - 1)


def _fab(clientapp: str) -> bytes:
    from hybridfl.runtime.flower import APP_DIR

    toml = (APP_DIR / "pyproject.toml").read_text().replace(CLIENTAPP_REF, clientapp)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pyproject.toml", toml)
    return buf.getvalue()


def test_executor_runs_only_the_hybridfl_clientapp():
    class Fab:
        def __init__(self, content, h):
            self.content, self.hash_str = content, h

    ex = Executor("127.0.0.1:1", poll_interval=0.05)  # never connects here
    try:
        ex._check_app(Fab(_fab(CLIENTAPP_REF), "a"))
        with pytest.raises(RuntimeError, match=r"runs only 'hybridfl.runtime.flower.clientapp:app', but the run's"):
            ex._check_app(Fab(_fab("other.app:client"), "b"))
        with pytest.raises(RuntimeError, match="cannot be read"):
            ex._check_app(Fab(b"not a zip", "c"))
    finally:
        ex.close()
    from hybridfl.errors import ConfigError

    with pytest.raises(ConfigError, match="poll interval"):
        Executor("127.0.0.1:1", poll_interval=0)


def test_poll_intervals_back_off_while_no_message_comes(monkeypatch):
    """The fast SuperNode pulls every ``--poll-interval`` s right after a message and every tenth of
    the time since, up to ``--idle-poll-interval``; the ServerApp's transport likewise within an
    exchange (0 = never waits, for the fake grids of the tests)."""
    from hybridfl.runtime.flower import supernode
    from hybridfl.runtime.flower.bridge import FlowerTransport

    now = [100.0]
    monkeypatch.setattr(supernode._time, "monotonic", lambda: now[0])
    clock = supernode._FastTime(0.05, 0.01, 0.2)
    assert clock.interval() == 0.2  # no message yet: idle
    clock.touch()
    assert clock.interval() == 0.05
    now[0] += 1.0
    assert clock.interval() == pytest.approx(0.1)
    now[0] += 60.0
    assert clock.interval() == 0.2
    t = FlowerTransport(None, poll_interval=0.05)
    assert [t.wait_interval(e) for e in (0.0, 0.3, 1.0, 30.0)] == [0.05, 0.05, pytest.approx(0.1), 0.2]
    assert FlowerTransport(None, poll_interval=0).wait_interval(30.0) == 0.0


def test_polls_start_an_interval_apart_so_a_held_poll_is_followed_at_once(monkeypatch):
    """The SuperNode's idle sleep and the ServerApp's wait between pulls count from the start of the
    last pull: after a quick pull they wait the rest of the interval, after a pull the SuperLink held
    (``superlink.HeldPolls``) for longer than the interval they pull again at once."""
    from hybridfl.runtime.flower import grid, supernode

    now, slept = [100.0], []
    monkeypatch.setattr(supernode._time, "monotonic", lambda: now[0])
    monkeypatch.setattr(supernode._time, "sleep", slept.append)
    clock = supernode._FastTime(0.05, 0.01, 0.2)
    clock.touch()
    clock.pulling()
    now[0] += 0.01  # a quick pull: the rest of the 0.05 s interval
    clock.sleep(3)
    assert slept[-1] == pytest.approx(0.04)
    clock.pulling()
    now[0] += 0.5  # a held pull
    clock.sleep(3)
    assert slept[-1] == 0.0
    clock.sleep(0.5)  # the SuperNode's wait for its own reply: capped, not paced
    assert slept[-1] == 0.01
    monkeypatch.setattr(grid.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(grid.time, "sleep", slept.append)
    grid.pace(now[0] - 0.02, 0.05)
    assert slept[-1] == pytest.approx(0.03)
    grid.pace(now[0] - 0.5, 0.05)
    assert slept[-1] == 0.0


# ------------------------------------------------------------------------------ real processes
# the executor as a process of its own (26 s) runs with -m slow; the inline default runs in CI
@pytest.mark.parametrize(
    "inline", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["inline", "executor-process"]
)
def test_loopback_warm_executor_equals_simulation(tmp_path, inline):
    """A real SuperLink + 2 SuperNodes (``--isolation process``) on 127.0.0.1 with the executor in
    the SuperNode's process (``--inline``, LocalFederation's default) or as a process of its own
    (``--warm``): HyFDCA for 3 rounds, ``w`` within 1e-9 of the simulation; during the run every
    SuperNode's process group is the SuperNode alone (inline) or the SuperNode and its one executor
    (no ClientApp process per message); everything is gone afterwards."""
    from hybridfl.runtime.flower.local import LocalFederation, group_members
    from tests.test_flower import _running

    algo = {**HYFDCA, "rounds": 3}
    prep, dirs, server_dir = _setup(tmp_path, algo, num_clients=2)
    w_ref, log_ref = _hyfdca_reference(prep, algo)
    fed = LocalFederation(dirs, work_dir=tmp_path / "fed", start_timeout=120, inline=inline)
    assert fed.warm and LocalFederation.__dataclass_fields__["inline"].default is True
    with _running(fed):
        fed.run({"server-dir": str(server_dir), "out-dir": str(tmp_path / "res"), "pings": 2}, timeout=600)
        for i in range(2):
            members = group_members(fed.node_proc(i).pid)
            want = 1 if inline else 2
            assert len(members) == want, f"SuperNode {i} has {len(members)} processes, expected {want}"
    for i in range(2):
        text = (fed.work_dir / f"supernode-{i}.log").read_text(errors="replace")
        assert text.count("hybridfl executor: taking ClientApp tasks") == (0 if inline else 1)
        assert "Sent successfully" in text
    s = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert s["messages_total"] == log_ref.messages_total and len(s["ping_seconds"]) == 2
    np.testing.assert_allclose(np.load(tmp_path / "res" / "final.npz")["w"], w_ref, rtol=1e-9, atol=1e-12)
    fed.close()


@pytest.mark.parametrize("bad", [1.5, "3", True, -1])
def test_a_record_with_a_bad_acked_or_seq_is_one_sentence(bad):
    """Issue 15: a non-integer ``acked`` (or ``seq``) in a Flower record was cast with ``int()``
    (a float truncated, a string parsed); now it is refused with one sentence."""
    from flwr.app import ConfigRecord

    from hybridfl.runtime.flower.bridge import ACKED, RECORD, SEQ, pack, unpack_meta
    from hybridfl.runtime.messages import Message, encode

    for key in (ACKED, SEQ):
        rec = pack(encode(Message("k", "server", "c", 1)), 1, 0)
        cfg = dict(rec[RECORD])
        cfg[key] = bad
        rec[RECORD] = ConfigRecord(cfg)
        with pytest.raises(ValueError) as e:
            unpack_meta(rec)
        assert "\n" not in str(e.value) and f"{key!r}" in str(e.value) and "non-negative integer" in str(e.value)


def test_the_supernodes_object_pulls_and_pushes_reuse_one_pool():
    """The SuperNode launcher gives Flower's object pulls and pushes one long-lived pool per worker
    count (``supernode._SharedPool``): the same objects come back, the threads are reused across
    calls, a failing pull fails as with Flower's own pools, and Flower still makes its pools
    through ``concurrent.futures.ThreadPoolExecutor`` and lets them go with ``cancel_futures``."""
    import inspect
    import threading
    import types

    import flwr.supercore.inflatable.inflatable_utils as real
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    from hybridfl.runtime.flower import supernode

    src = inspect.getsource(real)
    assert src.count("concurrent.futures.ThreadPoolExecutor(max_workers=num_workers)") == 2
    assert src.count("executor.shutdown(wait=False, cancel_futures=True)") == 2
    module = types.ModuleType("inflatable_utils_copy")  # the same functions on a copy of the module's names
    module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    for name in ("pull_objects", "push_object_contents_from_iterable"):
        f = getattr(real, name)
        setattr(module, name, types.FunctionType(f.__code__, module.__dict__, name, f.__defaults__, f.__closure__))
        module.__dict__[name].__kwdefaults__ = f.__kwdefaults__
    supernode._share_object_pools(module)
    store = {f"id{i}": f"object {i}".encode() for i in range(5)}
    pushed: dict = {}
    threads: set[str] = set()

    def pull(object_id: str) -> bytes:
        threads.add(threading.current_thread().name)
        return store[object_id]

    for _ in range(20):
        assert module.pull_objects(list(store), pull) == store
        module.push_object_contents_from_iterable(store.items(), lambda i, c: pushed.__setitem__(i, c))
    assert pushed == store
    workers = real.get_num_workers(real.FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS)
    assert len(threads) <= workers and all(t.startswith("hybridfl-objects") for t in threads)  # reused

    def missing(object_id: str) -> bytes:
        raise ObjectPullError(object_id, "gone")

    with pytest.raises(ObjectPullError):
        module.pull_objects(["x", "y"], missing)
    assert module.pull_objects(list(store), store.__getitem__) == store  # the pool still serves
