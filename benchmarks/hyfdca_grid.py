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
    .venv/bin/python -m benchmarks.hyfdca_grid --report-only     # rewrite the report from its JSON

Writes the report ``benchmarks/results/hyfdca_grid.json`` and ``.md`` (a row per setting, merged
with the settings run before; what the rows show is read in docs/results.md).
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
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from its JSON, run nothing")
    ap.add_argument("--child", type=str, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=str, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        Path(a.child_out).write_text(json.dumps(child(json.loads(a.child), a.eval_every, a.psi_samples), default=float))
        return
    results = read_grid()
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
            write_grid(results)  # after every setting
    write_grid(results)
    print((OUT / "hyfdca_grid.md").read_text())


# ---------------------------------------------------------------- report

ORDER = ("block", "block_long", "segment", "ckks_block", "ckks_segment", "ckks_segment_masked")
COLUMNS = [
    ("config", "setting"),
    "status",
    "clients",
    ("samples", "samples"),
    ("sigma", "sigma'"),
    ("setup_cpu_seconds", "setup CPU s"),
    ("setup_wall_seconds", "setup wall s"),
    ("round_cpu_seconds_mean", "round CPU s"),
    ("round_wall_seconds_mean", "round wall s"),
    ("server_seconds_per_round", "server s / round"),
    ("client_max_seconds_per_round", "slowest client s / round"),
    ("messages_per_round", "messages / round"),
    ("round_mb", "MB / round"),
    ("exchanges_per_round", "exchanges / round"),
    ("setup_mb", "setup MB"),
    ("setup_messages", "setup messages"),
    ("peak_rss_mb", "peak RSS MB"),
    ("rel_1", "rel. subopt. round 1"),
    ("rel_3", "round 3"),
    ("rel_10", "round 10"),
    ("rel_last", "last round"),
    ("last_round", "(round)"),
    ("median_rel_last10", "median rel. subopt. of the last 10 evaluations"),
    ("median_gap_last10", "(duality gap)"),
    ("load_start", "load before"),
    ("load_end", "load after"),
]
DERIVED = ("seed", "round_mb", "setup_mb", "rel_1", "rel_3", "rel_10", "rel_last", "last_round")
DERIVED += ("median_rel_last10", "median_gap_last10", "load_start", "load_end")
NOTES = [
    "MNIST 0-4 vs 5-9, 60,000 x 784, 49 tiles, hinge, lambda = 1e-3; `alignment: plaintext` (the paper's setting; "
    "the `psi_*` settings time the PSI setup on a subsample of the rows instead), secure aggregation on (default), "
    "full participation, last iterate. Each setting in its own single-threaded process, the clients simulated one "
    "after another in it (a round's CPU is the sum over all clients and the server); its command, source state, "
    "evaluated rounds and (`profile_*`) cProfile top functions are in its row of the JSON. 2 cores shared with "
    "other sessions: wall times are inflated by the load (1-min load average before/after each run), CPU times much "
    "less.",
    "Round times are taken around `HyFDCAServer.run_round` (the evaluation excluded), means over the rounds run. "
    "`server s / round`: the round's wall time minus the clients' own seconds (server work and the in-process "
    "transport; load-sensitive). `slowest client s / round`: per exchange the slowest reply's own seconds, summed "
    "over the exchanges (the clients' critical path if they ran in parallel). Relative suboptimality "
    "`(P(w) - P*) / P*` of the server's model (last iterate), `P*` the liblinear optimum; `-`: not run or not "
    "measured by that setting. `cli_*`: `hybridfl run` of `examples/configs/hyfdca_mnist.yaml` in a fresh process "
    "(its `results.json` under `results`).",
]


def _rel(r: dict, rnd: int) -> float | None:
    return next(
        (
            h["relative_suboptimality"]
            for h in r.get("history", [])
            if h["round"] == rnd and "relative_suboptimality" in h
        ),
        None,
    )


def _median_last(r: dict, key: str, n: int = 10) -> float | None:
    """Median of ``key`` over the last ``n`` evaluated rounds (the last iterate of SDCA on the
    hinge loss fluctuates from round to round; the median is steadier)."""
    import statistics

    v = [h[key] for h in r.get("history", []) if key in h][-n:]
    return statistics.median(v) if len(v) >= n else None


def grid_rows(res: dict) -> list[dict]:
    """One report row per setting: everything it measured, and the table's derived cells."""
    st = res["settings"]
    names = [n for p in ORDER for n in sorted(st) if n.rsplit("_", 1)[0] == p]
    rows = []
    for n in names + sorted(set(st) - set(names)):
        r = st[n]
        last = r["history"][-1]["round"] if r.get("history") else None
        load0, load1 = r.get("load_average_start") or [None], r.get("load_average_end") or [None]
        run = {k: v for k, v in r.items() if k != "config"}  # the row's config is the setting's name
        row = {"config": n, "seed": 0, "setting": r.get("config"), **run, "last_round": last}
        row.update(round_mb=r["bytes_per_round"] / 1e6 if "bytes_per_round" in r else None)
        row.update(setup_mb=r["setup_bytes"] / 1e6 if "setup_bytes" in r else None)
        row.update(rel_1=_rel(r, 1), rel_3=_rel(r, 3), rel_10=_rel(r, 10), rel_last=last and _rel(r, last))
        row.update(median_rel_last10=_median_last(r, "relative_suboptimality"))
        row.update(median_gap_last10=_median_last(r, "duality_gap"), load_start=load0[0], load_end=load1[0])
        rows.append(row)
    return rows


def write_grid(res: dict) -> None:
    """The report ``hyfdca_grid``: :func:`grid_rows` of every setting run so far."""
    rows = grid_rows(res)
    harness.write_report(
        "hyfdca_grid",
        rows,
        title="HyFDCA on a 10 x 10 grid (100 clients) against a 3 x 3 grid, MNIST binary",
        command="OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_grid --only SETTING (each row: its command)",
        columns=COLUMNS,
        notes=NOTES,
        out=OUT,
    )


def read_grid() -> dict:
    """The settings run so far, from the report (``{"settings": {}}`` without one)."""
    if not (OUT / "hyfdca_grid.json").exists():
        return {"settings": {}}
    rows = harness.read_report("hyfdca_grid", OUT)["rows"]
    drop = ("config", "setting", *DERIVED)
    runs = {r["config"]: {"config": r["setting"], **{k: v for k, v in r.items() if k not in drop}} for r in rows}
    return {"settings": {n: {k: v for k, v in r.items() if v is not None or k != "config"} for n, r in runs.items()}}


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
