"""Where a HyFDCA segment-mode round's CPU time goes, timed without a profiler (issue 17).

cProfile (``hyfdca_speed.py --profile``) slows every Python call and no compiled one, so its shares
overstate the Python message path and understate the compiled SDCA steps. Here the parts are timed
with the CPU clock (``time.process_time``) around the functions themselves, everything else
running at full speed: MNIST binary, 3 x 3 grid, the settings of ``hyfdca_speed.py`` (plaintext
alignment, ``encryption`` and ``segment_inner_products`` as given), ``--rounds`` rounds after the
setup and one warm-up round (numba's cache load, first slicing).

Run::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/hyfdca_round_timers.py \
        --batch-size 512 --rounds 10 [--encryption ckks --masked]

Writes ``benchmarks/results/hyfdca_round_timers_b<size>[_<encryption>][_masked].{json,md}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections import defaultdict

import hyfdca_speed as hs
from hybridfl.algorithms.hyfdca import segment_client as segment
from hybridfl.algorithms.hyfdca.client import HyFDCAClient
from hybridfl.algorithms.hyfdca.server import HyFDCAServer
from hybridfl.data import load_mnist
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.privacy import he
from hybridfl.runtime import transport
from hybridfl.runtime.simulation import build_federation, single_threaded

# part of a round -> the functions timed for it (module or class, attribute); nested parts are
# listed as "of which" in the report
PARTS = {
    "exact SDCA steps in a batch (gram_steps, compiled; each of the 3 holders)": [(segment, "gram_steps")],
    "inner-product shares X_B (w + sigma dw) (scipy CSR product, padding or encryption)": [
        (HyFDCAClient, "_batch_share")
    ],
    "X_B^T dalpha (compiled)": [(segment, "_rmatvec")],
    "batch visit orders (NumPy permutation)": [(HyFDCAClient, "_visit_order")],
    "message codec (encode + decode, every message both ways)": [(transport, "encode"), (transport, "decode")],
    "message and reply checks (client check_sweep, server _check_sweep)": [
        (HyFDCAClient, "check_sweep"),
        (HyFDCAServer, "_check_sweep"),
    ],
    "encryption backend (encrypt, decrypt, add)": [
        (he.HEBackend, "encrypt"),
        (he.HEBackend, "decrypt"),
        (he.HEBackend, "add"),
    ],
}


def timed(acc: dict, counts: dict, label: str, f):
    @functools.wraps(f)
    def g(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.process_time() - t
            counts[label] += 1

    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--encryption", default="none", choices=["none", "ckks"])
    ap.add_argument("--masked", action="store_true", help="segment_inner_products: masked")
    a = ap.parse_args()
    extra = {"segment_inner_products": "masked"} if a.masked else {}
    with single_threaded():
        split = load_mnist(hs.DATA / "mnist", layout="tiles", tiles=7, flatten=True)
        part = GridPartitioner(3, 3, 1, 0).partition(split.train)
        cfg = hs.config(
            a.batch_size, rounds=a.rounds + 1, eval_every=0, reference=False, encryption=a.encryption, **extra
        )
        fed = build_federation("hyfdca", split, part, cfg, seed=0)
        fed.setup()
        loop = fed.loop(monitor=False)
        server = fed.server
        server.run_round(1, fed.transport)  # warm-up: numba's cache, first slicing
        acc: dict = defaultdict(float)
        counts: dict = defaultdict(int)
        saved = []
        for label, targets in PARTS.items():
            for owner, name in targets:
                f = getattr(owner, name)
                saved.append((owner, name, f))
                setattr(owner, name, timed(acc, counts, label, f))
        t0 = time.process_time()
        for r in range(2, a.rounds + 2):
            server.run_round(r, fed.transport)
        total = time.process_time() - t0
        for owner, name, f in saved:
            setattr(owner, name, f)
        del loop
    per = {k: acc[k] / a.rounds for k in PARTS}
    out = {
        "command": "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/hyfdca_round_timers.py "
        f"--batch-size {a.batch_size} --rounds {a.rounds} --encryption {a.encryption}"
        + (" --masked" if a.masked else ""),
        "load_average": list(os.getloadavg()),
        "round_cpu_seconds": total / a.rounds,
        "parts_cpu_seconds_per_round": per,
        "calls_per_round": {k: counts[k] / a.rounds for k in PARTS},
    }
    stem = f"hyfdca_round_timers_b{a.batch_size}" + ("" if a.encryption == "none" else f"_{a.encryption}")
    stem += "_masked" if a.masked else ""
    (hs.OUT / f"{stem}.json").write_text(json.dumps(out, indent=1))
    rest = out["round_cpu_seconds"] - sum(per.values())
    lines = [
        f"# HyFDCA round, CPU time by part (MNIST binary, 3 x 3 grid, segment mode, batch {a.batch_size}, "
        f"encryption {a.encryption}{', inner products masked' if a.masked else ''})",
        "",
        f"Command: `{out['command']}` (load average {out['load_average']}). CPU clock around each part's functions, "
        f"{a.rounds} rounds after one warm-up round, no profiler; the 9 clients run one after another in this process.",
        "",
        f"Round: **{out['round_cpu_seconds'] * 1e3:.0f} ms CPU**.",
        "",
        "| part | ms per round | share | calls per round | us per call |",
        "|---|---|---|---|---|",
    ]
    for k, v in per.items():
        c = out["calls_per_round"][k]
        lines.append(
            f"| {k} | {v * 1e3:.1f} | {v / out['round_cpu_seconds']:.0%} | {c:.0f} | "
            + (f"{v / c * 1e6:.1f}" if c else "-")
            + " |"
        )
    lines.append(
        f"| the rest (client and server steps in Python, NumPy small-array work, transport, logging) | {rest * 1e3:.1f} | "
        f"{rest / out['round_cpu_seconds']:.0%} | | |"
    )
    lines.append("")
    (hs.OUT / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
