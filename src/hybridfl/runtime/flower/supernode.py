"""``python -m hybridfl.runtime.flower.supernode [--poll-interval S] [--warm] <flower-supernode args>``.

Flower 1.41's SuperNode sleeps a fixed 3 s whenever a pull from the SuperLink finds no message
(``flwr/supernode/start_client_internal.py``), waits 0.5 s between checks for the ClientApp's
reply, and waits 1 s before it first retries pulling a message's objects that the ServerApp has
not uploaded yet (``PULL_INITIAL_BACKOFF``); there is no option for any of them. This launcher runs
the stock ``flower-supernode`` with the idle sleep capped at ``--poll-interval`` seconds (default
0.1), the reply wait at 0.01 s (a check of its own memory, no request) and the first object
retry at ``--poll-interval`` (then backing off up to 1 s) and sets ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``
(Flower's own setting, default 1 s) for the SuperExec that starts the ClientApp processes. It
polls the SuperLink more often, which costs one small request per interval per node.

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


class _FastTime:
    """The ``time`` module with ``sleep`` capped: the SuperNode's 3 s idle sleep (its next pull
    from the SuperLink, over the network) at ``cap`` seconds, its shorter in-process waits (for the
    ClientApp's reply in its own state) at ``wait_cap`` seconds."""

    def __init__(self, cap: float, wait_cap: float | None = None):
        self.cap = cap
        self.wait_cap = cap if wait_cap is None else wait_cap

    def sleep(self, s: float) -> None:
        s = float(s)
        _time.sleep(min(s, self.cap if s >= 3.0 else self.wait_cap))

    def __getattr__(self, name: str):
        return getattr(_time, name)


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


def _announce_tasks(sci, fd: int) -> None:
    """Write a byte to ``fd`` whenever the SuperNode has stored a message pulled from the SuperLink
    (with its objects: its task can run now), so the executor need not poll for it."""
    pull_and_store = sci._pull_and_store_message

    @functools.wraps(pull_and_store)
    def announcing(*a, **kw):
        run_id = pull_and_store(*a, **kw)
        if run_id is not None:
            try:
                os.write(fd, b"!")
            except (BlockingIOError, BrokenPipeError):
                pass  # the pipe is full (the executor is behind, it will poll) or the executor is gone
        return run_id

    sci._pull_and_store_message = announcing


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-supernode`` with ``argv`` (default ``sys.argv[1:]``) minus ``--poll-interval S``
    and ``--warm``, its idle sleeps capped at ``S`` seconds (default 0.1); with ``--warm`` also the
    warm executor, and the SuperNode with ``--isolation process``.

    Raises:
        SystemExit: ``--poll-interval`` is outside ``[0.001, 3]`` seconds.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    cap = float(_take(args, "--poll-interval", "0.1") or 0.1)
    warm = _take(args, "--warm", None, has_value=False) is not None
    if not 0.001 <= cap <= 3.0:
        raise SystemExit(f"--poll-interval must be between 0.001 and 3 seconds, got {cap}.")
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", str(max(cap, 0.01)))
    os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    import flwr.supernode.start_client_internal as sci
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sci.time = _FastTime(cap, min(cap, 0.01))  # type: ignore[assignment]
    # first retry of a message's objects after `cap` seconds instead of 1 s, then up to 1 s apart;
    # no limit on the number of tries (Flower's PULL_MAX_TIME still applies)
    sci.pull_objects = functools.partial(  # type: ignore[assignment]
        sci.pull_objects, initial_backoff=cap, backoff_cap=1.0, max_tries_per_object=None
    )
    if warm:
        if "--isolation" in args:
            _take(args, "--isolation")
        args += ["--isolation", "process"]
        r, w = os.pipe()
        os.set_blocking(w, False)
        _announce_tasks(sci, w)
        # the executor's poll interval: at most the SuperNode's, never below 0.01 s
        subprocess.Popen(executor_command(args, max(min(cap, 0.02), 0.01), r), pass_fds=(r,))
        os.close(r)
    sys.argv = ["flower-supernode", *args]
    flower_supernode()


if __name__ == "__main__":
    main()
