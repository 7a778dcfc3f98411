"""Ratio charts for A/B results: each metric as a ratio to the reference with its interval and a line
at 1.0, throughputs and latencies in panels of their own (a 25 tok/s and a 4,000 tok/s bar never
share an axis). ``compare`` and the factorial A/B draw with this."""

from __future__ import annotations

from dataclasses import dataclass

from .results import HIGHER_IS_BETTER


@dataclass(frozen=True)
class RatioBar:
    """One bar: ``label`` (what is compared), ``metric``, the ratio to the reference and its interval."""

    label: str
    metric: str
    ratio: float
    lo: float | None
    hi: float | None


def ratio_chart(bars: list[RatioBar], title: str) -> bytes:
    """A PNG: one panel per metric family (throughput: higher is better; latency: lower)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [
        (name, [b for b in bars if HIGHER_IS_BETTER.get(b.metric, True) == higher])
        for name, higher in (("throughput (higher is better)", True), ("latency (lower is better)", False))
    ]
    families = [(n, fb) for n, fb in families if fb]
    fig, axes = plt.subplots(
        1, max(1, len(families)), figsize=(6 * max(1, len(families)), 0.45 * max(len(bars), 4) + 1.5), squeeze=False
    )
    for ax, (name, fam) in zip(axes[0], families):
        ys = range(len(fam))
        err = [
            [max(0.0, b.ratio - b.lo) if b.lo is not None else 0.0 for b in fam],
            [max(0.0, b.hi - b.ratio) if b.hi is not None else 0.0 for b in fam],
        ]
        ax.errorbar([b.ratio for b in fam], list(ys), xerr=err, fmt="o", capsize=4)
        ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_yticks(
            list(ys), [f"{b.label}: {b.metric.replace('_per_card', '/card').replace('_', ' ')}" for b in fam], fontsize=7
        )
        ax.set_xlabel("ratio to the reference (95% interval)")
        ax.set_title(name, fontsize=9)
        ax.invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
