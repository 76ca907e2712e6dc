"""Latency CDF and latency-vs-load plots (matplotlib, PNG), written via temp file + rename."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from flexlamps.sim.metrics import Summary


def _save(fig, path: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    os.replace(tmp, path)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("plots need matplotlib: pip install 'flexlamps[plots]'") from e
    return plt


def plot_cdf(e2e_by_policy: dict[str, list[float]], title: str, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, values in e2e_by_policy.items():
        v = np.sort(np.asarray(values))
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)
    plt.close(fig)


def plot_vs_load(summaries: list[Summary], path: str, trace_name: str = "") -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    metrics = [("e2e_mean", "mean E2E (s)"), ("ttft_mean", "mean TTFT (s)"),
               ("norm_mean", "normalized latency (s/token)")]
    for policy in dict.fromkeys(s.policy for s in summaries):
        rows = sorted((s for s in summaries if s.policy == policy), key=lambda s: s.qps)
        for ax, (field, label) in zip(axes, metrics):
            ax.plot([s.qps for s in rows], [getattr(s, field) for s in rows], marker="o", label=policy)
            ax.set_xlabel("load (requests/s)")
            ax.set_ylabel(label)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"latency vs load {trace_name}".strip())
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
