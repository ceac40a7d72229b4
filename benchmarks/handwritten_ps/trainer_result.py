"""What each hand-written trainer reports, in one JSON line (the two scripts' one format, which
benchmarks/ps_handwritten.py reads)."""

from __future__ import annotations

import json
import statistics
from typing import List, Optional

WARMUP_STEPS = 2  # steps left out of the step median: the first pulls create the table rows


def trainer_result(
    *, framework: str, trainer: int, batch: int, costs: List[float], losses: List[float], examples: int, seconds: float
) -> dict:
    """Examples/s over the loop and the median step's (the same span unitrain's summary times)."""
    step_rates = [batch / c for c in costs[WARMUP_STEPS:] or costs]
    return {
        "framework": framework,
        "trainer": trainer,
        "steps": len(costs),
        "examples": examples,
        "seconds": seconds,
        "examples_per_s": examples / seconds,
        "step_examples_per_s": statistics.median(step_rates),
        "first_loss": losses[0],
        "last_loss": statistics.fmean(losses[-10:]),
    }


def report(result: dict, out: Optional[str]) -> None:
    """Print the line, and append it to ``out`` when given."""
    line = json.dumps(result)
    print(line, flush=True)
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(line + "\n")
