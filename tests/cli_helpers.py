"""Helpers for tests that drive the ``hybridfl`` command line in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hybridfl.runtime.checkpoint import CHECKPOINT_NAME, load_checkpoint


def cli(*args: str) -> list[str]:
    """The command line of ``hybridfl <args>`` with this interpreter."""
    return [sys.executable, "-m", "hybridfl.cli.main", *args]


def kill_after(cmd: list[str], out: Path, after: int, timeout: float = 300) -> int:
    """Start ``cmd``, SIGKILL it (and its process group) once the checkpoint in ``out`` holds round
    ``>= after``; return the round the checkpoint holds. Fails if the run ends by itself first."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            ck = out / CHECKPOINT_NAME
            if ck.exists() and load_checkpoint(ck)[0] >= after:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be interrupted"
    return load_checkpoint(out / CHECKPOINT_NAME)[0]
