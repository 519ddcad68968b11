"""The cost of signed PSI (a roster, :mod:`hybridfl.privacy.roster`) in HyFDCA's sample alignment:
credit default (or MNIST binary), 3 x 3 grid (9 clients), ``alignment: psi``, no encryption, the
setup run without and with a roster (every client holding an in-memory roster: the same
signatures and checks as ``roster.json`` in its directory). Per run: the setup's CPU seconds
(this process and its PSI worker processes), wall seconds, bytes of the alignment messages
(hello and ``hyfdca.psi_*``) and of the whole setup, and, with the roster, the seconds spent
inside signing and verifying (Ed25519 and the blobs' SHA-256, timed around the calls) and their
count; and a check that both runs give the same segments.

    .venv/bin/python benchmarks/psi_roster.py --data credit

Writes ``benchmarks/results/psi_roster.json`` and ``psi_roster.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.privacy import roster as roster_mod
from hybridfl.runtime.messages import decode
from hybridfl.runtime.simulation import build_federation, single_threaded
from hyfdca_bench import dataset

OUT = Path(__file__).resolve().parent / "results"
ALIGN_KINDS = ("hyfdca.hello", "hyfdca.psi_serve", "hyfdca.psi_result", "hyfdca.psi_tags")


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class _Timed:
    """Wraps PeerAuth.sign / verify (the statement's SHA-256 digests are made inside the callers:
    psi.offer_fields and response_fields are timed too)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def wrap(self, fn):
        def inner(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1

        return inner


def run(name: str, signed: bool) -> tuple[dict, tuple]:
    split, pos, lam = dataset(name)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    cfg = HyFDCAConfig(fit_intercept=False, lam=lam, rounds=1, positive_classes=pos, reference=False, eval_every=0)
    raw: list[bytes] = []
    fed = build_federation("hyfdca", split, part, cfg, seed=0, recorder=raw.append)
    timed = _Timed()
    if signed:
        from hybridfl.privacy import psi

        for c, auth in roster_mod.in_memory_auths(list(fed.clients)).items():
            fed.clients[c].peer_auth = auth
        saved = (roster_mod.PeerAuth.sign, roster_mod.PeerAuth.verify, psi.offer_fields, psi.response_fields)
        roster_mod.PeerAuth.sign, roster_mod.PeerAuth.verify = timed.wrap(saved[0]), timed.wrap(saved[1])
        psi.offer_fields, psi.response_fields = timed.wrap(saved[2]), timed.wrap(saved[3])
    c0, w0 = _cpu(), time.perf_counter()
    try:
        fed.setup()
    finally:
        if signed:
            roster_mod.PeerAuth.sign, roster_mod.PeerAuth.verify, psi.offer_fields, psi.response_fields = saved
    cpu, wall = _cpu() - c0, time.perf_counter() - w0
    msgs = [(len(r), decode(r).kind) for r in raw]
    row = {
        "signed": signed,
        "samples": int(fed.server.N),
        "setup_cpu_seconds": round(cpu, 2),
        "setup_wall_seconds": round(wall, 2),
        "load_average_1_5_15": [round(v, 2) for v in os.getloadavg()],
        "setup_bytes": sum(n for n, _ in msgs),
        "alignment_bytes": sum(n for n, k in msgs if k in ALIGN_KINDS),
        "signature_seconds": round(timed.seconds, 4),
        "signature_calls": timed.calls,
    }
    return row, (fed.server.seg_holders, fed.server.seg_n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=["credit", "mnist"], default="credit")
    args = ap.parse_args()
    rows, layouts = [], []
    with single_threaded():
        for signed in (False, True):
            row, layout = run(args.data, signed)
            rows.append(row)
            layouts.append(layout)
            print(json.dumps(row), flush=True)
    result = {"data": args.data, "grid": "3x3", "runs": rows, "same_segments": layouts[0] == layouts[1]}
    (OUT / "psi_roster.json").write_text(json.dumps(result, indent=2))
    a, b = rows
    lines = [
        f"# Signed PSI (roster) vs unsigned: HyFDCA alignment setup, {args.data} 3 x 3",
        "",
        "Written by `benchmarks/psi_roster.py`; no encryption, secure aggregation on (defaults); 9 clients "
        "simulated in sequence. CPU = this process + its PSI worker processes.",
        "",
        "| roster | samples | setup CPU s | setup wall s (load 1/5/15) | setup bytes | alignment bytes | "
        "signing + checking s (calls) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {'yes' if r['signed'] else 'no'} | {r['samples']} | {r['setup_cpu_seconds']} | {r['setup_wall_seconds']} "
            f"({'/'.join(str(v) for v in r['load_average_1_5_15'])}) | {r['setup_bytes']} | {r['alignment_bytes']} | "
            f"{r['signature_seconds']} ({r['signature_calls']}) |"
        )
    lines += [
        "",
        f"Extra bytes with the roster: {b['setup_bytes'] - a['setup_bytes']} "
        f"({100 * (b['setup_bytes'] - a['setup_bytes']) / a['setup_bytes']:.3f} % of the setup); "
        f"same segments: {result['same_segments']}.",
    ]
    (OUT / "psi_roster.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
