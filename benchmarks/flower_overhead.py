"""Benchmark: Flower's own cost per exchange on loopback, warm executor vs Flower's default path.

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

Writes ``benchmarks/results/flower_overhead.json`` and ``.md`` (the parts run are replaced, the
others kept, and the json's ``notes``, markdown sections written by hand from measurements such as
``benchmarks/flower_trace.py``'s, are printed after the ping part; the ``real`` part is saved after every run, marked ``partial`` until it ends).
Usage: ``python benchmarks/flower_overhead.py [--part ping,hyfem,hyfdca,real|all] [--pings 10]
[--nodes 1,3] [--rounds 3] [--settings warm,tuned,default] [--real-settings warm,default]
[--real-rounds 5] [--segment-rounds 5] [--default-rounds 5] [--merge] [--md-only]``. The
committed results: ``--part ping,real --settings warm,default --real-settings warm,default
--real-rounds 5 --segment-rounds 2 --default-rounds 2``, then ``--part real --merge --real-cases
hyfem_mfeat,hyfdca_credit_block --real-settings default --default-rounds 5`` (the default setting
at 5 rounds, added once there was time), then ``--md-only``.
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
    "inline": (
        True,
        True,
        0.05,
        0.05,
        "LocalFederation's default since 2026-11-27: fast SuperNode answering in its own process (`supernode "
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
        inline=setting == "inline",
        poll_interval=min(node_poll, 3.0),
        idle_poll_interval=None if setting == "inline" else min(node_poll, 3.0),
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


ROOT = Path(__file__).resolve().parent.parent
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


def main() -> None:
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
    if args.md_only:  # also re-derives metrics_equal_in_process from the recorded differing keys (_not_compared)
        r = json.loads((OUT / "flower_overhead.json").read_text())
        for c in r.get("real", {}).get("cases", {}).values():
            for x in c["runs"].values():
                if "history_keys_differing" in x:
                    x["metrics_equal_in_process"] = _equal(x) == "True"
        (OUT / "flower_overhead.json").write_text(json.dumps(r, indent=1))
        write_md(r)
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
    path = OUT / "flower_overhead.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    if "ping" in old and "by_nodes" not in old.get("ping", {}):
        old.pop("ping")
    for stale in ("ping_1_client", "setup", "in_process", "tuned", "default", "load_average_start", "load_average_end"):
        old.pop(stale, None)  # the layout of earlier versions of this benchmark (other code, other settings)

    def save(key: str, value: dict) -> None:
        old[key] = value
        path.write_text(json.dumps(old, indent=1))
        write_md(old, quiet=True)

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
    write_md(old)


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table_row(label: str, first: str, cells: list[str]) -> str:
    return f"| {label} | {first} | " + " | ".join(cells) + " |"


def _earlier(part: dict) -> str:
    """How a part's table is dated: its ``date``, or (no date recorded) the commit that wrote it."""
    if "date" in part:
        return f"measured {part['date']}"
    return (
        "measured earlier (committed 2026-11-23 with the warm executor, 30e9607), before TLS + SuperNode "
        "authentication became LocalFederation's default, i.e. over insecure gRPC"
    )


def _tls(runs) -> str:
    flags = {(x.get("tls"), x.get("auth")) for x in runs}
    if flags == {(True, True)}:
        return "TLS + Flower SuperNode authentication on (LocalFederation's default, what users run)"
    if flags == {(False, False)}:
        return "insecure gRPC (no TLS, no authentication)"
    return "TLS/authentication: " + ", ".join(f"tls={t} auth={a}" for t, a in sorted(flags, key=str))


def _equal(run: dict) -> str:
    """Whether a Flower run's metrics equal the in-process run's (keys :func:`_not_compared` leaves
    out excepted), from the keys that differed."""
    if "history_keys_differing" not in run:
        return "-"
    return str(not [k for k in run["history_keys_differing"] if not _not_compared(k)])


def _real_md(real: dict) -> str:
    """The ``real`` part's table and notes."""
    m = real["machine"]
    cases = real["cases"]
    flower_runs = [x for c in cases.values() for x in c["runs"].values() if x["setting"] != "in process"]
    lines = [
        f"## HyFEM mfeat and HyFDCA credit default: in process vs over Flower ({'PARTIAL, ' if real.get('partial') else ''}"
        f"measured {real['date']})",
        "",
        f"Loopback, flwr {m['flwr']}, Python {m['python']}, {m['cores']} cores shared with other sessions; "
        f"{_tls(flower_runs)}. Load average (1, 5, 15 min) at the start of the part "
        f"{', '.join(f'{x:.1f}' for x in real['load_average_start'])}"
        + (
            f", at its end {', '.join(f'{x:.1f}' for x in real['load_average_end'])}"
            if "load_average_end" in real
            else ""
        )
        + ". Seconds per round: median over the rounds (the in-process rounds are the simulation's, one thread); "
        "seconds per exchange: median over the rounds' exchanges (setup exchanges excluded); exchanges per round "
        "include the evaluation exchanges; x in process: against the first in-process run of as many rounds (in "
        "process is timed once per invocation, and its seconds vary about 2x with the load); metrics equal: every metric of every round but the measured seconds, the "
        "times modelled from them and the byte counts (listed below), and, for "
        "HyFDCA, the relative max difference of the final `w` against the in-process run of the same config and rounds.",
        "",
        "| case | setting | rounds | s/round (median) | x in process | s/exchange (median, p90) | exchanges/round "
        "| metrics equal | final w rel. diff | wall s (Flower: incl. start-up; in process: setup + rounds) "
        "| load (1 min) start -> end |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, c in cases.items():
        ips = {x["rounds"]: x for x in c["runs"].values() if x["setting"] == "in process"}
        for x in c["runs"].values():
            ip = ips.get(x["rounds"])
            med = median(x["round_seconds"])
            ratio = "-" if x["setting"] == "in process" or ip is None else f"{med / median(ip['round_seconds']):.0f}x"
            ex = x.get("exchange_seconds_rounds")
            diff = x.get("final_max_relative_difference") or {}
            la = f"{x['load_average_start'][0]:.1f} -> {x['load_average_end'][0]:.1f}"
            lines.append(
                f"| {case} | {x['setting']} | {x['rounds']} | {_f(med, 3)} | {ratio} | "
                + (f"{_f(median(ex), 3)}, {_f(p90(ex), 3)}" if ex else "-")
                + f" | {x['exchanges_per_round']:.1f} | {_equal(x)} | "
                + (", ".join(f"{v:.1e}" for v in diff.values()) if diff else "-")
                + f" | {_f(x['wall_seconds_incl_startup'] if 'wall_seconds_incl_startup' in x else x['setup_seconds'] + x['rounds_wall_seconds'], 1)} | {la} |"
            )
    for mg in real.get("merged", []):
        lines += [
            "",
            f"Runs added by a later invocation (`--merge`), started {mg['date']}, load average (1, 5, 15 min) "
            f"{', '.join(f'{v:.1f}' for v in mg['load_average_start'])} at its start"
            + (
                f", {', '.join(f'{v:.1f}' for v in mg['load_average_end'])} at its end"
                if "load_average_end" in mg
                else ""
            )
            + ": "
            + ", ".join(
                f"{case} {x['setting']} ({x['rounds']} rounds)"
                for case, c in cases.items()
                for x in c["runs"].values()
                if x.get("date", "") >= mg["date"] and x["setting"] != "in process"
            )
            + ".",
        ]
    lines += ["", "Bytes and exchanges of every Flower run against the in-process run of the same rounds:", ""]
    for case, c in cases.items():
        for x in c["runs"].values():
            if x["setting"] == "in process":
                continue
            lines.append(
                f"- {case}, {x['setting']}, {x['rounds']} rounds: counted bytes (our codec) {x['bytes_total']} vs "
                f"{x['bytes_total_in_process']} in process, Flower serialized bytes {x['wire_bytes_total']}, messages "
                f"{x['messages_total']} vs {x['messages_total_in_process']}, exchanges {x['exchanges']} (equal to in "
                f"process: {x['exchanges_equal_in_process']}; setup exchanges "
                f"{', '.join(f'{e:.2f}' for e in x['exchange_seconds_setup']) or 'none'} s, hello "
                f"{x['hello_exchange_seconds']:.2f} s); history keys differing: "
                f"{', '.join(x['history_keys_differing']) or 'none'}."
            )
    lines += ["", "Cases:", ""]
    for case, c in cases.items():
        a = c.get("algorithm", {})
        lines.append(f"- `{case}`: {c['clients'] if 'clients' in c else '?'} clients, {c['description']}.")
        if case.startswith("hyfdca") and a:
            lines[-1] += (
                f" HyFDCA settings: loss {a.get('loss')}, lambda {a.get('lam')}, eval_every {a.get('eval_every')}."
            )
    lines += [
        "",
        "Why these overrides: `encryption: none` keeps the runs affordable (HE cost is the same in process and over "
        "Flower and is measured in benchmarks/results/hyfdca*.md; this table is about Flower's cost). "
        "`alignment: plaintext`: with the default `alignment: psi` the one-off pairwise PSI of the 9 clients "
        "took 126-142 s in process (measured here, load about 4) against about 0.5 s per plaintext-aligned round, so "
        "it would dominate the wall time without telling anything about Flower's per-round cost. "
        "`reference: false`: no centralised optimum (not part of a round). The default setting (a ClientApp "
        "process per message) runs only for the cases listed in it; segment mode has hundreds of exchanges per "
        "round and runs in the warm setting only.",
        "",
        "Settings: " + "; ".join(f"`{k}`: {v}" for k, v in real["settings"].items()) + ".",
        "",
        "CPU: in process (one thread) the rounds took "
        + "; ".join(
            f"{case} {x['rounds']} rounds {x['rounds_cpu_seconds']:.1f} CPU s ({x['rounds_wall_seconds']:.1f} wall s)"
            for case, c in cases.items()
            for x in c["runs"].values()
            if x["setting"] == "in process"
        )
        + ". Over Flower, CPU seconds of the SuperLink, SuperNodes and `flwr run` (incl. start-up; the ServerApp, "
        "the warm executors and the ClientApp processes count only as far as their parents reaped them): "
        + "; ".join(
            f"{case} {x['setting']} {x['rounds']} rounds {x['children_cpu_seconds']:.0f}"
            for case, c in cases.items()
            for x in c["runs"].values()
            if "children_cpu_seconds" in x
        )
        + ".",
    ]
    return "\n".join(lines)


def write_md(r: dict, quiet: bool = False) -> None:
    """``flower_overhead.md``: the tables of whatever parts ``r`` holds."""
    out = [
        "# Flower's overhead on loopback (benchmarks/flower_overhead.py)",
        "Reproduce: `OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/flower_overhead.py --part ping,real "
        "--settings warm,default --real-settings warm,default --real-rounds 5 --segment-rounds 2 --default-rounds 2` "
        "(the ping and real parts in one invocation), then `--part real --merge --real-cases "
        "hyfem_mfeat,hyfdca_credit_block --real-settings default --default-rounds 5` (Flower's default path at 5 "
        "rounds) and `--md-only`; see the module docstring for the other parts and options.",
    ]
    if "real" in r:
        out.append(_real_md(r["real"]))
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
        runs = [x for by in p["by_nodes"].values() for x in by.values()]
        ends = (
            f"; part load average at start {p['load_average_start'][0]:.1f}, at end {p['load_average_end'][0]:.1f}"
            if "load_average_end" in p
            else ""
        )
        out.append(
            f"## Empty exchanges ({_earlier(p)})\n\n"
            f"Seconds per empty exchange (`deploy.ping`: server -> every client -> server), {p['pings']} per setting, "
            f"loopback, flwr {m['flwr']}, {m['cores']} cores, {_tls(runs) if 'tls' in runs[0] else 'insecure gRPC'}; "
            f"load average (1 min) at the start of each: {loads}{ends}.\n\n"
            + head
            + "\n"
            + "\n".join(rows_med)
            + "\n\n"
            + "\n".join(f"- `{s}`: {d}" for s, d in p["settings"].items())
            + "\n\nEvery exchange:\n\n"
            + allx
        )
    for note in r.get("notes", []):  # measured analyses kept with the numbers (e.g. flower_trace.py's breakdown)
        out.append(note.strip())
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
            f"## HyFEM, digits ({_earlier(h)})\n\n"
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
            f"## HyFDCA, digits ({_earlier(d)})\n\n"
            f"HyFDCA (plaintext), digits, 3 clients, {d['algorithm']['rounds']} rounds of 3 exchanges (+3 setup); load "
            f"average {d['load_average_start'][0]:.1f} -> {d['load_average_end'][0]:.1f}.\n\n" + "\n".join(rows)
        )
    (OUT / "flower_overhead.md").write_text("\n\n".join(out) + "\n")
    if not quiet:
        print((OUT / "flower_overhead.md").read_text())


if __name__ == "__main__":
    main()
