"""Operator tables from Chrome/Perfetto traces, computed one way for every framework.

Each backend exports its framework profiler's trace and names the event categories that are
operators; self time here is an operator's duration minus that of the operators nested in it
on the same thread, as torch.profiler defines self time.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, Iterable, List


def load_events(path: str | Path) -> List[dict]:
    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def top_operators(
    events: Iterable[dict], categories: Iterable[str], normalize: Callable[[str], str] = str, n: int = 15
) -> List[Dict]:
    """The ``n`` operators with the most self time: name, calls, self and total milliseconds, share."""
    categories = set(categories)
    by_thread: Dict[tuple, List[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in categories and "dur" in e:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    stats: Dict[str, Dict[str, float]] = defaultdict(lambda: {"calls": 0, "self_us": 0.0, "total_us": 0.0})
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: List[list] = []  # [end, name, child time]
        for e in thread_events:
            start, dur = float(e["ts"]), float(e["dur"])
            while stack and stack[-1][0] <= start:
                _close(stack.pop(), stats)
            if stack:
                stack[-1][2] += dur
            name = normalize(e["name"])
            stats[name]["calls"] += 1
            stats[name]["total_us"] += dur
            stack.append([start + dur, name, 0.0, dur])
        while stack:
            _close(stack.pop(), stats)
    total_self = sum(s["self_us"] for s in stats.values()) or 1.0
    rows = [
        {
            "name": name,
            "calls": int(s["calls"]),
            "self_ms": s["self_us"] / 1e3,
            "total_ms": s["total_us"] / 1e3,
            "self_share": s["self_us"] / total_self,
        }
        for name, s in stats.items()
    ]
    return sorted(rows, key=lambda r: r["self_ms"], reverse=True)[:n]


def _close(frame: list, stats) -> None:
    _, name, children, dur = frame
    stats[name]["self_us"] += max(0.0, dur - children)


def operators_markdown(rows: List[Dict]) -> str:
    lines = ["| operator | calls | self ms | total ms | self share |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['name']} | {r['calls']} | {r['self_ms']:.3f} | {r['total_ms']:.3f} | {100 * r['self_share']:.1f}% |"
        for r in rows
    ]
    return "\n".join(lines)
