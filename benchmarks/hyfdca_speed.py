"""HyFDCA speed (issue 17), measured side by side in one process on MNIST binary (60,000 x 784,
digits 0-4 vs 5-9, 49 tiles, 3 x 3 grid = 9 clients; hinge, lambda = 1e-3, ``dual_mode: segment``,
``segment_schedule: sequential``, ``batch_size: 128``, full participation, secure aggregation on:
the settings of ``examples/configs/hyfdca_mnist.yaml``):

1. liblinear (scikit-learn ``LinearSVC``, dual coordinate descent, scikit-learn's default
   tolerance 1e-4) on the centralised problem: CPU and wall seconds of ``--liblinear-repeats``
   solves (the median is the ratio's basis), and its relative suboptimality;
2. HyFDCA, plaintext (``encryption: none``), evaluated every round: the first round whose output
   model has relative suboptimality ``<= --target`` and HyFDCA's CPU and wall seconds to it. The
   rounds' and the setup's times are taken around ``HyFDCAServer.run_round`` and
   ``HyFDCAServer.setup`` (the simulated clients run inside them, one after another, in this
   process), so the evaluation (the monitor) is excluded; the ratio is given for the rounds alone
   and with the setup. ``alignment: plaintext`` (the paper's setting): the PSI alignment that the
   example uses by default gives the same segments and rounds and costs setup time only
   (``benchmarks/hyfdca_psi.py``). The example's ``average_last: 0.5`` of 400 rounds averages
   from round 201 on, so up to round 200 its output model is the last iterate, as here
   (``average_last: 0``);
3. CKKS (``encryption: ckks``, degree 8192) against plaintext for ``--ckks-rounds`` rounds each,
   one after the other, the clients encrypting with the public key (the default) and with the
   secret key (``ckks_secret_key_encryption``): the round CPU and wall ratios and the difference
   of their ``w`` from the plaintext ``w``.

Run (single-threaded; about 3 minutes on an idle core)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/hyfdca_speed.py

Writes ``benchmarks/results/hyfdca_speed.json`` and ``.md`` (with the machine's load average:
the machine is shared, so wall times are only comparable within one run).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from hybridfl.algorithms.convex.losses import primal
from hybridfl.algorithms.convex.monitor import build_problem
from hybridfl.algorithms.convex.reference import liblinear_solve
from hybridfl.algorithms.hyfdca import HyFDCAConfig, HyFDCAServer, run_hyfdca
from hybridfl.data import load_mnist
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.runtime.simulation import single_threaded

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
OUT = ROOT / "benchmarks" / "results"
LAM = 1e-3
POSITIVE = [5, 6, 7, 8, 9]


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


@contextmanager
def timed_server(times: dict):
    """Time ``HyFDCAServer.setup`` and each ``run_round`` (wall, CPU) into ``times``."""
    setup, run_round = HyFDCAServer.setup, HyFDCAServer.run_round

    def timed_setup(self, *a, **k):
        w, c = clocks()
        out = setup(self, *a, **k)
        times["setup"] = (time.perf_counter() - w, time.process_time() - c)
        return out

    def timed_round(self, *a, **k):
        w, c = clocks()
        out = run_round(self, *a, **k)
        times["rounds"].append((time.perf_counter() - w, time.process_time() - c))
        return out

    HyFDCAServer.setup, HyFDCAServer.run_round = timed_setup, timed_round
    try:
        yield
    finally:
        HyFDCAServer.setup, HyFDCAServer.run_round = setup, run_round


def config(batch_size: int = 128, **kw) -> HyFDCAConfig:
    """The example's settings (``examples/configs/hyfdca_mnist.yaml``) with ``kw`` on top."""
    base = dict(
        lam=LAM,
        loss="hinge",
        positive_classes=POSITIVE,
        dual_mode="segment",
        segment_schedule="sequential",
        batch_size=batch_size,
        participation=1.0,
        local_epochs=1,
        alignment="plaintext",
        average_last=0.0,
    )
    return HyFDCAConfig(**{**base, **kw})


def run(split, part, cfg: HyFDCAConfig) -> tuple[object, dict]:
    times: dict = {"setup": None, "rounds": []}
    with timed_server(times):
        res = run_hyfdca(split, part, cfg, seed=0)
    return res, times


PROFILE_PARTS = {
    "exact SDCA steps (convex.losses.gram_steps, run by each of the 3 holders)": [("losses.py", "gram_steps")],
    "message codec (runtime.messages encode + decode, both directions)": [
        ("messages.py", "encode"),
        ("messages.py", "decode"),
    ],
    "encryption backend (privacy.he encrypt, decrypt, add; plaintext: byte copies)": [
        ("he.py", "encrypt"),
        ("he.py", "decrypt"),
        ("he.py", "add"),
    ],
    "sparse products (scipy X_B w, X_B^T dalpha, segment shares)": [("_compressed.py", "_matmul_vector")],
    "reply and message checks (runtime.validate, HyFDCA reply checks)": [
        ("validate.py", "blobs"),
        ("validate.py", "number"),
        ("validate.py", "only_keys"),
        ("segment.py", "check_sweep"),
        ("segment.py", "_check_sweep"),
    ],
}


def profile(split, part, rounds: int, batch_size: int) -> dict:
    """cProfile of ``rounds`` plaintext rounds (setup and evaluation excluded): the cumulative
    seconds of the parts in :data:`PROFILE_PARTS` (disjoint: none calls another) and the rest.
    Profiling adds overhead to every Python call, so the shares matter, not the seconds."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    run_round = HyFDCAServer.run_round

    def profiled(self, *a, **k):
        prof.enable()
        try:
            return run_round(self, *a, **k)
        finally:
            prof.disable()

    HyFDCAServer.run_round = profiled
    try:
        run_hyfdca(split, part, config(batch_size, rounds=rounds, eval_every=0, reference=False), seed=0)
    finally:
        HyFDCAServer.run_round = run_round
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    total = sum(v[2] for v in stats.values())
    parts = {}
    for label, keys in PROFILE_PARTS.items():
        sec = sum(v[3] for (f, _, n), v in stats.items() if any(f.endswith(kf) and n == kn for kf, kn in keys))
        parts[label] = {"seconds_per_round": sec / rounds, "share": sec / total}
    rest = total - sum(p["seconds_per_round"] for p in parts.values()) * rounds
    parts["the rest (HyFDCA client and server steps, transport, numpy small-array operations, RNG)"] = {
        "seconds_per_round": rest / rounds,
        "share": rest / total,
    }
    return {"rounds": rounds, "profiled_seconds_per_round": total / rounds, "parts": parts}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60, help="plaintext rounds (evaluated every round)")
    ap.add_argument("--target", type=float, default=1e-3)
    ap.add_argument("--ckks-rounds", type=int, default=3)
    ap.add_argument("--liblinear-repeats", type=int, default=3)
    ap.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="samples per mini-batch exchange (the example's 128; another size writes hyfdca_speed_b<size>.*)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        help="only profile this many plaintext rounds (cProfile) and write hyfdca_speed_profile.*",
    )
    a = ap.parse_args()
    t_start = time.perf_counter()
    if a.profile:
        with single_threaded():
            split = load_mnist(DATA / "mnist", layout="tiles", tiles=7, flatten=True)
            part = GridPartitioner(3, 3, 1, 0).partition(split.train)
            prof = profile(split, part, a.profile, a.batch_size)
        prof["command"] = (
            "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/hyfdca_speed.py "
            f"--profile {a.profile}" + ("" if a.batch_size == 128 else f" --batch-size {a.batch_size}")
        )
        prof["load_average"] = load()
        stem = "hyfdca_speed_profile" + ("" if a.batch_size == 128 else f"_b{a.batch_size}")
        lines = [
            f"# HyFDCA plaintext round profile (MNIST binary, 3 x 3 grid, segment mode, batch {a.batch_size})",
            "",
            f"Command: `{prof['command']}` (load average {prof['load_average']}). cProfile over {a.profile} rounds; "
            "profiling slows every Python call, so read the shares.",
            "",
            "| part of a round | share | s per round (profiled) |",
            "|---|---|---|",
        ]
        for label, v in prof["parts"].items():
            lines.append(f"| {label} | {100 * v['share']:.0f} % | {v['seconds_per_round']:.3f} |")
        lines.append("")
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{stem}.json").write_text(json.dumps(prof, indent=1, default=float))
        (OUT / f"{stem}.md").write_text("\n".join(lines))
        print("\n".join(lines))
        return
    out: dict = {
        "dataset": "MNIST binary (0-4 vs 5-9), 60,000 x 784, 49 tiles of 4 x 4, 3 x 3 grid = 9 clients",
        "command": "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/hyfdca_speed.py"
        + f" --rounds {a.rounds} --target {a.target:g} --ckks-rounds {a.ckks_rounds} --liblinear-repeats {a.liblinear_repeats}"
        + ("" if a.batch_size == 128 else f" --batch-size {a.batch_size}"),
        "batch_size": a.batch_size,
        "cpu_count": os.cpu_count(),
        "load_average_start": load(),
    }
    with single_threaded():
        split = load_mnist(DATA / "mnist", layout="tiles", tiles=7, flatten=True)
        part = GridPartitioner(3, 3, 1, 0).partition(split.train)
        prob = build_problem(split, part, "hinge", LAM, POSITIVE)

        # 1. liblinear on the centralised problem
        runs = []
        for _ in range(a.liblinear_repeats):
            w0, c0 = clocks()
            w_ll = liblinear_solve(prob.X, prob.y, LAM, "hinge")
            runs.append((time.perf_counter() - w0, time.process_time() - c0))
        ll = {
            "solver": "sklearn LinearSVC(loss='hinge', dual=True, tol=1e-4), C = 1 / (lambda N)",
            "wall_seconds": [r[0] for r in runs],
            "cpu_seconds": [r[1] for r in runs],
            "wall_seconds_median": float(np.median([r[0] for r in runs])),
            "cpu_seconds_median": float(np.median([r[1] for r in runs])),
            "primal": float(primal(prob.X, prob.y, w_ll, LAM, "hinge")),
            "load_average": load(),
        }
        print("liblinear", ll, flush=True)

        # 2. HyFDCA plaintext, evaluated every round
        cfg = config(a.batch_size, rounds=a.rounds, eval_every=1, encryption="none")
        res, times = run(split, part, cfg)
        hist = res.history
        p_star = float(res.summary["reference_objective"])
        ll["relative_suboptimality"] = (ll["primal"] - p_star) / abs(p_star)
        hit = next((i for i, h in enumerate(hist) if h.get("relative_suboptimality", 1.0) <= a.target), None)
        every10 = next(
            (
                i
                for i, h in enumerate(hist)
                if h["round"] % 10 == 0 and h.get("relative_suboptimality", 1.0) <= a.target
            ),
            None,
        )
        rw = np.array([t[0] for t in times["rounds"]])
        rc = np.array([t[1] for t in times["rounds"]])
        hy: dict = {
            "settings": cfg.model_dump(mode="json"),
            "setup_wall_seconds": times["setup"][0],
            "setup_cpu_seconds": times["setup"][1],
            "round_wall_seconds_mean": float(rw.mean()),
            "round_cpu_seconds_mean": float(rc.mean()),
            "round_cpu_seconds": rc.tolist(),
            "round_wall_seconds": rw.tolist(),
            "reference_objective": p_star,
            "history": [
                {k: h[k] for k in ("round", "relative_suboptimality", "duality_gap", "bytes", "messages") if k in h}
                for h in hist
            ],
            "load_average": load(),
        }
        if hit is None:
            hy["reached"] = False
        else:
            r = hit + 1
            hy.update(
                reached=True,
                round=int(hist[hit]["round"]),
                relative_suboptimality=float(hist[hit]["relative_suboptimality"]),
                rounds_cpu_seconds=float(rc[:r].sum()),
                rounds_wall_seconds=float(rw[:r].sum()),
                with_setup_cpu_seconds=float(rc[:r].sum() + times["setup"][1]),
                with_setup_wall_seconds=float(rw[:r].sum() + times["setup"][0]),
            )
            hy["ratio_to_liblinear"] = {
                "cpu_rounds": hy["rounds_cpu_seconds"] / ll["cpu_seconds_median"],
                "cpu_with_setup": hy["with_setup_cpu_seconds"] / ll["cpu_seconds_median"],
                "wall_rounds": hy["rounds_wall_seconds"] / ll["wall_seconds_median"],
                "wall_with_setup": hy["with_setup_wall_seconds"] / ll["wall_seconds_median"],
            }
        if every10 is not None:  # the example evaluates every 10 rounds
            r = every10 + 1
            hy["every_10"] = {
                "round": int(hist[every10]["round"]),
                "rounds_cpu_seconds": float(rc[:r].sum()),
                "ratio_cpu_rounds": float(rc[:r].sum()) / ll["cpu_seconds_median"],
            }
        print("hyfdca", {k: v for k, v in hy.items() if k not in ("history", "settings")}, flush=True)

        # 3. CKKS against plaintext, the same rounds, side by side
        enc: dict = {"rounds": a.ckks_rounds}
        ws = {}
        for scheme, extra in (("none", {}), ("ckks", {}), ("ckks_secret_key", {"ckks_secret_key_encryption": True})):
            cfg = config(
                a.batch_size, rounds=a.ckks_rounds, eval_every=0, reference=False, encryption=scheme[:4], **extra
            )
            res, times = run(split, part, cfg)
            ws[scheme] = np.asarray(res.summary["w"], dtype=np.float64)
            rounds = np.array(times["rounds"])
            enc[scheme] = {
                "setup_wall_seconds": times["setup"][0],
                "setup_cpu_seconds": times["setup"][1],
                "round_wall_seconds": rounds[:, 0].tolist(),
                "round_cpu_seconds": rounds[:, 1].tolist(),
                "round_wall_seconds_mean": float(rounds[:, 0].mean()),
                "round_cpu_seconds_mean": float(rounds[:, 1].mean()),
                "round_bytes_mean": float(np.mean([h["bytes"] for h in res.history])),
                "encryption_seconds_per_round": float(np.mean([h["encryption_seconds"] for h in res.history])),
                "load_average": load(),
            }
            print(scheme, enc[scheme], flush=True)
        for scheme in ("ckks", "ckks_secret_key"):
            e, base = enc[scheme], enc["none"]
            e["round_cpu_ratio"] = e["round_cpu_seconds_mean"] / base["round_cpu_seconds_mean"]
            e["round_wall_ratio"] = e["round_wall_seconds_mean"] / base["round_wall_seconds_mean"]
            e["w_max_abs_difference"] = float(np.max(np.abs(ws[scheme] - ws["none"])))
            e["w_relative_difference"] = float(np.linalg.norm(ws[scheme] - ws["none"]) / np.linalg.norm(ws["none"]))
    out.update(liblinear=ll, hyfdca=hy, ckks_vs_plaintext=enc)
    out["load_average_end"] = load()
    out["benchmark_seconds"] = time.perf_counter() - t_start
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "hyfdca_speed" + ("" if a.batch_size == 128 else f"_b{a.batch_size}")
    (OUT / f"{stem}.json").write_text(json.dumps(out, indent=1, default=float))
    (OUT / f"{stem}.md").write_text(report(out))
    print(report(out))


def report(o: dict) -> str:
    ll, hy, enc = o["liblinear"], o["hyfdca"], o["ckks_vs_plaintext"]
    lines = [
        f"# HyFDCA speed (issue 17): MNIST binary, 3 x 3 grid, segment mode, batch {o['batch_size']}",
        "",
        f"Command: `{o['command']}`. One process, single-threaded, {o['cpu_count']} cores shared with other "
        f"sessions: load average {o['load_average_start']} at the start, {o['load_average_end']} at the end "
        "(wall times are inflated by the load; CPU times much less).",
        "",
        "| | CPU s | wall s |",
        "|---|---|---|",
        f"| liblinear (median of {len(ll['cpu_seconds'])}; rel. subopt. {ll['relative_suboptimality']:.1e}) | "
        f"{ll['cpu_seconds_median']:.2f} | {ll['wall_seconds_median']:.2f} |",
        f"| HyFDCA setup (plaintext alignment) | {hy['setup_cpu_seconds']:.2f} | {hy['setup_wall_seconds']:.2f} |",
        f"| HyFDCA round (mean of {len(hy['round_cpu_seconds'])}) | {hy['round_cpu_seconds_mean']:.3f} | "
        f"{hy['round_wall_seconds_mean']:.3f} |",
    ]
    if hy.get("reached"):
        r = hy["ratio_to_liblinear"]
        lines += [
            f"| HyFDCA to rel. subopt. <= {o['command'].split('--target ')[1].split()[0]} (round {hy['round']}, "
            f"evaluated every round): rounds | {hy['rounds_cpu_seconds']:.2f} | {hy['rounds_wall_seconds']:.2f} |",
            f"| ... with the setup | {hy['with_setup_cpu_seconds']:.2f} | {hy['with_setup_wall_seconds']:.2f} |",
            "",
            f"**Ratio to liblinear**: rounds {r['cpu_rounds']:.1f}x CPU ({r['wall_rounds']:.1f}x wall); with the "
            f"setup {r['cpu_with_setup']:.1f}x CPU ({r['wall_with_setup']:.1f}x wall).",
        ]
        if "every_10" in hy:
            e = hy["every_10"]
            lines.append(
                f"Evaluated every 10 rounds as the example does, the target is first seen at round {e['round']}: "
                f"{e['rounds_cpu_seconds']:.2f} s CPU, {e['ratio_cpu_rounds']:.1f}x liblinear."
            )
    else:
        lines += ["", f"HyFDCA did not reach the target in {len(hy['round_cpu_seconds'])} rounds."]
    base = enc["none"]
    lines += [
        "",
        f"**CKKS against plaintext** ({enc['rounds']} rounds each, one after the other; plaintext round "
        f"{base['round_cpu_seconds_mean']:.3f} s CPU, {base['round_wall_seconds_mean']:.3f} s wall, "
        f"{base['round_bytes_mean'] / 1e6:.2f} MB):",
        "",
        "| clients encrypt with | round CPU s | CPU ratio | wall ratio | encryption s/round (wall) | MB/round | w max abs diff (relative) |",
        "|---|---|---|---|---|---|---|",
    ]
    for scheme, label in (
        ("ckks", "the public key (default)"),
        ("ckks_secret_key", "the secret key (`ckks_secret_key_encryption`)"),
    ):
        e = enc[scheme]
        lines.append(
            f"| {label} | {e['round_cpu_seconds_mean']:.2f} | **{e['round_cpu_ratio']:.1f}x** | {e['round_wall_ratio']:.1f}x | "
            f"{e['encryption_seconds_per_round']:.2f} | {e['round_bytes_mean'] / 1e6:.1f} | "
            f"{e['w_max_abs_difference']:.1e} ({e['w_relative_difference']:.1e}) |"
        )
    best = min(enc["ckks"]["round_cpu_ratio"], enc["ckks_secret_key"]["round_cpu_ratio"])
    lines += [
        "",
        "Issue 17's goals, CPU: HyFDCA to the target within 3x liblinear: "
        + (
            f"{'met' if hy['ratio_to_liblinear']['cpu_rounds'] <= 3 else 'missed'} "
            f"({hy['ratio_to_liblinear']['cpu_rounds']:.1f}x, rounds only)"
            if hy.get("reached")
            else "not measured (target not reached)"
        )
        + f"; a CKKS round within 3x a plaintext one: {'met' if best <= 3 else 'missed'} (best {best:.1f}x). "
        "Where a plaintext round's time goes: `hyfdca_speed_profile.md` (`--profile 3`).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
