"""Flower deployment cost: per-exchange overhead of the ways to run SuperNodes, and a trace of where an empty exchange spends its seconds.

Run from the repository root: ``python -m benchmarks.flower PART [options]``.

Part ``overhead``
-----------------

Benchmark: Flower's own cost per exchange on loopback, warm executor vs Flower's default path.

Ways to run the same SuperNodes, measured in the same invocation (same machine, same load):

- ``inline`` (``LocalFederation``'s and ``deploy-local``'s default since 2026-11-27): ``python -m
  hybridfl.runtime.flower.supernode --inline`` (the SuperNode answers in its own process with the
  warm executor's code; pulls every 0.05 s after a message, backing off to 0.2 s), the ServerApp
  pulling every 0.05 s (backing off to 0.2 s in long exchanges);
- ``warm``: ``python -m hybridfl.runtime.flower.supernode --warm`` (fast-polling SuperNode with
  ``--isolation process`` and hybridfl's warm executor: one long-lived process keeps the client in
  memory; the SuperNode pulls every 0.1 s), the ServerApp pulling every 0.05 s;
- ``tuned``: the same fast-polling SuperNode (every 0.05 s) with Flower's SuperExec (a new
  ``flwr-clientapp`` process per message), the ServerApp pulling every 0.02 s;
- ``default``: the stock ``flower-supernode`` (3 s idle sleep, SuperExec, a process per message)
  and the ServerApp pulling every 3 s, as Flower's ``grid.send_and_receive`` does.

The SuperLink keeps its state in memory in all three (``--database FILE`` costs more per exchange).
Every federation is :class:`LocalFederation`'s default, what users run: TLS and Flower SuperNode
authentication on (each result records ``tls`` and ``auth``; the tables measured before that
default are labelled as such).

Parts:

- ``ping`` (``--nodes 1,3``, ``--pings 10``): per number of SuperNodes and setting, the seconds of
  each empty exchange (``deploy.ping``: server -> every client -> server, no algorithm work),
  their median and 90th percentile;
- ``hyfem``: HyFEM, digits, 3 clients, ``--rounds`` rounds: seconds per round and per exchange in
  process and per setting, counted vs Flower bytes, metrics equal to the in-process run;
- ``hyfdca``: HyFDCA (plaintext), 3 clients: warm vs tuned, ``w`` against the in-process run;
- ``real`` (issue 14): the example configs users run, ``examples/configs/hyfem_mfeat.yaml`` (6
  clients) and ``examples/configs/hyfdca_credit_default.yaml`` (9 clients) in ``dual_mode: block``
  and ``segment``, HyFDCA with ``encryption: none``, ``alignment: plaintext`` and ``reference:
  false`` (:data:`REAL_CASES`), ``--real-rounds`` rounds (``--segment-rounds`` for segment mode):
  in process (the simulation, one thread) and over Flower per ``--real-settings`` (``default``
  only for ``--default-cases``, with ``--default-rounds`` rounds, compared with an in-process run
  of as many rounds): seconds per round and per exchange, exchanges per round, every metric and
  the final ``w`` against the in-process run, counted and Flower bytes, load average before and
  after every run. Reads the data from ``../shared/data`` (the project's copy).

Writes the report ``benchmarks/results/flower_overhead.json`` and ``.md``: a row per run (the parts
run are replaced, the others kept; the ``real`` part is saved after every run, marked ``partial``
until it ends). What ``python -m benchmarks.flower trace`` found is told in docs/results.md.
Usage: ``python -m benchmarks.flower overhead [--part ping,hyfem,hyfdca,real|all] [--pings 10]
[--nodes 1,3] [--rounds 3] [--settings warm,tuned,default] [--real-settings warm,default]
[--real-rounds 5] [--segment-rounds 5] [--default-rounds 5] [--merge] [--md-only]``. The
committed results: ``--part ping,real --settings warm,default --real-settings warm,default
--real-rounds 5 --segment-rounds 2 --default-rounds 2``, then ``--part real --merge --real-cases
hyfem_mfeat,hyfdca_credit_block --real-settings default --default-rounds 5`` (the default setting
at 5 rounds, added once there was time), then ``--md-only``.

Part ``trace``
--------------

Where the seconds of an empty exchange go: every HTTP request of every Flower process, timed.

Starts a :class:`LocalFederation` (TLS + SuperNode authentication, warm executor: what users run)
with ``--nodes`` SuperNodes, runs ``--pings`` empty exchanges (``deploy.ping``) and records, in
every process the federation starts (SuperLink, ServerApp, SuperNodes, warm executors, ``flwr
run``), each HTTP request Flower makes (``httpx.Client.send``: start, end, path, bytes) through a
``sitecustomize`` module put first on ``PYTHONPATH`` (nothing of hybridfl or Flower is changed).
Also samples each process's CPU seconds (``/proc/<pid>/stat``) over ``--idle`` seconds of an idle
federation before the run and over the pings.

For every ping (from the ServerApp's ``push-messages`` request to the end of its last
``pull-object``/``confirm`` of the replies) it splits the seconds into the phases of the path
server -> SuperLink -> SuperNode -> executor -> SuperNode -> SuperLink -> server, and prints the
median per phase and the request counts per process. Writes ``--out`` (JSON) if given.

Usage: ``PYTHONPATH=src python -m benchmarks.flower trace [--nodes 3] [--pings 20] [--idle 10]
[--server-poll S] [--node-poll S] [--out FILE]``.
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

from benchmarks import harness
from benchmarks.harness import dispatch
from hybridfl.algorithms.hyfem import HyFEMConfig, run_hyfem
from hybridfl.config import parse_config
from hybridfl.data.export import export_clients
from hybridfl.experiment import prepare
from hybridfl.runtime.flower.local import LocalFederation
from hybridfl.runtime.simulation import single_threaded

# ======================================== part overhead

OUT = Path(__file__).resolve().parent / "results"
SETTINGS = {
    # name: (fast launcher, warm executor, SuperNode poll interval, ServerApp poll interval, description)
    "gated": (
        True,
        True,
        0.05,
        0.05,
        "LocalFederation's default since 2026-11-28: `inline` with the SuperLink started by "
        "`hybridfl.runtime.flower.superlink` (its six Control-API and plugin middleware layers skipped on the "
        "Fleet and ServerAppIo requests they only pass on; since 16:50 UTC also empty polls held until news, "
        "`HeldPolls`, and verified SuperNode signatures remembered, `signing.py`)",
    ),
    "inline": (
        True,
        True,
        0.05,
        0.05,
        "LocalFederation's default 2026-11-27 to 28: fast SuperNode answering in its own process (`supernode "
        "--inline`), pulling every 0.05 s right after a message, backing off to 0.2 s; ServerApp pulls every 0.05 s, "
        "backing off to 0.2 s in long exchanges; first object retries after 0.02 s (node) / 0.01 s (ServerApp)",
    ),
    "warm": (
        True,
        True,
        0.1,
        0.05,
        "fast SuperNode (pulls every 0.1 s) --isolation process + hybridfl warm executor process; ServerApp pulls "
        "every 0.05 s (runs from 2026-11-27 on: with the first object retries and the ServerApp's back-off of `inline`)",
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


def utc_now() -> str:
    """The current time, UTC, to the minute (when a part was measured)."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def machine() -> dict:
    """Where the numbers were measured."""
    return {"cores": os.cpu_count(), "flwr": version("flwr"), "python": platform.python_version()}


def flower_run(dirs, server_dir: Path, work: Path, setting: str, extra: dict) -> tuple[dict, float]:
    """Start a federation in ``setting``, run once, stop; returns (summary.json, wall seconds incl. start-up).

    The federation is :class:`LocalFederation`'s default, what users run: TLS and Flower SuperNode
    authentication on (``summary["tls"]``, ``summary["auth"]`` say so); the summary also gets
    ``children_cpu_seconds``, the CPU seconds of the processes started and reaped meanwhile
    (SuperLink, SuperNodes, ``flwr run``, and those of their children they reaped: approximate).
    """
    import resource

    fast, warm, node_poll, poll, _ = SETTINGS[setting]
    fed = LocalFederation(
        dirs,
        fast=fast,
        warm=warm,
        inline=setting in ("inline", "gated"),
        gate=setting == "gated",
        poll_interval=min(node_poll, 3.0),
        idle_poll_interval=None if setting in ("inline", "gated") else min(node_poll, 3.0),
        work_dir=work,
        start_timeout=180,
    )
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = ru.ru_utime + ru.ru_stime
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
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads((work / "res" / "summary.json").read_text())
    summary.update(tls=fed.tls, auth=fed.auth, children_cpu_seconds=ru.ru_utime + ru.ru_stime - cpu0)
    return summary, wall


def ping_part(nodes: list[int], pings: int, settings: list[str]) -> dict:
    """Per number of SuperNodes and setting: ``pings`` empty exchanges (then a 1-round, 1-step HyFEM run)."""
    res: dict = {
        "date": utc_now(),
        "load_average_start": os.getloadavg(),
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
                    "tls": s["tls"],
                    "auth": s["auth"],
                    "wall_seconds_incl_startup": wall,
                    "load_average_start": la,
                    "load_average_end": os.getloadavg(),
                }
                print(
                    f"{n} node(s), {name}: median {out[name]['median']:.3f} s, p90 {out[name]['p90']:.3f} s", flush=True
                )
        res["by_nodes"][str(n)] = out
    res["load_average_end"] = os.getloadavg()
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
        "fit_intercept": False,  # as the committed numbers
        "rounds": rounds,
        "positive_classes": [0, 1, 2, 3, 4],
        "encryption": "none",
        "reference": False,
        "local_fraction": 0.5,
        "dual_mode": "block",  # the committed numbers' settings (the defaults then)
        "output": "last",
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


ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"  # the project's real datasets (examples/configs read ../shared/data)
REAL_CASES = {
    # name: (example config, algorithm overrides, what the overrides change from the example)
    "hyfem_mfeat": (
        "hyfem_mfeat.yaml",
        {"baselines": False},
        "examples/configs/hyfem_mfeat.yaml (6 clients, 3 of the 6 views and 5-7 classes each), baselines off",
    ),
    "hyfdca_credit_block": (
        "hyfdca_credit_default.yaml",
        {"dual_mode": "block", "encryption": "none", "alignment": "plaintext", "reference": False},
        "examples/configs/hyfdca_credit_default.yaml (3 sample groups x 3 block groups = 9 clients) with "
        "dual_mode: block, encryption: none, alignment: plaintext, reference: false",
    ),
    "hyfdca_credit_segment": (
        "hyfdca_credit_default.yaml",
        {"dual_mode": "segment", "encryption": "none", "alignment": "plaintext", "reference": False},
        "examples/configs/hyfdca_credit_default.yaml (9 clients, dual_mode: segment, batch_size 128, sequential) "
        "with encryption: none, alignment: plaintext, reference: false",
    ),
}


def _real_config(case: str, rounds: int):
    """The run config of a ``real`` case: the example config users run, with :data:`REAL_CASES`'s
    overrides, ``rounds`` rounds and the dataset read from the project's ``../shared/data``."""
    import yaml

    file, over, _ = REAL_CASES[case]
    d = yaml.safe_load((ROOT / "examples" / "configs" / file).read_text())
    d["dataset"]["data_dir"] = str(DATA / Path(d["dataset"]["data_dir"]).name)
    d["algorithm"].update(over, rounds=rounds)
    return parse_config(d)


def _not_compared(key: str) -> bool:
    """History keys not compared with the in-process run: measured seconds and what is modelled
    from them (``time_model*``), byte counts (over Flower they can differ by a few bytes: reported
    separately) and HyFEM's clients' local accuracy (not sent over Flower)."""
    return "seconds" in key or key.startswith("time_model") or "bytes" in key or key == "client_accuracy_local_mean"


def _strip(history: list[dict]) -> list[dict]:
    """Metrics rows without the keys :func:`_not_compared` leaves out."""
    return [{k: v for k, v in r.items() if not _not_compared(k)} for r in history]


def _in_process(prep) -> dict:
    """One in-process run (the simulation, one thread): metrics rows, final arrays, timings and the
    number of exchanges (calls of the in-process transports) in the setup and in the rounds."""
    from hybridfl.algorithms.spec import get_algorithm
    from hybridfl.runtime.simulation import build_federation
    from hybridfl.runtime.transport import InProcessTransport

    spec = get_algorithm(prep.algorithm.name)
    calls = [0]
    original = InProcessTransport.send_and_receive

    def counted(self, *a, **k):
        calls[0] += 1
        return original(self, *a, **k)

    InProcessTransport.send_and_receive = counted
    try:
        with single_threaded():
            fed = build_federation(spec, prep.split, prep.partition, prep.algorithm, prep.config.seed)
            c0, t0 = time.process_time(), time.perf_counter()
            fed.setup()
            setup = (time.perf_counter() - t0, time.process_time() - c0, calls[0])
            c0, t0 = time.process_time(), time.perf_counter()
            hist = fed.loop(monitor=False).run()
            rounds = (time.perf_counter() - t0, time.process_time() - c0, calls[0] - setup[2])
    finally:
        InProcessTransport.send_and_receive = original
    final = spec.final_arrays(fed.server) if spec.final_arrays is not None else {}
    return {
        "history": hist,
        "final": final,
        "round_seconds": [r["seconds"] for r in hist],
        "setup_seconds": setup[0],
        "setup_cpu_seconds": setup[1],
        "rounds_wall_seconds": rounds[0],
        "rounds_cpu_seconds": rounds[1],
        "setup_exchanges": setup[2],
        "round_exchanges": rounds[2],
        "bytes_total": fed.transport.log.bytes_total,
        "messages_total": fed.transport.log.messages_total,
        "clients": len(fed.clients),
    }


def real_part(
    cases: list[str], rounds: dict[str, int], settings: list[str], default_cases: list[str], default_rounds: int, save
) -> dict:
    """HyFEM on mfeat and HyFDCA on credit default (the example configs users run): per case, in
    process and over Flower (``settings``; ``default`` only for ``default_cases``, with
    ``default_rounds`` rounds), results checked equal to the in-process run of the same rounds.
    ``save(res)`` is called after every run (partial results survive an interruption)."""
    import numpy as np

    res: dict = {
        "date": utc_now(),
        "machine": machine(),
        "load_average_start": os.getloadavg(),
        "settings": {s: SETTINGS[s][4] for s in settings},
        "cases": {},
    }
    refs = {}
    jobs = []  # every case's warm (tuned) runs first, then the default-setting runs
    for case in cases:
        todo = [s for s in settings if s != "default" or case in default_cases]
        jobs += [(case, s) for s in todo if s != "default"]
        by_rounds = {rounds[case]} | ({default_rounds} if "default" in todo else set())
        out: dict = {"description": REAL_CASES[case][2], "load_average_start": os.getloadavg(), "runs": {}}
        res["cases"][case] = out
        for r in sorted(by_rounds, reverse=True):
            cfg = _real_config(case, r)
            prep = prepare(cfg)
            la = os.getloadavg()
            refs[case, r] = (cfg, prep, _in_process(prep))
            ip = refs[case, r][2]
            out["algorithm"] = prep.algorithm.model_dump(mode="json") | {"rounds": rounds[case]}
            out["clients"] = ip["clients"]
            out["runs"][f"in_process_{r}"] = {
                "setting": "in process",
                "rounds": r,
                **{k: v for k, v in ip.items() if k not in ("history", "final")},
                "exchanges_per_round": ip["round_exchanges"] / r,
                "load_average_start": la,
                "load_average_end": os.getloadavg(),
            }
            print(f"{case}, in process, {r} rounds: round median {median(ip['round_seconds']):.3f} s", flush=True)
            save(res)
    jobs += [(case, "default") for case in cases if "default" in settings and case in default_cases]
    for case, name in jobs:
        out = res["cases"][case]
        r = default_rounds if name == "default" else rounds[case]
        cfg, prep, ip = refs[case, r]
        la = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="hybridfl-real-") as tmp:
            tmp = Path(tmp)
            dirs = export_clients(
                prep.split, prep.partition, tmp / "export", seed=cfg.seed, run_config=cfg.model_dump(mode="json")
            )
            s, wall = flower_run(dirs, tmp / "export" / "server", tmp / name, name, {})
            hist = json.loads((tmp / name / "res" / "history.json").read_text())
            final = {}
            if (tmp / name / "res" / "final.npz").is_file():
                with np.load(tmp / name / "res" / "final.npz") as z:
                    final = {k: z[k] for k in z.files}
        setup_ex = ip["setup_exchanges"]
        round_ex = s["exchange_seconds"][setup_ex:]
        diff = {
            k: float(np.max(np.abs(final[k] - v)) / max(float(np.max(np.abs(v))), 1e-300))
            for k, v in ip["final"].items()
            if k in final and np.size(v)
        }
        differing = sorted(
            {k for a, b in zip(hist, ip["history"], strict=False) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        )
        out["runs"][name] = {
            "date": utc_now(),
            "setting": name,
            "description": SETTINGS[name][4],
            "rounds": r,
            "tls": s["tls"],
            "auth": s["auth"],
            "round_seconds": s["round_seconds"],
            "exchange_seconds_rounds": round_ex,
            "exchange_seconds_setup": s["exchange_seconds"][:setup_ex],
            "hello_exchange_seconds": s["setup_exchange_seconds"],
            "exchanges": s["exchanges"],
            "exchanges_equal_in_process": s["exchanges"] == ip["setup_exchanges"] + ip["round_exchanges"],
            "exchanges_per_round": len(round_ex) / r,
            "bytes_total": s["bytes_total"],
            "bytes_total_in_process": ip["bytes_total"],
            "wire_bytes_total": s["wire_bytes_total"],
            "messages_total": s["messages_total"],
            "messages_total_in_process": ip["messages_total"],
            "metrics_equal_in_process": len(hist) == len(ip["history"]) and _strip(hist) == _strip(ip["history"]),
            "history_keys_differing": differing,
            "final_max_relative_difference": diff,
            "server_wall_seconds": s["wall_seconds"],
            "wall_seconds_incl_startup": wall,
            "children_cpu_seconds": s["children_cpu_seconds"],
            "load_average_start": la,
            "load_average_end": os.getloadavg(),
        }
        print(
            f"{case}, {name}, {r} rounds: round median {median(s['round_seconds']):.2f} s, exchange median "
            f"{median(round_ex) if round_ex else float('nan'):.3f} s, metrics equal "
            f"{out['runs'][name]['metrics_equal_in_process']} (differing: {differing}), final diff {diff}",
            flush=True,
        )
        out["load_average_end"] = os.getloadavg()
        save(res)
    res["load_average_end"] = os.getloadavg()
    return res


def _merge_real(stored: dict | None, new: dict) -> dict:
    """``new`` (a real part's result) added to ``stored`` (``--merge``): per case, the new runs
    replace the stored ones of the same name, except that a stored Flower run with another number
    of rounds is kept as ``NAME_<rounds>r`` and a stored in-process run is kept; the stored runs get the stored part's date if they
    have none. ``stored`` None: ``new`` itself."""
    import copy

    if not stored:
        return new
    out = copy.deepcopy(stored)
    out.pop("partial", None)
    out.setdefault("merged", []).append(
        {k: new[k] for k in ("date", "load_average_start", "load_average_end") if k in new}
    )
    out["settings"] = out["settings"] | new["settings"]
    for c in out["cases"].values():
        for x in c["runs"].values():
            x.setdefault("date", stored["date"])
    for case, c in new["cases"].items():
        o = out["cases"].setdefault(case, c)
        for k, x in c["runs"].items():
            if x["setting"] == "in process" and k in o["runs"]:
                continue  # the stored in-process run of these rounds stays (the new one was only the check)
            if k in o["runs"] and o["runs"][k]["rounds"] != x["rounds"]:
                kept = o["runs"].pop(k)
                o["runs"][f"{k}_{kept['rounds']}r"] = kept
            o["runs"][k] = x
    return out


def main_overhead() -> None:
    """Run the parts asked for and write the results files."""
    parts = ("ping", "hyfem", "hyfdca", "real")
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all", help="comma-separated subset of " + ",".join(parts) + ", or all")
    ap.add_argument("--md-only", action="store_true", help="only rewrite the .md from the .json")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="real part: add the runs to the stored real part (a stored run of the same setting with other rounds "
        "is kept as SETTING_Nr) instead of replacing it",
    )
    ap.add_argument("--pings", type=int, default=10)
    ap.add_argument("--nodes", default="1,3", help="numbers of SuperNodes for the ping part, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the digits HyFEM part")
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--settings", default="warm,tuned,default", help="comma-separated subset of " + ",".join(SETTINGS))
    ap.add_argument("--real-cases", default=",".join(REAL_CASES), help="real part: comma-separated cases")
    ap.add_argument("--real-settings", default="warm,default", help="real part: settings")
    ap.add_argument("--real-rounds", type=int, default=5, help="real part: rounds of each case (but segment mode)")
    ap.add_argument("--segment-rounds", type=int, default=5, help="real part: rounds of hyfdca_credit_segment")
    ap.add_argument(
        "--default-cases",
        default="hyfem_mfeat,hyfdca_credit_block",
        help="real part: the cases also run in the default setting (a ClientApp process per message)",
    )
    ap.add_argument("--default-rounds", type=int, default=5, help="real part: rounds of the default-setting runs")
    args = ap.parse_args()
    if args.md_only:
        write_overhead(read_overhead())
        return
    todo = parts if args.part == "all" else tuple(p for p in args.part.split(",") if p)
    if not todo or any(p not in parts for p in todo):
        raise SystemExit(f"--part must be all or a comma-separated subset of {','.join(parts)}.")
    settings = [s for s in args.settings.split(",") if s]
    real_settings = [s for s in args.real_settings.split(",") if s]
    if not settings or any(s not in SETTINGS for s in settings + real_settings):
        raise SystemExit(f"--settings must be a comma-separated subset of {','.join(SETTINGS)}.")
    cases = [c for c in args.real_cases.split(",") if c]
    if any(c not in REAL_CASES for c in cases):
        raise SystemExit(f"--real-cases must be a comma-separated subset of {','.join(REAL_CASES)}.")
    old = read_overhead()

    def save(key: str, value: dict) -> None:
        old[key] = value
        write_overhead(old)

    if "ping" in todo:
        save("ping", ping_part([int(n) for n in args.nodes.split(",") if n], max(args.pings, 2), settings))
    if "hyfem" in todo:
        save("hyfem", hyfem_part(args.rounds, args.local_steps, 3, settings) | {"date": utc_now()})
    if "hyfdca" in todo:
        save("hyfdca", hyfdca_part([s for s in settings if s != "default"] or settings) | {"date": utc_now()})
    if "real" in todo:
        rounds = {c: args.segment_rounds if c == "hyfdca_credit_segment" else args.real_rounds for c in cases}
        defaults = [c for c in args.default_cases.split(",") if c]
        stored = old.get("real") if args.merge else None

        def save_real(r: dict, partial: bool = True) -> None:
            save("real", _merge_real(stored, r) | ({"partial": True} if partial else {}))

        save_real(real_part(cases, rounds, real_settings, defaults, args.default_rounds, save_real), partial=False)
    print((OUT / "flower_overhead.md").read_text())


def _equal(run: dict) -> bool | None:
    """Whether a Flower run's metrics equal the in-process run's (keys :func:`_not_compared` leaves
    out excepted), from the keys that differed; None when not compared."""
    if "history_keys_differing" not in run:
        return None
    return not [k for k in run["history_keys_differing"] if not _not_compared(k)]


DIGITS = ("hyfem", "hyfdca")  # the digits parts: one run per setting, and ``in_process``
COLUMNS = [
    "part",
    "case",
    "setting",
    "nodes",
    "rounds",
    ("s_per_round", "s/round (median)"),
    ("x_in_process", "x in process"),
    ("s_per_exchange", "s/exchange (median)"),
    ("s_per_exchange_p90", "p90"),
    ("exchanges_per_round", "exchanges/round"),
    ("metrics_equal", "metrics equal"),
    ("w_rel_diff", "final w rel. diff"),
    ("bytes", "counted bytes"),
    ("wire_bytes", "Flower bytes"),
    ("wall_s", "wall s"),
    ("load_start", "load start"),
    ("load_end", "load end"),
    "tls",
    "date",
]
NOTES = [
    "Loopback, flwr and Python as each part's `machine` in the JSON, 2 cores shared with other sessions. Parts: "
    "`real` = the example configs (HyFEM mfeat 6 clients; HyFDCA credit default 9 clients, `encryption: none`, "
    "`alignment: plaintext`, `reference: false`) in process and over Flower; `ping` = empty exchanges "
    "(`deploy.ping`: server -> every client -> server), `nodes` SuperNodes; `ping_before_this_change` = the same "
    "with the code before the inline SuperNode; `hyfem` / `hyfdca` = digits, 3 clients (measured earlier, over "
    "insecure gRPC when `tls` is `-`). Seconds per round: median over the rounds (in process: the simulation, one "
    "thread); seconds per exchange: median and 90th percentile over the rounds' exchanges (setup excluded) or the "
    "pings; x in process: against the in-process run of as many rounds; metrics equal: every metric of every round "
    "but the measured seconds, the times modelled from them and the byte counts; final w rel. diff: HyFDCA's final "
    "`w` against the in-process run; wall s: Flower's including start-up, in process setup + rounds. Every run's "
    "raw record (each exchange's seconds, bytes, loads, settings) is its row's `run` in the JSON; each part's "
    "metadata (date, machine, settings, cases) is under `parts`.",
]


def _row(part: str, x: dict, **ids) -> dict:
    """A report row: a run's identifiers, the table's cells derived from it, the run under ``run``."""
    load0, load1 = x.get("load_average_start") or [None], x.get("load_average_end") or [None]
    ex = x.get("exchange_seconds_rounds", x.get("exchange_seconds", x.get("ping_exchange_seconds")))
    wall = x.get("wall_seconds_incl_startup")
    if wall is None and "setup_seconds" in x:
        wall = x["setup_seconds"] + x["rounds_wall_seconds"]
    diff = x.get("final_max_relative_difference") or {}
    row = {"config": " ".join(str(v) for v in (part, *ids.values())), "part": part, **ids}
    row.update(rounds=x.get("rounds"), s_per_round=median(x.get("round_seconds") or []))
    row.update(s_per_exchange=x.get("median", median(ex or [])), s_per_exchange_p90=x.get("p90", p90(ex or [])))
    row.update(exchanges_per_round=x.get("exchanges_per_round"), metrics_equal=x.get("metrics_equal_in_process"))
    row.update(w_rel_diff=max(diff.values()) if diff else x.get("w_max_relative_difference"))
    row.update(bytes=x.get("bytes_total"), wire_bytes=x.get("wire_bytes_total"), wall_s=wall)
    row.update(load_start=load0[0], load_end=load1[0], tls=x.get("tls"), date=x.get("date"), run=x)
    return row


def overhead_rows(r: dict) -> list[dict]:
    """The report's rows: every run of every part of ``r`` (the stored layout: ``real``, ``ping``,
    ``ping_before_this_change``, ``hyfem``, ``hyfdca``)."""
    rows = []
    for case, c in r.get("real", {}).get("cases", {}).items():
        ips = {x["rounds"]: x for x in c["runs"].values() if x["setting"] == "in process"}
        for key, x in c["runs"].items():
            row = _row("real", x, case=case, setting=key)
            ip = ips.get(x["rounds"])
            if x["setting"] != "in process" and ip is not None:
                row["x_in_process"] = row["s_per_round"] / median(ip["round_seconds"])
            row["metrics_equal"] = _equal(x)
            rows.append(row)
    for part in ("ping", "ping_before_this_change"):
        for n, by in r.get(part, {}).get("by_nodes", {}).items():
            rows += [_row(part, x, setting=s, nodes=int(n)) | {"date": r[part].get("date")} for s, x in by.items()]
    for part in DIGITS:
        d = r.get(part, {})
        for s in ("in_process", *SETTINGS):
            if s in d:
                rows.append(_row(part, d[s], case="digits", setting=s))
    return rows


def write_overhead(r: dict) -> None:
    """The report ``flower_overhead``: :func:`overhead_rows` of ``r``, each part's metadata under
    ``parts`` (the trace analyses once kept under ``notes`` are sentences in docs/results.md)."""
    meta = {}
    for part, d in r.items():
        if part == "notes":
            continue
        m = {k: v for k, v in d.items() if k not in ("by_nodes", "in_process", *SETTINGS)}
        if part == "real":
            m["cases"] = {c: {k: v for k, v in x.items() if k != "runs"} for c, x in d["cases"].items()}
        meta[part] = m
    harness.write_report(
        "flower_overhead",
        overhead_rows(r),
        title="Flower's overhead on loopback: in process against over Flower",
        command="OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.flower overhead --part ping,real "
        "(the parts and options of every committed run: the module docstring)",
        columns=COLUMNS,
        notes=NOTES,
        out=OUT,
        extra={"parts": meta},
    )


def read_overhead() -> dict:
    """The stored parts in the layout the parts write (the inverse of :func:`write_overhead`)."""
    if not (OUT / "flower_overhead.json").is_file():
        return {}
    rep = harness.read_report("flower_overhead", OUT)
    r = {k: json.loads(json.dumps(v)) for k, v in rep.get("parts", {}).items()}
    for row in rep["rows"]:
        part, x = row["part"], row["run"]
        if part == "real":
            r[part]["cases"][row["case"]].setdefault("runs", {})[row["setting"]] = x
        elif part in DIGITS:
            r[part][row["setting"]] = x
        else:
            r[part].setdefault("by_nodes", {}).setdefault(str(row["nodes"]), {})[row["setting"]] = x
    return r


# ======================================== part trace

SITECUSTOMIZE = r"""
import os, sys, time, json
_d = os.environ.get("HYBRIDFL_TRACE_DIR")
if _d:
    try:
        import httpx
        _f = open(os.path.join(_d, f"{os.getpid()}.jsonl"), "a", buffering=1)
        _role = open("/proc/self/cmdline", "rb").read().replace(b"\0", b" ").decode()[:300]
        _f.write(json.dumps({"pid": os.getpid(), "role": _role}) + "\n")
        _send = httpx.Client.send
        def send(self, request, *a, **k):
            t0 = time.time()
            r = _send(self, request, *a, **k)
            t1 = time.time()
            try:
                n = len(r.content)
            except Exception:
                n = -1
            _f.write(json.dumps({"t0": t0, "t1": t1, "path": request.url.path, "req": len(request.content or b""),
                                 "resp": n, "tid": __import__("threading").get_ident() % 10000}) + "\n")
            return r
        httpx.Client.send = send
    except Exception as e:  # never break the process
        sys.stderr.write(f"trace: {e}\n")
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return ""


def role_of(cmd: str) -> str:
    for key, name in (
        ("flower-superlink", "superlink"),
        ("runtime.flower.superlink", "superlink"),  # our launcher (LocalFederation's default)
        ("flwr-serverapp", "serverapp"),
        ("flower-superexec", "superexec"),
        ("runtime.flower.executor", "executor"),
        ("runtime.flower.supernode", "supernode"),
        ("flower-supernode", "supernode"),
        ("flwr run", "flwr-run"),
        ("flwr-clientapp", "clientapp"),
    ):
        if key in cmd:
            return name
    return cmd.split(" ")[0][-30:]


def all_pids(pgids: list[int]) -> list[int]:
    from hybridfl.runtime.flower.local import group_members

    return [p for g in pgids for p in group_members(g)]


def sample_cpu(pgids: list[int], seconds: float) -> dict[str, float]:
    """CPU seconds per second of every process of the groups over ``seconds`` (by role and pid);
    nothing when ``seconds`` is not positive (``trace --idle 0``)."""
    if seconds <= 0:
        return {}
    pids = all_pids(pgids)
    c0 = {p: cpu_seconds(p) for p in pids}
    time.sleep(seconds)
    out = {}
    for p in pids:
        try:
            out[f"{role_of(cmdline(p))}:{p}"] = (cpu_seconds(p) - c0[p]) / seconds
        except OSError:
            pass
    return out


def load(trace_dir: Path) -> list[dict]:
    """Every request of every process, with its process's role."""
    ev = []
    for f in trace_dir.glob("*.jsonl"):
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        head = lines[0]
        role = role_of(head["role"])
        for e in lines[1:]:
            ev.append({**e, "pid": head["pid"], "role": role})
    return sorted(ev, key=lambda e: e["t0"])


def phases(ev: list[dict], npings: int, nodes: int) -> list[dict]:
    """Per ping: the phases of the exchange (seconds)."""
    sa = [e for e in ev if e["role"] == "serverapp"]
    pushes = [e for e in sa if e["path"].endswith("/push-messages")]
    pings = pushes[-(npings + 0) :] if len(pushes) >= npings else pushes
    # the pings are the pushes after the hello; the algorithm's 1 round follows: take the first npings after hello
    hello_end = pushes[0]["t0"] if pushes else 0
    pings = [p for p in pushes if p["t0"] > hello_end][:npings] if len(pushes) > npings else pushes[:npings]
    out = []
    for i, p in enumerate(pings):
        t0 = p["t0"]
        nxt = pings[i + 1]["t0"] if i + 1 < len(pings) else t0 + 5
        win = [e for e in ev if t0 <= e["t0"] < nxt]
        srv = [e for e in win if e["role"] == "serverapp"]
        # end: the ServerApp's last request before the next push
        end = max(e["t1"] for e in srv)
        push_done = max(e["t1"] for e in srv if "push" in e["path"])
        r = {"t0": t0, "total": end - t0, "server_push": push_done - t0}
        per_node = []
        for pid in sorted({e["pid"] for e in win if e["role"] == "supernode"}):
            sn = [e for e in win if e["pid"] == pid]
            got = [e for e in sn if e["path"].endswith("/pull-messages") and e["resp"] > 200]
            if not got:
                continue
            first_pull = got[0]
            sent = [e for e in sn if e["path"].endswith("/push-messages")]
            last_push_obj = [e for e in sn if e["path"].endswith("/push-object") and sent and e["t0"] >= sent[0]["t0"]]
            received = [e for e in sn if e["path"].endswith("/confirm-message-received")]
            # the executor of this node: requests in the window between received and sent
            ex = [
                e
                for e in win
                if e["role"] == "executor" and received and sent and received[0]["t1"] <= e["t0"] <= sent[0]["t0"]
            ]
            ex_acq = [e for e in ex if e["path"].endswith("/acquire-task") and e["resp"] > 50]
            ex_out = [e for e in ex if e["path"].endswith("/push-task-output")]
            per_node.append(
                {
                    "node_pull_start": first_pull["t0"] - t0,  # the SuperNode's pull that found the message
                    "node_received": received[0]["t1"] - t0 if received else None,
                    "exec_acquire": ex_acq[0]["t0"] - t0 if ex_acq else None,
                    "exec_done": ex_out[-1]["t1"] - t0 if ex_out else None,
                    "node_send_start": sent[0]["t0"] - t0 if sent else None,
                    "node_sent": (last_push_obj[-1]["t1"] if last_push_obj else sent[0]["t1"]) - t0 if sent else None,
                }
            )
        r["nodes"] = per_node
        pulls = [e for e in srv if e["path"].endswith("/pull-messages")]
        got = [e for e in pulls if e["resp"] > 200]
        r["server_pulls"] = len(pulls)
        r["server_first_reply_pull"] = (got[0]["t0"] - t0) if got else None
        r["server_last_reply_pull"] = (got[-1]["t0"] - t0) if got else None
        r["requests"] = {}
        for e in win:
            k = f"{e['role']} {e['path'].rsplit('/', 1)[-1]}"
            c = r["requests"].setdefault(k, [0, 0.0])
            c[0] += 1
            c[1] += e["t1"] - e["t0"]
        out.append(r)
    return out


def main_trace() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--pings", type=int, default=20)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU sampling before the run")
    ap.add_argument(
        "--server-poll", type=float, default=None, help="the ServerApp's poll-interval (default: the app's)"
    )
    ap.add_argument("--node-poll", type=float, default=None, help="LocalFederation poll_interval (default: its own)")
    ap.add_argument("--idle-node-poll", type=float, default=None, help="LocalFederation idle_poll_interval")
    ap.add_argument("--executor", choices=("inline", "process"), default="inline", help="where the warm client runs")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    from hybridfl.config import parse_config
    from hybridfl.data.export import export_clients
    from hybridfl.experiment import prepare
    from hybridfl.runtime.flower.local import LocalFederation

    cfg = parse_config(
        {
            "seed": 0,
            "dataset": {"name": "digits"},
            "partition": {"kind": "iid", "num_clients": a.nodes},
            "algorithm": {"name": "hyfem", "rounds": 1, "local_steps": 1, "baselines": False},
        }
    )
    prep = prepare(cfg)
    with tempfile.TemporaryDirectory(prefix="hybridfl-trace-") as tmp:
        tmp = Path(tmp)
        dirs = export_clients(
            prep.split, prep.partition, tmp / "export", seed=0, run_config=cfg.model_dump(mode="json")
        )
        site = tmp / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        trace = tmp / "trace"
        trace.mkdir()
        os.environ["HYBRIDFL_TRACE_DIR"] = str(trace)
        os.environ["PYTHONPATH"] = f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        kw: dict = {"inline": a.executor == "inline"}
        if a.node_poll is not None:
            kw["poll_interval"] = a.node_poll
        if a.idle_node_poll is not None:
            kw["idle_poll_interval"] = a.idle_node_poll
        fed = LocalFederation(dirs, work_dir=tmp / "fed", **kw)
        rc = {"server-dir": str(tmp / "export" / "server"), "out-dir": str(tmp / "res"), "pings": a.pings}
        if a.server_poll is not None:
            rc["poll-interval"] = a.server_poll
        la0 = os.getloadavg()
        try:
            fed.start()
            time.sleep(5.0)  # the SuperNodes connect
            pg = [p.pid for _, p in fed.procs]
            idle_nodes = sample_cpu(pg, a.idle)
            import threading

            samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
            stop = threading.Event()

            def sampler() -> None:  # every process's CPU seconds, 5 times a second, during the run
                while not stop.wait(0.2):
                    snap = {}
                    for q in all_pids(pg):
                        try:
                            snap[q] = (role_of(cmdline(q)), cpu_seconds(q))
                        except OSError:
                            pass
                    samples.append((time.time(), snap))

            th = threading.Thread(target=sampler, daemon=True)
            th.start()
            p = fed.start_run(rc)
            # idle CPU of a waiting ServerApp: sampled while it waits (the hello is answered fast, so
            # this is measured separately with --idle-server, see the results); here the run's CPU
            t_run = time.time()
            fed.finish_run(p, timeout=600)
            stop.set()
            th.join()
        except BaseException:
            print(fed.logs(40))
            raise
        finally:
            fed.stop()
        la1 = os.getloadavg()
        summary = json.loads((tmp / "res" / "summary.json").read_text())
        ev = [e for e in load(trace) if e["t0"] >= t_run]
    ph = phases(ev, a.pings, a.nodes)
    pings = summary["ping_seconds"]
    print(f"load average {la0} -> {la1}")
    print(
        f"pings (ServerApp's own timing): median {statistics.median(pings):.3f} s, all: "
        + ", ".join(f"{x:.3f}" for x in pings)
    )
    print(
        "idle CPU (CPU s per s) of the waiting federation, per process: "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(idle_nodes.items()))
    )
    med = lambda xs: statistics.median([x for x in xs if x is not None]) if any(x is not None for x in xs) else None  # noqa: E731
    keys = ["node_pull_start", "node_received", "exec_acquire", "exec_done", "node_send_start", "node_sent"]
    print("median seconds from the ServerApp's push (per node, then over pings):")
    print(f"  server push done {med([r['server_push'] for r in ph]):.4f}")
    for k in keys:
        vals = [n[k] for r in ph for n in r["nodes"]]
        m = med(vals)
        print(f"  {k:18s} {m:.4f}" if m is not None else f"  {k:18s} -")
    print(
        f"  server first reply pull {med([r['server_first_reply_pull'] for r in ph]):.4f}, "
        f"last {med([r['server_last_reply_pull'] for r in ph]):.4f}, end {med([r['total'] for r in ph]):.4f}"
    )
    agg: dict[str, list] = {}
    for r in ph:
        for k, (c, s) in r["requests"].items():
            x = agg.setdefault(k, [0, 0.0])
            x[0] += c
            x[1] += s
    print(f"requests per ping (count, ms of request time per ping), over {len(ph)} pings:")
    for k, (c, s) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:45s} {c / len(ph):6.1f} {1000 * s / len(ph):8.1f}")
    if ph and samples:  # CPU seconds per ping, per role, between the first and the last ping
        ta, tb = ph[0]["t0"], ph[-1]["t0"] + ph[-1]["total"]
        sa = min(samples, key=lambda x: abs(x[0] - ta))
        sb = min(samples, key=lambda x: abs(x[0] - tb))
        per: dict[str, float] = {}
        for q, (role, c) in sb[1].items():
            if q in sa[1]:
                per[role] = per.get(role, 0.0) + c - sa[1][q][1]
        n = len(ph) * (sb[0] - sa[0]) / (tb - ta)
        print(
            f"CPU seconds per ping over {sb[0] - sa[0]:.1f} s (all processes of a role together): "
            + ", ".join(f"{k} {v / n:.3f}" for k, v in sorted(per.items()))
            + f"; total {sum(per.values()) / n:.3f}"
        )
    if ph:  # one ping's timeline, every request (ms from the ServerApp's push)
        mid = ph[len(ph) // 2]
        t0, t1 = mid["t0"], mid["t0"] + mid["total"]
        print("timeline of one ping (ms from its push; role pid path duration resp-bytes):")
        for e in ev:
            if t0 <= e["t0"] <= t1:
                print(
                    f"  {1000 * (e['t0'] - t0):7.1f} +{1000 * (e['t1'] - e['t0']):6.1f} {e['role']:10s} {e['pid']:>7d} "
                    f"{e['path'].rsplit('/', 1)[-1]:26s} {e['resp']}"
                )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(
            json.dumps(
                {"pings": pings, "phases": ph, "idle_cpu": idle_nodes, "load": [la0, la1], "requests": agg}, indent=1
            )
        )


PARTS = {
    "overhead": (main_overhead, "--part ping --nodes 1 --pings 2 --settings warm".split()),
    "trace": (main_trace, "--nodes 1 --pings 2 --idle 1".split()),
}


def main() -> None:
    """``python -m benchmarks.flower PART [options] [--smoke]`` (see :func:`benchmarks.harness.dispatch`)."""
    dispatch("flower", PARTS, globals())


if __name__ == "__main__":
    main()
