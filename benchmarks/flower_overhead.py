"""Benchmark: HyFEM over Flower on loopback vs the in-process simulation, same work.

For one set-up (digits, 3 clients, HyFEM, same seed) it measures

- in process: seconds per round of ``run_hyfem`` (no Flower);
- over Flower on 127.0.0.1 (a real SuperLink + 3 SuperNodes + ``flwr run``), twice:
  ``default``: stock ``flower-supernode`` (sleeps 3 s when a pull finds nothing) and the ServerApp
  pulling every 3 s (what Flower's ``grid.send_and_receive`` does); ``tuned``: the fast-polling
  SuperNode launcher (0.05 s) and the ServerApp pulling every 0.02 s;
  per run: seconds per round, seconds of an empty exchange (``deploy.ping``: Flower's own cost of
  one server -> 3 clients -> server exchange: polling + one new ClientApp process per message),
  our counted bytes vs Flower's serialized bytes;
- and checks the Flower runs' metrics equal the in-process run.

``--part ping``: one client only, ``--pings`` empty exchanges per setting (default and tuned), to
separate Flower's per-exchange overhead from CPU contention between several ClientApp processes.

Writes ``benchmarks/results/flower_overhead.json`` and ``.md`` (parts are merged). Usage:
``python benchmarks/flower_overhead.py [--part hyfem|ping|all] [--rounds 3] [--pings 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem
from hybridfl.config import parse_config
from hybridfl.data.export import export_clients
from hybridfl.experiment import prepare
from hybridfl.runtime.flower.local import LocalFederation
from hybridfl.runtime.simulation import single_threaded

OUT = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pings", type=int, default=3)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--part", choices=("hyfem", "ping", "hyfdca", "all"), default="all")
    args = ap.parse_args()
    old = json.loads((OUT / "flower_overhead.json").read_text()) if (OUT / "flower_overhead.json").is_file() else {}
    if args.part in ("ping", "all"):
        old["ping_1_client"] = ping_part(max(args.pings, 5))
        (OUT / "flower_overhead.json").write_text(json.dumps(old, indent=1))
    if args.part in ("hyfem", "all"):
        old.update(hyfem_part(args))
        (OUT / "flower_overhead.json").write_text(json.dumps(old, indent=1))
    if args.part in ("hyfdca", "all"):
        old["hyfdca"] = hyfdca_part()
        (OUT / "flower_overhead.json").write_text(json.dumps(old, indent=1))
    write_md(old)


def ping_part(pings: int) -> dict:
    """One SuperNode, ``pings`` empty exchanges, stock vs fast polling (then a 1-round HyFEM run)."""
    algo = {"name": "hyfem", "rounds": 1, "local_steps": 1, "baselines": False}
    cfg = parse_config(
        {"seed": 0, "dataset": {"name": "digits"}, "partition": {"kind": "iid", "num_clients": 1}, "algorithm": algo}
    )
    prep = prepare(cfg)
    res: dict = {"load_average_start": os.getloadavg(), "pings": pings}
    with tempfile.TemporaryDirectory(prefix="hybridfl-ping-") as tmp:
        tmp = Path(tmp)
        dirs = export_clients(
            prep.split, prep.partition, tmp / "export", seed=0, run_config=cfg.model_dump(mode="json")
        )
        for name, fast, poll in (("tuned", True, 0.02), ("default", False, 3.0)):
            fed = LocalFederation(dirs, fast=fast, poll_interval=0.05, work_dir=tmp / name, start_timeout=180)
            try:
                fed.start()
                fed.run(
                    {
                        "server-dir": str(tmp / "export" / "server"),
                        "out-dir": str(tmp / name / "res"),
                        "poll-interval": poll,
                        "pings": pings,
                    },
                    timeout=1800,
                )
            finally:
                fed.stop()
            s = json.loads((tmp / name / "res" / "summary.json").read_text())
            res[name] = {
                "ping_exchange_seconds": s["ping_seconds"],
                "serverapp_poll_interval": poll,
                "supernode": "fast 0.05 s" if fast else "stock 3 s",
            }
    res["load_average_end"] = os.getloadavg()
    return res


def hyfdca_part(rounds: int = 5) -> dict:
    """HyFDCA (plaintext, 3 exchanges per round), 3 clients: in process vs loopback (tuned)."""
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
    cfg = parse_config(
        {
            "seed": 0,
            "dataset": {"name": "digits"},
            "partition": {
                "kind": "class_block",
                "num_clients": 3,
                "classes_per_client": [5, 7],
                "blocks_per_client": 2,
            },
            "algorithm": algo,
        }
    )
    prep = prepare(cfg)
    res: dict = {"algorithm": algo, "load_average_start": os.getloadavg()}
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
        fed = LocalFederation(dirs, fast=True, poll_interval=0.05, work_dir=tmp / "fed", start_timeout=180)
        try:
            fed.start()
            fed.run({"server-dir": str(tmp / "export" / "server"), "out-dir": str(tmp / "res")}, timeout=1800)
        finally:
            fed.stop()
        s = json.loads((tmp / "res" / "summary.json").read_text())
        w = np.load(tmp / "res" / "final.npz")["w"]
    res["tuned"] = {
        "round_seconds": s["round_seconds"],
        "exchange_seconds": s["exchange_seconds"],
        "bytes_total": s["bytes_total"],
        "wire_bytes_total": s["wire_bytes_total"],
        "messages_total": s["messages_total"],
        "w_max_relative_difference": float(np.max(np.abs(w - server.w)) / max(float(np.max(np.abs(server.w))), 1e-300)),
    }
    res["load_average_end"] = os.getloadavg()
    return res


def hyfem_part(args) -> dict:
    algo = {
        "name": "hyfem",
        "rounds": args.rounds,
        "local_steps": args.local_steps,
        "batch_size": 32,
        "lr": 0.05,
        "momentum": 0.9,
        "baselines": False,
    }
    cfg = parse_config(
        {
            "seed": 0,
            "dataset": {"name": "digits"},
            "partition": {
                "kind": "class_block",
                "num_clients": 3,
                "classes_per_client": [5, 7],
                "blocks_per_client": 2,
            },
            "algorithm": algo,
        }
    )
    prep = prepare(cfg)
    result: dict = {
        "setup": {
            "dataset": "digits",
            "clients": 3,
            "algorithm": algo,
            "cores": os.cpu_count(),
            "rounds": args.rounds,
            "local_steps": args.local_steps,
        },
        "load_average_start": os.getloadavg(),
    }
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
        for name, fast, poll in (("tuned", True, 0.02), ("default", False, 3.0)):
            fed = LocalFederation(dirs, fast=fast, poll_interval=0.05, work_dir=tmp / name, start_timeout=180)
            t0 = time.perf_counter()
            try:
                fed.start()
                fed.run(
                    {
                        "server-dir": str(tmp / "export" / "server"),
                        "out-dir": str(tmp / name / "res"),
                        "poll-interval": poll,
                        "pings": args.pings,
                    },
                    timeout=1800,
                )
            finally:
                fed.stop()
            s = json.loads((tmp / name / "res" / "summary.json").read_text())
            hist = json.loads((tmp / name / "res" / "history.json").read_text())
            result[name] = {
                "supernode": "hybridfl.runtime.flower.supernode --poll-interval 0.05"
                if fast
                else "flower-supernode (stock, 3 s)",
                "serverapp_poll_interval": poll,
                "ping_exchange_seconds": s["ping_seconds"],
                "round_seconds": s["round_seconds"],
                "exchange_seconds": s["exchange_seconds"],
                "hello_exchange_seconds": s["setup_exchange_seconds"],
                "bytes_total": s["bytes_total"],
                "wire_bytes_total": s["wire_bytes_total"],
                "messages_total": s["messages_total"],
                "metrics_equal_in_process": strip(hist) == strip(ref.history),
                "wall_seconds_incl_startup": time.perf_counter() - t0,
            }
    result["load_average_end"] = os.getloadavg()
    return result


def write_md(r: dict) -> None:
    med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"  # noqa: E731
    out = []
    if "in_process" in r:
        ip, t, d, st = r["in_process"], r["tuned"], r["default"], r["setup"]
        rows = ["| | in process | Flower loopback, tuned | Flower loopback, default |", "|---|---|---|---|"]
        rows.append(
            f"| seconds per round (median) | {med(ip['round_seconds'])} | {med(t['round_seconds'])} | {med(d['round_seconds'])} |"
        )
        rows.append(
            f"| seconds per empty exchange, 3 clients (median) | - | {med(t['ping_exchange_seconds'])} | {med(d['ping_exchange_seconds'])} |"
        )
        rows.append(f"| counted bytes (our codec) | {ip['bytes_total']} | {t['bytes_total']} | {d['bytes_total']} |")
        rows.append(f"| Flower serialized bytes | - | {t['wire_bytes_total']} | {d['wire_bytes_total']} |")
        rows.append(f"| messages | {ip['messages_total']} | {t['messages_total']} | {d['messages_total']} |")
        rows.append(
            f"| metrics equal to in process | - | {t['metrics_equal_in_process']} | {d['metrics_equal_in_process']} |"
        )
        la = f"load average (1 min) {r['load_average_start'][0]:.1f} at start, {r['load_average_end'][0]:.1f} at end, {st['cores']} cores"
        rounds = st.get("rounds", st["algorithm"]["rounds"])
        out.append(
            f"HyFEM, digits, 3 clients, {rounds} rounds x {st['algorithm']['local_steps']} local steps, seed 0; {la}.\n\n"
            + "\n".join(rows)
        )
    if "ping_1_client" in r:
        p = r["ping_1_client"]
        out.append(
            f"One SuperNode, {p['pings']} empty exchanges (deploy.ping) per setting; load average {p['load_average_start'][0]:.1f} -> {p['load_average_end'][0]:.1f}.\n\n"
            "| | tuned (fast SuperNode 0.05 s, ServerApp pulls every 0.02 s) | default (stock SuperNode 3 s, pulls every 3 s) |\n|---|---|---|\n"
            f"| seconds per empty exchange (median) | {med(p['tuned']['ping_exchange_seconds'])} | {med(p['default']['ping_exchange_seconds'])} |\n"
            f"| all | {', '.join(f'{x:.2f}' for x in p['tuned']['ping_exchange_seconds'])} | {', '.join(f'{x:.2f}' for x in p['default']['ping_exchange_seconds'])} |"
        )
    if "hyfdca" in r:
        d = r["hyfdca"]
        ip, t = d["in_process"], d["tuned"]
        out.append(
            f"HyFDCA (plaintext), digits, 3 clients, {d['algorithm']['rounds']} rounds of 3 exchanges (+3 setup); load average "
            f"{d['load_average_start'][0]:.1f} -> {d['load_average_end'][0]:.1f}.\n\n"
            "| | in process | Flower loopback, tuned |\n|---|---|---|\n"
            f"| seconds per round (median) | {med(ip['round_seconds'])} | {med(t['round_seconds'])} |\n"
            f"| seconds per exchange (median) | - | {med(t['exchange_seconds'])} |\n"
            f"| counted bytes ({ip['messages_total']} messages) | {ip['bytes_total']} | {t['bytes_total']} |\n"
            f"| Flower serialized bytes | - | {t['wire_bytes_total']} |\n"
            f"| max relative difference of w | - | {t['w_max_relative_difference']:.1e} |"
        )
    (OUT / "flower_overhead.md").write_text("\n\n".join(out) + "\n")
    print((OUT / "flower_overhead.md").read_text())


if __name__ == "__main__":
    main()
