"""The comparison table printed at the end of a run or a multirun, from the runs' summary.json files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List

COLUMNS = ("backend", "model", "precision", "threads", "world", "batch", "samples/s (median, min-max)", "final loss", "top-1", "top-5", "steps")


def load_summaries(dirs: Iterable[str | Path]) -> List[Dict[str, Any]]:
    """summary.json of each given run directory, or of every run below a multirun directory."""
    summaries = []
    for d in dirs:
        d = Path(d)
        files = [d / "summary.json"] if (d / "summary.json").exists() else sorted(d.glob("*/summary.json"))
        for f in files:
            summary = json.loads(f.read_text())
            summary["run_dir"] = str(f.parent)
            summaries.append(summary)
    return summaries


def _row(s: Dict[str, Any]) -> List[str]:
    t, final = s["throughput"], s.get("final") or {}
    speed = "n/a" if t["samples_per_s"] is None else f"{t['samples_per_s']:.1f} ({t['samples_per_s_min']:.1f}-{t['samples_per_s_max']:.1f})"
    p = s["precision"]
    # An arrow only where the precision that ran is not the one asked for.
    honest = p["requested"].startswith("O0") or p["requested"] == p["effective"]
    precision = p["effective"] if honest else f"{p['requested']} -> {p['effective']}"
    num = lambda key, fmt: format(final[key], fmt) if key in final else "n/a"  # noqa: E731
    return [
        s["backend"], s["model"], precision, str(s["threads"]), str(s["world_size"]), str(s["global_batch_size"]),
        speed, num("loss", ".4f"), num("top1", ".3f"), num("top5", ".3f"), str(s["steps"]),
    ]  # fmt: skip


def markdown_table(summaries: List[Dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_row(s)) + " |" for s in summaries]
    window = max((s.get("final", {}).get("window", 0) for s in summaries), default=0)
    lines.append(f"\nfinal loss/accuracy: mean of the last {window} steps; samples/s: median over steps after warm-up.")
    return "\n".join(lines)
