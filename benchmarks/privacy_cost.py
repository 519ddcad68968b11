"""Cost of the privacy mechanisms: PSI by itself, HyFDCA sample alignment by PSI against plaintext IDs, secure aggregation of HyFDCA primal shares.

Run from the repository root: ``python -m benchmarks.privacy_cost PART [options]``.

Part ``psi``
------------

PSI time and bytes (hybridfl.privacy.psi over openmined-psi, ECDH P-256, RAW) for n IDs per side.

For each size ``n`` the client and the server each hold ``n`` IDs, half of them common. One run
times the four steps -- client request, server setup, server response, client intersection --
in one process, one side after the other (so the total is the CPU time of both sides), with
``workers`` processes per step, and counts the bytes each way: client -> server the request,
server -> client the setup and the response. The result is checked against the plaintext
intersection. The machine's load average is recorded with every run (the two cores are shared).

    nice -n 5 .venv/bin/python -m benchmarks.privacy_cost psi                     # 10^4, 10^5 (1 and 2 workers), 10^6 (2)
    nice -n 5 .venv/bin/python -m benchmarks.privacy_cost psi --sizes 10000 --workers 1 2

Writes ``benchmarks/results/psi.json`` and ``psi.md`` (merged with earlier runs by (n, workers)).

Part ``hyfdca-psi``
-------------------

HyFDCA setup cost of the sample alignment: ``alignment: psi`` (pairwise private set
intersection between the clients, :mod:`hybridfl.algorithms.hyfdca.align`) vs ``alignment:
plaintext`` (every client sends its IDs), on credit default and MNIST binary, 3 x 3 grids
(9 clients), no encryption (the alignment's own cost). Per run: the setup's CPU seconds (this
process and its PSI worker processes), wall seconds with the load average, bytes of all setup
messages and of the alignment messages alone (hello and ``hyfdca.psi_*``), exchanges; and a check
that both alignments give the same segments and, after one round, the same ``w`` (max abs diff).

    .venv/bin/python -m benchmarks.privacy_cost hyfdca-psi            # both datasets
    .venv/bin/python -m benchmarks.privacy_cost hyfdca-psi --data credit

Writes ``benchmarks/results/hyfdca_psi.json`` and ``hyfdca_psi.md``.

Part ``psi-roster``
-------------------

The cost of signed PSI (a roster, :mod:`hybridfl.privacy.roster`) in HyFDCA's sample alignment:
credit default (or MNIST binary), 3 x 3 grid (9 clients), ``alignment: psi``, no encryption, the
setup run without and with a roster (every client holding an in-memory roster: the same
signatures and checks as ``roster.json`` in its directory). Per run: the setup's CPU seconds
(this process and its PSI worker processes), wall seconds, bytes of the alignment messages
(hello and ``hyfdca.psi_*``) and of the whole setup, and, with the roster, the seconds spent
inside signing and verifying (Ed25519 and the blobs' SHA-256, timed around the calls) and their
count; and a check that both runs give the same segments.

    .venv/bin/python -m benchmarks.privacy_cost psi-roster --data credit

Writes ``benchmarks/results/psi_roster.json`` and ``psi_roster.md``.

Part ``secagg``
---------------

Cost of secure aggregation of HyFDCA's primal shares (issue 15 item 4, "the cost of each
mitigation, measured"): the same run with ``secure_aggregation`` off and on, side by side, in one
process: wall seconds per round, bytes per round (all messages, counted by our codec), the bytes of
the PrimalAggregation exchange alone, the extra unmasking exchanges, and the largest difference of
``w``. Same problems as ``benchmarks.hyfdca bench`` (3 x 3 grid, hinge, lambda 1e-3).

    .venv/bin/python -m benchmarks.privacy_cost secagg --dataset credit --rounds 10 --rates 0,0.2

Writes ``benchmarks/results/secagg_cost.json`` and ``secagg_cost.md`` (rows keyed by dataset, dual
mode, failure rate and ``--code``, a label for the code measured: the same script measures an older
``src`` run as ``PYTHONPATH=<checkout>/src``, and each row names the ``src`` commit).

Part ``secagg-hyfem``
---------------------

Cost of HyFEM's secure aggregation of the extractors (double masking, Bonawitz et al. 2017) with
many clients: ``examples/configs/hyfem_mnist.yaml`` with ``--clients`` clients, ``--rounds`` rounds
of ``--local-steps`` steps, secure aggregation off and on in one process: CPU seconds per round,
bytes per round, unmasking messages.

    .venv/bin/python -m benchmarks.privacy_cost secagg-hyfem --clients 100 --rounds 2 --local-steps 1

Writes ``benchmarks/results/secagg_cost_hyfem.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.harness import dispatch
from benchmarks.hyfdca import OUT, dataset
from hybridfl.algorithms.hyfdca import HyFDCAConfig
from hybridfl.data.partitioners import GridPartitioner
from hybridfl.privacy import psi
from hybridfl.runtime.messages import decode
from hybridfl.runtime.simulation import build_federation, single_threaded

# ======================================== part psi


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


PSI_COLUMNS = ["n", "workers", "request_s", "setup_s", "response_s", "intersect_s", "total_s"]
PSI_COLUMNS += ["bytes_client_to_server", "bytes_server_to_client", "correct", "load_before", "load_after"]


def write(rows: list[dict]) -> None:
    """Merge ``rows`` into the report ``psi`` (keyed by (n, workers); earlier rows keep their own
    commit and machine) and rewrite ``psi.json`` and ``psi.md``."""
    path = OUT / "psi.json"
    old = json.loads(path.read_text())["rows"] if path.is_file() else []
    mine = {"commit": harness.commit(), "machine": harness.machine()}
    keep = {(r["n"], r["workers"]): r for r in old}
    keep.update({(r["n"], r["workers"]): {**r, **mine} for r in rows})
    harness.write_report(
        "psi",
        [keep[k] for k in sorted(keep)],
        title="PSI: time and bytes per side size",
        command="nice -n 5 .venv/bin/python -m benchmarks.privacy_cost psi [--sizes N ...] [--workers W ...]",
        columns=PSI_COLUMNS + ["commit"],
        notes=[
            f"openmined-psi {psi.library_version()}, ECDH P-256, RAW data structure; client = request + "
            "intersection, server = setup + response; n IDs per side, half common; both sides timed one after "
            "the other in one process (seconds), bytes each way; the load average before and after each run."
        ],
        out=OUT,
    )


def main_psi() -> None:
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
    configs = {f"n{n}_w{w}": {"n": n, "workers": w} for n, w in plan}
    rows = harness.run_grid(lambda cfg, seed: run(cfg["n"], cfg["workers"]), configs)
    write(rows)


# ======================================== part hyfdca-psi

ALIGN_KINDS = ("hyfdca.hello", "hyfdca.psi_serve", "hyfdca.psi_result", "hyfdca.psi_tags")


def _cpu() -> float:
    """CPU seconds (user + system) of this process and of its finished children (PSI workers)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run_alignment(name: str, alignment: str) -> tuple[dict, np.ndarray, list, list]:
    """One setup (and one round) of ``name`` on a 3 x 3 grid with ``alignment``."""
    split, pos, lam = dataset(name)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    cfg = HyFDCAConfig(
        fit_intercept=False,
        lam=lam,
        rounds=1,
        positive_classes=pos,
        reference=False,
        eval_every=0,
        alignment=alignment,
        dual_mode="block",  # the committed numbers' settings (the defaults then)
        encryption="none",
    )
    raw: list[bytes] = []
    fed = build_federation("hyfdca", split, part, cfg, seed=0, recorder=raw.append)
    c0, w0 = _cpu(), time.perf_counter()
    fed.setup()
    cpu, wall = _cpu() - c0, time.perf_counter() - w0
    load = os.getloadavg()
    setup_msgs = [(len(r), decode(r).kind) for r in raw]
    raw.clear()
    fed.loop(monitor=False).run()
    out = {
        "alignment": alignment,
        "clients": len(part.clients),
        "samples": int(fed.server.N),
        "setup_cpu_seconds": cpu,
        "setup_wall_seconds": wall,
        "load_average_1_5_15": [round(v, 2) for v in load],
        "setup_bytes": sum(n for n, _ in setup_msgs),
        "alignment_bytes": sum(n for n, k in setup_msgs if k in ALIGN_KINDS),
        "setup_messages": len(setup_msgs),
        "setup_exchanges": int(fed.server.setup_stats["exchanges"]),
        "segments": len(fed.server.seg_n),
    }
    return out, fed.server.w.copy(), fed.server.seg_holders, fed.server.seg_n


def main_hyfdca_psi() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", choices=["credit", "mnist", "both"], default="both")
    args = ap.parse_args()
    names = ["credit", "mnist"] if args.data == "both" else [args.data]
    rows = []
    mine = {"commit": harness.commit(), "machine": harness.machine()}
    with single_threaded():
        for name in names:
            pair, ws, layouts = [], {}, {}
            for alignment in ("plaintext", "psi"):
                row, w, holders, sizes = run_alignment(name, alignment)
                pair.append({"data": name, **row})
                ws[alignment], layouts[alignment] = w, (holders, sizes)
                print(name, json.dumps(row), flush=True)
            same = layouts["psi"] == layouts["plaintext"]
            diff = float(np.abs(ws["psi"] - ws["plaintext"]).max())
            rows += [{**r, "same_segments": same, "w_max_abs_diff_after_1_round": diff, **mine} for r in pair]
    harness.write_report(
        "hyfdca_psi",
        [with_mb(r) for r in _merge_rows("hyfdca_psi", rows, ("data", "alignment"))],
        title="HyFDCA sample alignment: PSI vs plaintext (setup cost)",
        command=".venv/bin/python -m benchmarks.privacy_cost hyfdca-psi [--data credit|mnist]",
        columns=HYFDCA_PSI_COLUMNS,
        notes=[
            "3 x 3 grid (9 clients), no encryption, secure aggregation on (defaults). CPU = this process + its PSI "
            f"worker processes (openmined-psi {psi.library_version()}, {psi.default_workers()} worker processes per "
            "step). Bytes: every setup message; alignment bytes: hello + `hyfdca.psi_*` only. Exchanges: plaintext "
            "hello, init, norms; psi adds serve, result, tags. PSI cost grows with the pairs: each client blinds its "
            "IDs twice (one request, one setup) and every pair costs about two exponentiations per ID of the "
            "lower-named client; the clients run in sequence here (in a deployment in parallel). Each row keeps the "
            "commit it was measured at (`-`: before rows recorded it)."
        ],
        out=OUT,
    )


def with_mb(r: dict) -> dict:
    """The row with ``setup_mb`` and ``alignment_mb`` (bytes / 10^6) for the table."""
    return {**r, "setup_mb": r["setup_bytes"] / 1e6, "alignment_mb": r["alignment_bytes"] / 1e6}


HYFDCA_PSI_COLUMNS = [
    "data",
    "alignment",
    "samples",
    ("setup_cpu_seconds", "setup CPU s"),
    ("setup_wall_seconds", "setup wall s"),
    ("load_average_1_5_15", "load 1/5/15"),
    ("setup_mb", "setup MB"),
    ("alignment_mb", "alignment MB"),
    ("setup_exchanges", "exchanges"),
    ("same_segments", "same segments"),
    ("w_max_abs_diff_after_1_round", "max abs diff of w after 1 round"),
    "commit",
]


# ======================================== part secagg


def measure(split, part, cfg: HyFDCAConfig, seed: int = 0) -> dict:
    """CPU seconds per round (median), bytes per round and of the primal shares, unmask messages
    and the final ``w`` of one HyFDCA run of ``cfg`` on ``part`` with ``seed``."""
    fed = build_federation("hyfdca", split, part, cfg, seed=seed)
    _sign(fed.clients)
    fed.setup()
    secs = []
    for rnd in range(1, cfg.rounds + 1):  # single-threaded, so CPU time is the round's compute time
        t0 = time.process_time()  # CPU time of this process: the machine's load does not enter
        fed.server.run_round(rnd, fed.transport)
        secs.append(time.process_time() - t0)
    log = fed.transport.log.entries
    rounds = [e for e in log if e.round >= 1]
    primal = sum(e.nbytes for e in rounds if e.kind == "hyfdca.primal")
    unmask = [e for e in rounds if e.kind == "hyfdca.unmask"]
    return {
        "round_cpu_seconds_median": statistics.median(secs),
        "bytes_per_round": sum(e.nbytes for e in rounds) / cfg.rounds,
        "primal_bytes_per_round": primal / cfg.rounds,
        "unmask_messages": len(unmask),
        "unmask_bytes": sum(e.nbytes for e in unmask),
        "failures": len(fed.transport.failures),
        "w": fed.server.w.copy(),
    }


def _off_on(p: dict, s: dict) -> dict:
    """A row's CPU, bytes and unmasking columns from the run without (``p``) and with (``s``)
    secure aggregation, and both runs' measurements."""
    return {
        "cpu_s_round_plain": p["round_cpu_seconds_median"],
        "cpu_s_round_secure": s["round_cpu_seconds_median"],
        "ratio": s["round_cpu_seconds_median"] / p["round_cpu_seconds_median"],
        "kB_round_plain": p["bytes_per_round"] / 1e3,
        "kB_round_secure": s["bytes_per_round"] / 1e3,
        "unmask_messages": s["unmask_messages"],
        "plain_shares": p,
        "secure_aggregation": s,
    }


def _sign(clients: dict) -> None:
    """Every client signs its keys with a credential of an in-memory roster (``peer_auth``), as
    clients of an assembled federation do; code without signed keys (``--code before``) has no
    roster module and the clients stay as they are."""
    try:
        from hybridfl.privacy.roster import in_memory_auths
    except ImportError:
        return
    if all(hasattr(c, "peer_auth") for c in clients.values()):
        for cid, auth in in_memory_auths(sorted(clients)).items():
            clients[cid].peer_auth = auth


def mask_seconds(dim: int, peers: int, reps: int = 200) -> float:
    """Median seconds of one client's masking (fixed point + pair masks with ``peers`` peers that
    all hold its ``dim`` coordinates): the client-side cost per PrimalAggregation exchange."""
    from hybridfl.privacy.secagg import SecAggClient, to_fixed

    others = {f"p{i}": SecAggClient(f"p{i}", ["x"], [dim]) for i in range(peers)}
    me = SecAggClient("me", ["x"], [dim])
    me.set_peers({c: (o.public_bytes(), ["x"]) for c, o in others.items()})
    x = np.random.default_rng(0).normal(size=dim)
    times = []
    for tag in range(reps):
        t0 = time.process_time()
        me.mask(to_fixed(x, "x"), tag, list(others))
        times.append(time.process_time() - t0)
    return statistics.median(times)


def _config(cls, **settings):
    """``cls(**settings)`` without the settings this checkout's ``cls`` does not have (the same script
    measures an older ``src`` through ``PYTHONPATH``: there ``output: last`` was the default)."""
    return cls(**{k: v for k, v in settings.items() if k in cls.model_fields})


def src_commit() -> str:
    """The commit of the ``hybridfl`` package measured (its checkout may be another worktree than the
    script's: ``PYTHONPATH=<worktree>/src``), with ``+dirty`` for uncommitted changes."""
    import subprocess

    import hybridfl

    where = Path(hybridfl.__file__).resolve().parent
    git = ["git", "-C", str(where)]
    sha = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "."], capture_output=True, text=True).stdout.strip()
    return (sha or "unknown") + ("+dirty" if dirty else "")


def _merge_rows(name: str, rows: list[dict], key: tuple[str, ...]) -> list[dict]:
    """``rows`` merged into the report ``name``'s earlier rows (a row with the same ``key`` values
    replaces the earlier one; the others keep their own commit and machine)."""
    path = OUT / f"{name}.json"
    old = json.loads(path.read_text())["rows"] if path.is_file() else []
    kept = {tuple(str(r.get(k)) for k in key): r for r in old}
    kept.update({tuple(str(r.get(k)) for k in key): r for r in rows})
    return [kept[k] for k in sorted(kept)]


def main_secagg() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", default="credit", choices=["mnist", "credit", "adult"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--rates", default="0,0.2", help="comma-separated failure rates")
    ap.add_argument("--dual-mode", default="block", choices=["block", "consensus", "segment"])
    ap.add_argument("--code", default="now", help="a label for the code measured (e.g. before, now)")
    args = ap.parse_args()
    split, pos, lam = dataset(args.dataset)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    code = src_commit()

    def compare(setting: dict, seed: int) -> dict:
        """The same run with secure aggregation off and on at one failure rate."""
        res = {}
        for secure in (False, True):
            cfg = _config(
                HyFDCAConfig,
                fit_intercept=False,
                lam=lam,
                rounds=args.rounds,
                positive_classes=pos,
                eval_every=0,
                reference=False,
                failure_rate=setting["failure_rate"],
                dual_mode=args.dual_mode,
                secure_aggregation=secure,
                batch_size=128,
                encryption="none",  # the committed numbers' settings (the defaults then)
                alignment="plaintext",  # the one-off PSI setup is not part of a round (part hyfdca-psi)
                output="last",
                segment_inner_products="encrypted",
            )
            res[secure] = measure(split, part, cfg, seed)
        diff = float(np.abs(res[True].pop("w") - res[False].pop("w")).max())
        p, s = res[False], res[True]
        return {
            **_off_on(p, s),
            "primal_kB_round_plain": p["primal_bytes_per_round"] / 1e3,
            "primal_kB_round_secure": s["primal_bytes_per_round"] / 1e3,
            "w_max_abs_diff": diff,
        }

    with single_threaded():
        warm = _config(
            HyFDCAConfig,
            fit_intercept=False,
            lam=lam,
            rounds=2,
            positive_classes=pos,
            eval_every=0,
            reference=False,
            encryption="none",
            alignment="plaintext",
        )
        measure(split, part, warm)  # first-use costs (imports, caches) outside the comparison
        base = {"dataset": args.dataset, "grid": "3x3", "dual_mode": args.dual_mode, "rounds": args.rounds}
        rates = [float(r) for r in args.rates.split(",")]
        rows = harness.run_grid(compare, {f"failure_rate {r:g}": {**base, "failure_rate": r} for r in rates})
    micro = {f"d={d}, {k} peers": mask_seconds(d, k) for d, k in ((784, 8), (784, 99), (100_000, 8))}
    new = [
        {
            **r,
            "dataset": args.dataset,
            "dual_mode": args.dual_mode,
            "failure_rate": r["setting"]["failure_rate"],
            "code": args.code,
            "src_commit": code,
        }
        for r in rows
    ]
    harness.write_report(
        "secagg_cost",
        _merge_rows("secagg_cost", new, ("dataset", "dual_mode", "failure_rate", "code")),
        title="HyFDCA secure aggregation of the primal shares, off vs on (3 x 3 grid)",
        command=".venv/bin/python -m benchmarks.privacy_cost secagg --dataset D --rounds R --rates F [--code LABEL]",
        columns=SECAGG_COLUMNS,
        notes=[
            f"{args.rounds} rounds, encryption none (secure aggregation concerns the plaintext shares; its cost "
            "does not depend on the scheme); the same seed and failures in both runs, one process. Round times are "
            "CPU seconds of the whole simulated round (server and all 9 clients in sequence, one thread), so the "
            "machine's load does not enter them. `code`: which code was measured (`before`: single masks at the "
            "`src_commit` named, run as `PYTHONPATH=<that checkout>/src`; `now`: double masking, every client "
            "signing its keys against an in-memory roster), rows of other runs kept.",
            "Client-side masking per exchange (fixed point + ChaCha20 pair masks), median of 200 (last run): "
            + ", ".join(f"{k}: {v * 1e3:.3f} ms" for k, v in micro.items())
            + ".",
        ],
        out=OUT,
        extra={"mask_seconds_median": micro},
    )


# ======================================== part secagg-hyfem


def hyfem_measure(prep, algo, rounds: int) -> dict:
    """CPU seconds per round (median), bytes per round and the unmasking messages of one HyFEM run
    (single-threaded: CPU time is the round's compute)."""
    fed = build_federation("hyfem", prep.split, prep.partition, algo, seed=0)
    _sign(fed.clients)
    fed.setup()
    secs = []
    for rnd in range(1, rounds + 1):
        t0 = time.process_time()
        fed.server.run_round(rnd, fed.transport)
        secs.append(time.process_time() - t0)
    entries = [e for e in fed.transport.log.entries if e.round >= 1]
    unmask = [e for e in entries if "unmask" in e.kind]
    return {
        "round_cpu_seconds_median": statistics.median(secs),
        "bytes_per_round": sum(e.nbytes for e in entries) / rounds,
        "unmask_messages": len(unmask),
        "unmask_bytes": sum(e.nbytes for e in unmask),
        "failures": len(fed.transport.failures),
    }


def main_secagg_hyfem() -> None:
    """HyFEM's secure aggregation of the extractors, off vs on, with many clients (module docs)."""
    from hybridfl.algorithms.hyfem import HyFEMConfig
    from hybridfl.config import load_config
    from hybridfl.experiment import prepare

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--local-steps", type=int, default=1)
    ap.add_argument("--code", default="now", help="a label for the code measured (e.g. before, now)")
    ap.add_argument("--data-dir", default=str(harness.ROOT.parent / "shared" / "data" / "mnist"))
    args = ap.parse_args()
    cfg = load_config(harness.ROOT / "examples" / "configs" / "hyfem_mnist.yaml")
    data = cfg.model_dump(mode="json")
    data["dataset"]["data_dir"] = args.data_dir
    data["partition"]["num_clients"] = args.clients
    prep = prepare(type(cfg).model_validate(data))
    code = src_commit()

    def compare(setting: dict, seed: int) -> dict:
        res = {}
        for secure in (False, True):
            settings = {**prep.algorithm.model_dump(), "rounds": args.rounds, "local_steps": args.local_steps}
            settings.update(eval_every=0, baselines=False, secure_aggregation=secure)
            res[secure] = hyfem_measure(prep, _config(HyFEMConfig, **settings), args.rounds)
        return _off_on(res[False], res[True])

    with single_threaded():
        name = f"{args.clients} clients"
        base = {"clients": args.clients, "rounds": args.rounds, "local_steps": args.local_steps}
        rows = harness.run_grid(compare, {name: base})
    new = [{**r, **base, "code": args.code, "src_commit": code} for r in rows]
    harness.write_report(
        "secagg_cost_hyfem",
        _merge_rows("secagg_cost_hyfem", new, ("clients", "local_steps", "code")),
        title="HyFEM secure aggregation of the extractors, off vs on (MNIST quadrants, many clients)",
        command=(
            ".venv/bin/python -m benchmarks.privacy_cost secagg-hyfem --clients N --rounds R --local-steps Q "
            "[--code LABEL]"
        ),
        columns=SECAGG_HYFEM_COLUMNS,
        notes=[
            "examples/configs/hyfem_mnist.yaml with N clients (class x block partition, 3 of 4 quadrants each), "
            "Q local steps (few, so that the secure aggregation's share of a round shows), no evaluation or "
            "baselines; the same seed in both runs, one process, one thread: CPU seconds of the whole simulated "
            "round (server and every client in sequence). `code`: which code was measured (`before`: single "
            "masks at the `src_commit` named, run as `PYTHONPATH=<that checkout>/src`; `now`: double masking, "
            "every client signing its keys against an in-memory roster)."
        ],
        out=OUT,
    )


SECAGG_HYFEM_COLUMNS = [
    ("code", "code"),
    ("src_commit", "src commit"),
    ("clients", "clients"),
    ("local_steps", "Q"),
    ("cpu_s_round_plain", "CPU s/round plain"),
    ("cpu_s_round_secure", "CPU s/round secure"),
    ("ratio", "ratio"),
    ("kB_round_plain", "kB/round plain"),
    ("kB_round_secure", "kB/round secure"),
    ("unmask_messages", "unmask messages"),
    ("load_before", "load before"),
]


SECAGG_COLUMNS = [
    ("code", "code"),
    ("src_commit", "src commit"),
    ("dataset", "dataset"),
    ("failure_rate", "failure rate"),
    ("cpu_s_round_plain", "CPU s/round plain"),
    ("cpu_s_round_secure", "CPU s/round secure"),
    ("ratio", "ratio"),
    ("kB_round_plain", "kB/round plain"),
    ("kB_round_secure", "kB/round secure"),
    ("primal_kB_round_plain", "primal kB/round plain"),
    ("primal_kB_round_secure", "primal kB/round secure"),
    ("unmask_messages", "unmask messages"),
    ("w_max_abs_diff", "max abs diff of w"),
    ("load_before", "load before"),
]


# ======================================== part psi-roster
ROSTER_ALIGN_KINDS = ("hyfdca.hello", "hyfdca.psi_serve", "hyfdca.psi_result", "hyfdca.psi_tags")


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


def roster_run(name: str, signed: bool) -> tuple[dict, tuple]:
    split, pos, lam = dataset(name)
    part = GridPartitioner(3, 3, 1, 0).partition(split.train)
    cfg = HyFDCAConfig(
        fit_intercept=False,
        lam=lam,
        rounds=1,
        positive_classes=pos,
        reference=False,
        eval_every=0,
        dual_mode="block",  # as measured (the defaults then)
        encryption="none",
    )
    raw: list[bytes] = []
    fed = build_federation("hyfdca", split, part, cfg, seed=0, recorder=raw.append)
    timed = _Timed()
    from hybridfl.privacy import roster as roster_mod  # here: the secagg parts also measure older src

    if signed:
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
        "alignment_bytes": sum(n for n, k in msgs if k in ROSTER_ALIGN_KINDS),
        "signature_seconds": round(timed.seconds, 4),
        "signature_calls": timed.calls,
    }
    return row, (fed.server.seg_holders, fed.server.seg_n)


def main_psi_roster() -> None:
    """The cost of signed PSI (a roster): HyFDCA's alignment setup without and with one."""
    ap = argparse.ArgumentParser(description="signed vs unsigned PSI setup")
    ap.add_argument("--data", choices=["credit", "mnist"], default="credit")
    args = ap.parse_args()
    rows, layouts = [], []
    mine = {"data": args.data, "grid": "3x3", "commit": harness.commit(), "machine": harness.machine()}
    with single_threaded():
        for signed in (False, True):
            row, layout = roster_run(args.data, signed)
            rows.append({**mine, **row})
            layouts.append(layout)
            print(json.dumps(row), flush=True)
    for r in rows:
        r["same_segments"] = layouts[0] == layouts[1]
        r["extra_setup_bytes"] = r["setup_bytes"] - rows[0]["setup_bytes"]
        r["extra_setup_share"] = r["extra_setup_bytes"] / rows[0]["setup_bytes"]
    harness.write_report(
        "psi_roster",
        _merge_rows("psi_roster", rows, ("data", "signed")),
        title="Signed PSI (roster) vs unsigned: HyFDCA alignment setup, 3 x 3 grid",
        command=".venv/bin/python -m benchmarks.privacy_cost psi-roster [--data credit|mnist]",
        columns=PSI_ROSTER_COLUMNS,
        notes=[
            "No encryption, secure aggregation on (defaults); 9 clients simulated in sequence. CPU = this process + "
            "its PSI worker processes. `signing + checking s (calls)`: the seconds inside Ed25519 signing and "
            "verifying and the blobs' SHA-256 (timed around the calls) and their count. `extra setup bytes`: the "
            "setup's bytes over those of the run without a roster (share of them)."
        ],
        out=OUT,
    )


PSI_ROSTER_COLUMNS = [
    "data",
    ("signed", "roster"),
    "samples",
    ("setup_cpu_seconds", "setup CPU s"),
    ("setup_wall_seconds", "setup wall s"),
    ("load_average_1_5_15", "load 1/5/15"),
    ("setup_bytes", "setup bytes"),
    ("alignment_bytes", "alignment bytes"),
    ("signature_seconds", "signing + checking s"),
    ("signature_calls", "calls"),
    ("extra_setup_bytes", "extra setup bytes"),
    ("extra_setup_share", "share"),
    ("same_segments", "same segments"),
    "commit",
]


PARTS = {
    "psi": (main_psi, "--sizes 200 --workers 1".split()),
    "hyfdca-psi": (main_hyfdca_psi, "--data credit".split()),
    "secagg": (main_secagg, "--dataset credit --rounds 2 --rates 0".split()),
    "secagg-hyfem": (main_secagg_hyfem, "--clients 4 --rounds 1".split()),
    "psi-roster": (main_psi_roster, "--data credit".split()),
}


def main() -> None:
    """``python -m benchmarks.privacy_cost PART [options] [--smoke]`` (see :func:`benchmarks.harness.dispatch`)."""
    dispatch("privacy_cost", PARTS, globals())


if __name__ == "__main__":
    main()
