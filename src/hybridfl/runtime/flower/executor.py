"""The warm ClientApp executor: one long-lived process answers every message of a SuperNode.

Flower 1.41's SuperNode turns every message it pulls from the SuperLink into a ``CLIENT_APP`` task
of its Runtime API; its stock SuperExec (``flower-superexec``, which the SuperNode starts itself
unless it runs with ``--isolation process``) polls for tasks every second and starts one new
``flwr-clientapp`` process per task, which imports Flower, hybridfl and the algorithm's libraries
and rebuilds the client. Most of the seconds of an exchange go there.

:class:`Executor` takes the place of the SuperExec for a SuperNode started with
``--isolation process``: it polls the SuperNode's Runtime API (``AcquireTask``) every
``poll_interval`` seconds and runs each task itself, with Flower's own task protocol (the steps of
``flwr/supernode/runtime/run_clientapp.py``: ``PullTaskInput``, ``PullMessages`` and the message's
objects, then :func:`~flwr.supernode.runtime.run_clientapp.push_message` and
:func:`~flwr.supernode.runtime.run_clientapp.push_task_output`), and answers with the same code
as the ClientApp (:func:`hybridfl.runtime.flower.clientapp.answer`). Within a run it keeps the
client object and its data in memory (:class:`~hybridfl.runtime.flower.node.WarmClient`), and it
still writes the run's state file after every message that changes it, so a crash of the executor
or of the SuperNode is recovered from exactly as before (``docs/deploy.md``, "Node failures").

Differences to a ``flwr-clientapp`` process, on purpose:

- it runs only the hybridfl ClientApp: a run whose Flower app names another ClientApp gets an
  error reply (the FAB is read, never installed or imported);
- it pulls a message's objects with a first retry after ``poll_interval`` seconds instead of
  Flower's fixed 1 s (a fast poller often finds the task before the SuperNode has stored the
  message's objects);
- it keeps the state out of ``context.state`` (the SuperNode's memory, lost with it anyway), so
  the context it pushes back stays small.

Start it with ``hybridfl flower-executor --runtime-api-address HOST:PORT`` next to each SuperNode
(``python -m hybridfl.runtime.flower.supernode --warm ...`` starts both).

The Flower names used here are internal to Flower 1.41 (hence ``flwr<1.42``);
``tests/test_flower_executor.py`` imports every one of :data:`FLOWER_NAMES` and checks the
signatures this module calls.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

CLIENTAPP_REF = "hybridfl.runtime.flower.clientapp:app"
FLOWER_NAMES = (
    ("flwr.app", "Error"),
    ("flwr.common.config", "get_fab_config"),
    ("flwr.common.constant", "ErrorCode"),
    ("flwr.common.constant", "SubStatus"),
    ("flwr.common.serde", "context_from_proto"),
    ("flwr.common.serde", "fab_from_proto"),
    ("flwr.common.serde", "run_from_proto"),
    ("flwr.proto.node_pb2", "Node"),
    ("flwr.proto.runtime_pb2", "AcquireTaskRequest"),
    ("flwr.proto.runtime_pb2", "PullAppMessagesRequest"),
    ("flwr.proto.runtime_pb2", "PullTaskInputRequest"),
    ("flwr.proto.runtime_pb2", "SendTaskHeartbeatRequest"),
    ("flwr.supercore.constant", "TaskType"),
    ("flwr.supercore.inflatable.inflatable_protobuf_utils", "make_confirm_message_received_fn_protobuf"),
    ("flwr.supercore.inflatable.inflatable_protobuf_utils", "make_pull_object_fn_protobuf"),
    ("flwr.supercore.inflatable.inflatable_utils", "pull_and_inflate_object_from_tree"),
    ("flwr.supercore.interceptors", "RuntimeTokenHttpInterceptor"),
    ("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor"),
    ("flwr.supercore.runtime", "RuntimeHttpClient"),
    ("flwr.supernode.runtime.run_clientapp", "push_message"),
    ("flwr.supernode.runtime.run_clientapp", "push_task_output"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "acquire_task"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "pull_task_input"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "pull_messages"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "pull_object"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "confirm_message_received"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "push_messages"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "push_object"),
    ("flwr.supernode.servicer.runtime.runtime_handlers", "push_task_output"),
    ("flwr.supercore.servicer.runtime.runtime_handlers", "send_task_heartbeat"),
)
"""(module, name) of every Flower 1.41 internal this module uses."""

log = logging.getLogger("hybridfl.flower")
BUSY_SECONDS = 10.0
"""Seconds after a task during which the executor polls every ``poll_interval`` seconds."""
IDLE_POLL = 0.1
"""Seconds between two polls of an executor that has had no task for :data:`BUSY_SECONDS`."""
WAKE_POLL = 0.25
"""Seconds between two polls of an executor whose SuperNode announces its tasks on a pipe."""


class _TaskToken:
    """HTTP interceptor adding the current task's token (none between tasks, for ``AcquireTask``)."""

    def __init__(self) -> None:
        self.inner = None
        self.value: str | None = None

    def set(self, token: str | None) -> None:
        self.value = token or None
        if token and self.http:
            from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor

            self.inner = RuntimeTokenHttpInterceptor(token)
        else:
            self.inner = None

    http = True

    def intercept(self, context, call_next):
        inner = self.inner
        return inner.intercept(context, call_next) if inner is not None else call_next(context)


class InProcessRuntime:
    """The SuperNode's Runtime API without HTTP: each call runs Flower's own handler of that call
    (``flwr/supernode/servicer/runtime/runtime_handlers.py``, what the SuperNode's Runtime API server
    runs for a request) on the SuperNode's ``NodeState``, with the task of the current token, so an
    :class:`Executor` can run in the SuperNode's own process (``supernode --inline``): no process
    hand-off, no HTTP request, no poll. A handler's ``FlowerError`` propagates as the HTTP error
    would (the executor turns it into the task's error reply)."""

    def __init__(self, state, token: _TaskToken):
        self.state, self.token = state, token

    def _task(self):
        from flwr.supercore.error import ApiErrorCode, FlowerError

        task = self.state.get_task_by_token(self.token.value) if self.token.value else None
        if task is None:
            raise FlowerError(ApiErrorCode.RUNTIME_AUTHENTICATION_FAILED, "Runtime task-token authentication failed.")
        return task

    def _call(self, name: str, request):
        from flwr.supernode.servicer.runtime import runtime_handlers as h

        return getattr(h, name)(request, self.state, self._task())

    def AcquireTask(self, request):
        """Flower's ``acquire_task`` handler: the executor takes the next task (no token needed yet)."""
        from flwr.supernode.servicer.runtime.runtime_handlers import acquire_task

        return acquire_task(request, self.state)

    def PullTaskInput(self, request):
        """Flower's ``pull_task_input`` handler for the current task."""
        return self._call("pull_task_input", request)

    def PullMessages(self, request):
        """Flower's ``pull_messages`` handler: the task's message from the SuperNode."""
        return self._call("pull_messages", request)

    def PullObject(self, request):
        """Flower's ``pull_object`` handler: one object of the task's message."""
        return self._call("pull_object", request)

    def ConfirmMessageReceived(self, request):
        """Flower's ``confirm_message_received`` handler."""
        return self._call("confirm_message_received", request)

    def PushMessages(self, request):
        """Flower's ``push_messages`` handler: the task's reply to the SuperNode."""
        return self._call("push_messages", request)

    def PushObject(self, request):
        """Flower's ``push_object`` handler: one object of the reply."""
        return self._call("push_object", request)

    def PushTaskOutput(self, request):
        """Flower's ``push_task_output`` handler: the task's end."""
        return self._call("push_task_output", request)

    def SendTaskHeartbeat(self, request):
        """Flower's ``send_task_heartbeat`` handler: the task is alive."""
        from flwr.supercore.servicer.runtime.runtime_handlers import send_task_heartbeat

        return send_task_heartbeat(request, self.state, self._task())

    def close(self) -> None:
        """Nothing to close: no connection (the gRPC stub's ``close`` in Flower's API)."""


class _Heartbeat:
    """Sends the task's heartbeat every ``interval`` seconds while a task runs (the SuperNode
    fails a task after 2 x 30 s without one)."""

    def __init__(self, client, interval: float):
        self.client, self.interval = client, interval
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

        while not self.stop_event.wait(self.interval):
            try:
                self.client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
            except Exception as e:  # a missed heartbeat is retried at the next interval
                log.debug("hybridfl executor: task heartbeat failed: %s", e)

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)


class _Run:
    """What the executor keeps for one Flower run: its state store and its client object."""

    def __init__(self, path: Path | None, key: bytes | None):
        from hybridfl.runtime.flower.clientapp import FileStore
        from hybridfl.runtime.flower.node import WarmClient

        self.path = path
        self.store = FileStore(path, key)
        self.warm = WarmClient()


class Executor:
    """Takes the ``CLIENT_APP`` tasks of one SuperNode (started with ``--isolation process``) and
    answers them in this process, keeping each run's client object in memory.

    Args:
        runtime_api_address: the SuperNode's Runtime API, ``HOST:PORT`` (its ``--host``/``--port``).
        insecure: connect without TLS (the SuperNode's Runtime API has no ``--ssl-certfile``).
        root_certificates: CA file (PEM) that signed the Runtime API's certificate (TLS).
        poll_interval: seconds between two ``AcquireTask`` polls for :data:`BUSY_SECONDS` after a
            task (then every :data:`IDLE_POLL` seconds, or ``poll_interval`` if longer: an idle
            node costs less), and the first retry when a message's objects are not stored yet.
        heartbeat_interval: seconds between two heartbeats of a running task.
        wake_fd: a pipe on which the SuperNode announces each new task (``supernode --warm``): the
            executor then waits on it and polls only every :data:`WAKE_POLL` seconds, as a fallback.
        state: the SuperNode's ``NodeState``: run in the SuperNode's own process (``supernode
            --inline``) on :class:`InProcessRuntime` instead of the Runtime API over HTTP
            (``runtime_api_address`` and the TLS arguments are then unused); the SuperNode calls
            :meth:`run_pending` after each message it stored.
    """

    def __init__(
        self,
        runtime_api_address: str,
        insecure: bool = True,
        root_certificates: str | None = None,
        poll_interval: float = 0.02,
        heartbeat_interval: float = 15.0,
        wake_fd: int | None = None,
        state=None,
    ):
        from hybridfl.errors import ConfigError

        if not 0.001 <= float(poll_interval) <= 5.0:
            raise ConfigError(f"the executor's poll interval must be between 0.001 and 5 seconds, got {poll_interval}.")
        if insecure and root_certificates:
            raise ConfigError("give the executor either --insecure or --root-certificates, not both.")
        self.address = runtime_api_address
        self.poll_interval = float(poll_interval)
        self.heartbeat_interval = float(heartbeat_interval)
        self.token = _TaskToken()
        self.runs: dict[tuple[int, str], _Run] = {}
        self.fabs: dict[str, str] = {}  # FAB hash -> "" (hybridfl's ClientApp) or why it is refused
        self.tasks = 0
        self.stop_event = threading.Event()
        self.wake_fd = wake_fd
        if state is not None:  # in the SuperNode's process: Flower's handlers on its NodeState
            self.token.http = False
            self.client = InProcessRuntime(state, self.token)
            return
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.runtime import RuntimeHttpClient

        self.client = RuntimeHttpClient.from_server_address(
            server_address=runtime_api_address,
            insecure=insecure,
            root_certificates=None
            if insecure
            else (Path(root_certificates).read_bytes() if root_certificates else None),
            interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), self.token],
            # no Flower retry invoker: it raises SIGINT in this process on an HTTP 401 (a stale
            # task token), which would end a long-lived executor; the loop waits out failures itself
            retry_invoker=None,
        )

    # ------------------------------------------------------------------ the loop
    def poll_once(self) -> bool:
        """Ask the SuperNode for one ``CLIENT_APP`` task and run it; True if there was one."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest
        from flwr.supercore.constant import TaskType

        res = self.client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        if not (res.HasField("task") and res.token):
            return False
        self.run_task(res.token)
        return True

    def run_pending(self) -> int:
        """Run every pending ``CLIENT_APP`` task now (the in-process executor, called by the SuperNode
        right after it stored a message); returns how many ran. A failure is logged, not raised:
        the SuperNode's loop goes on."""
        n = 0
        try:
            while self.poll_once():
                n += 1
        except Exception as e:  # the SuperNode outlives one bad task
            log.error("hybridfl executor: %s", e)
        return n

    def serve_forever(self) -> None:
        """Poll and run tasks until :meth:`stop` (or SIGTERM/SIGINT in :func:`serve`). A SuperNode
        that is not reachable (not started yet, restarting) is waited for."""
        import httpx

        last_task = time.monotonic()
        while not self.stop_event.is_set():
            try:
                if self.poll_once():
                    last_task = time.monotonic()
                    continue  # the next message of an exchange often waits already
            except httpx.HTTPError as e:
                log.debug("hybridfl executor: Runtime API at %s not reachable: %s", self.address, e)
                self.stop_event.wait(1.0)
                continue
            except Exception as e:  # the executor outlives one bad task or response
                log.error("hybridfl executor: %s", e)
                self.stop_event.wait(1.0)
                continue
            if self.wake_fd is not None:
                self._wait_for_wake(WAKE_POLL)
                continue
            idle = time.monotonic() - last_task > BUSY_SECONDS
            self.stop_event.wait(max(self.poll_interval, IDLE_POLL) if idle else self.poll_interval)

    def _wait_for_wake(self, timeout: float) -> None:
        """Wait until the SuperNode announces a task on the wake pipe (or ``timeout`` seconds)."""
        import select

        try:
            ready, _, _ = select.select([self.wake_fd], [], [], timeout)
            if ready and not os.read(self.wake_fd, 4096):  # the SuperNode closed its end: it is gone
                self.wake_fd = None
        except (OSError, ValueError):
            self.wake_fd = None  # poll instead

    def stop(self) -> None:
        """Stop :meth:`serve_forever` after the task it is running."""
        self.stop_event.set()

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()

    # ------------------------------------------------------------------ one task
    def run_task(self, token: str) -> None:
        """Run one acquired task (``token``): pull its input and message, answer it with
        :func:`hybridfl.runtime.flower.clientapp.answer`, push the reply and the task's output.
        A failure is replied as Flower's ``CLIENT_APP_RAISED_EXCEPTION`` error, as a
        ``flwr-clientapp`` process replies it; the executor goes on with the next task."""
        from flwr.app import Error, Message
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

        self.token.set(token)
        message = context = reply = None
        status, details = SubStatus.FAILED, "the hybridfl executor failed for an unknown reason"
        try:
            with _Heartbeat(self.client, self.heartbeat_interval):
                try:
                    context, fab = self._pull_input()
                    message = self._pull_message(context)
                    self._check_app(fab)
                    reply = self._answer(message, context)
                    status, details = SubStatus.COMPLETED, ""
                except Exception as ex:  # every failure becomes the task's error reply
                    details = str(type(ex)) + ":<'" + str(ex) + "'>"  # Flower's own format of the reason
                    log.error("hybridfl executor: the ClientApp raised an exception: %s", ex)
                    if message is not None:
                        reply = Message(
                            Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message
                        )
                if reply is not None and context is not None:
                    try:
                        push_message(self.client, reply, context)
                    except Exception as ex:
                        log.error("hybridfl executor: pushing the reply failed: %s", ex)
                        status, details = SubStatus.FAILED, f"pushing the reply failed: {ex}"
                push_task_output(self.client, context, status, details)
        finally:
            self.token.set(None)
            self.tasks += 1

    def _pull_input(self):
        from flwr.common.serde import context_from_proto, fab_from_proto
        from flwr.proto.runtime_pb2 import PullTaskInputRequest

        res = self.client.PullTaskInput(PullTaskInputRequest())
        return context_from_proto(res.context), fab_from_proto(res.fab)

    def _pull_message(self, context):
        from flwr.app import Message
        from flwr.proto.node_pb2 import Node
        from flwr.proto.runtime_pb2 import PullAppMessagesRequest
        from flwr.supercore.inflatable.inflatable_protobuf_utils import (
            make_confirm_message_received_fn_protobuf,
            make_pull_object_fn_protobuf,
        )
        from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree

        res = self.client.PullMessages(PullAppMessagesRequest())
        deadline = time.monotonic() + 5.0
        while not res.messages_list and time.monotonic() < deadline:  # the task was created first
            time.sleep(self.poll_interval)
            res = self.client.PullMessages(PullAppMessagesRequest())
        if not res.messages_list:
            raise RuntimeError("the SuperNode gave the task no message.")
        node = Node(node_id=context.node_id)
        tree = res.message_object_trees[0]
        message = pull_and_inflate_object_from_tree(
            tree,
            make_pull_object_fn_protobuf(self.client.PullObject, node, context.run_id),
            make_confirm_message_received_fn_protobuf(self.client.ConfirmMessageReceived, node, context.run_id),
            return_type=Message,
            max_tries_per_object=None,  # the limit is Flower's PULL_MAX_TIME
            initial_backoff=self.poll_interval,  # Flower waits 1 s before the first retry
            backoff_cap=0.5,
        )
        message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's ClientApp process does
        return message

    def _check_app(self, fab) -> None:
        """Refuse a run whose Flower app is not hybridfl's (its FAB names another ClientApp)."""
        why = self.fabs.get(fab.hash_str)
        if why is None:
            from flwr.common.config import get_fab_config

            try:
                ref = get_fab_config(fab.content)["tool"]["flwr"]["app"]["components"]["clientapp"]
                why = "" if ref == CLIENTAPP_REF else f"the run's ClientApp is {ref!r}"
            except Exception as e:  # not a zip, no pyproject.toml, no such key: not our app
                why = f"its Flower app bundle cannot be read ({e})"
            self.fabs[fab.hash_str] = why
        if why:
            raise RuntimeError(f"this SuperNode's hybridfl executor runs only {CLIENTAPP_REF!r}, but {why}.")

    def _answer(self, message, context):
        from hybridfl.runtime.flower.bridge import MESSAGE_TYPE
        from hybridfl.runtime.flower.clientapp import answer, state_key, state_path

        if message.metadata.message_type != MESSAGE_TYPE:
            raise ValueError(
                f"the hybridfl ClientApp answers only {MESSAGE_TYPE!r} messages, got {message.metadata.message_type!r}."
            )
        path = state_path(context.node_config, context.run_id)
        key = (int(context.run_id), str(path))
        run = self.runs.get(key)
        if run is None:
            # a run new to this process: its state file, if any
            run = self.runs[key] = _Run(path, state_key(context.node_config))
        try:
            reply = answer(message, context, run.store, run.warm)
        except BaseException:
            # the store may hold changes that never reached the file: start again from the file
            self.runs.pop(key, None)
            raise
        from hybridfl.runtime.flower.bridge import HELLO, unpack_meta
        from hybridfl.runtime.messages import decode

        raw, seq, _ = unpack_meta(message.content)
        if seq is None and decode(raw).kind == HELLO:  # a new run: forget the others
            for k in [k for k in self.runs if k != key]:
                del self.runs[k]
        return reply


def _watch_parent(pid: int, ex: Executor) -> None:
    """Stop ``ex`` (and, after 5 s, exit hard) when process ``pid`` is gone: the executor dies with
    its SuperNode, as Flower's SuperExec does."""

    def watch() -> None:
        while True:
            time.sleep(0.2)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                pass
        ex.stop()
        time.sleep(5.0)
        os._exit(0)  # the state file is written atomically: nothing is lost

    threading.Thread(target=watch, daemon=True).start()


def serve(
    runtime_api_address: str,
    insecure: bool = True,
    root_certificates: str | None = None,
    poll_interval: float = 0.02,
    parent_pid: int | None = None,
    wake_fd: int | None = None,
) -> None:
    """Run an :class:`Executor` until SIGTERM/SIGINT (or until process ``parent_pid`` exits);
    ``wake_fd``: see :class:`Executor`."""
    ex = Executor(runtime_api_address, insecure, root_certificates, poll_interval, wake_fd=wake_fd)
    for noisy in ("httpx", "httpcore"):  # not one log line per poll
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def on_signal(signum, frame) -> None:
        ex.stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    if parent_pid:
        _watch_parent(int(parent_pid), ex)
    log.info("hybridfl executor: taking ClientApp tasks from %s every %g s", runtime_api_address, poll_interval)
    try:
        ex.serve_forever()
    finally:
        ex.close()
    log.info("hybridfl executor: stopped after %d tasks", ex.tasks)


def main(argv: list[str] | None = None) -> None:
    """``python -m hybridfl.runtime.flower.executor --runtime-api-address HOST:PORT [--insecure |
    --root-certificates CA] [--poll-interval S] [--parent-pid PID] [--wake-fd FD]`` (also ``hybridfl``
    ``flower-executor``, without ``--wake-fd``)."""
    import argparse

    ap = argparse.ArgumentParser(prog="hybridfl-flower-executor", description=__doc__.splitlines()[0])
    ap.add_argument("--runtime-api-address", default="127.0.0.1:9094", help="the SuperNode's Runtime API HOST:PORT")
    ap.add_argument("--insecure", action="store_true", help="no TLS to the Runtime API")
    ap.add_argument("--root-certificates", default=None, help="CA certificate (PEM) of the Runtime API's TLS")
    ap.add_argument("--poll-interval", type=float, default=0.02, help="seconds between polls for tasks")
    ap.add_argument("--parent-pid", type=int, default=None, help="exit when this process exits")
    ap.add_argument("--wake-fd", type=int, default=None, help="pipe on which the SuperNode announces tasks")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    serve(
        a.runtime_api_address,
        a.insecure or not a.root_certificates,
        a.root_certificates,
        a.poll_interval,
        a.parent_pid,
        a.wake_fd,
    )


if __name__ == "__main__":
    main()
