"""``hybridfl.runtime.memory``: glibc keeps large freed buffers for reuse in an in-process run
(each test in a fresh interpreter: the settings are per process and stay once set)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.runtime import simulation

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

PROBE = """
import os
from hybridfl.runtime.memory import keep_freed_memory
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
ok = keep_freed_memory()
buf = bytearray(256 << 20)  # zero-filled, so every page is touched
held = rss()
del buf
print(ok, keep_freed_memory(), (held - rss()) >> 20)
"""


def _probe(setting: str | None) -> tuple[str, str, int]:
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDFL_MALLOC"}
    if setting is not None:
        env["HYBRIDFL_MALLOC"] = setting
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    ok, again, freed_mib = out.stdout.split()
    return ok, again, int(freed_mib)


def test_freed_large_buffers_stay_for_reuse_unless_opted_out():
    """With the settings a freed 256 MiB buffer stays in the process (the next one reuses its
    pages without faults); with ``HYBRIDFL_MALLOC=default`` glibc unmaps it at once."""
    ok, again, freed = _probe(None)
    assert (ok, again) == ("True", "True") and freed < 16, freed
    ok, again, freed = _probe("default")
    assert (ok, again) == ("False", "False") and freed > 200, freed


def test_an_in_process_run_applies_them_before_its_setup(tiny, monkeypatch):
    calls = []
    monkeypatch.setattr(simulation, "keep_freed_memory", lambda: calls.append("memory"))
    setup = simulation.Federation.setup
    monkeypatch.setattr(simulation.Federation, "setup", lambda self: calls.append("setup") or setup(self))
    split, part = tiny
    simulation.simulate("hyfdca", split, part, HyFDCAConfig(rounds=1, encryption="none", positive_classes=[1]))
    assert calls == ["memory", "setup"]
