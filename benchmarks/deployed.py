"""Deployed training to target: every algorithm's default settings, in process and over Flower
across network namespaces, with a per-round breakdown and a modelled WAN time.

Run from the repository root (as root: the network namespaces need it):
``python -m benchmarks.deployed [--cases hyfem_mfeat,hyfdca_credit,...] [--cap N] [--skip-deployed]``;
``--smoke`` runs the three-organisation case on 90 customers for at most 3 rounds.

Cases (:data:`CASES`):

- ``hyfem_mfeat``: ``examples/configs/hyfem_mfeat.yaml`` (6 clients, 40 rounds, baselines off);
  target: the test accuracy the in-process run ends with after its 40 rounds (HyFEM has no
  optimum to measure against; the first round reaching it may come earlier);
- ``hyfdca_credit``: UCI credit default, 22,500 training rows, 3 sample groups x 3 block groups
  (the data and partition of ``examples/configs/hyfdca_credit_default.yaml``) with HyFDCA's
  defaults (no algorithm setting but the name); target: relative suboptimality
  ``(P(w) - P*) / P* <= 1e-3`` of the output model (HyFDCA Sec. 5: the paper's measure);
- ``hyfdca_orgs600`` / ``hyfdca_orgs5000``: three organisations' CSVs (600 / 5,000 customers, 30
  columns in three blocks of 10, each organisation holding two blocks of its own customers and the
  labels), prepared with ``hybridfl client prepare``, standardised with ``federation stats`` (pooled
  means and stds, then prepared again), one CKKS key from ``hybridfl he-keys`` copied to every
  organisation, the server directory from ``federation assemble``; HyFDCA's defaults; target as
  ``hyfdca_credit`` (``P*`` from the centralised reference solver on the union of the
  organisations' rows, :func:`hybridfl.algorithms.convex.reference.reference_optimum`);
  ``hyfdca_orgs600_logistic``: the same 600 customers with the objective changed to the logistic
  loss and ``lambda = 1e-3`` (every protocol setting the default): the default hinge loss with
  ``lambda = 1e-4`` on 600 samples (``lambda n = 0.06``) needs thousands of SDCA epochs to reach
  1e-3, centralised or not, so this case shows the deployed cost of a run that reaches its target;
- ``fedbcd_credit``: ``examples/configs/fedbcd_credit.yaml`` (4 parties); target: its
  ``target_auc`` (0.71 test AUC).

Method: the in-process run (the simulation, one thread) stops at the first round reaching the
target (the benchmark's stop: no algorithm option is added); the deployed run then trains exactly
that many rounds over Flower (:class:`~hybridfl.runtime.flower.local.LocalFederation`'s default:
TLS, SuperNode authentication, inline SuperNodes), every SuperNode in its own network namespace
(:class:`~hybridfl.runtime.flower.netns.Hosts`, one per client), and its result is checked
against the target (HyFEM, FedBCD: the deployed run's own evaluated metric; HyFDCA: the deployed
final ``w``'s suboptimality ``P(w)`` computed here from the data).

Per round (both runs have the same exchanges, messages and counted bytes: checked):

- ``exchanges``: server -> clients -> server exchanges, evaluation exchanges included;
- ``bytes``: counted bytes of the messages (our codec), evaluation included; Flower's serialized
  form is a few percent more (``wire_over_counted``);
- ``crypto_s``: HE seconds (HyFDCA's ``encryption_seconds``, clients and server, CPU of the
  in-process run); none for HyFEM and FedBCD;
- ``compute_s``: the in-process round's server seconds (round wall minus the clients' seconds)
  plus, per exchange, the slowest client's seconds (clients in parallel, as deployed);
- ``flower_s``: the deployed round's wall seconds minus ``compute_s``: what Flower, TLS, polling
  and the two shared cores add;
- ``wan_s``, the modelled WAN time of the round (50 ms round trip, 100 Mbit/s):
  ``exchanges x 0.05 + bytes x 8 / 1e8 + compute_s``.

The setup (alignment, key checks, HyFDCA's batch Gram sums, ...) is timed and modelled the same
way and reported separately; ``to target`` times include it. Deployed setup seconds: its exchanges'
measured seconds plus the in-process setup's server seconds. The Flower federation's start-up (the
processes, TLS, registration, the hello) is reported as ``start_s`` and not counted.

Writes ``benchmarks/results/deployed.json`` and ``.md`` after every case (``--cases`` replaces
those cases' rows and keeps the others). ``--deployed-rounds K`` deploys only the first K rounds
and extrapolates the deployed time to target from them (the row says so);
``--merge-from DIR ...`` writes the rows of runs made at once into separate ``--out`` folders
into one report. The committed report: ``--cases hyfem_mfeat,fedbcd_credit``, ``--cases
hyfdca_orgs600 --deployed-rounds 5 --cap 400``, ``--cases hyfdca_orgs5000 --cap 3`` and ``--cases
hyfdca_credit --cap 2``, each into its own ``--out``, then ``--merge-from`` (each row keeps its
command).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness

ROOT = harness.ROOT
OUT = harness.RESULTS
DATA = ROOT.parent / "shared" / "data"
RTT = 0.05  # seconds, the modelled WAN round trip
BANDWIDTH = 1e8  # bit/s, the modelled WAN bandwidth
TARGET_SUBOPT = 1e-3
SUBNET = 200 + os.getpid() % 30  # 10.SUBNET.k.0/24: not the tests' 231; two runs at once most likely apart
CASES = {
    "hyfem_mfeat": "HyFEM, mfeat, 6 clients (examples/configs/hyfem_mfeat.yaml, baselines off)",
    "hyfdca_credit": "HyFDCA defaults, credit default 22,500 rows, 3 x 3 clients",
    "hyfdca_orgs600": "HyFDCA defaults, three organisations' CSVs, 600 customers, 30 columns in 3 blocks",
    "hyfdca_orgs5000": "HyFDCA defaults, three organisations' CSVs, 5,000 customers, 30 columns in 3 blocks",
    "hyfdca_orgs600_logistic": "HyFDCA defaults but loss logistic, lambda 1e-3 (a better conditioned problem), "
    "the 600 customers' CSVs",
    "fedbcd_credit": "FedBCD-p, credit default, 4 parties (examples/configs/fedbcd_credit.yaml)",
}
COLUMNS = [
    ("config", "case"),
    ("target", "target"),
    ("rounds", "rounds"),
    ("reached", "reached"),
    ("metric_at_rounds", "in process at rounds"),
    ("in_process_s", "in process s"),
    ("deployed_s", "deployed s"),
    ("deployed_s_extrapolated_from_rounds", "deployed s extrapolated from rounds"),
    ("wan_s", "WAN modelled s"),
    ("setup_in_process_s", "setup in process s"),
    ("setup_deployed_s", "setup deployed s"),
    ("exchanges_per_round", "exchanges/round"),
    ("mb_per_round", "MB/round"),
    ("crypto_s_per_round", "crypto s/round"),
    ("compute_s_per_round", "compute s/round"),
    ("flower_s_per_round", "Flower s/round"),
    ("deployed_s_per_round", "deployed s/round"),
    ("load_before", "load"),
]


# ---------------------------------------------------------------- the cases' data and configs


def _example(file: str, algorithm: dict | None = None, **overrides):
    """The example config ``file`` with the data read from the project's ``../shared/data``,
    ``algorithm`` replacing its algorithm section (HyFDCA's defaults) or ``overrides`` updating it."""
    import yaml

    from hybridfl.config import parse_config

    d = yaml.safe_load((ROOT / "examples" / "configs" / file).read_text())
    d["dataset"]["data_dir"] = str(DATA / Path(d["dataset"]["data_dir"]).name)
    d["algorithm"] = dict(algorithm) if algorithm is not None else {**d["algorithm"], **overrides}
    return parse_config(d)


def _cli(*args: str) -> None:
    """``hybridfl ARGS`` in a subprocess (the organisations' own commands); raises on failure."""
    p = subprocess.run([sys.executable, "-m", "hybridfl.cli.main", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"hybridfl {args[0]} {args[1] if len(args) > 1 else ''} failed: {p.stderr.strip()[-500:]}")


BLOCKS = {b: [f"{b}{j}" for j in range(10)] for b in ("bank", "demo", "shop")}


def _org_tables(n: int, tmp: Path) -> dict[str, Path]:
    """Three organisations' CSVs of ``n`` customers ``c00000..``: 30 numeric columns in three
    blocks of 10 (scaled and shifted per column, so standardisation matters) and a yes/no label
    from a noisy linear score. The bank holds the first two thirds of the customers (bank, demo),
    the census the last two thirds (demo, shop), the shop every second customer (shop, bank)."""
    rng = np.random.default_rng(17)
    cols = [c for b in BLOCKS.values() for c in b]
    X = rng.normal(size=(n, len(cols))) @ (np.eye(len(cols)) + 0.3 * rng.normal(size=(len(cols), len(cols))))
    score = X @ rng.normal(size=len(cols)) / np.sqrt(len(cols)) + rng.normal(scale=0.5, size=n)
    X = X * rng.uniform(0.5, 20, size=len(cols)) + rng.uniform(-50, 50, size=len(cols))
    ids = np.array([f"c{i:05d}" for i in range(n)])
    orgs = {
        "bank": (np.arange(0, 2 * n // 3), ["bank", "demo"]),
        "census": (np.arange(n // 3, n), ["demo", "shop"]),
        "shop": (np.arange(0, n, 2), ["shop", "bank"]),
    }
    out = {}
    for org, (rows, blocks) in orgs.items():
        keep = [cols.index(c) for b in blocks for c in BLOCKS[b]]
        head = ",".join(["ID", *(cols[k] for k in keep), "default"])
        lines = [",".join([ids[i], *(f"{X[i, k]:.6g}" for k in keep), "yes" if score[i] > 0 else "no"]) for i in rows]
        out[org] = tmp / f"{org}.csv"
        out[org].write_text(head + "\n" + "\n".join(lines) + "\n")
    return out


ORG_SETTINGS = {"_logistic": {"loss": "logistic", "lam": 1e-3}}
"""Case-name suffix -> the HyFDCA settings it changes (the objective; every protocol setting stays
the default)."""


def _org_federation(n: int, tmp: Path, rounds: int, settings: dict | None = None) -> tuple[Path, list[Path], Path]:
    """``federation init``, every organisation's ``client prepare``, ``federation stats``, the
    prepare again with the pooled statistics, one ``he-keys`` key copied to each, and ``federation
    assemble``: ``(standardised schema, client directories, server directory)``."""
    tables = _org_tables(n, tmp)
    blocks = "\n".join(f"    {b}: [{', '.join(c)}]" for b, c in BLOCKS.items())
    (tmp / "run.yaml").write_text(
        "seed: 0\ndataset:\n  name: table\n  path: unused.csv\n  id_column: ID\n  label_column: default\n"
        f'  classes: ["no", "yes"]\n  standardize: true\n  blocks:\n{blocks}\n'
        "partition: {kind: iid, num_clients: 3}\nalgorithm: "
        + json.dumps({"name": "hyfdca", "rounds": rounds, **(settings or {})})
        + "\n"
    )
    _cli("federation", "init", "--config", str(tmp / "run.yaml"), "--out", str(tmp / "federation.toml"))
    stats = []
    for i, (org, table) in enumerate(tables.items()):
        d = tmp / "raw" / org
        _cli("client", "prepare", "--table", str(table), "--schema", str(tmp / "federation.toml"), "--out", str(d))
        stats += ["--stats", str(d / "stats.json")]
    schema = tmp / "federation-std.toml"
    _cli("federation", "stats", "--schema", str(tmp / "federation.toml"), *stats, "--out", str(schema))
    _cli("he-keys", "--scheme", "ckks", "--out", str(tmp / "he_secret.key"))
    dirs, clients = [], []
    for i, (org, table) in enumerate(tables.items()):
        d = tmp / "clients" / org
        _cli("client", "prepare", "--table", str(table), "--schema", str(schema), "--out", str(d), "--index", str(i))
        shutil.copy(tmp / "he_secret.key", d / "he_secret.key")
        os.chmod(d / "he_secret.key", 0o600)
        dirs.append(d)
        clients += ["--client", str(d / "client.json")]
    _cli("federation", "assemble", "--schema", str(schema), *clients, "--out", str(tmp / "server"))
    return schema, dirs, tmp / "server"


@dataclasses.dataclass
class Built:
    """One case ready to run: the in-process federation, the directories of the deployed run and
    the target (``metric`` compared with ``value`` by ``at_least``; ``value`` None: HyFEM's, set
    from the in-process run)."""

    fed: object
    dirs: list[Path]
    server_dir: Path
    metric: str
    value: float | None
    at_least: bool
    problem: object = None  # HyFDCA: ``(X, y, lam, loss, P*)`` built from the client directories


def _export(prep, fed, tmp: Path) -> tuple[list[Path], Path]:
    """The simulation's data as the deployed run reads it: ``export_clients`` (with the clients'
    test rows) and the in-process run's HE key pair in every client directory."""
    from hybridfl.data.export import SECRET_FILE, export_clients
    from hybridfl.privacy.keys import write_secret_bytes

    cfg = prep.config
    dirs = export_clients(
        prep.split,
        prep.partition,
        tmp / "export",
        seed=cfg.seed,
        run_config=cfg.model_dump(mode="json"),
        client_test=fed.spec.clients_hold_test,
    )
    if "he_secret" in fed.secrets:
        for d in dirs:
            write_secret_bytes(fed.secrets["he_secret"], d / SECRET_FILE)
    return dirs, tmp / "export" / "server"


def _problem(dirs: list[Path], offsets: dict, cfg) -> tuple:
    """HyFDCA's problem in the clear from the client directories: ``(X, y, lam, loss, P*)`` with
    ``X`` ``(N, d)`` in the server's feature layout ``offsets`` (block -> columns; the constant
    ``intercept`` column for the labelled rows with ``fit_intercept``), ``y`` in {-1, +1}, ``P*``
    the reference optimum (the benchmark's evaluator: it reads every organisation's data)."""
    from hybridfl.algorithms.convex.monitor import client_positive_set
    from hybridfl.algorithms.convex.reference import reference_optimum
    from hybridfl.data.export import load_client_dir

    cds = [load_client_dir(d) for d in dirs]
    ids = sorted({str(s) for cd in cds for s in cd.data.ids})
    row = {s: i for i, s in enumerate(ids)}
    d = max(b for _, b in offsets.values())
    X, y = np.zeros((len(ids), d)), np.zeros(len(ids))
    for cd in cds:
        r = np.array([row[str(s)] for s in cd.data.ids])
        for b in cd.data.block_names:
            a, e = offsets[b]
            X[r, a:e] = np.asarray(cd.data.blocks[b], dtype=np.float64).reshape(len(r), -1)
        if cd.has_labels:
            pos = client_positive_set(cd, cfg.loss, cfg.positive_classes, "benchmark")
            y[r] = np.where(np.isin(cd.data.y, pos), 1.0, -1.0)
            if cfg.fit_intercept:
                a, e = offsets["intercept"]
                X[r, a:e] = 1.0
    if not np.all(y != 0):
        raise RuntimeError("some customer has no label holder")
    ref = reference_optimum(X, y, cfg.lam, cfg.loss, sdca_epochs=cfg.reference_sdca_epochs)
    return X, y, cfg.lam, cfg.loss, float(ref.objective)


def _relative_suboptimality(problem: tuple, w: np.ndarray) -> float:
    from hybridfl.algorithms.convex.losses import primal

    X, y, lam, loss, pstar = problem
    return (primal(X, y, np.asarray(w, dtype=np.float64), lam, loss) - pstar) / abs(pstar)


def build(case: str, tmp: Path, cap: int) -> Built:
    """The in-process federation and the deployed run's directories of ``case`` (at most ``cap``
    rounds)."""
    from hybridfl.algorithms.spec import get_algorithm
    from hybridfl.experiment import prepare
    from hybridfl.runtime.simulation import assemble_federation, build_federation

    if case.startswith("hyfdca_orgs"):
        from hybridfl.data.federation import load_federation

        size, _, suffix = case.removeprefix("hyfdca_orgs").partition("_")
        settings = ORG_SETTINGS.get("_" + suffix, {}) if suffix else {}
        n = 90 if harness.smoke() else int(size)
        schema, dirs, server = _org_federation(n, tmp, cap, settings)
        spec = get_algorithm("hyfdca")
        sd, cds = load_federation(schema, dirs)
        cfg = spec.config_model.model_validate({"name": "hyfdca", "rounds": cap, **settings})
        fed = assemble_federation(spec, sd, cds, cfg, 0)
        b = Built(fed, dirs, server, "relative_suboptimality", TARGET_SUBOPT, False)
        b.problem = _problem(dirs, fed.server.offsets, cfg)
        prob = b.problem
        fed.monitor = lambda server: {"relative_suboptimality": _relative_suboptimality(prob, server.output_w())}
        return b
    if case == "hyfem_mfeat":
        cfg = _example("hyfem_mfeat.yaml", baselines=False, rounds=min(40, cap))
    elif case == "hyfdca_credit":
        cfg = _example("hyfdca_credit_default.yaml", {"name": "hyfdca", "rounds": cap})
    elif case == "fedbcd_credit":
        cfg = _example("fedbcd_credit.yaml", rounds=cap)
    else:
        raise SystemExit(f"unknown case {case!r}; the cases are {', '.join(CASES)}.")
    prep = prepare(cfg)
    fed = build_federation(get_algorithm(prep.algorithm.name), prep.split, prep.partition, prep.algorithm, cfg.seed)
    dirs, server = _export(prep, fed, tmp)
    if case == "hyfem_mfeat":
        return Built(fed, dirs, server, "server_accuracy", None, True)
    if case == "fedbcd_credit":
        return Built(fed, dirs, server, "auc", float(prep.algorithm.target_auc), True)
    b = Built(fed, dirs, server, "relative_suboptimality", TARGET_SUBOPT, False)
    b.problem = _problem(dirs, fed.server.offsets, prep.algorithm)
    return b


# ---------------------------------------------------------------- the in-process run, instrumented


class _Timed:
    """A client endpoint whose ``handle`` seconds go into ``times`` (client ID -> seconds)."""

    def __init__(self, inner, cid: str, times: dict):
        self.inner, self.cid, self.times = inner, cid, times

    def handle(self, msg):
        t0 = time.perf_counter()
        try:
            return self.inner.handle(msg)
        finally:
            self.times[self.cid] = self.times.get(self.cid, 0.0) + time.perf_counter() - t0


def _instrument(fed) -> tuple[list[dict], dict]:
    """Record every exchange of ``fed``'s transports (the training one and the evaluation one the
    loop makes): phase (``setup``, ``train``, ``eval``), round, messages, counted bytes, each
    client's seconds. Returns ``(records, state)``; ``state["phase"]`` and ``state["round"]``
    are set by the caller and the wrapped ``run_round``. Undo with :func:`_restore`."""
    from hybridfl.runtime.transport import InProcessTransport

    records: list[dict] = []
    state = {"phase": "setup", "round": 0, "original": InProcessTransport.send_and_receive}
    original = state["original"]

    def counted(self, messages):
        msgs = list(messages)
        times: dict = {}
        clients, b0 = self.clients, self.log.bytes_total
        self.clients = {c: _Timed(e, c, times) for c, e in clients.items()}
        try:
            return original(self, msgs)
        finally:
            self.clients = clients
            records.append(
                {
                    "phase": state["phase"],
                    "round": state["round"],
                    "messages": len(msgs),
                    "bytes": self.log.bytes_total - b0,
                    "client_sum": sum(times.values()),
                    "client_max": max(times.values(), default=0.0),
                }
            )

    run_round = fed.server.run_round

    def timed_round(rnd, transport):
        state.update(phase="train", round=int(rnd))
        try:
            return run_round(rnd, transport)
        finally:
            state["phase"] = "eval"
            if int(rnd) == state.get("snap_round") and fed.spec.final_arrays is not None:
                state["snap"] = {k: np.array(v) for k, v in fed.spec.final_arrays(fed.server).items()}

    InProcessTransport.send_and_receive = counted
    fed.server.run_round = timed_round
    return records, state


def _restore(state: dict) -> None:
    from hybridfl.runtime.transport import InProcessTransport

    InProcessTransport.send_and_receive = state["original"]


def _reached(b: Built, row: dict) -> bool:
    v = row.get(b.metric)
    if v is None or b.value is None:
        return False
    return v >= b.value if b.at_least else v <= b.value


def in_process(b: Built, snap_round: int = 0) -> dict:
    """The in-process run to the target (one thread): setup, then rounds until the target (or the
    config's rounds); per round the breakdown of the module docstring; ``snap``: the final arrays
    after round ``snap_round`` (to compare a shorter deployed run with)."""
    from hybridfl.runtime.simulation import single_threaded

    fed = b.fed
    records, state = _instrument(fed)
    state["snap_round"] = snap_round
    try:
        with single_threaded():
            t0 = time.perf_counter()
            fed.setup()
            setup_s = time.perf_counter() - t0
            loop = fed.loop(monitor=True)
            if b.value is not None:
                loop.spec = dataclasses.replace(loop.spec, should_stop=lambda h, _c: _reached(b, h[-1]))
            history = loop.run()
    finally:
        _restore(state)
    if b.value is None:  # HyFEM: the accuracy the run ends with
        b.value = float(history[-1][b.metric])
    first = next((int(r["round"]) for r in history if _reached(b, r)), None)
    rounds = []
    for r in history:
        rnd = int(r["round"])
        mine = [x for x in records if x["round"] == rnd and x["phase"] != "setup"]
        train = [x for x in mine if x["phase"] == "train"]
        server = max(0.0, float(r["seconds"]) - sum(x["client_sum"] for x in train))
        compute = server + sum(x["client_max"] for x in mine)
        rounds.append(
            {
                "round": rnd,
                "seconds": float(r["seconds"]),
                "exchanges": len(mine),
                "train_exchanges": len(train),
                "messages": sum(x["messages"] for x in mine),
                "bytes": sum(x["bytes"] for x in mine),
                "train_bytes": sum(x["bytes"] for x in train),
                "crypto_s": float(r.get("encryption_seconds", 0.0)),
                "server_s": server,
                "client_max_s": sum(x["client_max"] for x in mine),
                "compute_s": compute,
                b.metric: r.get(b.metric),
            }
        )
    setup = [x for x in records if x["phase"] == "setup"]
    setup_server = max(0.0, setup_s - sum(x["client_sum"] for x in setup))
    final = fed.spec.final_arrays(fed.server) if fed.spec.final_arrays is not None else {}
    return {
        "first": first,
        "rounds": rounds,
        "setup": {
            "seconds": setup_s,
            "exchanges": len(setup),
            "bytes": sum(x["bytes"] for x in setup),
            "server_s": setup_server,
            "compute_s": setup_server + sum(x["client_max"] for x in setup),
        },
        "final": {k: np.asarray(v) for k, v in final.items()},
        "history": history,
        "snap": state.get("snap"),
    }


# ---------------------------------------------------------------- the deployed run


GATE = True
"""Start the SuperLink gated (``LocalFederation``'s default); ``--stock-superlink`` sets it off."""


def deployed(b: Built, rounds: int, work: Path) -> dict:
    """``rounds`` rounds over Flower: :class:`LocalFederation` (TLS, SuperNode authentication,
    inline SuperNodes, the gated SuperLink unless :data:`GATE` is off), SuperNode ``i`` in network
    namespace ``i``. Returns the server's summary, history and final arrays, and the seconds the
    federation took to start."""
    from hybridfl.runtime.flower.local import LocalFederation
    from hybridfl.runtime.flower.netns import Hosts

    res = work / "res"
    with Hosts(len(b.dirs), subnet=SUBNET) as hosts:
        fed = LocalFederation(b.dirs, work_dir=work / "flower", start_timeout=180, hosts=hosts, gate=GATE)
        try:
            t0 = time.perf_counter()
            fed.start()
            start_s = time.perf_counter() - t0
            fed.run({"server-dir": str(b.server_dir), "out-dir": str(res), "rounds": rounds}, timeout=7200)
        except BaseException:
            print(fed.logs(40), flush=True)
            raise
        finally:
            fed.close()
        tls, auth = fed.tls, fed.auth
    final = {}
    if (res / "final.npz").is_file():
        with np.load(res / "final.npz") as z:
            final = {k: z[k] for k in z.files}
    return {
        "summary": json.loads((res / "summary.json").read_text()),
        "history": json.loads((res / "history.json").read_text()),
        "final": final,
        "start_s": start_s,
        "tls": tls,
        "auth": auth,
    }


def wan(exchanges: int, nbytes: int, compute: float) -> float:
    """The modelled WAN seconds of exchanges carrying ``nbytes`` and ``compute`` seconds of work:
    ``exchanges x RTT + nbytes x 8 / BANDWIDTH + compute`` (RTT 0.05 s, 100 Mbit/s)."""
    return exchanges * RTT + nbytes * 8 / BANDWIDTH + compute


def _target_text(b: Built) -> str:
    if b.metric == "relative_suboptimality":
        return f"rel. subopt. <= {b.value:g}"
    return f"{'test accuracy' if b.metric == 'server_accuracy' else 'test AUC'} >= {b.value:.4g}"


def _metric_at(row: dict) -> float | None:
    """The target's metric of the in-process run after its last round (a row's ``rounds``)."""
    last = row["in_process_rounds"][-1] if row.get("in_process_rounds") else {}
    return next((last[k] for k in ("relative_suboptimality", "auc", "server_accuracy") if k in last), None)


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def measure(case: str, cap: int, with_deployed: bool, deployed_rounds: int = 0) -> dict:
    """One case: in process to the target, then deployed for as many rounds (at most
    ``deployed_rounds`` if > 0: the rest extrapolated from the measured rounds); the row's values."""
    with tempfile.TemporaryDirectory(prefix=f"hybridfl-deployed-{case}-") as tmp:
        tmp = Path(tmp)
        b = build(case, tmp, cap)
        ip = in_process(b, deployed_rounds)
        n = ip["first"] or len(ip["rounds"])  # not reached: the deployed run trains as many rounds
        rounds, setup = ip["rounds"][:n], ip["setup"]
        out = {
            "description": CASES[case],
            "target": _target_text(b),
            "rounds": n,
            "reached": ip["first"] is not None,
            "clients": len(b.dirs),
            "in_process_s": setup["seconds"] + sum(r["seconds"] for r in rounds),
            "setup_in_process_s": setup["seconds"],
            "wan_s": wan(setup["exchanges"], setup["bytes"], setup["compute_s"])
            + sum(wan(r["exchanges"], r["bytes"], r["compute_s"]) for r in rounds),
            "setup_wan_s": wan(setup["exchanges"], setup["bytes"], setup["compute_s"]),
            "setup_exchanges": setup["exchanges"],
            "setup_bytes": setup["bytes"],
            "exchanges_per_round": _mean([r["exchanges"] for r in rounds]),
            "mb_per_round": _mean([r["bytes"] / 1e6 for r in rounds]),
            "crypto_s_per_round": _mean([r["crypto_s"] for r in rounds]),
            "compute_s_per_round": _mean([r["compute_s"] for r in rounds]),
            "in_process_rounds": rounds,
            "in_process_setup": setup,
        }
        out["metric_at_rounds"] = _metric_at(out)
        if b.problem is not None and "w" in ip["final"] and b.metric in ip["history"][-1]:
            # the benchmark's own P(w) against the run's monitor (the same problem, built apart)
            mine = _relative_suboptimality(b.problem, ip["final"]["w"])
            out["evaluator_check"] = abs(mine - ip["history"][-1][b.metric])
        if with_deployed:
            k = min(n, deployed_rounds) if deployed_rounds > 0 else n
            out.update(_deployed_part(b, ip, k, rounds[:k], tmp / "deployed"))
            if k < n:  # labelled: the deployed time to target is extrapolated from k measured rounds
                out["deployed_measured_s"] = out["deployed_s"]
                out["deployed_s"] += (n - k) * out["deployed_s_per_round"]
                out["deployed_s_extrapolated_from_rounds"] = k
                out["deployed_reached"] = None
        return out


def _deployed_part(b: Built, ip: dict, n: int, rounds: list[dict], work: Path) -> dict:
    """The deployed run of ``n`` rounds and its per-round breakdown against the in-process one."""
    d = deployed(b, n, work)
    s, hist = d["summary"], d["history"]
    setup_ex = ip["setup"]["exchanges"]
    ex_s = [float(x) for x in s["exchange_seconds"]]
    aligned = len(ex_s) == setup_ex + sum(r["exchanges"] for r in rounds)
    per_round, i = [], setup_ex
    for r, h in zip(rounds, hist, strict=False):
        mine = ex_s[i : i + r["exchanges"]] if aligned else []
        i += r["exchanges"]
        evals = r["exchanges"] - _train_exchanges(r)
        seconds = float(h["seconds"]) + (sum(mine[len(mine) - evals :]) if aligned and evals else 0.0)
        per_round.append(
            {
                "round": r["round"],
                "seconds": seconds,
                "exchange_seconds": mine,
                "bytes": int(h.get("bytes", 0)),
                "flower_s": seconds - r["compute_s"],
                "wan_s": wan(r["exchanges"], r["bytes"], r["compute_s"]),
            }
        )
    setup_s = sum(ex_s[:setup_ex]) + ip["setup"]["server_s"]
    last = hist[n - 1] if len(hist) >= n else {}
    if b.problem is not None and "w" in d["final"]:
        got = _relative_suboptimality(b.problem, d["final"]["w"])
        w0 = ip["final"]["w"] if n == len(ip["rounds"]) or not ip.get("snap") else ip["snap"]["w"]
        w_diff = float(np.max(np.abs(d["final"]["w"] - w0)) / max(float(np.max(np.abs(w0))), 1e-300))
    else:
        got, w_diff = last.get(b.metric), None
    return {
        "deployed_s": setup_s + sum(r["seconds"] for r in per_round),
        "setup_deployed_s": setup_s,
        "start_s": d["start_s"],
        "hello_s": s.get("setup_exchange_seconds"),
        "server_wall_s": s.get("wall_seconds"),
        "deployed_s_per_round": _mean([r["seconds"] for r in per_round]),
        "flower_s_per_round": _mean([r["flower_s"] for r in per_round]),
        "deployed_metric": got,
        "deployed_reached": got is not None and _reached(b, {b.metric: got}),
        "final_w_rel_diff": w_diff,
        "exchanges_equal": aligned,
        "exchanges_deployed": len(ex_s),
        # counted bytes of the setup and the rounds, evaluation excluded (the server's summary)
        "bytes_deployed": s.get("bytes_total"),
        "bytes_in_process": ip["setup"]["bytes"] + sum(r.get("train_bytes", r["bytes"]) for r in rounds),
        # Flower's serialized bytes of every exchange (evaluation included) against our count
        "wire_bytes_deployed": s["wire_bytes_total"],
        "wire_over_counted": s["wire_bytes_total"] / max(ip["setup"]["bytes"] + sum(r["bytes"] for r in rounds), 1),
        "tls": d["tls"],
        "auth": d["auth"],
        "deployed_rounds": per_round,
    }


def _train_exchanges(r: dict) -> int:
    return int(r.get("train_exchanges", r["exchanges"]))


# ---------------------------------------------------------------- the command line

NOTES = [
    "Method: the in-process run (one thread) stops at the first round reaching the target; the deployed run "
    "trains exactly that many rounds over Flower (TLS, SuperNode authentication, inline SuperNodes, every SuperNode "
    "in its own network namespace) and its own result is checked against the target (`deployed_reached`).",
    "Times to target include the one-off setup (HyFDCA: PSI alignment of the clients, key checks, batch Gram sums). "
    "In process: setup + rounds (wall, one thread, evaluation excluded). Deployed: the setup exchanges' measured "
    "seconds + the setup's server seconds, then every round's measured wall seconds (+ its evaluation exchanges); "
    "the federation's start-up (processes, TLS, registration, hello) is `start_s`, not counted.",
    "WAN modelled s = setup + sum over rounds of (exchanges x 0.05 s + bytes x 8 / 1e8 + compute s): 50 ms round "
    "trip, 100 Mbit/s; compute s = the in-process round's server seconds + per exchange the slowest client's "
    "seconds (clients in parallel). Flower s/round = deployed s/round - compute s/round. Crypto s/round: HyFDCA's "
    "measured HE seconds (clients + server, in process), part of the compute.",
]


def main() -> None:
    p = harness.parser(__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated cases (default: all)")
    p.add_argument("--cap", type=int, default=300, help="at most this many rounds in process (default 300)")
    p.add_argument("--skip-deployed", action="store_true", help="in process only")
    p.add_argument(
        "--deployed-rounds",
        type=int,
        default=0,
        help="deploy at most this many rounds and extrapolate the rest from them (default 0: all rounds to the target)",
    )
    p.add_argument(
        "--merge-from",
        type=Path,
        nargs="+",
        default=[],
        help="write the rows of these folders' deployed.json (runs made at once into separate --out folders) into --out",
    )
    p.add_argument(
        "--stock-superlink",
        action="store_true",
        help="deploy with the stock flower-superlink instead of the gated one (for a comparison)",
    )
    a = p.parse_args()
    global GATE
    GATE = not a.stock_superlink
    # SIGTERM unwinds like an exception: the federation's processes and the namespaces are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = OUT if a.out == harness.RESULTS else a.out  # OUT: redirected by --smoke
    if a.merge_from:
        rows = [r for d in a.merge_from for r in harness.read_report("deployed", d)["rows"]]
        for r in rows:  # rows measured before the column existed
            r.setdefault("metric_at_rounds", _metric_at(r))
        rows.sort(key=lambda r: list(CASES).index(r["config"]))
        command = "; ".join(sorted({r.get("command", "?") for r in rows}))
        harness.write_report(
            "deployed",
            rows,
            title="Deployed training to target",
            command=command,
            columns=COLUMNS,
            notes=NOTES,
            out=out,
        )
        return
    cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.exit(f"unknown case {unknown[0]!r}; the cases are {', '.join(CASES)}.")

    def one(setting: dict, _seed: int) -> dict:
        try:
            return measure(setting["case"], a.cap, not a.skip_deployed, a.deployed_rounds)
        except Exception as e:  # one case failing does not lose the others' rows
            import traceback

            traceback.print_exc()
            return {"error": f"{type(e).__name__}: {e}"[:500]}

    command = ("python -m benchmarks.deployed " + " ".join(sys.argv[1:])).strip()
    rows: list[dict] = []
    for case in cases:  # the report is written after every case (a long run keeps what it measured)
        setting = {
            "case": case,
            "cap": a.cap,
            "deployed_rounds": a.deployed_rounds,
            "superlink": "gated" if GATE else "stock",
        }
        rows += harness.run_grid(one, {case: setting}, a.seeds)
        rows[-1].update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), command=command)
        kept = []
        if (out / "deployed.json").is_file():
            kept = [r for r in harness.read_report("deployed", out)["rows"] if r["config"] not in cases]
        every = sorted(kept + rows, key=lambda r: list(CASES).index(r["config"]))
        harness.write_report(
            "deployed",
            every,
            title="Deployed training to target",
            command=command,
            columns=COLUMNS,
            notes=NOTES,
            out=out,
        )
    print(harness.markdown_table(every, COLUMNS))


PARTS = {"": (main, ["--cases", "hyfdca_orgs600", "--cap", "3"])}

if __name__ == "__main__":
    harness.dispatch("deployed", PARTS, globals())
