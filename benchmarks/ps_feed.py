"""Paddle's two ways to feed a parameter-server trainer, side by side on the same files.

    python -m unitrain.make_criteo --rows 200000 --parts 4 --out /data/r200k
    python benchmarks/ps_feed.py /data/r200k [--repeats 3] [--out benchmarks/results/ps_feed]

``dist.ps.feed=steps``: unitrain's reader parses each batch in the trainer and ``Executor.run``
steps it (the per-step loop every mode and both frameworks share). ``dist.ps.feed=engine``:
Fleet's ``QueueDataset`` streams each trainer's files through unitrain's parsing (a pipe command
per file and reader thread) and ``Executor.train_from_dataset`` steps them in Hogwild threads,
as PaddleRec trains. For the one-process job and for 1 server + 2 trainers (async), each repeat
runs steps, then engine with 1 and 2 threads: each engine run's examples/s over the steps run's
of the same repeat is one interleaved pair (all rows over the whole training time, both sides),
summarized as a median with its 95% interval. Held-out AUC beside it. Writes ps_feed.json and
ps_feed.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from ps_scale import run  # noqa: E402 - benchmarks/ps_scale.py, beside this file

from unitrain.host import machine  # noqa: E402 - after the path above
from unitrain.report.intervals import ratio_summary, ratio_text  # noqa: E402

LAYOUTS = ("local", "async")
ENGINE_THREADS = (1, 2)
BUCKETS = 1_000_000


def _feeds():
    yield "steps", ("dist.ps.feed=steps",)
    for threads in ENGINE_THREADS:
        yield f"engine x{threads}", ("dist.ps.feed=engine", f"dist.ps.threads={threads}")


def measure(folder: Path, repeats: int, held_out: int, tmp: Path, out: Path) -> dict:
    results: dict = {}
    for repeat in range(repeats):
        for layout in LAYOUTS:
            for name, extra in _feeds():
                run_dir = tmp / f"{layout}_{name.replace(' ', '')}_{repeat}"
                summary = run("paddle", layout, folder, held_out, run_dir, BUCKETS, extra)
                results.setdefault(f"{layout}:{name}", []).append(summary)
                (out / "ps_feed.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def table(results: dict) -> str:
    lines = [
        "| layout | feed | examples/s (median of repeats) | over feed=steps | held-out AUC | threads read back |",
        "|---|---|---|---|---|---|",
    ]
    for layout in LAYOUTS:
        base = [s["examples_per_s_overall"] for s in results[f"{layout}:steps"]]
        for name, _ in _feeds():
            runs = results[f"{layout}:{name}"]
            speeds = [s["examples_per_s_overall"] for s in runs]
            ratio = "1" if name == "steps" else ratio_text(ratio_summary([e / b for e, b in zip(speeds, base)]))
            fed = runs[0]["observed"].get("fed") or {}
            median = sorted(speeds)[len(speeds) // 2]
            aucs = ", ".join(f"{s['eval']['val_auc']:.4f}" for s in runs)
            lines.append(f"| {layout} | {name} | {median:,.0f} | {ratio} | {aucs} | {fed.get('threads', '-')} |")
    cpu = machine.cpu()
    lines += [
        "",
        f"Paddle {runs[0]['version']}, Adam, batch 1024 per trainer (2048 in one process), {BUCKETS:,} buckets; "
        "examples/s: all rows over the whole training time. Ratios: interleaved pairs, median [95% interval]. "
        f"(wide): an interval wider than a quarter of the median. CPU: {machine.describe_cpu(cpu, {})}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a make_criteo output folder of at least 2 part files")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--held-out", type=int, default=20_000)
    parser.add_argument("--out", default=str(HERE / "results" / "ps_feed"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="unitrain-bench-ps-feed-") as tmp:
        results = measure(Path(args.folder), args.repeats, args.held_out, Path(tmp), out)
    text = table(results)
    (out / "ps_feed.md").write_text(text + "\n")
    print(f"\n{text}\n\nwritten: {out / 'ps_feed.md'}, {out / 'ps_feed.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
