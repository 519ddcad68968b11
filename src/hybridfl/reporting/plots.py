"""Plots a person would rather look at than read: accuracy vs round, partition coverage."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from hybridfl.data.partition import Coverage
from hybridfl.runtime.simulation import RunResult


def _save(fig, path: Path) -> Path:
    from hybridfl.files import atomic_write

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return path


def plot_accuracy(result: RunResult, path: str | Path) -> Path:
    """Test accuracy vs round: server (global), mean client (local: the clients' models after
    their local steps, HyFEM's client models, and the models they receive), and the baselines as
    horizontal lines (centralised, centralised on the held cells, mean stand-alone) when present."""
    h = [r for r in result.history if "server_accuracy" in r or "accuracy" in r]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    rounds = [r["round"] for r in h]
    if any("server_accuracy" in r for r in h):
        ax.plot(rounds, [100 * r["server_accuracy"] for r in h], "o-", ms=3, label="server (global, all blocks)")
    if any("client_accuracy_local_mean" in r for r in h):
        hl = [r for r in h if "client_accuracy_local_mean" in r]
        ax.plot(
            [r["round"] for r in hl],
            [100 * r["client_accuracy_local_mean"] for r in hl],
            "^-",
            ms=3,
            label="clients, mean, after Q local steps (own blocks)",
        )
    if any("client_accuracy_mean" in r for r in h):
        ax.plot(
            rounds,
            [100 * r["client_accuracy_mean"] for r in h],
            "s-",
            ms=3,
            label="clients, mean, received model (own blocks)",
        )
    if any("accuracy" in r for r in h):
        ax.plot(rounds, [100 * r["accuracy"] for r in h], "o-", ms=3, label="test accuracy")
    s = result.summary
    if s.get("centralized_accuracy") is not None:
        ax.axhline(100 * s["centralized_accuracy"], color="k", ls="--", lw=1, label="centralised")
    if s.get("centralized_held_accuracy") is not None:
        ax.axhline(100 * s["centralized_held_accuracy"], color="k", ls="-.", lw=1, label="centralised, held cells")
    if s.get("standalone_accuracy_mean") is not None:
        ax.axhline(100 * s["standalone_accuracy_mean"], color="gray", ls=":", lw=1.5, label="stand-alone, mean")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{s.get('algorithm', '')} on {s.get('dataset', '')}".strip())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, Path(path))


def plot_coverage(cov: Coverage, path: str | Path, title: str = "") -> Path:
    """Heatmap of how many clients hold each (class, block) cell (HyFEM Fig. 2/11)."""
    counts = cov.counts.T  # blocks x classes, as in the paper (x: class, y: block)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * len(cov.classes) + 2), max(2.5, 0.45 * len(cov.blocks) + 1.5)))
    im = ax.imshow(counts, cmap="Blues", vmin=0, vmax=max(1, int(counts.max())), aspect="auto")
    for i in range(counts.shape[0]):
        for j in range(counts.shape[1]):
            v = int(counts[i, j])
            ax.text(
                j, i, str(v), ha="center", va="center", fontsize=8, color="white" if v > counts.max() / 2 else "black"
            )
    ax.set_xticks(np.arange(len(cov.classes)), cov.classes, fontsize=8)
    ax.set_yticks(np.arange(len(cov.blocks)), cov.blocks, fontsize=8)
    ax.set_xlabel("class")
    ax.set_ylabel("feature block")
    ax.set_title(
        title or f"clients holding each (class, block); {100 * cov.unused_share:.2f} % of cells unused", fontsize=9
    )
    fig.colorbar(im, ax=ax, label="clients")
    return _save(fig, Path(path))
