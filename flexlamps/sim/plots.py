"""Latency CDF and latency-vs-load plots (matplotlib, PNG), written via temp file + rename."""

from __future__ import annotations

import numpy as np

from flexlamps.io.atomic import atomic_output
from flexlamps.sim.metrics import Summary


def _save(fig, path: str) -> None:
    with atomic_output(path, "wb") as handle:
        fig.savefig(handle, dpi=120, bbox_inches="tight", format="png")


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


def plot_vs_load(summaries: list[Summary], path: str, trace_name: str = "",
                 saturation: dict[str, float] | None = None,
                 stable: dict[tuple[str, float], bool] | None = None) -> None:
    """Latency-vs-load curves per policy (mean E2E, P99 E2E, mean TTFT), as the papers draw
    them; a dashed line marks the load where each policy saturates (`saturation`), and points
    that failed the window test (`stable[(policy, qps)]` False) are drawn hollow."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    metrics = [("e2e_mean", "mean E2E (s)"), ("e2e_p99", "P99 E2E (s)"), ("ttft_mean", "mean TTFT (s)")]
    stable = stable or {}
    for i, policy in enumerate(dict.fromkeys(s.policy for s in summaries)):
        color = f"C{i}"
        rows = sorted((s for s in summaries if s.policy == policy), key=lambda s: s.qps)
        for ax, (field, label) in zip(axes, metrics):
            xs, ys = [s.qps for s in rows], [getattr(s, field) for s in rows]
            ax.plot(xs, ys, color=color, label=policy)
            for x, y in zip(xs, ys):
                ok = stable.get((policy, x), True)
                ax.plot([x], [y], "o", color=color, markerfacecolor=color if ok else "none")
            if saturation and saturation.get(policy):
                ax.axvline(saturation[policy], color=color, ls="--", lw=1)
            ax.set_xlabel("offered load (requests/s)")
            ax.set_ylabel(label)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
    axes[0].legend(title="dashed: saturation; hollow: unstable")
    fig.suptitle(f"latency vs load {trace_name}".strip())
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
