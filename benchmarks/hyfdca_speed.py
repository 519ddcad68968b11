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
   (``python -m benchmarks.privacy_cost hyfdca-psi``). The example's ``average_last: 0.5`` of 400 rounds averages
   from round 201 on, so up to round 200 its output model is the last iterate, as here
   (``average_last: 0``). Then the same with ``step_average: true`` (our option, each round's
   output model the mean of its iterates, SDCA's averaged output; ``--step-average-rounds``
   rounds): the same steps, another output model; then the same again, to the round it reached
   the target in, without the monitor (:func:`unmonitored`: the time a real run takes, with no
   evaluation between its rounds; a check that the monitor does not distort the timing), three
   times, between four more liblinear solves (the ratio of the medians, both under the same load);
3. CKKS (``encryption: ckks``, degree 8192 until the default became 4096) against plaintext for ``--ckks-rounds`` rounds each,
   one after the other, the clients encrypting with the public key (the default) and with the
   secret key (``ckks_secret_key_encryption``), each with the inner products encrypted (the
   paper's SecureInnerProduct, the default) and masked (``segment_inner_products: masked``, our
   option: :mod:`hybridfl.privacy.segmask`; the duals stay under CKKS): the round CPU and wall
   ratios and the difference of their ``w`` from the plaintext ``w``.

Run (single-threaded; about 3 minutes on an idle core at batch 128, longer at larger batches,
whose CKKS setup encrypts ``n_s (b + 1) / 2`` Gram values per holder)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_speed \
        --rounds 60 --step-average-rounds 25 --target 0.001 --ckks-rounds 3 [--batch-size 512]

Adds the run to the report ``benchmarks/results/hyfdca_speed.json`` and ``.md``: one row per run,
the latest of each batch size with the whole run, the earlier ones with their headline numbers and
commit (with the machine's load average: the machine is shared, so wall times are only comparable
within one run).

Profile a round instead (cProfile, CPU clock; rows of ``hyfdca_speed_profile.*``)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_speed \
        --profile 2 --profile-scheme ckks_secret_key [--batch-size 512]
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.harness import dispatch
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


def timed_liblinear(prob) -> tuple[np.ndarray, float, float]:
    """liblinear's solution of ``prob`` and its wall and CPU seconds."""
    w0, c0 = clocks()
    w = liblinear_solve(prob.X, prob.y, LAM, "hinge")
    return w, time.perf_counter() - w0, time.process_time() - c0


@contextmanager
def timed_server(times: dict, cpu=time.process_time):
    """Time ``HyFDCAServer.setup`` and each ``run_round`` (wall, and CPU by the clock ``cpu``;
    ``benchmarks.hyfdca_grid`` passes one that counts child processes too) into ``times``."""
    setup, run_round = HyFDCAServer.setup, HyFDCAServer.run_round

    def timed_setup(self, *a, **k):
        w, c = time.perf_counter(), cpu()
        out = setup(self, *a, **k)
        times["setup"] = (time.perf_counter() - w, cpu() - c)
        return out

    def timed_round(self, *a, **k):
        w, c = time.perf_counter(), cpu()
        out = run_round(self, *a, **k)
        times["rounds"].append((time.perf_counter() - w, cpu() - c))
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
        fit_intercept=False,  # the paper's problem: the committed numbers are without an intercept
        loss="hinge",
        positive_classes=POSITIVE,
        dual_mode="segment",
        segment_schedule="sequential",
        batch_size=batch_size,
        participation=1.0,
        local_epochs=1,
        alignment="plaintext",
        output="last",
        encryption="none",
        segment_inner_products="encrypted",
    )
    return HyFDCAConfig(**{**base, **kw})


def run(split, part, cfg: HyFDCAConfig) -> tuple[object, dict]:
    times: dict = {"setup": None, "rounds": []}
    with timed_server(times):
        res = run_hyfdca(split, part, cfg, seed=0)
    return res, times


CHECKS = [
    ("validate.py", "blobs"),
    ("validate.py", "number"),
    ("validate.py", "only_keys"),
    ("segment.py", "check_sweep"),
    ("segment.py", "_check_sweep"),
]
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
    "sparse products (scipy X_B w and segment shares; compiled X_B^T dalpha)": [
        ("_compressed.py", "_matmul_vector"),
        ("kernels.py", "rmatvec"),
    ],
    "reply and message checks (runtime.validate, HyFDCA reply checks)": CHECKS,
}
PROFILE_PARTS_CKKS = {
    "exact SDCA steps (convex.losses.gram_steps, run by each of the 3 holders)": [("losses.py", "gram_steps")],
    "message codec (runtime.messages encode + decode, both directions)": [
        ("messages.py", "encode"),
        ("messages.py", "decode"),
    ],
    "clients: CKKS encryption (privacy.he encrypt: encode, encrypt, serialise)": [("he.py", "encrypt")],
    "server: CKKS addition (privacy.he add: deserialise, add, serialise)": [("he.py", "add")],
    "clients: CKKS decryption (privacy.he decrypt: deserialise, decrypt, decode)": [("he.py", "decrypt")],
    "sparse products (scipy X_B w and segment shares; compiled X_B^T dalpha)": [
        ("_compressed.py", "_matmul_vector"),
        ("kernels.py", "rmatvec"),
    ],
    "reply and message checks (runtime.validate, HyFDCA reply checks)": CHECKS,
}
SCHEMES = {  # benchmark label -> (encryption, extra HyFDCA settings)
    "none": ("none", {}),
    "ckks": ("ckks", {}),
    "ckks_secret_key": ("ckks", {}),  # CKKS clients now always encrypt with the secret key
    "ckks_masked": ("ckks", {"segment_inner_products": "masked"}),
    "ckks_secret_key_masked": ("ckks", {"segment_inner_products": "masked"}),
}
MASKED = ("ckks_masked", "ckks_secret_key_masked")
"""CKKS runs whose inner products are masked (``segment_inner_products: masked``; the duals stay
under CKKS): the issue's CKKS goal measured with our option, each number labelled."""


def profile(split, part, rounds: int, batch_size: int, scheme: str = "none") -> dict:
    """cProfile (CPU clock, ``time.process_time``) of ``rounds`` rounds of ``scheme`` (a key of
    :data:`SCHEMES`; setup and evaluation excluded): the cumulative CPU seconds of the parts in
    :data:`PROFILE_PARTS` (plaintext) or :data:`PROFILE_PARTS_CKKS` (disjoint: none calls another)
    and the rest, plus the unprofiled CPU seconds of the same rounds measured around the profiler.
    Profiling adds overhead to every Python call, so the shares matter, not the seconds."""
    import cProfile
    import pstats

    prof = cProfile.Profile(time.process_time)
    run_round = HyFDCAServer.run_round
    cpu: list[float] = []

    def profiled(self, *a, **k):
        c = time.process_time()
        prof.enable()
        try:
            return run_round(self, *a, **k)
        finally:
            prof.disable()
            cpu.append(time.process_time() - c)

    enc, extra = SCHEMES[scheme]
    HyFDCAServer.run_round = profiled
    try:
        cfg = config(batch_size, rounds=rounds, eval_every=0, reference=False, encryption=enc, **extra)
        res = run_hyfdca(split, part, cfg, seed=0)
    finally:
        HyFDCAServer.run_round = run_round
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    total = sum(v[2] for v in stats.values())
    parts = {}
    for label, keys in (PROFILE_PARTS if scheme == "none" else PROFILE_PARTS_CKKS).items():
        hits = [v for (f, _, n), v in stats.items() if any(f.endswith(kf) and n == kn for kf, kn in keys)]
        sec = sum(v[3] for v in hits)
        parts[label] = {
            "seconds_per_round": sec / rounds,
            "share": sec / total,
            "calls_per_round": sum(v[0] for v in hits) / rounds,
        }
    rest = total - sum(p["seconds_per_round"] for p in parts.values()) * rounds
    parts["the rest (HyFDCA client and server steps, transport, numpy small-array operations, RNG)"] = {
        "seconds_per_round": rest / rounds,
        "share": rest / total,
    }
    return {
        "scheme": scheme,
        "rounds": rounds,
        "profiled_seconds_per_round": total / rounds,
        "round_cpu_seconds_profiled": cpu,
        "round_bytes_mean": float(np.mean([h["bytes"] for h in res.history])),
        "parts": parts,
    }


def to_target(split, part, cfg: HyFDCAConfig, ll: dict, target: float) -> dict:
    """HyFDCA ``cfg`` evaluated every round: its timing and the first round whose output model has
    relative suboptimality ``<= target``, with the CPU and wall ratios to liblinear ``ll``."""
    res, times = run(split, part, cfg)
    hist = res.history
    p_star = float(res.summary["reference_objective"])
    hit = next((i for i, h in enumerate(hist) if h.get("relative_suboptimality", 1.0) <= target), None)
    every10 = next(
        (i for i, h in enumerate(hist) if h["round"] % 10 == 0 and h.get("relative_suboptimality", 1.0) <= target),
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
        # HyFDCA Sec. 5.1's model of a round with the clients on their own machines: per exchange
        # the slowest client plus the server's own time (``model_seconds`` without its modelled
        # network latency, ``latency_seconds``)
        hy["rounds_model_seconds"] = float(sum(h["model_seconds"] - h["latency_seconds"] for h in hist[:r]))
        hy["ratio_to_liblinear"] = {
            "model_rounds": hy["rounds_model_seconds"] / ll["wall_seconds_median"],
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
    return hy


def unmonitored(split, part, prob, cfg: HyFDCAConfig, hy: dict, ll: dict, repeats: int = 3) -> dict:
    """``cfg`` run again to the round ``hy`` reached the target in, without the monitor (no
    evaluation between rounds, as a real run), ``repeats`` times, each run between two of
    ``repeats + 1`` liblinear solves: each run's setup and rounds timed, the relative suboptimality
    of its output model (the monitored run's at that round: the same seed) and the CPU ratios with
    the setup: the first run's to liblinear ``ll`` (solved at the benchmark's start: whether the
    evaluation's passes over the 60,000 x 784 matrix between the monitored rounds, left out of
    their timing, slow them), and the median run's to the median of the solves around them (both
    timed under the same load of this shared machine, which moves liblinear's time by up to 2x
    between runs of the benchmark)."""
    runs, solves, w = [], [], None
    for k in range(repeats + 1):
        solves.append(timed_liblinear(prob)[2])
        if k == repeats:
            break
        res, times = run(
            split, part, cfg.model_copy(update={"rounds": hy["round"], "eval_every": 0, "reference": False})
        )
        runs.append(times)
        if w is None:  # the first run's output model (the others are the same seed's)
            w = np.asarray(res.summary["w"], dtype=np.float64)
    times = runs[0]
    p_star = hy["reference_objective"]
    totals = [float(sum(t[1] for t in tm["rounds"]) + tm["setup"][1]) for tm in runs]
    return {
        "rounds": hy["round"],
        "setup_cpu_seconds": times["setup"][1],
        "rounds_cpu_seconds": totals[0] - times["setup"][1],
        "with_setup_cpu_seconds": totals[0],
        "relative_suboptimality": float((primal(prob.X, prob.y, w, LAM, "hinge") - p_star) / abs(p_star)),
        "ratio_to_liblinear_cpu_with_setup": totals[0] / ll["cpu_seconds_median"],
        "interleaved": {
            "with_setup_cpu_seconds": totals,
            "liblinear_cpu_seconds": solves,
            "ratio_cpu_with_setup": float(np.median(totals) / np.median(solves)),
        },
    }


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60, help="plaintext rounds (evaluated every round)")
    ap.add_argument("--target", type=float, default=1e-3)
    ap.add_argument(
        "--step-average-rounds", type=int, default=25, help="plaintext rounds with step_average (evaluated every round)"
    )
    ap.add_argument("--ckks-rounds", type=int, default=3)
    ap.add_argument("--liblinear-repeats", type=int, default=3)
    ap.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="samples per mini-batch exchange (the example's 128; each size has its own rows in the report)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        help="only profile this many rounds (cProfile, CPU clock): rows of hyfdca_speed_profile.*",
    )
    ap.add_argument(
        "--profile-scheme",
        choices=sorted(SCHEMES),
        default="none",
        help="what --profile runs: plaintext (none), CKKS with the public key (ckks) or the secret key (ckks_secret_key)",
    )
    a = ap.parse_args()
    t_start = time.perf_counter()
    if a.profile:
        with single_threaded():
            split = harness.shrink(load_mnist(DATA / "mnist", layout="tiles", tiles=7, flatten=True))
            part = GridPartitioner(3, 3, 1, 0).partition(split.train)
            prof = profile(split, part, a.profile, a.batch_size, a.profile_scheme)
        prof["command"] = (
            "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_speed "
            f"--profile {a.profile}"
            + ("" if a.batch_size == 128 else f" --batch-size {a.batch_size}")
            + ("" if a.profile_scheme == "none" else f" --profile-scheme {a.profile_scheme}")
        )
        prof["load_average"] = load()
        prof["batch_size"] = a.batch_size
        write_profile(prof)
        return
    out: dict = {
        "dataset": "MNIST binary (0-4 vs 5-9), 60,000 x 784, 49 tiles of 4 x 4, 3 x 3 grid = 9 clients",
        "command": "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.hyfdca_speed"
        + f" --rounds {a.rounds} --step-average-rounds {a.step_average_rounds} --target {a.target:g} --ckks-rounds {a.ckks_rounds} --liblinear-repeats {a.liblinear_repeats}"
        + ("" if a.batch_size == 128 else f" --batch-size {a.batch_size}"),
        "batch_size": a.batch_size,
        "cpu_count": os.cpu_count(),
        "load_average_start": load(),
    }
    with single_threaded():
        split = harness.shrink(load_mnist(DATA / "mnist", layout="tiles", tiles=7, flatten=True))
        part = GridPartitioner(3, 3, 1, 0).partition(split.train)
        prob = build_problem(split, part, "hinge", LAM, POSITIVE)

        # 1. liblinear on the centralised problem
        runs = []
        for _ in range(a.liblinear_repeats):
            w_ll, wall, cpu = timed_liblinear(prob)
            runs.append((wall, cpu))
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

        # 2. HyFDCA plaintext, evaluated every round: the last iterate (the paper's output) and the
        # step average (``step_average``, our option)
        hy = to_target(
            split, part, config(a.batch_size, rounds=a.rounds, eval_every=1, encryption="none"), ll, a.target
        )
        ll["relative_suboptimality"] = (ll["primal"] - hy["reference_objective"]) / abs(hy["reference_objective"])
        print("hyfdca", {k: v for k, v in hy.items() if k not in ("history", "settings")}, flush=True)
        cfg = config(a.batch_size, rounds=a.step_average_rounds, eval_every=1, encryption="none", output="step_average")
        hy_avg = to_target(split, part, cfg, ll, a.target)
        if hy_avg["reached"]:
            hy_avg["unmonitored"] = unmonitored(split, part, prob, cfg, hy_avg, ll)
        print("hyfdca step_average", {k: v for k, v in hy_avg.items() if k not in ("history", "settings")}, flush=True)

        # 3. CKKS against plaintext, the same rounds, side by side
        enc: dict = {"rounds": a.ckks_rounds}
        ws = {}
        for scheme, (encryption, extra) in SCHEMES.items():
            cfg = config(
                a.batch_size, rounds=a.ckks_rounds, eval_every=0, reference=False, encryption=encryption, **extra
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
                "round_messages_mean": float(np.mean([h["messages"] for h in res.history])),
                "encryption_seconds_per_round": float(np.mean([h["encryption_seconds"] for h in res.history])),
                "load_average": load(),
            }
            print(scheme, enc[scheme], flush=True)
        for scheme in ("ckks", "ckks_secret_key", *MASKED):
            e, base = enc[scheme], enc["none"]
            e["round_cpu_ratio"] = e["round_cpu_seconds_mean"] / base["round_cpu_seconds_mean"]
            e["round_wall_ratio"] = e["round_wall_seconds_mean"] / base["round_wall_seconds_mean"]
            e["w_max_abs_difference"] = float(np.max(np.abs(ws[scheme] - ws["none"])))
            e["w_relative_difference"] = float(np.linalg.norm(ws[scheme] - ws["none"]) / np.linalg.norm(ws["none"]))
    out.update(liblinear=ll, hyfdca=hy, hyfdca_step_average=hy_avg, ckks_vs_plaintext=enc)
    out["load_average_end"] = load()
    out["benchmark_seconds"] = time.perf_counter() - t_start
    write_speed(out)


SPEED_COLUMNS = [
    ("batch_size", "batch"),
    "latest",
    "commit",
    ("load_average_start", "load at start"),
    ("liblinear_cpu_seconds", "liblinear CPU s"),
    ("hyfdca_round", "HyFDCA round to 1e-3"),
    ("hyfdca_to_liblinear_cpu_rounds", "HyFDCA / liblinear CPU"),
    ("step_average_round", "step_average: round"),
    ("step_average_to_liblinear_cpu_rounds", "step_average / liblinear CPU"),
    ("step_average_to_liblinear_cpu_with_setup", "... with the setup"),
    ("step_average_unmonitored_to_liblinear_cpu_with_setup", "... run again without the monitor"),
    ("step_average_interleaved_to_liblinear_cpu_with_setup", "... 3 such runs between 4 liblinear solves"),
    ("plaintext_round_cpu_seconds", "plaintext round CPU s"),
    ("ckks_round_cpu_ratio", "CKKS round / plaintext (public key)"),
    ("ckks_secret_key_round_cpu_ratio", "(secret key)"),
    ("ckks_masked_round_cpu_ratio", "masked inner products (public key)"),
    ("ckks_secret_key_masked_round_cpu_ratio", "(secret key)"),
    ("ckks_round_megabytes", "CKKS MB/round"),
    ("ckks_setup_cpu_seconds", "CKKS setup CPU s"),
    ("w_max_abs_difference", "w max abs diff"),
]
SPEED_NOTES = [
    "One row per run (`latest`: the last run at that batch size; the others keep their headline numbers). "
    "CPU seconds, one process, single-threaded; 2 cores shared with other sessions (wall times are inflated by "
    "the load, CPU times much less). HyFDCA / liblinear: HyFDCA's CPU seconds for the rounds to relative "
    "suboptimality 1e-3 (plaintext, evaluated every round, the setup excluded) over liblinear's (median of the "
    "solves); `step_average`: the same with `step_average: true`; run again without the monitor: the same "
    "settings and seed run again to that round without the evaluation between rounds (as a real run; a check "
    "that the monitor does not distort the timing), the setup included; 3 such runs between 4 liblinear solves: "
    "the median run over the median of those solves (both under the same load; liblinear's time moves by up to 2x "
    "between runs of the benchmark on this shared machine). CKKS degree 8192 (4,096 slots) in the committed "
    "runs (4096, 2,048 slots, and seed-compressed client ciphertexts since); one "
    "exchange = one ciphertext per holder of `b` values (masked: `b` uint64 words per holder, the duals still "
    "under CKKS); the ratios are of the mean CPU seconds of the `--ckks-rounds` rounds run one after the "
    "other. w max abs diff: the largest over the CKKS settings against plaintext. Each latest row holds the "
    "whole run under `run` (liblinear's solves, every evaluated round, every CKKS setting's times and bytes)."
]


def headline(o: dict) -> dict:
    """A run's headline numbers (a row of the speed report)."""
    hy, enc, av = o["hyfdca"], o["ckks_vs_plaintext"], o.get("hyfdca_step_average", {})
    return {
        "command": o["command"],
        "load_average_start": o["load_average_start"],
        "liblinear_cpu_seconds": o["liblinear"]["cpu_seconds_median"],
        "hyfdca_round": hy.get("round"),
        "hyfdca_to_liblinear_cpu_rounds": hy.get("ratio_to_liblinear", {}).get("cpu_rounds"),
        "step_average_round": av.get("round"),
        "step_average_to_liblinear_cpu_rounds": av.get("ratio_to_liblinear", {}).get("cpu_rounds"),
        "step_average_to_liblinear_cpu_with_setup": av.get("ratio_to_liblinear", {}).get("cpu_with_setup"),
        "step_average_unmonitored_to_liblinear_cpu_with_setup": av.get("unmonitored", {}).get(
            "ratio_to_liblinear_cpu_with_setup"
        ),
        "step_average_interleaved_to_liblinear_cpu_with_setup": av.get("unmonitored", {})
        .get("interleaved", {})
        .get("ratio_cpu_with_setup"),
        "plaintext_round_cpu_seconds": enc["none"]["round_cpu_seconds_mean"],
        "ckks_round_cpu_ratio": enc["ckks"]["round_cpu_ratio"],
        "ckks_secret_key_round_cpu_ratio": enc["ckks_secret_key"]["round_cpu_ratio"],
        "ckks_round_megabytes": enc["ckks"]["round_bytes_mean"] / 1e6,
        "ckks_setup_cpu_seconds": enc["ckks"]["setup_cpu_seconds"],
        "w_max_abs_difference": max(
            v["w_max_abs_difference"] for v in enc.values() if isinstance(v, dict) and "w_max_abs_difference" in v
        ),
        **{f"{k}_round_cpu_ratio": enc[k]["round_cpu_ratio"] for k in MASKED if k in enc},
    }


def write_speed(o: dict, commit: str | None = None) -> None:
    """Add the run ``o`` to the speed report ``hyfdca_speed`` as the latest row of its batch size;
    the row it replaces stays as an earlier run (its headline numbers, without ``run``)."""
    path = OUT / "hyfdca_speed.json"
    rows = harness.read_report("hyfdca_speed", OUT)["rows"] if path.is_file() else []
    for r in rows:
        if r["batch_size"] == o["batch_size"] and r["latest"]:
            r["latest"] = False
            r.pop("run", None)
    row = {"config": f"batch {o['batch_size']}", "seed": 0, "batch_size": o["batch_size"], "latest": True}
    rows.append({**row, "commit": commit or harness.commit(), **headline(o), "run": o})
    rows.sort(key=lambda r: (r["batch_size"], r["latest"]))  # stable: earlier runs in their order
    harness.write_report(
        "hyfdca_speed",
        rows,
        title="HyFDCA speed: MNIST binary, 3 x 3 grid, segment mode, against liblinear; CKKS against plaintext",
        command=o["command"],
        columns=SPEED_COLUMNS,
        notes=SPEED_NOTES,
        out=OUT,
    )


def write_profile(prof: dict, commit: str | None = None) -> None:
    """Replace the rows of ``prof``'s scheme and batch size in the profile report
    ``hyfdca_speed_profile`` by one row per part of a round (its share of the profiled CPU time)."""
    path = OUT / "hyfdca_speed_profile.json"
    old = harness.read_report("hyfdca_speed_profile", OUT)["rows"] if path.is_file() else []
    key = (prof["scheme"], prof["batch_size"])
    rows = [r for r in old if (r["scheme"], r["batch_size"]) != key]
    meta = {k: prof[k] for k in ("command", "load_average", "round_cpu_seconds_profiled", "round_bytes_mean")}
    for label, v in prof["parts"].items():
        row = {"config": f"{prof['scheme']} b{prof['batch_size']}", "seed": 0, "scheme": prof["scheme"]}
        rows.append(
            {**row, "batch_size": prof["batch_size"], "part": label, **v, "commit": commit or harness.commit(), **meta}
        )
    harness.write_report(
        "hyfdca_speed_profile",
        rows,
        title="HyFDCA round profiles (MNIST binary, 3 x 3 grid, segment mode): cProfile, CPU clock",
        command=prof["command"],
        columns=[
            "scheme",
            ("batch_size", "batch"),
            ("part", "part of a round"),
            "share",
            ("seconds_per_round", "CPU s per round (profiled)"),
            ("calls_per_round", "calls per round"),
            "commit",
        ],
        notes=[
            "scheme: none = plaintext, ckks = CKKS with the public key, ckks_secret_key = with the secret key. "
            "cProfile with the CPU clock over the rounds of each row's command; profiling slows every Python "
            "call (the message path most), so read the shares, not the seconds: timed without a profiler the "
            "compiled SDCA steps take a larger share and the message codec a smaller one (docs/results.md)."
        ],
        out=OUT,
    )


PARTS = {
    "": (run_main, "--rounds 2 --ckks-rounds 1 --liblinear-repeats 1".split()),
}


def main() -> None:
    """``python -m benchmarks.hyfdca_speed [options] [--smoke]`` (see :func:`benchmarks.harness.dispatch`)."""
    dispatch("hyfdca_speed", PARTS, globals())


if __name__ == "__main__":
    main()
