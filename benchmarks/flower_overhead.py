"""Benchmark: Flower's own cost per exchange on loopback, warm executor vs Flower's default path.

Three ways to run the same SuperNodes, measured in the same invocation (same machine, same load):

- ``warm``: ``python -m hybridfl.runtime.flower.supernode --warm`` (fast-polling SuperNode with
  ``--isolation process`` and hybridfl's warm executor: one long-lived process keeps the client in
  memory), the ServerApp pulling every 0.02 s;
- ``tuned``: the same fast-polling SuperNode with Flower's SuperExec (a new ``flwr-clientapp``
  process per message), pulling every 0.02 s;
- ``default``: the stock ``flower-supernode`` (3 s idle sleep, SuperExec, a process per message)
  and the ServerApp pulling every 3 s, as Flower's ``grid.send_and_receive`` does.

The SuperLink keeps its state in memory in all three (``--database FILE`` costs more per exchange).

Parts:

- ``ping`` (``--nodes 1,3``, ``--pings 10``): per number of SuperNodes and setting, the seconds of
  each empty exchange (``deploy.ping``: server -> every client -> server, no algorithm work),
  their median and 90th percentile;
- ``hyfem``: HyFEM, digits, 3 clients, ``--rounds`` rounds: seconds per round and per exchange in
  process and per setting, counted vs Flower bytes, metrics equal to the in-process run;
- ``hyfdca``: HyFDCA (plaintext), 3 clients: warm vs tuned, ``w`` against the in-process run.

Writes ``benchmarks/results/flower_overhead.json`` and ``.md`` (the parts run are replaced, the
others kept). Usage: ``python benchmarks/flower_overhead.py [--part ping|hyfem|hyfdca|all]
[--pings 10] [--nodes 1,3] [--rounds 3] [--settings warm,tuned,default]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem
from hybridfl.config import parse_config
from hybridfl.data.export import export_clients
from hybridfl.experiment import prepare
from hybridfl.runtime.flower.local import LocalFederation
from hybridfl.runtime.simulation import single_threaded

OUT = Path(__file__).resolve().parent / "results"
SETTINGS = {
    # name: (fast launcher, warm executor, SuperNode poll interval, ServerApp poll interval, description)
    "warm": (
        True,
        True,
        0.1,
        0.05,
        "fast SuperNode (pulls every 0.1 s) --isolation process + hybridfl warm executor; ServerApp pulls every 0.05 s",
    ),
    "tuned": (
        True,
        False,
        0.05,
        0.02,
        "fast SuperNode (pulls every 0.05 s) + Flower SuperExec, a ClientApp process per message; ServerApp pulls "
        "every 0.02 s",
    ),
    "default": (
        False,
        False,
        3.0,
        3.0,
        "stock flower-supernode (3 s) + Flower SuperExec, a ClientApp process per message; ServerApp pulls every 3 s",
    ),
}


def median(xs: list[float]) -> float | None:
    """Median of ``xs`` (None if empty)."""
    return statistics.median(xs) if xs else None


def p90(xs: list[float]) -> float | None:
    """90th percentile of ``xs`` (inclusive method; None if empty)."""
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=10, method="inclusive")[-1]


def machine() -> dict:
    """Where the numbers were measured."""
    return {"cores": os.cpu_count(), "flwr": version("flwr"), "python": platform.python_version()}


def flower_run(dirs, server_dir: Path, work: Path, setting: str, extra: dict) -> tuple[dict, float]:
    """Start a federation in ``setting``, run once, stop; returns (summary.json, wall seconds incl. start-up)."""
    fast, warm, node_poll, poll, _ = SETTINGS[setting]
    fed = LocalFederation(
        dirs, fast=fast, warm=warm, poll_interval=min(node_poll, 3.0), work_dir=work, start_timeout=180
    )
    t0 = time.perf_counter()
    try:
        fed.start()
        fed.run(
            {"server-dir": str(server_dir), "out-dir": str(work / "res"), "poll-interval": poll, **extra}, timeout=3600
        )
    except BaseException:
        print(fed.logs(40))
        raise
    finally:
        fed.stop()
    return json.loads((work / "res" / "summary.json").read_text()), time.perf_counter() - t0


def ping_part(nodes: list[int], pings: int, settings: list[str]) -> dict:
    """Per number of SuperNodes and setting: ``pings`` empty exchanges (then a 1-round, 1-step HyFEM run)."""
    res: dict = {
        "pings": pings,
        "machine": machine(),
        "settings": {s: SETTINGS[s][4] for s in settings},
        "by_nodes": {},
    }
    for n in nodes:
        algo = {"name": "hyfem", "rounds": 1, "local_steps": 1, "baselines": False}
        cfg = parse_config(
            {
                "seed": 0,
                "dataset": {"name": "digits"},
                "partition": {"kind": "iid", "num_clients": n},
                "algorithm": algo,
            }
        )
        prep = prepare(cfg)
        out: dict = {}
        with tempfile.TemporaryDirectory(prefix="hybridfl-ping-") as tmp:
            tmp = Path(tmp)
            dirs = export_clients(
                prep.split, prep.partition, tmp / "export", seed=0, run_config=cfg.model_dump(mode="json")
            )
            for name in settings:
                la = os.getloadavg()
                s, wall = flower_run(dirs, tmp / "export" / "server", tmp / name, name, {"pings": pings})
                xs = s["ping_seconds"]
                out[name] = {
                    "ping_exchange_seconds": xs,
                    "median": median(xs),
                    "p90": p90(xs),
                    "hello_seconds": s["setup_exchange_seconds"],
                    "wall_seconds_incl_startup": wall,
                    "load_average_start": la,
                    "load_average_end": os.getloadavg(),
                }
                print(
                    f"{n} node(s), {name}: median {out[name]['median']:.3f} s, p90 {out[name]['p90']:.3f} s", flush=True
                )
        res["by_nodes"][str(n)] = out
    return res


def _digits_config(algo: dict):
    """The run config of the HyFEM and HyFDCA parts: digits, 3 clients with 5-7 classes and 2 blocks each."""
    partition = {"kind": "class_block", "num_clients": 3, "classes_per_client": [5, 7], "blocks_per_client": 2}
    return parse_config({"seed": 0, "dataset": {"name": "digits"}, "partition": partition, "algorithm": algo})


def _hyfem_setup(rounds: int, local_steps: int):
    algo = {
        "name": "hyfem",
        "rounds": rounds,
        "local_steps": local_steps,
        "batch_size": 32,
        "lr": 0.05,
        "momentum": 0.9,
        "baselines": False,
    }
    cfg = _digits_config(algo)
    return algo, cfg, prepare(cfg)


def hyfem_part(rounds: int, local_steps: int, pings: int, settings: list[str]) -> dict:
    """HyFEM, 3 clients: in process vs each Flower setting (same work, same seed)."""
    algo, cfg, prep = _hyfem_setup(rounds, local_steps)
    result: dict = {"algorithm": algo, "clients": 3, "machine": machine(), "load_average_start": os.getloadavg()}
    with single_threaded():
        ref = run_hyfem(prep.split, prep.partition, HyFEMConfig(**{k: v for k, v in algo.items() if k != "name"}), 0)
    strip = lambda h: [{k: v for k, v in r.items() if k not in ("seconds", "client_accuracy_local_mean")} for r in h]  # noqa: E731
    result["in_process"] = {
        "round_seconds": [r["seconds"] for r in ref.history],
        "bytes_total": ref.summary["bytes_total"],
        "messages_total": ref.summary["messages_total"],
    }
    with tempfile.TemporaryDirectory(prefix="hybridfl-bench-") as tmp:
        tmp = Path(tmp)
        dirs = export_clients(
            prep.split, prep.partition, tmp / "export", seed=0, run_config=cfg.model_dump(mode="json")
        )
        for name in settings:
            s, wall = flower_run(dirs, tmp / "export" / "server", tmp / name, name, {"pings": pings})
            hist = json.loads((tmp / name / "res" / "history.json").read_text())
            result[name] = {
                "description": SETTINGS[name][4],
                "ping_exchange_seconds": s["ping_seconds"],
                "round_seconds": s["round_seconds"],
                "exchange_seconds": s["exchange_seconds"],
                "hello_exchange_seconds": s["setup_exchange_seconds"],
                "bytes_total": s["bytes_total"],
                "wire_bytes_total": s["wire_bytes_total"],
                "messages_total": s["messages_total"],
                "metrics_equal_in_process": strip(hist) == strip(ref.history),
                "wall_seconds_incl_startup": wall,
            }
            print(f"hyfem, {name}: round median {median(s['round_seconds']):.2f} s", flush=True)
    result["load_average_end"] = os.getloadavg()
    return result


def hyfdca_part(settings: list[str], rounds: int = 5) -> dict:
    """HyFDCA (plaintext, 3 exchanges per round), 3 clients: in process vs each setting."""
    import numpy as np

    from hybridfl.algorithms.hyfdca import HyFDCAConfig
    from hybridfl.runtime.simulation import build_federation

    algo = {
        "name": "hyfdca",
        "loss": "hinge",
        "lam": 1e-3,
        "rounds": rounds,
        "positive_classes": [0, 1, 2, 3, 4],
        "encryption": "none",
        "reference": False,
        "local_fraction": 0.5,
    }
    cfg = _digits_config(algo)
    prep = prepare(cfg)
    res: dict = {"algorithm": algo, "clients": 3, "machine": machine(), "load_average_start": os.getloadavg()}
    with single_threaded():
        fed = build_federation(
            "hyfdca", prep.split, prep.partition, HyFDCAConfig(**{k: v for k, v in algo.items() if k != "name"}), 0
        )
        fed.setup()
        hist = fed.loop(monitor=False).run()
        server, tr = fed.server, fed.transport
    res["in_process"] = {
        "round_seconds": [r["seconds"] for r in hist],
        "bytes_total": tr.log.bytes_total,
        "messages_total": tr.log.messages_total,
    }
    with tempfile.TemporaryDirectory(prefix="hybridfl-bench-d-") as tmp:
        tmp = Path(tmp)
        dirs = export_clients(
            prep.split, prep.partition, tmp / "export", seed=0, run_config=cfg.model_dump(mode="json")
        )
        for name in settings:
            s, wall = flower_run(dirs, tmp / "export" / "server", tmp / name, name, {})
            w = np.load(tmp / name / "res" / "final.npz")["w"]
            res[name] = {
                "description": SETTINGS[name][4],
                "round_seconds": s["round_seconds"],
                "exchange_seconds": s["exchange_seconds"],
                "bytes_total": s["bytes_total"],
                "wire_bytes_total": s["wire_bytes_total"],
                "messages_total": s["messages_total"],
                "w_max_relative_difference": float(
                    np.max(np.abs(w - server.w)) / max(float(np.max(np.abs(server.w))), 1e-300)
                ),
                "wall_seconds_incl_startup": wall,
            }
            print(f"hyfdca, {name}: round median {median(s['round_seconds']):.2f} s", flush=True)
    res["load_average_end"] = os.getloadavg()
    return res


def main() -> None:
    """Run the parts asked for and write the results files."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("ping", "hyfem", "hyfdca", "all"), default="all")
    ap.add_argument("--pings", type=int, default=10)
    ap.add_argument("--nodes", default="1,3", help="numbers of SuperNodes for the ping part, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--settings", default="warm,tuned,default", help="comma-separated subset of " + ",".join(SETTINGS))
    args = ap.parse_args()
    settings = [s for s in args.settings.split(",") if s]
    if not settings or any(s not in SETTINGS for s in settings):
        raise SystemExit(f"--settings must be a comma-separated subset of {','.join(SETTINGS)}.")
    path = OUT / "flower_overhead.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    if "ping" in old and "by_nodes" not in old.get("ping", {}):
        old.pop("ping")
    for stale in ("ping_1_client", "setup", "in_process", "tuned", "default", "load_average_start", "load_average_end"):
        old.pop(stale, None)  # the layout of earlier versions of this benchmark (other code, other settings)
    if args.part in ("ping", "all"):
        old["ping"] = ping_part([int(n) for n in args.nodes.split(",") if n], max(args.pings, 2), settings)
        path.write_text(json.dumps(old, indent=1))
    if args.part in ("hyfem", "all"):
        old["hyfem"] = hyfem_part(args.rounds, args.local_steps, 3, settings)
        path.write_text(json.dumps(old, indent=1))
    if args.part in ("hyfdca", "all"):
        old["hyfdca"] = hyfdca_part([s for s in settings if s != "default"] or settings)
        path.write_text(json.dumps(old, indent=1))
    write_md(old)


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table_row(label: str, first: str, cells: list[str]) -> str:
    return f"| {label} | {first} | " + " | ".join(cells) + " |"


def write_md(r: dict) -> None:
    """``flower_overhead.md``: the tables of whatever parts ``r`` holds."""
    out = []
    if "ping" in r:
        p = r["ping"]
        m = p["machine"]
        names = list(p["settings"])
        head = "| SuperNodes | " + " | ".join(names) + " |\n|---|" + "---|" * len(names)
        rows_med = []
        for n, by in p["by_nodes"].items():
            rows_med.append(
                f"| {n}, median | " + " | ".join(_f(by[s]["median"], 3) if s in by else "-" for s in names) + " |"
            )
            rows_med.append(
                f"| {n}, p90 | " + " | ".join(_f(by[s]["p90"], 3) if s in by else "-" for s in names) + " |"
            )
        loads = "; ".join(
            f"{n} node(s) {s}: {by[s]['load_average_start'][0]:.1f}"
            for n, by in p["by_nodes"].items()
            for s in names
            if s in by
        )
        allx = "\n".join(
            f"- {n} node(s), {s}: " + ", ".join(f"{x:.3f}" for x in by[s]["ping_exchange_seconds"])
            for n, by in p["by_nodes"].items()
            for s in names
            if s in by
        )
        out.append(
            f"Seconds per empty exchange (`deploy.ping`: server -> every client -> server), {p['pings']} per setting, "
            f"loopback, flwr {m['flwr']}, {m['cores']} cores; load average (1 min) at the start of each: {loads}.\n\n"
            + head
            + "\n"
            + "\n".join(rows_med)
            + "\n\n"
            + "\n".join(f"- `{s}`: {d}" for s, d in p["settings"].items())
            + "\n\nEvery exchange:\n\n"
            + allx
        )
    if "hyfem" in r:
        h = r["hyfem"]
        ip = h["in_process"]
        names = [s for s in SETTINGS if s in h]
        rows = ["| | in process | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for label, first, cell in (
            ("seconds per round (median)", _f(median(ip["round_seconds"])), lambda x: _f(median(x["round_seconds"]))),
            ("seconds per exchange (median)", "-", lambda x: _f(median(x["exchange_seconds"]))),
            (
                "seconds per empty exchange, 3 clients (median)",
                "-",
                lambda x: _f(median(x["ping_exchange_seconds"])),
            ),
            ("counted bytes (our codec)", str(ip["bytes_total"]), lambda x: str(x["bytes_total"])),
            ("Flower serialized bytes", "-", lambda x: str(x["wire_bytes_total"])),
            ("messages", str(ip["messages_total"]), lambda x: str(x["messages_total"])),
            ("metrics equal to in process", "-", lambda x: str(x["metrics_equal_in_process"])),
        ):
            rows.append(_table_row(label, first, [cell(h[s]) for s in names]))
        a = h["algorithm"]
        out.append(
            f"HyFEM, digits, 3 clients, {a['rounds']} rounds x {a['local_steps']} local steps, seed 0; load average "
            f"{h['load_average_start'][0]:.1f} at start, {h['load_average_end'][0]:.1f} at end, {h['machine']['cores']} cores.\n\n"
            + "\n".join(rows)
        )
    if "hyfdca" in r:
        d = r["hyfdca"]
        ip = d["in_process"]
        names = [s for s in SETTINGS if s in d]
        rows = ["| | in process | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for label, first, cell in (
            ("seconds per round (median)", _f(median(ip["round_seconds"])), lambda x: _f(median(x["round_seconds"]))),
            ("seconds per exchange (median)", "-", lambda x: _f(median(x["exchange_seconds"]))),
            (
                f"counted bytes ({ip['messages_total']} messages)",
                str(ip["bytes_total"]),
                lambda x: str(x["bytes_total"]),
            ),
            ("Flower serialized bytes", "-", lambda x: str(x["wire_bytes_total"])),
            ("max relative difference of w", "-", lambda x: f"{x['w_max_relative_difference']:.1e}"),
        ):
            rows.append(_table_row(label, first, [cell(d[s]) for s in names]))
        out.append(
            f"HyFDCA (plaintext), digits, 3 clients, {d['algorithm']['rounds']} rounds of 3 exchanges (+3 setup); load "
            f"average {d['load_average_start'][0]:.1f} -> {d['load_average_end'][0]:.1f}.\n\n" + "\n".join(rows)
        )
    (OUT / "flower_overhead.md").write_text("\n\n".join(out) + "\n")
    print((OUT / "flower_overhead.md").read_text())


if __name__ == "__main__":
    main()
