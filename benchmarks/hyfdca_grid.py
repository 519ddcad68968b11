"""HyFDCA on a large grid (issue 17: "HyFDCA with a 10 x 10 grid (100 clients) on MNIST binary
completes; time per round reported").

MNIST binary (digits 0-4 -> -1, 5-9 -> +1; all 60,000 training rows x 784 pixels in [0, 1], 49
tiles of 4 x 4), hinge loss, lambda = 1e-3 (the settings of ``examples/configs/hyfdca_mnist.yaml``
and ``python -m benchmarks.hyfdca bench``), partitioned by :class:`~hybridfl.data.partitioners.GridPartitioner`
into ``S`` sample groups x ``F`` block groups, one client per cell (HyFDCA Fig. 2; default 10 x 10
= 100 clients, each 6,000 samples x 4-5 tiles), against the same mode on a 3 x 3 grid (9 clients).

Every setting runs in its own subprocess (so its peak RSS, ``ru_maxrss``, is its own) through
:func:`~hybridfl.algorithms.hyfdca.run_hyfdca`, i.e. :func:`~hybridfl.runtime.simulation.simulate`,
the path ``hybridfl run`` takes: the 100 simulated clients run one after another in that process.
Per setting: setup and per-round CPU and wall seconds (taken around ``HyFDCAServer.setup`` and
``HyFDCAServer.run_round``, so the evaluation is excluded), messages, bytes and exchanges per round
and of the setup, the server's and the slowest client's seconds per round (the protocol's own
timers), peak RSS, relative suboptimality ``(P(w) - P*) / P*`` per evaluated round against the
centralised optimum ``P*`` (the run's monitor: :func:`~hybridfl.algorithms.convex.reference.reference_optimum`,
liblinear, cached; the grid partition holds every (sample, block) cell, so ``P*`` is the same for
every grid), and the load average before and after.

Settings (``--only`` picks some; results are merged into the existing JSON):

- ``block_SxF``, ``block_3x3``: ``dual_mode: block`` (the paper's protocol, the library default,
  CoCoA+ ``sigma'`` = number of clients), plaintext (``encryption: none``);
- ``segment_SxF``, ``segment_3x3``: ``dual_mode: segment``, ``segment_schedule: sequential``,
  ``batch_size: 128`` (the example's mode), plaintext;
- ``block_long_SxF``: block mode, plaintext, ``--long-rounds`` rounds evaluated every 10 (not
  run by default; 200 rounds about 25 minutes);
- ``ckks_block_SxF``, ``ckks_block_3x3``: block mode with ``encryption: ckks`` (degree 8192 in the committed runs; 4096 now) for
  ``--ckks-rounds`` rounds;
- ``ckks_segment_SxF``, ``ckks_segment_3x3``: segment mode with CKKS, not run by default
  (``--only``; at 10 x 10 its setup moves 2.6 GB and peaks at 4.2 GB RSS);
  ``ckks_segment_masked_SxF``, ``ckks_segment_masked_3x3``: the same with
  ``segment_inner_products: masked`` (the inner products and batch Gram matrices padded instead
  of encrypted, the duals under CKKS);
- ``profile_block_SxF``, ``profile_block_3x3``: 3 plaintext block-mode rounds under cProfile (no
  evaluation): the functions with the most own time per round;
- ``cli_SxF``: ``hybridfl run`` of ``examples/configs/hyfdca_mnist.yaml`` itself (CKKS, segment
  mode, secure aggregation) with the S x F grid, ``alignment: plaintext`` and 2 rounds, in a fresh
  process: exit status, whole-process wall and CPU seconds, peak RSS, its ``results.json``;
- ``psi_SxF_n<n>``: setup (and one round) with ``alignment: psi`` on a random subsample of
  ``n = --psi-samples`` training rows (the full set would need 4,950 pairwise intersections of
  6,000 IDs each), pinned to one core so the PSI uses one worker process; ``psi_plain_SxF_n<n>``:
  the same subsample with ``alignment: plaintext``.

All runs but ``psi_*``: ``alignment: plaintext`` (the paper's setting; the default ``psi`` gives the
same segments and rounds and costs setup time only, ``python -m benchmarks.privacy_cost hyfdca-psi``, and at 100 clients
that setup would dominate), secure aggregation on (the default, as in the example), full
participation, ``average_last: 0`` (the last iterate), seed 0.

Run (single-threaded, one setting at a time; the default set about 25 minutes at load 5, the
others about 20 minutes together)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid --rounds 50
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid \\
        --only ckks_segment_10x10,ckks_segment_3x3,ckks_segment_masked_10x10,ckks_segment_masked_3x3 --ckks-rounds 2
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid \\
        --only profile_block_10x10,profile_block_3x3,cli_10x10
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid \\
        --only block_long_10x10 --long-rounds 200 --timeout 3000
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid \\
        --only psi_10x10_n1000,psi_plain_10x10_n1000 --psi-samples 1000
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid \\
        --only psi_10x10_n3000 --psi-samples 3000 --timeout 2400
    .venv/bin/python -m benchmarks.hyfdca_grid --report-only     # rewrite the .md from the .json

Writes ``benchmarks/results/hyfdca_grid.json`` and ``hyfdca_grid.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from benchmarks import harness
from benchmarks.harness import dispatch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results"
LAM = 1e-3
POSITIVE = [5, 6, 7, 8, 9]
SEGMENT = {"dual_mode": "segment", "segment_schedule": "sequential", "batch_size": 128}
HISTORY_KEYS = (
    "round",
    "relative_suboptimality",
    "duality_gap",
    "accuracy",
    "bytes",
    "messages",
    "exchanges",
    "server_seconds",
    "client_max_seconds",
    "encryption_seconds",
    "model_seconds",
)


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine."""
    return [round(x, 2) for x in os.getloadavg()]


def settings(s: int, f: int, rounds: int, ckks_rounds: int, psi_samples: int, long_rounds: int) -> dict[str, dict]:
    """The named settings: ``grid`` ``[S, F]``, ``hyfdca`` (config fields on top of the common ones
    set in :func:`child`), ``rounds``, and the kind flags ``psi``, ``profile``, ``cli``, ``default``."""
    g = f"{s}x{f}"
    out: dict[str, dict] = {}
    for grid in (g, "3x3"):
        gs, gf = (int(v) for v in grid.split("x"))
        base = {"grid": [gs, gf]}
        out[f"block_{grid}"] = {**base, "hyfdca": {"dual_mode": "block"}, "rounds": rounds}
        out[f"segment_{grid}"] = {**base, "hyfdca": dict(SEGMENT), "rounds": rounds}
        out[f"ckks_block_{grid}"] = {
            **base,
            "hyfdca": {"dual_mode": "block", "encryption": "ckks"},
            "rounds": ckks_rounds,
        }
        out[f"ckks_segment_{grid}"] = {
            **base,
            "hyfdca": {**SEGMENT, "encryption": "ckks"},
            "rounds": ckks_rounds,
            "default": False,
        }
        out[f"ckks_segment_masked_{grid}"] = {
            **base,
            "hyfdca": {**SEGMENT, "encryption": "ckks", "segment_inner_products": "masked"},
            "rounds": ckks_rounds,
            "default": False,
        }
    out[f"block_long_{g}"] = {
        "grid": [s, f],
        "hyfdca": {"dual_mode": "block", "eval_every": 10},
        "rounds": long_rounds,
        "default": False,
    }
    out[f"cli_{g}"] = {"grid": [s, f], "rounds": 2, "cli": True, "hyfdca": {"alignment": "plaintext"}, "default": False}
    psi = {"grid": [s, f], "rounds": 1, "psi": True, "default": False}
    for grid in (g, "3x3"):
        out[f"profile_block_{grid}"] = {
            "grid": [int(v) for v in grid.split("x")],
            "hyfdca": {"dual_mode": "block", "eval_every": 0, "reference": False},
            "rounds": 3,
            "profile": True,
            "default": False,
        }
    out[f"psi_{g}_n{psi_samples}"] = {**psi, "hyfdca": {"alignment": "psi"}}
    out[f"psi_plain_{g}_n{psi_samples}"] = {**psi, "hyfdca": {}}
    return out


# ---------------------------------------------------------------- child: one setting, one process


def _cpu_with_children() -> float:
    """CPU seconds (user + system) of this process and its finished children (PSI workers)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def source_state() -> dict:
    """The library source this process runs: git HEAD, the ``src/`` files differing from it
    (``git diff``) and a SHA-256 of every ``src/hybridfl`` Python file (other sessions edit ``src/``
    while benchmarks run, so each result says which source it measured)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted((ROOT / "src" / "hybridfl").rglob("*.py")):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {
        "git_head": git("rev-parse", "--short", "HEAD"),
        "src_uncommitted": [x for x in git("diff", "--name-only", "HEAD", "--", "src").splitlines() if x],
        "src_sha256": h.hexdigest()[:16],
    }


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


@contextmanager
def profiled_rounds(out: dict, top: int = 12):
    """cProfile ``HyFDCAServer.run_round`` (setup and evaluation excluded); on exit ``out`` holds
    the ``top`` functions by own time: seconds per round and share of the profiled time."""
    import cProfile
    import pstats

    from hybridfl.algorithms.hyfdca import HyFDCAServer

    prof, run_round, n = cProfile.Profile(), HyFDCAServer.run_round, [0]

    def profiled(self, *a, **k):
        n[0] += 1
        prof.enable()
        try:
            return run_round(self, *a, **k)
        finally:
            prof.disable()

    HyFDCAServer.run_round = profiled
    try:
        yield
    finally:
        HyFDCAServer.run_round = run_round
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    total = sum(v[2] for v in stats.values())
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    out["profile"] = {
        "rounds": n[0],
        "profiled_seconds_per_round": total / n[0],
        "top_own_time": [
            {
                "function": f"{Path(f).parent.name}/{Path(f).name}:{name}",
                "calls_per_round": v[0] / n[0],
                "seconds_per_round": v[2] / n[0],
                "share": v[2] / total,
            }
            for (f, _, name), v in rows
        ],
    }


def cli_child(spec: dict) -> dict:
    """``hybridfl run`` of ``examples/configs/hyfdca_mnist.yaml`` (CKKS, segment mode, secure
    aggregation) with the grid ``spec["grid"]``, ``spec["rounds"]`` rounds and the fields
    ``spec["hyfdca"]`` on top, in a subprocess of this one (so ``RUSAGE_CHILDREN`` is its alone):
    return code, wall and CPU seconds, peak RSS and the run's ``results.json`` headline numbers."""
    import yaml

    cfg = yaml.safe_load((ROOT / "examples" / "configs" / "hyfdca_mnist.yaml").read_text())
    cfg["dataset"]["data_dir"] = str(DATA / "mnist")
    cfg["partition"].update(sample_groups=spec["grid"][0], block_groups=spec["grid"][1])
    cfg["algorithm"].update(rounds=spec["rounds"], eval_every=spec["rounds"], **spec["hyfdca"])
    out: dict = {"load_average_start": load(), "config": cfg, "source": source_state()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        cmd = [str(Path(sys.executable).parent / "hybridfl"), "run", "--config", str(path), "--out", f"{tmp}/run", "-q"]
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.update(
            returncode=p.returncode,
            wall_seconds=time.perf_counter() - t,
            cpu_seconds=ch.ru_utime + ch.ru_stime,
            peak_rss_mb=ch.ru_maxrss / 1024,
            stderr_tail=p.stderr[-2000:],
            load_average_end=load(),
        )
        res = Path(tmp) / "run" / "results.json"
        if res.exists():
            sm = json.loads(res.read_text())
            sm = sm.get("summary", sm)
            out["results"] = {
                k: sm[k]
                for k in (
                    "rounds",
                    "clients",
                    "messages_total",
                    "bytes_total",
                    "round_seconds_mean",
                    "wall_seconds",
                    "relative_suboptimality",
                    "accuracy",
                )
                if k in sm
            }
    return out


def child(spec: dict, eval_every: int, psi_samples: int) -> dict:
    """Run one setting in this process and return its measurements."""
    if spec.get("cli"):
        return cli_child(spec)
    if spec.get("psi"):  # one core: the PSI steps then use one worker process (psi.default_workers)
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import numpy as np

    from benchmarks.hyfdca_speed import timed_server  # the same timer; this grid counts child processes' CPU too
    from hybridfl.algorithms.hyfdca import HyFDCAConfig, run_hyfdca
    from hybridfl.data import load_mnist
    from hybridfl.data.dataset import DatasetSplit
    from hybridfl.data.partitioners import GridPartitioner
    from hybridfl.runtime.simulation import single_threaded

    out: dict = {"load_average_start": load(), "source": source_state()}
    with single_threaded():
        split = harness.shrink(load_mnist(DATA / "mnist", layout="tiles", tiles=7, flatten=True))
        if spec.get("psi"):
            rows = np.sort(np.random.default_rng(0).choice(split.train.n_samples, psi_samples, replace=False))
            split = DatasetSplit(split.train.take(rows), split.test)
        s, f = spec["grid"]
        part = GridPartitioner(s, f, 1, 0).partition(split.train)
        fields = {
            "lam": LAM,
            "loss": "hinge",
            "fit_intercept": False,  # the paper's problem: the committed numbers are without an intercept
            "positive_classes": POSITIVE,
            "rounds": spec["rounds"],
            "alignment": "plaintext",
            "participation": 1.0,
            "output": "last",
            "encryption": "none",
            "segment_inner_products": "encrypted",
            "eval_every": 0 if spec.get("psi") else eval_every,
            "reference": not spec.get("psi"),
            **spec["hyfdca"],
        }
        cfg = HyFDCAConfig(**fields)
        out["config"] = cfg.model_dump(mode="json")
        out["clients"] = len(part.clients)
        out["samples"] = int(split.train.n_samples)
        out["peak_rss_mb_after_data"] = _peak_rss_mb()
        times: dict = {"setup": None, "rounds": []}
        w0, c0 = time.perf_counter(), _cpu_with_children()
        with (
            timed_server(times, cpu=_cpu_with_children),
            profiled_rounds(out) if spec.get("profile") else nullcontext(),
        ):
            res = run_hyfdca(split, part, cfg, seed=0)
        out["run_wall_seconds"] = time.perf_counter() - w0
        out["run_cpu_seconds"] = _cpu_with_children() - c0
    sm, hist = res.summary, res.history
    rw = np.array([t[0] for t in times["rounds"]])
    rc = np.array([t[1] for t in times["rounds"]])
    out.update(
        peak_rss_mb=_peak_rss_mb(),
        psi_workers=len(os.sched_getaffinity(0)) if spec.get("psi") else None,
        setup_wall_seconds=times["setup"][0],
        setup_cpu_seconds=times["setup"][1],
        setup_messages=int(sm["messages_total"] - sum(h["messages"] for h in hist)),
        setup_bytes=int(sm["bytes_total"] - sum(h["bytes"] for h in hist)),
        setup_exchanges=int(sm["setup"]["exchanges"]),
        setup_server_seconds=float(sm["setup"]["server_seconds"]),
        round_wall_seconds=rw.tolist(),
        round_cpu_seconds=rc.tolist(),
        round_wall_seconds_mean=float(rw.mean()),
        round_cpu_seconds_mean=float(rc.mean()),
        messages_per_round=float(np.mean([h["messages"] for h in hist])),
        bytes_per_round=float(np.mean([h["bytes"] for h in hist])),
        exchanges_per_round=float(np.mean([h["exchanges"] for h in hist])),
        server_seconds_per_round=float(np.mean([h["server_seconds"] for h in hist])),
        client_max_seconds_per_round=float(np.mean([h["client_max_seconds"] for h in hist])),
        encryption_seconds_per_round=float(np.mean([h["encryption_seconds"] for h in hist])),
        sigma=sm.get("sigma"),
        history=[{k: h[k] for k in HISTORY_KEYS if k in h} for h in hist],
        load_average_end=load(),
    )
    for k in ("reference_objective", "reference_solver", "relative_suboptimality", "duality_gap", "accuracy"):
        if k in sm:
            out[k] = sm[k]
    return out


# ---------------------------------------------------------------- parent: one subprocess per setting


def run_setting(name: str, spec: dict, a: argparse.Namespace) -> dict:
    """``spec`` in a fresh interpreter (same environment); its result, or the failure."""
    with tempfile.TemporaryDirectory() as tmp:
        res = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.hyfdca_grid",
            "--child",
            json.dumps(spec),
            "--child-out",
            str(res),
            "--eval-every",
            str(a.eval_every),
            "--psi-samples",
            str(a.psi_samples),
        ]
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"status": "timed out", "timeout_seconds": a.timeout, "load_average": load()}
        wall = time.perf_counter() - t
        if p.returncode != 0 or not res.exists():
            return {
                "status": "failed",
                "returncode": p.returncode,
                "stderr_tail": p.stderr[-3000:],
                "wall_seconds": wall,
                "load_average": load(),
            }
        out = json.loads(res.read_text())
    out["status"] = "ok" if out.get("returncode", 0) == 0 else "failed"
    out["process_wall_seconds"] = wall
    return out


def run_main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample-groups", type=int, default=10, help="S of the large grid")
    ap.add_argument("--block-groups", type=int, default=10, help="F of the large grid (at most 49 tiles)")
    ap.add_argument("--rounds", type=int, default=50, help="plaintext rounds per setting")
    ap.add_argument("--ckks-rounds", type=int, default=3)
    ap.add_argument("--long-rounds", type=int, default=200, help="rounds of block_long_SxF (evaluated every 10)")
    ap.add_argument("--eval-every", type=int, default=1, help="evaluate every this many rounds (outside the timing)")
    ap.add_argument("--psi-samples", type=int, default=1000, help="training rows of the psi_* settings")
    ap.add_argument("--only", type=str, default=None, help="comma-separated setting names (default: the default set)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per setting before it is stopped")
    ap.add_argument("--report-only", action="store_true", help="rewrite the .md from the .json, run nothing")
    ap.add_argument("--child", type=str, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=str, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        Path(a.child_out).write_text(json.dumps(child(json.loads(a.child), a.eval_every, a.psi_samples), default=float))
        return
    path = OUT / "hyfdca_grid.json"
    results = json.loads(path.read_text()) if path.exists() else {"settings": {}}
    if not a.report_only:
        every = settings(a.sample_groups, a.block_groups, a.rounds, a.ckks_rounds, a.psi_samples, a.long_rounds)
        names = a.only.split(",") if a.only else [n for n, v in every.items() if v.get("default", True)]
        unknown = [n for n in names if n not in every]
        if unknown:
            raise SystemExit(f"unknown settings {unknown}; known: {list(every)}")
        for name in names:
            spec = {k: v for k, v in every[name].items() if k != "default"}
            print(time.strftime("%H:%M:%S"), name, "...", flush=True)
            r = run_setting(name, spec, a)
            r["command"] = (
                "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid "
                f"--sample-groups {a.sample_groups} --block-groups {a.block_groups} --rounds {a.rounds} "
                f"--ckks-rounds {a.ckks_rounds} --long-rounds {a.long_rounds} --eval-every {a.eval_every} "
                f"--psi-samples {a.psi_samples} "
                f"--only {name}"
            )
            results["settings"][name] = r
            print(
                name,
                json.dumps({k: v for k, v in r.items() if k not in ("history", "config", "round_wall_seconds")})[:1500],
                flush=True,
            )
            results["cpu_count"] = os.cpu_count()
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=1, default=float))  # after every setting
    (OUT / "hyfdca_grid.md").write_text(report(results))
    print(report(results))


# ---------------------------------------------------------------- report


def _rel(r: dict, rnd: int) -> str:
    for h in r.get("history", []):
        if h["round"] == rnd and "relative_suboptimality" in h:
            return f"{h['relative_suboptimality']:.2e}"
    return "-"


def _median_last(r: dict, key: str, n: int = 10) -> str:
    """Median of ``key`` over the last ``n`` evaluated rounds (the last iterate of SDCA on the
    hinge loss fluctuates from round to round; the median is steadier)."""
    import statistics

    v = [h[key] for h in r.get("history", []) if key in h][-n:]
    return f"{statistics.median(v):.2e}" if len(v) >= n else "-"


ORDER = ("block", "block_long", "segment", "ckks_block", "ckks_segment", "ckks_segment_masked")


def report(res: dict) -> str:
    st = res["settings"]
    lines = [
        "# HyFDCA on a 10 x 10 grid (100 clients), MNIST binary (issue 17)",
        "",
        "Written by `python -m benchmarks.hyfdca_grid` (commands per row in `hyfdca_grid.json`). MNIST 0-4 vs 5-9, "
        "60,000 x 784, 49 tiles, hinge, lambda = 1e-3; `alignment: plaintext` (the paper's setting: "
        "PSI alignment at 100 clients would dominate the setup, see below), secure aggregation on (default), "
        "full participation, last iterate. Each setting in its own single-threaded process, the clients "
        "simulated one after another in it (a round's CPU is the sum over all clients and the server). "
        f"{res.get('cpu_count', 2)} cores shared with other sessions: wall times are inflated by the load "
        "(1-min load average before/after each run in the table), CPU times much less.",
        "",
        "| setting | clients | sigma' | setup CPU s (wall) | round CPU s | round wall s | server s / round | "
        "slowest client s / round | messages / round | MB / round | exchanges / round | setup MB | "
        "peak RSS MB | rel. subopt. round 1 / 3 / 10 / last (round) | median rel. subopt. (duality gap) of the "
        "last 10 evaluations | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = [n for p in ORDER for n in sorted(st) if n.rsplit("_", 1)[0] == p]
    for n in names:
        r = st[n]
        if r.get("status") != "ok":
            lines.append(f"| {n} | **{r.get('status')}**: see `hyfdca_grid.json` |" + " |" * 14)
            continue
        last = r["history"][-1]["round"] if r["history"] else 0
        lines.append(
            f"| {n} | {r['clients']} | {r['sigma']:g} | {r['setup_cpu_seconds']:.2f} ({r['setup_wall_seconds']:.2f}) | "
            f"{r['round_cpu_seconds_mean']:.3f} | {r['round_wall_seconds_mean']:.3f} | "
            f"{r['server_seconds_per_round']:.3f} | {r['client_max_seconds_per_round']:.3f} | "
            f"{r['messages_per_round']:.0f} | {r['bytes_per_round'] / 1e6:.2f} | {r['exchanges_per_round']:.0f} | "
            f"{r['setup_bytes'] / 1e6:.1f} | {r['peak_rss_mb']:.0f} | "
            f"{_rel(r, 1)} / {_rel(r, 3)} / {_rel(r, 10)} / {_rel(r, last)} ({last}) | "
            f"{_median_last(r, 'relative_suboptimality')} ({_median_last(r, 'duality_gap')}) | "
            f"{r['load_average_start'][0]:.1f}/{r['load_average_end'][0]:.1f} |"
        )
    lines += [
        "",
        "Round times are taken around `HyFDCAServer.run_round` (the evaluation excluded), means over the rounds "
        "run (the last round in brackets in the suboptimality column). `server s / round`: the round's wall time minus the clients' own "
        "seconds (server work and the in-process transport; load-sensitive). `slowest client s / round`: per "
        "exchange the slowest reply's own seconds, summed over the exchanges (the clients' critical path if they "
        "ran in parallel). Relative suboptimality `(P(w) - P*) / P*` of the server's model (last iterate), "
        "`P*` the liblinear optimum; `-`: that round was not run.",
    ]
    psi = {n: st[n] for n in sorted(st) if n.startswith("psi_") and st[n].get("status") == "ok"}
    if psi:
        lines += [
            "",
            "**Setup with PSI alignment** (setup only, on a random subsample of the training rows, one core, "
            "one PSI worker process; CPU includes the worker):",
            "",
            "| setting | clients | samples | setup CPU s | setup wall s | setup MB | setup messages | load |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n, r in psi.items():
            lines.append(
                f"| {n} ({r['config']['alignment']}) | {r['clients']} | {r['samples']} | {r['setup_cpu_seconds']:.1f} | "
                f"{r['setup_wall_seconds']:.1f} | {r['setup_bytes'] / 1e6:.1f} | {r['setup_messages']} | "
                f"{r['load_average_start'][0]:.1f}/{r['load_average_end'][0]:.1f} |"
            )
    for n, r in sorted(st.items()):
        if "profile" not in r or r.get("status") != "ok":
            continue
        pr = r["profile"]
        lines += [
            "",
            f"**Profile of {n}** ({r['clients']} clients, {pr['rounds']} rounds under cProfile, "
            f"{pr['profiled_seconds_per_round']:.2f} profiled s per round; profiling slows every Python call, "
            "so read the shares): the functions with the most own time",
            "",
            "| function | calls / round | own s / round | share |",
            "|---|---|---|---|",
            *[
                f"| `{t['function']}` | {t['calls_per_round']:.0f} | {t['seconds_per_round']:.3f} | "
                f"{100 * t['share']:.1f} % |"
                for t in pr["top_own_time"]
            ],
        ]
    for n, r in sorted(st.items()):
        if n.startswith("cli_") and r.get("status") == "ok":
            res = r.get("results", {})
            lines += [
                "",
                f"**Through the CLI** (`{n}`): `hybridfl run` of `examples/configs/hyfdca_mnist.yaml` (CKKS, segment "
                f"mode, secure aggregation) with `partition: {{kind: grid, sample_groups: {r['config']['partition']['sample_groups']}, "
                f"block_groups: {r['config']['partition']['block_groups']}}}`, `alignment: plaintext`, "
                f"{r['config']['algorithm']['rounds']} rounds: exit status {r['returncode']}, "
                f"{res.get('clients', '?')} clients, {r['wall_seconds']:.0f} s wall and {r['cpu_seconds']:.0f} s CPU for "
                f"the whole process (start-up, data, setup, rounds, evaluation, checkpoint, files), mean round "
                f"{res.get('round_seconds_mean', float('nan')):.1f} s wall, peak RSS {r['peak_rss_mb']:.0f} MB, "
                f"relative suboptimality {res.get('relative_suboptimality', float('nan')):.2e} after the last round "
                f"(load {r['load_average_start'][0]:.1f}/{r['load_average_end'][0]:.1f}).",
            ]
    lines += ckks_check(st)
    lines += scaling(st)
    lines += sources(st)
    lines += psi_extrapolation(st)
    lines += ["", *reading(st)]
    return "\n".join(lines) + "\n"


def ckks_check(st: dict) -> list[str]:
    """CKKS against plaintext, same grid and mode: relative suboptimality at the same rounds."""
    out = []
    for n, r in sorted(st.items()):
        # the plaintext run of the same grid and mode (masked CKKS segment: plaintext segment mode)
        p = st.get(n.removeprefix("ckks_").replace("segment_masked_", "segment_"), {})
        if not n.startswith("ckks_") or r.get("status") != "ok" or p.get("status") != "ok":
            continue
        plain = {h["round"]: h["relative_suboptimality"] for h in p["history"] if "relative_suboptimality" in h}
        diffs = [
            abs(h["relative_suboptimality"] - plain[h["round"]]) / plain[h["round"]]
            for h in r["history"]
            if "relative_suboptimality" in h and h["round"] in plain
        ]
        if diffs:
            out.append(
                f"{n}: round CPU {r['round_cpu_seconds_mean'] / p['round_cpu_seconds_mean']:.1f}x plaintext "
                f"({r['round_wall_seconds_mean'] / p['round_wall_seconds_mean']:.1f}x wall), bytes per round "
                f"{r['bytes_per_round'] / p['bytes_per_round']:.1f}x; relative suboptimality of rounds 1-{len(diffs)} "
                f"within {max(diffs):.0e} (relative) of the plaintext run's."
            )
    return ["", "**CKKS against plaintext** (same grid, mode and seed):", "", *[f"- {x}" for x in out]] if out else []


def sources(st: dict) -> list[str]:
    """Which library source each setting measured (:func:`source_state`)."""
    groups: dict[str, list[str]] = {}
    for n, r in sorted(st.items()):
        src = r.get("source")
        key = (
            f"HEAD {src['git_head']} + uncommitted {', '.join(src['src_uncommitted']) or 'nothing'} "
            f"(src sha256 {src['src_sha256']})"
            if src
            else "not recorded (run before the script recorded it)"
        )
        groups.setdefault(key, []).append(n)
    note = (
        "The runs without a record ran on earlier states of `src/` (HEAD 6dcf54c to 57d0dad, with uncommitted "
        "edits by other sessions). By `git diff` / `git show`, what changed in that window is the dataset's ID "
        "lookups and the partition's validation (4150dac, results bit-identical by its tests), segment mode's "
        "setup (packed Gram vectors), the CKKS backend and the clients' acceptance of an encrypted `alpha`: "
        "none of it is in plaintext block mode's rounds or in the PSI alignment."
    )
    return (
        ["", "**Source measured** (`src/` is edited by other sessions meanwhile):", ""]
        + [f"- {k}: {', '.join(v)}" for k, v in groups.items()]
        + (["", note] if any(k.startswith("not recorded") for k in groups) else [])
    )


def scaling(st: dict) -> list[str]:
    """Ratios large grid / 3 x 3 grid of the same mode (both runs ok)."""
    keys = (
        ("clients", "clients"),
        ("round_cpu_seconds_mean", "round CPU"),
        ("server_seconds_per_round", "server s / round"),
        ("client_max_seconds_per_round", "slowest client s / round"),
        ("messages_per_round", "messages / round"),
        ("bytes_per_round", "bytes / round"),
        ("exchanges_per_round", "exchanges / round"),
        ("setup_bytes", "setup bytes"),
        ("setup_cpu_seconds", "setup CPU"),
        ("peak_rss_mb", "peak RSS"),
    )
    rows = []
    for mode in ORDER:
        small = st.get(f"{mode}_3x3", {})
        for n, big in sorted(st.items()):
            if n.rsplit("_", 1)[0] != mode or n.endswith("_3x3"):
                continue
            if big.get("status") != "ok" or small.get("status") != "ok":
                continue
            rows.append(
                f"| {n} / {mode}_3x3 | "
                + " | ".join(f"{big[k] / small[k]:.2f}" if small[k] else "-" for k, _ in keys)
                + " |"
            )
    if not rows:
        return []
    return [
        "",
        "**Large grid / 3 x 3 grid**, same mode (ratios of the table's numbers):",
        "",
        "| | " + " | ".join(label for _, label in keys) + " |",
        "|---|" + "---|" * len(keys),
        *rows,
    ]


def psi_extrapolation(st: dict, full: int = 60_000) -> list[str]:
    """Least-squares line ``a + b n`` through the ``psi_*`` runs' setup CPU seconds and bytes
    (``n`` training rows), evaluated at ``full`` rows: an extrapolation, not a run."""
    runs = sorted(
        (
            r
            for n, r in st.items()
            if n.startswith("psi_") and r.get("status") == "ok" and r["config"]["alignment"] == "psi"
        ),
        key=lambda r: r["samples"],
    )
    if len({r["samples"] for r in runs}) < 2:
        return []
    import numpy as np

    n = np.array([r["samples"] for r in runs], dtype=float)
    fit = {}
    for key in ("setup_cpu_seconds", "setup_bytes"):
        b, a = np.polyfit(n, [r[key] for r in runs], 1)
        fit[key] = (a, b, a + b * full)
    c, by = fit["setup_cpu_seconds"], fit["setup_bytes"]
    return [
        "",
        f"PSI setup against the rows ({', '.join(str(int(v)) for v in n)}): CPU = {c[0]:.1f} s + "
        f"{1e3 * c[1]:.1f} ms per row, bytes = {by[0] / 1e6:.1f} MB + {by[1] / 1e3:.1f} kB per row; "
        f"**extrapolated (not run) to all {full:,} rows: {c[2] / 3600:.1f} h CPU and {by[2] / 1e9:.1f} GB "
        "relayed by the server**, against under 1 s and a few MB with `alignment: plaintext`.",
    ]


def _num(st: dict, name: str, key: str, fmt: str = ".2f") -> str:
    r = st.get(name, {})
    return format(r[key], fmt) if r.get("status") == "ok" and key in r else "?"


def _mb(st: dict, name: str, key: str) -> str:
    r = st.get(name, {})
    return f"{r[key] / 1e6:,.0f} MB" if r.get("status") == "ok" and key in r else "?"


def _ratio(st: dict, big: str, small: str, key: str) -> str:
    a, b = st.get(big, {}), st.get(small, {})
    if a.get("status") != "ok" or b.get("status") != "ok" or not b.get(key):
        return "?"
    return f"{a[key] / b[key]:.1f}x"


def reading(st: dict) -> list[str]:
    """The reading under the tables: what scales with the number of clients and why (the numbers
    are filled in from ``st``; the mechanisms are the protocol's, :mod:`hybridfl.algorithms.hyfdca`)."""
    big = next((n.split("_", 1)[1] for n in sorted(st) if n.startswith("block_") and not n.endswith("_3x3")), "10x10")
    b, s3, bl = f"block_{big}", "block_3x3", f"block_long_{big}"
    g, g3 = f"segment_{big}", "segment_3x3"
    cb, cs = f"ckks_block_{big}", f"ckks_segment_{big}"
    prof = st.get(f"profile_block_{big}", {}).get("profile", {}).get("top_own_time", [])
    prof3 = st.get("profile_block_3x3", {}).get("profile", {}).get("top_own_time", [])

    rss = sorted(
        r["peak_rss_mb"] for n, r in st.items() if r.get("status") == "ok" and n.rsplit("_", 1)[0] in ORDER
    ) or [float("nan")]

    def calls(rows: list, fn: str) -> str:
        return next((f"{t['calls_per_round']:,.0f}" for t in rows if t["function"].endswith(fn)), "?")

    return [
        "## Reading",
        "",
        f"**It completes.** The {big} grid ({_num(st, b, 'clients', 'd')} clients, 6,000 samples x 4-5 tiles each) "
        "runs in block and segment mode, plaintext and CKKS, in process and through `hybridfl run` (below), with "
        f"no error and no check rejecting anything; nothing in `src/` needed changing. Time per round (CPU of all clients and the server in one process): block "
        f"{_num(st, b, 'round_cpu_seconds_mean')} s, segment {_num(st, g, 'round_cpu_seconds_mean')} s, CKKS block "
        f"{_num(st, cb, 'round_cpu_seconds_mean')} s, CKKS segment {_num(st, cs, 'round_cpu_seconds_mean')} s "
        "(wall times in the table). CKKS gives the plaintext run's numbers (list above).",
        "",
        "**What grows with the clients, and why** (grid of S sample groups x F block groups, K = S F clients, "
        "N samples, d features):",
        "",
        "- *Messages per round* = 2 x clients asked x exchanges. Block mode asks every client in each of its 3 "
        f"exchanges: 6K messages ({_ratio(st, b, s3, 'messages_per_round')}, as the clients). Segment mode "
        "(sequential) has one exchange per mini-batch of each segment plus 2 per segment (about N / b + 2S, "
        f"nearly the same for both grids: {_num(st, g, 'exchanges_per_round', '.0f')} vs "
        f"{_num(st, g3, 'exchanges_per_round', '.0f')}), each with the F holders of the segment: messages grow as F "
        f"({_ratio(st, g, g3, 'messages_per_round')}).",
        "- *Bytes per round* grow as F N + S d, not as K: each per-sample vector (inner-product shares, summed "
        "inner products, dual changes) travels once per holder of the sample (F times), `w` and the primal shares "
        f"once per (sample group, feature): {_ratio(st, b, s3, 'bytes_per_round')} (block) and "
        f"{_ratio(st, g, g3, 'bytes_per_round')} (segment) for F going 3 -> 10. CKKS adds padding: a client's "
        "per-segment vector takes ceil(n / 4096) ciphertexts (6,000 values: 2 ciphertexts, 73 % full; 20,000: 5, "
        f"98 %), so CKKS block bytes grow {_ratio(st, cb, 'ckks_block_3x3', 'bytes_per_round')}; in segment mode "
        "each 128-value batch fills 3 % of a ciphertext, whence 61x the plaintext bytes on any grid.",
        "- *Round CPU* (clients simulated one after another): the local SDCA does one coordinate step per "
        "(client, sample): each sample is stepped by each of its F holders on its own block (block mode), or the "
        "F holders of a segment repeat the same exact batch steps (segment mode). That is F N steps per round "
        f"(`coordinate_step` calls in the profiles: {calls(prof, ':coordinate_step')} vs {calls(prof3, ':coordinate_step')}), "
        f"and the CPU grows about as F: {_ratio(st, b, s3, 'round_cpu_seconds_mean')} (block), "
        f"{_ratio(st, g, g3, 'round_cpu_seconds_mean')} (segment). On top, a part that grows with the clients: "
        "secure aggregation masks each client's primal share with every other client of the exchange "
        "(K (K - 1) pair masks per round: 9,900 vs 72, the 9,900 seen in the profile; the X25519 agreements, "
        "K (K - 1), are made once, in the first round, and cached; 90 of a client's 99 peers share no block "
        "with it, so their masks are empty but still set up) and the per-message encoding and checks. "
        "In a deployment, where the clients run in parallel, the slowest client's seconds per round fall "
        f"({_ratio(st, b, s3, 'client_max_seconds_per_round')} in block mode: 6,000 samples x 64-80 "
        f"features per client instead of 20,000 x 256-272; not in segment mode, "
        f"{_ratio(st, g, g3, 'client_max_seconds_per_round')}: there every holder repeats each batch's b x b "
        "exact steps whatever its features and the round is a chain of about 470 batches on either grid, each "
        "waiting for the slowest of F holders; we did not profile this further) while the server's grow with "
        f"the messages ({_ratio(st, b, s3, 'server_seconds_per_round')} in block mode; "
        "`server s / round` is the round's wall time minus the clients' own seconds, so it also holds the "
        "in-process transport and is load-sensitive).",
        "- *Setup*: segment mode sums every holder's partial Gram matrix of every batch: F N (b + 1) / 2 values "
        "up and their sums back down to every holder "
        f"({_mb(st, g, 'setup_bytes')} vs {_mb(st, g3, 'setup_bytes')} plaintext; "
        f"{_mb(st, cs, 'setup_bytes')} under CKKS). Block mode's setup is small either way.",
        f"- *Peak RSS* ({rss[0]:.0f}-{rss[-1]:.0f} MB over the settings) is the "
        "in-process simulation: about 760 MB after loading the data (with torch), then every client's copy of "
        "its cell, and in segment mode every holder's full 128 x 128 Gram of each of its batches (F N b 8 bytes: "
        "614 MB at 10 x 10, 184 MB at 3 x 3). A deployment spreads this over the clients.",
        "- *Convergence.* Block mode (the paper's protocol) uses CoCoA+'s safe sigma' = K, which damps every "
        f"client's step by 1 / K: after {len(st.get(b, {}).get('history', []))} rounds its model is at "
        f"{_num(st, b, 'relative_suboptimality', '.2e')} relative suboptimality on the {big} grid against "
        f"{_num(st, s3, 'relative_suboptimality', '.2e')} on the 3 x 3 grid (sigma' = 9)"
        + (
            f", and after {len(st[bl]['history']) and st[bl]['history'][-1]['round']} rounds at "
            f"{_num(st, bl, 'relative_suboptimality', '.2e')} (`{bl}`)"
            if st.get(bl, {}).get("status") == "ok"
            else ""
        )
        + ": the paper's protocol needs more rounds the more clients there are. (Its duality gap is the loose one of the holders' mean "
        "`alpha`, `hyfdca.md`.) Segment mode with the sequential schedule makes every round one exact epoch of "
        "centralised SDCA whatever the grid (sigma' = 1): both grids run the same algorithm in different random "
        "orders and converge alike (median of the last 10 evaluations in the table; the last iterate of SDCA on the "
        "hinge loss fluctuates), but a round is a chain of about 490 exchanges (126 s of modelled latency per "
        "round at the paper's 0.2575 s per round trip, against 0.77 s for block mode's 3).",
        "- *PSI alignment* (the library's default) costs about two elliptic-curve exponentiations per ID of the "
        "lower-named client of every pair of clients: K (K - 1) / 2 = 4,950 pairs of 6,000 IDs on the 10 x 10 grid "
        "against 36 pairs of 20,000 on the 3 x 3 one: 41x the exponentiations (the 3 x 3 setup measured 178 s CPU, "
        "with 2 worker processes at load 17-20, `hyfdca_psi.md`). Hence `alignment: plaintext` for the timings "
        "above, and the PSI cost measured on subsamples and extrapolated linearly in the rows (the PSI table). "
        "Both alignments give the same segments and rounds (`hyfdca_psi.md`).",
    ]


PARTS = {
    "": (
        run_main,
        "--sample-groups 2 --block-groups 2 --rounds 1 --ckks-rounds 1 --long-rounds 1 --psi-samples 200".split(),
    ),
}


def main() -> None:
    """``python -m benchmarks.hyfdca_grid [options] [--smoke]`` (see :func:`benchmarks.harness.dispatch`)."""
    dispatch("hyfdca_grid", PARTS, globals())


if __name__ == "__main__":
    main()
