"""Where the seconds of an empty exchange go: every HTTP request of every Flower process, timed.

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

Usage: ``PYTHONPATH=src python benchmarks/flower_trace.py [--nodes 3] [--pings 20] [--idle 10]
[--server-poll S] [--node-poll S] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

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
    """CPU seconds per second of every process of the groups over ``seconds`` (by role and pid)."""
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


def main() -> None:
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
        Path(a.out).write_text(
            json.dumps(
                {"pings": pings, "phases": ph, "idle_cpu": idle_nodes, "load": [la0, la1], "requests": agg}, indent=1
            )
        )


if __name__ == "__main__":
    sys.exit(main())
