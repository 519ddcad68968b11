"""HyFEM matching that matters (issue 16): a case where the clients' hidden neurons do not align.

In a HyFEM run every client starts each round from the server's neurons (``Pi_m^t w_0^t``, Alg. 2
line 2), so after ``Q`` local steps its neurons are still where the server put them and the
matching keeps the identity: the server width stays at the client width. This script measures the
case the matching is for (PFNM's one-shot setting, Yurochkin et al. 2019, and HyFEM Appendix A):

- the example mfeat partition (``examples/configs/hyfem_mfeat.yaml``: 6 clients, 3 of the 6 views
  and 5-7 of the 10 classes each), fixed features (the standardised views themselves, no
  extractors, so only the classifier is merged);
- every client trains its one-hidden-layer classifier (``hidden`` neurons) on its own views and
  classes from its *own* random initialisation ("trained apart") for ``--steps`` SGD steps;
- the server merges the client classifiers once with :func:`hybridfl.matching.match_classifiers`
  (HyFEM Alg. 3, closed form Alg. 3 line 9, uncovered entries zero-padded as Appendix A):
  ``cost="pfnm"`` (the paper's PFNM cost), ``cost="euclidean"``, and ``cost="index"`` (no matching:
  plain index-wise averaging, neuron ``j`` of every client averaged into server neuron ``j``);
- score: the server classifier on all test samples with all views (HyFEM's global accuracy), and
  its width.

    .venv/bin/python benchmarks/hyfem_paper.py                 # seeds 0-4
    .venv/bin/python benchmarks/hyfem_paper.py --seeds 0 --steps 500

Writes ``benchmarks/results/hyfem_matching.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from hybridfl.config import load_config, parse_config  # noqa: E402
from hybridfl.experiment import prepare  # noqa: E402
from hybridfl.matching import ClientClassifier, MatchingConfig, ServerClassifier, match_classifiers  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def flat(ds, blocks) -> np.ndarray:
    """The samples of ``ds`` with ``blocks`` concatenated, float32 ``(n, sum of widths)``."""
    return np.concatenate([ds.blocks[b].reshape(ds.n_samples, -1) for b in blocks], axis=1).astype(np.float32)


def train_apart(x: np.ndarray, y: np.ndarray, hidden: int, n_classes: int, steps: int, seed: int) -> dict:
    """A one-hidden-layer classifier trained alone from its own initialisation (seed ``seed``):
    SGD, batch 32, lr 0.05, momentum 0.9. Returns ``W1``, ``b1``, ``W2``, ``b2`` as float64."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, n_classes))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    X, Y = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        idx = torch.randint(len(Y), (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(net(X[idx]), Y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    sd = {k: v.detach().numpy().astype(np.float64) for k, v in net.state_dict().items()}
    return {"W1": sd["0.weight"], "b1": sd["0.bias"], "W2": sd["2.weight"], "b2": sd["2.bias"]}


def server_accuracy(s: ServerClassifier, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of the server classifier on ``x`` (all columns)."""
    h = np.maximum(x @ s.W1.T.astype(np.float64) + s.b1, 0.0)
    return float(np.mean((h @ s.W2.T + s.b2).argmax(1) == y))


def run_seed(seed: int, steps: int, hidden: int, costs: list[str], sigmas: list[float]) -> list[dict]:
    """The clients of the example partition of ``seed`` trained apart, merged by every cost."""
    cfg = load_config(ROOT / "examples" / "configs" / "hyfem_mfeat.yaml").model_dump(mode="json")
    cfg["seed"] = seed
    prep = prepare(parse_config(cfg))
    split, part = prep.split, prep.partition
    names = split.train.block_names
    widths = {b: int(np.prod(split.train.block_shapes[b])) for b in names}
    start = dict(zip(names, np.cumsum([0] + [widths[b] for b in names])[:-1].tolist()))
    C = split.train.n_classes
    clients, alone = [], []
    for i, c in enumerate(part.clients):
        data = split.train.subset(c.sample_ids, c.blocks)
        w = train_apart(flat(data, c.blocks), data.y, hidden, C, steps, 1000 * seed + i)
        cols = np.concatenate([np.arange(start[b], start[b] + widths[b]) for b in c.blocks])
        clients.append(
            ClientClassifier(
                w["W1"],
                w["b1"],
                w["W2"],
                w["b2"],
                columns=cols,
                weight=float(data.n_samples),
                class_counts=np.bincount(data.y, minlength=C),
            )
        )
        alone.append(
            server_accuracy(
                ServerClassifier(w["W1"], w["b1"], w["W2"], w["b2"]), flat(split.test, c.blocks), split.test.y
            )
        )
    xt, yt = flat(split.test, names), split.test.y
    D0 = xt.shape[1]
    rng0 = np.random.default_rng(seed)
    # the round-0 server of HyFEM: He-initialised, `hidden` neurons (index-wise averaging starts there)
    prev = ServerClassifier(
        rng0.normal(0, np.sqrt(2 / D0), (hidden, D0)),
        np.zeros(hidden),
        rng0.normal(0, np.sqrt(2 / hidden), (C, hidden)),
        np.zeros(C),
    )
    rows = []
    for cost in costs:
        for sigma in sigmas if cost == "pfnm" else [None]:
            mc = MatchingConfig(cost=cost, sweeps=3, **({"sigma": sigma} if sigma is not None else {}))
            t0 = time.perf_counter()
            res = match_classifiers(clients, prev, mc, np.random.default_rng(seed))
            rows.append(
                {
                    "seed": seed,
                    "cost": cost,
                    "sigma": sigma,
                    "uncovered": mc.uncovered,
                    "sweeps": res.stats["sweeps"],
                    "client_width": hidden,
                    "server_width": res.server.width,
                    "server_accuracy": server_accuracy(res.server, xt, yt),
                    "standalone_accuracy_mean": float(np.mean(alone)),
                    "match_seconds": time.perf_counter() - t0,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    """Run the seeds, write ``hyfem_matching.json`` and ``.md``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=1000, help="SGD steps each client trains apart")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--sigmas", nargs="+", type=float, default=[1.0])
    ap.add_argument("--name", default="hyfem_matching")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        rows += run_seed(seed, args.steps, args.hidden, ["pfnm", "euclidean", "index"], args.sigmas)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=2))
    lines = [
        "| seed | merge (cost, sigma) | server width (clients: "
        f"{args.hidden}) | server accuracy | stand-alone clients (mean, own views) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        how = r["cost"] + (f", sigma {r['sigma']:g}" if r["sigma"] is not None else "")
        lines.append(
            f"| {r['seed']} | {how} | {r['server_width']} | {100 * r['server_accuracy']:.2f} "
            f"| {100 * r['standalone_accuracy_mean']:.2f} |"
        )
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
