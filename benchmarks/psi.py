"""PSI time and bytes (hybridfl.privacy.psi over openmined-psi, ECDH P-256, RAW) for n IDs per side.

For each size ``n`` the client and the server each hold ``n`` IDs, half of them common. One run
times the four steps -- client request, server setup, server response, client intersection --
in one process, one side after the other (so the total is the CPU time of both sides), with
``workers`` processes per step, and counts the bytes each way: client -> server the request,
server -> client the setup and the response. The result is checked against the plaintext
intersection. The machine's load average is recorded with every run (the two cores are shared).

    nice -n 5 .venv/bin/python benchmarks/psi.py                     # 10^4, 10^5 (1 and 2 workers), 10^6 (2)
    nice -n 5 .venv/bin/python benchmarks/psi.py --sizes 10000 --workers 1 2

Writes ``benchmarks/results/psi.json`` and ``psi.md`` (merged with earlier runs by (n, workers)).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from hybridfl.privacy import psi

OUT = Path(__file__).resolve().parent / "results"


def ids_for(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` client IDs and ``n`` server IDs (email-like strings), ``n // 2`` of them common."""
    rng = np.random.default_rng(seed)
    pool = rng.permutation(2 * n - n // 2)
    client = [f"user{int(i):09d}@example.org" for i in pool[:n]]
    server = [f"user{int(i):09d}@example.org" for i in pool[n - n // 2 :]]
    rng.shuffle(server)
    return client, server


def run(n: int, workers: int) -> dict:
    """One PSI of ``n`` against ``n`` IDs with ``workers`` processes per step: seconds per step,
    bytes each way, and whether the result equals the plaintext intersection."""
    client_ids, server_ids = ids_for(n)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    client = psi.PSIClient(client_ids, workers=workers)
    request = client.request()
    t1 = time.perf_counter()
    server = psi.PSIServer(server_ids, workers=workers)
    setup = server.setup(len(client_ids))
    t2 = time.perf_counter()
    response = server.respond(request)
    t3 = time.perf_counter()
    found = client.intersect(setup, response)
    t4 = time.perf_counter()
    truth = set(psi.plaintext_intersection(client_ids, server_ids))
    correct = sorted(client_ids[i] for i in found) == sorted(truth)
    return {
        "n": n,
        "workers": workers,
        "request_s": t1 - t0,
        "setup_s": t2 - t1,
        "response_s": t3 - t2,
        "intersect_s": t4 - t3,
        "total_s": t4 - t0,
        "bytes_client_to_server": len(request),
        "bytes_server_to_client": len(setup) + len(response),
        "intersection": int(found.size),
        "correct": bool(correct),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def write(rows: list[dict]) -> None:
    """Merge ``rows`` into ``psi.json`` (keyed by (n, workers)) and rewrite ``psi.md``."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "psi.json"
    old = json.loads(path.read_text())["runs"] if path.is_file() else []
    keep = {(r["n"], r["workers"]): r for r in old}
    keep.update({(r["n"], r["workers"]): r for r in rows})
    runs = [keep[k] for k in sorted(keep)]
    meta = {
        "library": f"openmined-psi {psi.library_version()}",
        "protocol": "ECDH P-256, RAW data structure, client = request + intersection, server = setup + response",
        "cpus": psi.default_workers(),
        "python": platform.python_version(),
        "command": "nice -n 5 .venv/bin/python benchmarks/psi.py",
    }
    path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
    lines = [
        "# PSI: time and bytes per side size",
        "",
        f"{meta['library']}, {meta['protocol']}; n IDs per side, half common; both sides timed one after",
        f"the other in one process ({meta['cpus']} CPUs, shared with other jobs: see the load average).",
        f"Command: `{meta['command']}`.",
        "",
        "| n per side | workers | request s | setup s | response s | intersect s | total s | MB client->server | MB server->client | correct | load avg |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['n']:,} | {r['workers']} | {r['request_s']:.1f} | {r['setup_s']:.1f} | {r['response_s']:.1f} "
            f"| {r['intersect_s']:.1f} | {r['total_s']:.1f} | {r['bytes_client_to_server'] / 1e6:.2f} "
            f"| {r['bytes_server_to_client'] / 1e6:.2f} | {'yes' if r['correct'] else 'NO'} "
            f"| {r['load_before']:.1f}-{r['load_after']:.1f} |"
        )
    (OUT / "psi.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    """Run the sizes and worker counts asked for (default: 10^4 and 10^5 with 1 and 2 workers,
    10^6 once with all CPUs) and write the results after every run."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=None)
    ap.add_argument("--workers", type=int, nargs="*", default=None)
    a = ap.parse_args()
    if a.sizes is None and a.workers is None:
        plan = [(10**4, 1), (10**4, 2), (10**5, 1), (10**5, 2), (10**6, psi.default_workers())]
    else:
        plan = [(n, w) for n in (a.sizes or [10**4]) for w in (a.workers or [psi.default_workers()])]
    rows = []
    for n, w in plan:
        r = run(n, w)
        print(json.dumps(r), flush=True)
        rows.append(r)
        write(rows)


if __name__ == "__main__":
    main()
