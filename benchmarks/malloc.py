"""What glibc's malloc thresholds cost a training step: unitrain (trainer.malloc=dynamic|fixed)
against the hand-written script (glibc's defaults, and the same fixed thresholds through glibc's
environment variables), interleaved in one run, batch 16, 1 process x 2 threads, at the overhead
section's sizes (ResNet50 64x64 by default, ResNet18 32x32). Writes results.json and results.md.

    python benchmarks/malloc.py [--pairs 8] [--backend torch] [--model resnet50] [--out benchmarks/results/malloc]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from harness import OVERHEAD_SIZES, Bench, Stopped, machine, stop_on_termination

from unitrain.host import malloc
from unitrain.report.intervals import median_ci

# glibc's tunables for what unitrain sets with mallopt (the native script cannot call it).
FIXED_ENV = {"MALLOC_MMAP_THRESHOLD_": str(malloc.MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(malloc.TRIM_THRESHOLD)}
RUNS = ("unitrain dynamic", "native dynamic", "unitrain fixed", "native fixed")
RATIOS = (
    ("unitrain dynamic", "native dynamic"),
    ("unitrain fixed", "native fixed"),
    ("unitrain fixed", "native dynamic"),
    ("unitrain fixed", "unitrain dynamic"),
    ("native fixed", "native dynamic"),
)


def measure(args, bench: Bench, size, steps) -> None:
    for i in range(args.pairs):
        # Alternate the order, so that drift over the run falls on every variant alike.
        for name in RUNS if i % 2 == 0 else RUNS[::-1]:
            who, mode = name.split()
            if who == "unitrain":
                result = bench.unitrain(args.backend, f"trainer.malloc={mode}", size=size)
            else:
                result = bench.native(args.backend, size, env=FIXED_ENV if mode == "fixed" else None)
            steps[name].append(result["step_s"])
        print(
            f"pair {i + 1}/{args.pairs}: " + ", ".join(f"{n} {1e3 * v[-1]:.0f} ms" for n, v in steps.items()),
            flush=True,
        )


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="ResNet18 at 16x16, few steps: checks the script, measures little"
    )
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--backend", default="torch", choices=("paddle", "torch"))
    parser.add_argument("--model", default="resnet50", choices=[s.model for s in OVERHEAD_SIZES[False]])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "malloc")
    return parser.parse_args()


def _measure_or_exit(args, size, steps) -> None:
    """Runs the pairs; a stop writes nothing, since an unequal number of runs per variant would bias the ratios."""
    stop_on_termination()
    try:
        with (
            tempfile.TemporaryDirectory() as work,
            Bench(args.quick, 1, Path(work), args.pairs, (args.backend,)) as bench,
        ):
            measure(args, bench, size, steps)
    except (KeyboardInterrupt, Stopped) as e:
        signum = e.signum if isinstance(e, Stopped) else signal.SIGINT
        print(
            f"malloc.py: stopped by {signal.Signals(signum).name}: its runs are ended; nothing was written",
            file=sys.stderr,
        )
        sys.exit(128 + signum)


def _result(args, size, steps) -> dict:
    rows = []
    for num, den in RATIOS:
        ratio, low, high = median_ci([a / b for a, b in zip(steps[num], steps[den])])
        rows.append({"ratio": f"{num} / {den}", "median": ratio, "ci": [low, high]})
    return {
        "machine": machine(),
        "backend": args.backend,
        "model": size.model,
        "image_size": size.image,
        "pairs": args.pairs,
        "step_ms": {n: 1e3 * statistics.median(v) for n, v in steps.items()},
        "step_s": steps,
        "ratios": rows,
    }


def _markdown(args, size, result: dict) -> list[str]:
    lines = [
        f"# glibc malloc thresholds: {args.backend} {size.model} {size.image}x{size.image}, batch 16, 1 x 2 threads, "
        f"{args.pairs} interleaved pairs",
        "",
        "{cpu}, {cores} cores ({extensions}), Python {python}, torch {torch}, paddle {paddle}".format(
            **result["machine"]
        ),
        "",
        "| run | median step ms |",
        "|---|---|",
    ]
    lines += [f"| {n} | {v:.1f} |" for n, v in result["step_ms"].items()]
    lines += ["", "| ratio | median | 95% CI |", "|---|---|---|"]
    lines += [f"| {r['ratio']} | {r['median']:.3f} | [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] |" for r in result["ratios"]]
    return lines


def main() -> None:
    args = _parse_args()
    (size,) = OVERHEAD_SIZES[True] if args.quick else [s for s in OVERHEAD_SIZES[False] if s.model == args.model]
    steps = {name: [] for name in RUNS}
    _measure_or_exit(args, size, steps)
    result = _result(args, size, steps)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    lines = _markdown(args, size, result)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
