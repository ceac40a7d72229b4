"""results.png: the benchmark sections people would rather see than read, one panel each.

Ratios are drawn with their bootstrap 95% intervals against the line each section is judged by
(overhead: 1.01; tuned: 1, no gain; scaling: the 0.85 efficiency goal), so that a row whose
interval crosses its line shows as not settled, however its median looks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, List, Optional

OVERHEAD_TARGET = 1.01
EFFICIENCY_GOAL = 0.85


def _interval_panel(
    ax, rows: List[Dict], label: Callable[[Dict], str], key: str, title: str, target: Optional[float] = None
) -> None:
    """One horizontal interval per row, its median a dot; 1 (no difference) and the target dashed."""
    y = list(range(len(rows)))[::-1]
    medians = [r[key] for r in rows]
    low = [m - r[f"{key}_ci"][0] for m, r in zip(medians, rows)]
    high = [r[f"{key}_ci"][1] - m for m, r in zip(medians, rows)]
    ax.errorbar(medians, y, xerr=[low, high], fmt="o", capsize=3, color="tab:blue")
    ax.axvline(1.0, linestyle="--", color="gray", linewidth=1, label="1 (no difference)")
    if target is not None:
        ax.axvline(target, linestyle="--", color="tab:red", linewidth=1, label=f"target {target}")
    low_edge, high_edge = ax.get_xlim()
    ax.set_xlim(low_edge, max(high_edge, (target or 1.0) + 0.01))  # the judging line never on the frame
    ax.set_yticks(y, [label(r) for r in rows], fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")


def _overhead(ax, rows: List[Dict]) -> None:
    _interval_panel(
        ax,
        rows,
        lambda r: (
            f"{r['model']} {r['image_size']}px {r['backend']} {r['processes']}x{r['threads']} ({r['pairs']} pairs)"
        ),
        "ratio",
        "overhead: unitrain / native step time (median, 95% CI)",
        OVERHEAD_TARGET,
    )


def _tuned(ax, rows: List[Dict]) -> None:
    _interval_panel(
        ax,
        rows,
        lambda r: f"{r['model']} {r['image_size']}px {r['backend']} {r.get('variant', 'default')}",
        "speedup",
        "tuned / same settings samples/s (median, 95% CI)",
    )


def _scaling(ax, rows: List[Dict]) -> None:
    labels = [f"{r['backend']} {r.get('variant', 'default')}" for r in rows][::-1]
    eff = [r["efficiency"] for r in rows][::-1]
    spread = [
        [e - r["efficiency_min"] for e, r in zip(eff, rows[::-1])],
        [r["efficiency_max"] - e for e, r in zip(eff, rows[::-1])],
    ]
    # The ceiling (two independent jobs, no all-reduce) is the machine's limit, not a lever: grey.
    colors = ["tab:gray" if r.get("variant", "").startswith("no all-reduce") else "tab:green" for r in rows[::-1]]
    ax.barh(range(len(rows)), eff, xerr=spread, capsize=3, color=colors)
    ax.axvline(EFFICIENCY_GOAL, linestyle="--", color="tab:red", linewidth=1, label=f"goal {EFFICIENCY_GOAL}")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlim(0, max(1.05, max(r["efficiency_max"] for r in rows) + 0.05))
    ax.set_title("data-parallel efficiency, 2 x 1 over 2 x (1 x 1) (median, min-max)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")


def _amp(ax, rows: List[Dict]) -> None:
    labels = [f"{r['backend']} {r['amp']} (ran {r['effective']})" for r in rows][::-1]
    ips = [r["ips"] for r in rows][::-1]
    spread = [[i - r["ips_min"] for i, r in zip(ips, rows[::-1])], [r["ips_max"] - i for i, r in zip(ips, rows[::-1])]]
    ax.barh(range(len(rows)), ips, xerr=spread, capsize=3, color="tab:purple")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlabel("samples/s", fontsize=8)
    ax.set_title("mixed precision: samples/s (median, min-max) and the precision that ran", fontsize=9)


PANELS = (("overhead", _overhead), ("tuned", _tuned), ("scaling", _scaling), ("amp", _amp))


def plot(results: Dict, path: Path) -> Optional[Path]:
    """Draw the sections that have rows into ``path`` (written beside and renamed into place);
    None, and nothing written, when none has."""
    panels = [(draw, results[name]) for name, draw in PANELS if results.get(name)]
    if not panels:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [1.2 + 0.28 * len(rows) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights) + 0.6), height_ratios=heights, squeeze=False)
    for ax, (draw, rows) in zip(axes[:, 0], panels):
        draw(ax, rows)
        # Rows can come from several runs of the harness (run.py keeps what a partial run did not
        # measure again): say when, so that a kept row is not read as this run's.
        when = sorted({r["measured_at"] for r in rows if r.get("measured_at")})
        if when:
            measured = (
                f"measured {when[0]}" if len(when) == 1 else f"rows from {len(when)} runs (results.md names each row's)"
            )
            ax.set_title(f"{ax.get_title()}\n{measured}", fontsize=9)
    m = results["machine"]
    fig.suptitle(
        f"{m['cpu']}, {m['cores']} cores ({m.get('extensions', '?')}); torch {m['torch']}, paddle {m['paddle']}",
        fontsize=8,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.99))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
