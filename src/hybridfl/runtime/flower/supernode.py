"""``python -m hybridfl.runtime.flower.supernode [--poll-interval S] [--idle-poll-interval I]
[--object-retry R] [--inline | --warm] <flower-supernode args>``.

Flower 1.41's SuperNode sleeps a fixed 3 s whenever a pull from the SuperLink finds no message
(``flwr/supernode/start_client_internal.py``), waits 0.5 s between checks for the ClientApp's
reply, and waits 1 s before it first retries pulling a message's objects that the ServerApp has
not uploaded yet (``PULL_INITIAL_BACKOFF``); there is no option for any of them. This launcher runs
the stock ``flower-supernode`` with the idle sleep replaced: the next pull starts ``--poll-interval``
seconds (default 0.05) after the last one started right after a message, then a tenth
(:data:`BACKOFF`) of the time since the last message after it, up to ``--idle-poll-interval``
(default 0.2: an idle node costs a stock SuperLink 5 requests a second), and at once after a
pull that took longer (one our SuperLink held until there was news, ``superlink.HeldPolls``);
the reply wait at 0.01 s (a check of its own memory, no request); the first object retry
at ``--object-retry`` (default 0.02 s, then doubling up to 1 s); and it sets
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (Flower's own setting, default 1 s) for the SuperExec that
starts the ClientApp processes.
It also signs one authentication timestamp a second (:mod:`hybridfl.runtime.flower.signing`)
and gives Flower's object pulls and pushes one long-lived thread pool (:class:`_SharedPool`).

``--inline`` (what ``LocalFederation`` and ``deploy-local`` run): run the SuperNode with
``--isolation process`` and answer each message in this process right after the SuperNode stored
it (:func:`_answer_inline`): the warm executor's code on Flower's Runtime API handlers and the
SuperNode's ``NodeState``, no executor process, no HTTP request, no poll between them; the client
object stays in memory.

``--warm``: run the SuperNode with ``--isolation process`` and start, as its child (same process
group, it exits with the SuperNode), the warm executor
(:mod:`hybridfl.runtime.flower.executor`) on its Runtime API (``--host``/``--port``, TLS with
``--ssl-ca-certfile`` if the Runtime API has a certificate) instead of Flower's SuperExec: one
long-lived process answers every message and keeps the client object in memory. The SuperNode
announces each new task to the executor on a pipe, so the executor's polls of the Runtime API are
only a fallback (every 0.25 s).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time as _time
from typing import Any

BACKOFF = 0.1
"""The SuperNode waits at most this fraction of the time since its last message between two pulls
(between ``--poll-interval`` and ``--idle-poll-interval``)."""


class _FastTime:
    """The ``time`` module with ``sleep`` capped: the SuperNode's 3 s idle sleep (its next pull
    from the SuperLink, over the network) at ``cap`` seconds right after a message (:meth:`touch`),
    growing with the time since then (:data:`BACKOFF` of it) up to ``idle_cap`` seconds; its shorter
    in-process waits (for the ClientApp's reply in its own state) at ``wait_cap`` seconds."""

    def __init__(self, cap: float, wait_cap: float | None = None, idle_cap: float | None = None):
        self.cap = cap
        self.wait_cap = cap if wait_cap is None else wait_cap
        self.idle_cap = max(cap, cap if idle_cap is None else idle_cap)
        self.last = float("-inf")
        self.pulled = float("-inf")

    def touch(self) -> None:
        """A message arrived or was answered: poll every ``cap`` seconds again."""
        self.last = _time.monotonic()

    def pulling(self) -> None:
        """A pull from the SuperLink starts now."""
        self.pulled = _time.monotonic()

    def interval(self) -> float:
        """Seconds between the starts of two pulls from the SuperLink."""
        return min(self.idle_cap, max(self.cap, BACKOFF * (_time.monotonic() - self.last)))

    def sleep(self, s: float) -> None:
        s = float(s)
        if s >= 3.0:  # the idle sleep: the next pull starts an interval after the last one started
            # (at once after a pull the SuperLink held: superlink.HeldPolls)
            _time.sleep(max(0.0, min(s, self.interval()) - (_time.monotonic() - self.pulled)))
        else:
            _time.sleep(min(s, self.wait_cap))

    def __getattr__(self, name: str):
        return getattr(_time, name)


class _SharedPool:
    """``concurrent.futures.ThreadPoolExecutor`` as Flower's object pulls and pushes use it
    (``flwr.supercore.inflatable.inflatable_utils``: a pool per call, ``submit``, then
    ``shutdown(wait=False, cancel_futures=True)``), on one long-lived pool per worker count instead
    of new threads per call. The SuperNode calls them one at a time from its loop, so each call
    still has its ``max_workers`` threads; its own futures are cancelled at its shutdown."""

    pools: dict[int, Any] = {}

    def __init__(self, max_workers: int | None = None, **_: Any):
        import concurrent.futures as cf

        n = max(1, int(max_workers or 1))
        if n not in self.pools:
            self.pools[n] = cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="hybridfl-objects")
        self.pool, self.futures = self.pools[n], []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        future = self.pool.submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        import concurrent.futures as cf

        if cancel_futures:
            for f in self.futures:
                f.cancel()
        if wait:
            cf.wait(self.futures)


def _share_object_pools(module: Any = None) -> None:
    """Give Flower's object pulls and pushes in this process (``module``, default
    ``flwr.supercore.inflatable.inflatable_utils``) :class:`_SharedPool` for their thread pools."""
    import concurrent.futures as cf
    import types

    if module is None:
        import flwr.supercore.inflatable.inflatable_utils as module
    futures = types.SimpleNamespace(**{k: getattr(cf, k) for k in dir(cf) if not k.startswith("__")})
    futures.ThreadPoolExecutor = _SharedPool
    module.concurrent = types.SimpleNamespace(futures=futures)


def _take(args: list[str], flag: str, default: str | None = None, has_value: bool = True) -> str | None:
    """Remove ``flag`` (and its value) from ``args``; return the value (``"1"`` for a bare flag)."""
    if flag not in args:
        return default
    i = args.index(flag)
    if not has_value:
        del args[i]
        return "1"
    value = args[i + 1]
    del args[i : i + 2]
    return value


def _value(args: list[str], flag: str, default: str | None = None) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``), left in place."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return default


def executor_command(args: list[str], poll_interval: float = 0.02, wake_fd: int | None = None) -> list[str]:
    """The command that starts the warm executor for a SuperNode started with ``args`` (its
    Runtime API from ``--host``/``--port``, TLS from ``--ssl-ca-certfile``), watching this process;
    ``wake_fd``: the read end of the pipe on which this process announces each new task."""
    host = _value(args, "--host", "127.0.0.1")
    port = _value(args, "--port", "9094")
    ca = _value(args, "--ssl-ca-certfile")
    cmd = [sys.executable, "-m", "hybridfl.runtime.flower.executor", "--runtime-api-address", f"{host}:{port}"]
    cmd += ["--root-certificates", str(ca)] if ca else ["--insecure"]
    cmd += ["--wake-fd", str(wake_fd)] if wake_fd is not None else []
    return [*cmd, "--poll-interval", str(poll_interval), "--parent-pid", str(os.getpid())]


def _announce_tasks(sci, fd: int | None, on_message=None, on_pull=None) -> None:
    """Write a byte to ``fd`` whenever the SuperNode has stored a message pulled from the SuperLink
    (with its objects: its task can run now), so the executor need not poll for it; call
    ``on_message()`` then too, and ``on_pull()`` as each pull starts."""
    pull_and_store = sci._pull_and_store_message

    @functools.wraps(pull_and_store)
    def announcing(*a, **kw):
        if on_pull is not None:
            on_pull()
        run_id = pull_and_store(*a, **kw)
        if run_id is not None:
            if on_message is not None:
                on_message()
            if fd is not None:
                try:
                    os.write(fd, b"!")
                except (BlockingIOError, BrokenPipeError):
                    pass  # the pipe is full (the executor is behind, it will poll) or the executor is gone
        return run_id

    sci._pull_and_store_message = announcing


def _answer_inline(sci, on_message=None, on_pull=None) -> None:
    """Answer each message in this (the SuperNode's) process, right after the SuperNode stored it:
    an :class:`~hybridfl.runtime.flower.executor.Executor` on Flower's Runtime API handlers and the
    SuperNode's own ``NodeState`` (no executor process, no HTTP request, no poll), so the SuperNode's
    loop finds the reply at once and pushes it. ``on_message()`` is called after each message,
    ``on_pull()`` as each pull starts."""
    pull_and_store = sci._pull_and_store_message
    holder: dict = {}

    @functools.wraps(pull_and_store)
    def answering(*a, **kw):
        if on_pull is not None:
            on_pull()
        run_id = pull_and_store(*a, **kw)
        if run_id is not None:
            if on_message is not None:
                on_message()
            ex = holder.get("ex")
            if ex is None:
                from hybridfl.runtime.flower.executor import Executor

                ex = holder["ex"] = Executor("in-process", state=kw["state"])
            ex.run_pending()
            if on_message is not None:
                on_message()
        return run_id

    sci._pull_and_store_message = answering


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-supernode`` with ``argv`` (default ``sys.argv[1:]``) minus this launcher's own
    options: ``--poll-interval S`` (pulls every ``S`` seconds right after a message, default 0.05,
    then every :data:`BACKOFF` x the time since the last message, up to ``--idle-poll-interval I``
    seconds, default ``max(S, 0.2)``), ``--object-retry R`` (first retry of a message's objects that are not
    uploaded yet, default ``min(S, 0.02)``), and ``--warm`` (the warm executor process, see the
    module docstring) or ``--inline`` (answer in this process, :func:`_answer_inline`); both run
    the SuperNode with ``--isolation process``.

    Raises:
        SystemExit: an interval is outside ``[0.001, 3]`` seconds, or both ``--warm`` and ``--inline``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    cap = float(_take(args, "--poll-interval", "0.05") or 0.05)
    idle = float(_take(args, "--idle-poll-interval", str(max(cap, 0.2))) or max(cap, 0.2))
    retry = float(_take(args, "--object-retry", str(min(cap, 0.02))) or min(cap, 0.02))
    warm = _take(args, "--warm", None, has_value=False) is not None
    inline = _take(args, "--inline", None, has_value=False) is not None
    for name, v in (("--poll-interval", cap), ("--idle-poll-interval", idle), ("--object-retry", retry)):
        if not 0.001 <= v <= 3.0:
            raise SystemExit(f"{name} must be between 0.001 and 3 seconds, got {v}.")
    if warm and inline:
        raise SystemExit("give --warm (an executor process) or --inline (answer in the SuperNode), not both.")
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", str(max(cap, 0.01)))
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    import flwr.supernode.start_client_internal as sci
    from flwr.supernode.cli.flower_supernode import flower_supernode

    from hybridfl.runtime.flower.signing import reuse_signed_timestamps

    clock = _FastTime(cap, min(cap, 0.01), idle)
    sci.time = clock  # type: ignore[assignment]
    reuse_signed_timestamps()  # one signature a second, not one a request (signing.py)
    _share_object_pools()
    # first retry of a message's objects after `retry` seconds instead of 1 s (the SuperLink lists a
    # message before the ServerApp has uploaded its objects), doubling up to 1 s; no limit on the
    # number of tries (Flower's PULL_MAX_TIME still applies)
    sci.pull_objects = functools.partial(  # type: ignore[assignment]
        sci.pull_objects, initial_backoff=retry, backoff_cap=1.0, max_tries_per_object=None
    )
    if warm or inline:
        if "--isolation" in args:
            _take(args, "--isolation")
        args += ["--isolation", "process"]
    if inline:
        _answer_inline(sci, clock.touch, clock.pulling)
    elif warm:
        r, w = os.pipe()
        os.set_blocking(w, False)
        _announce_tasks(sci, w, clock.touch, clock.pulling)
        # the executor's poll interval: at most the SuperNode's, never below 0.01 s
        subprocess.Popen(executor_command(args, max(min(cap, 0.02), 0.01), r), pass_fds=(r,))
        os.close(r)
    else:
        _announce_tasks(sci, None, clock.touch, clock.pulling)
    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":
    main()
