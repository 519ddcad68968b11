"""Helpers for tests that drive the ``hybridfl`` command line in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hybridfl.runtime.checkpoint import CHECKPOINT_NAME, TEST_STOP_ENV, TEST_STOP_EXIT_CODE, load_checkpoint


def cli(*args: str) -> list[str]:
    """The command line of ``hybridfl <args>`` with this interpreter."""
    return [sys.executable, "-m", "hybridfl.cli.main", *args]


def cli_in_process(monkeypatch, capsys, *args: str) -> subprocess.CompletedProcess:
    """``hybridfl <args>`` run in this process through the CLI's entry point, returned as a completed process (exit status, stdout, stderr)
    so the same output checks apply: no new interpreter to start, whose imports (torch) are most of
    the seconds of a command that stops at a bad input. Tests that check the entry point itself
    (``python -m hybridfl.cli.main``: import-time output, the real exit status) keep :func:`cli`."""
    from hybridfl.cli import main as cli_main

    monkeypatch.setattr(sys, "argv", ["hybridfl", *args])
    code = 0
    try:
        cli_main.main()
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["hybridfl", *args], code, out.out, out.err)


def stop_after(cmd: list[str], out: Path, rnd: int, timeout: float = 600) -> int:
    """Run ``cmd`` with the test-only ``HYBRIDFL_TEST_STOP_AFTER_ROUND=rnd``: the run ends its
    process right after writing the checkpoint of round ``rnd`` in ``out`` (no results), at that
    round exactly, not when a timer fires. Return the round the checkpoint holds. Fails if the run
    ended any other way (finished before round ``rnd``, or an error)."""
    env = {**os.environ, TEST_STOP_ENV: str(rnd)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == TEST_STOP_EXIT_CODE, f"the run was not stopped (exit {proc.returncode}): {proc.stderr}"
    return load_checkpoint(out / CHECKPOINT_NAME)[0]
