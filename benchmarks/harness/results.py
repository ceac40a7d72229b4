"""results.json across runs: what an earlier run left in --out, rows measured again in place, and
the three files written whole or not at all."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List

from unitrain.host.atomic import replace_text

from .markdown import markdown
from .settings import SECTIONS

#: What makes two rows of a section the same measurement: a later run's row replaces an earlier
#: one with the same key, and leaves the others (a run of --backends torch keeps Paddle's rows).
ROW_KEYS = {
    "overhead": ("model", "image_size", "backend", "processes", "threads"),
    "loop": ("model", "image_size", "backend"),
    "data": ("backend", "data", "workers"),
    "scaling": ("backend", "variant"),
    "compression": ("backend", "data", "grad_compression"),
    "tuned": ("model", "image_size", "backend", "variant"),
    "maxbatch": ("backend", "model", "image_size"),
    "amp": ("backend", "amp"),
}


def load_previous(
    path: Path,
    unstamped: str = "an earlier run (time not recorded)",
    advice: str = "move it away or pass another --out",
) -> Dict:
    """An earlier run's results in --out, each row stamped with the run that measured it (rows
    from before the stamps with ``unstamped``); {} when there is none.
    SystemExit(2) after one line when the file is not this harness's: nothing is run or written."""
    if not path.exists():
        return {}
    try:
        previous = json.loads(path.read_text())
        check(previous)
    except (ValueError, KeyError, AssertionError) as e:
        reason = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
        print(
            f"run.py: error: {path} is not results of this harness ({reason}); {advice}: nothing was run or written",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    # A file's time says when it was checked out, not measured: an older file's rows say so instead.
    when = previous.get("started") or unstamped
    runs = previous.setdefault("runs", {})
    runs.setdefault(when, {"machine": previous["machine"], "config": previous.get("config")})
    for section in SECTIONS:
        for row in previous.get(section) or []:
            row.setdefault("measured_at", when)
    return previous


def check(previous) -> None:
    """AssertionError or KeyError, saying why, for what this harness did not write."""
    # Every run of the harness writes these sections, empty or not (the others came later).
    assert isinstance(previous, dict) and isinstance(previous["machine"], dict), "no machine"
    assert {"overhead", "data", "scaling", "amp"} <= previous.keys(), "no overhead, data, scaling and amp sections"
    for section in SECTIONS:
        for row in previous.get(section) or []:
            missing = [k for k in ROW_KEYS[section] if k not in row]
            assert not missing, f"its {section} rows lack {', '.join(missing)}: written by an older harness"


def merge(previous: List[Dict], new: List[Dict], section: str) -> List[Dict]:
    """The earlier rows, each measured again in its place (so a table keeps its order), then the
    new rows that were not there."""
    key = lambda r: tuple(r.get(k) for k in ROW_KEYS[section])  # noqa: E731
    fresh = {key(r): r for r in new}
    merged = [fresh.pop(key(r), r) for r in previous]
    return merged + [r for r in new if key(r) in fresh]


def save(out: Path, results: Dict, with_json: bool = True) -> None:
    """results.json, results.md and results.png, each written beside and renamed into place: an
    interrupted benchmark leaves the last complete set, never half a file."""
    from plot import plot  # benchmarks/plot.py: a script of its own, found beside run.py

    used = {r.get("measured_at") for section in SECTIONS for r in results.get(section) or []}
    results["runs"] = {
        when: run for when, run in results.get("runs", {}).items() if when in used or when == results["started"]
    }
    files = [("results.json", json.dumps(results, indent=2) + "\n")] if with_json else []
    for name, text in [*files, ("results.md", markdown(results))]:
        replace_text(out / name, text)
    plot(results, out / "results.png")
