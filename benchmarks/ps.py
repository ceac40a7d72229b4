"""Parameter-server training on both frameworks, side by side in one run.

    python benchmarks/ps.py [--rows 40000] [--repeats 3] [--trainers 2] [--out benchmarks/results/ps]

For each framework: the one-process baseline (no servers) and 1 server + T trainers (each of
``--trainers``) in every mode its engine runs (torch: sync, async; Paddle: sync, async, geo), on
the same seeded synthetic Criteo rows, interleaved repeat by repeat: each repeat runs the
baseline, then every layout, so each layout's examples/s over the baseline's is one interleaved
pair, summarized as a median with its 95% interval. Paddle's jobs run from the parameter-server
environment (.venv-ps, paddlepaddle 3.0.0; `make ps-env`), torch's from this one. Writes
ps.json (every run's summary), ps.md (medians with min-max over repeats, ratios with intervals,
CPU flags) and ps.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from unitrain.host import machine  # noqa: E402 - after the path above
from unitrain.report import ps as ps_report  # noqa: E402
from unitrain.report.intervals import ratio_summary, ratio_text  # noqa: E402

JOBS = [
    ("torch", "local"),
    ("torch", "sync"),
    ("torch", "async"),
    ("paddle", "local"),
    ("paddle", "sync"),
    ("paddle", "async"),
    ("paddle", "geo"),
]
LOCAL = "local"


def python_for(backend: str) -> str:
    if backend == "paddle":
        ps = ROOT / ".venv-ps" / "bin" / "python"
        if not ps.exists():
            sys.exit(f"benchmarks/ps.py: error: no {ps}: build the parameter-server environment with `make ps-env`")
        return str(ps)
    return sys.executable


def run(backend: str, mode: str, rows: int, val_rows: int, seed: int, run_dir: Path, trainers: int = 2) -> dict:
    layout = (
        ["dist.ps.servers=0", "dist.ps.trainers=1"]
        if mode == LOCAL
        else [f"dist.ps.sync={mode}", f"dist.ps.trainers={trainers}"]
    )
    args = [
        "-m",
        "unitrain",
        "experiment=wide_deep_ps",
        f"backend={backend}",
        *layout,
        f"data.num_samples={rows}",
        f"data.val_samples={val_rows}",
        f"trainer.seed={seed}",
        "trainer.log_every=100",
        f"hydra.run.dir={run_dir}",
    ]
    print(f"{backend} {mode} x{trainers if mode != LOCAL else 1} (seed {seed})", flush=True)
    done = subprocess.run([python_for(backend), *args], cwd=run_dir.parent, capture_output=True, text=True)
    if done.returncode != 0:
        # One retry, said aloud: a job that fails at start-up (Paddle's first push of the dense
        # parameters to a server still setting up) says nothing about the speed of the others.
        print(f"  failed, once more: {done.stderr.strip().splitlines()[-1:]}", flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        done = subprocess.run([python_for(backend), *args], cwd=run_dir.parent, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"benchmarks/ps.py: {backend} {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def spread(values) -> str:
    return (
        f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"
        if len(values) > 1
        else f"{values[0]:.0f}"
    )


def table(results: dict, repeats: int) -> str:
    lines = [
        "| backend | framework | mode | servers x trainers | examples/s total, median (min-max) | per trainer "
        "(median) | examples/s over one process (pairs) | held-out AUC, median (min-max) | "
        "held-out log loss (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (backend, mode, _), runs in results.items():
        baseline = results.get((backend, LOCAL, 1))
        ratios = [r["examples_per_s"] / b["examples_per_s"] for r, b in zip(runs, baseline)] if baseline else []
        ratio = ratio_text(ratio_summary(ratios)) if len(ratios) > 1 and mode != LOCAL else "-"
        s = runs[0]
        speeds = [r["examples_per_s"] for r in runs]
        aucs = [r["eval"]["val_auc"] for r in runs]
        per_trainer = [
            statistics.median(r["examples_per_s_per_trainer"][i] for r in runs) for i in range(s["trainers"])
        ]
        label = mode + (f" (k={s['geo_k_steps']})" if s.get("geo_k_steps") else "")
        lines.append(
            f"| {backend} | {s['framework']} {s['version']} | {label} | {s['servers']} x {s['trainers']} | "
            f"{spread(speeds)} | "
            f"{', '.join(f'{v:.0f}' for v in per_trainer)} | {ratio} | {statistics.median(aucs):.4f} "
            f"({min(aucs):.4f}-{max(aucs):.4f}) | "
            f"{statistics.median(r['eval']['val_logloss'] for r in runs):.4f} |"
        )
    cpu = machine.cpu()
    s = next(iter(results.values()))[0]
    lines += [
        "",
        f"{repeats} repeats per row (trainer.seed 1..{repeats}, the same rows and initial weights for every row of a "
        "repeat), jobs "
        f"interleaved; {s['rows']:,} training rows, held-out rows evaluated by trainer 0 after all trainers finished; "
        "batch "
        f"{s['batch_size']} per trainer, SGD lr {s['lr']}. Threads: the cores split over the processes (1 process: all "
        f"of them; more: one each). Ratios: a layout's total examples/s over the one-process baseline's of the same "
        f"repeat, one pair per repeat: the interval bootstraps the repeats' ratios (with 3, a coarse one); (wide): "
        f"an interval wider than a quarter of its median. CPU: {machine.describe_cpu(cpu, {})}.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--val-rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", default=",".join(f"{b}:{m}" for b, m in JOBS), help="backend:mode,... (default: all)")
    parser.add_argument("--trainers", default="2", help="trainer counts of the server layouts, e.g. 1,2,4")
    parser.add_argument("--out", default=str(HERE / "results" / "ps"))
    args = parser.parse_args()
    counts = [int(t) for t in args.trainers.split(",")]
    jobs = [(b, m, t) for b, m in (j.split(":") for j in args.jobs.split(",")) for t in ([1] if m == LOCAL else counts)]
    results: dict = {job: [] for job in jobs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="unitrain-bench-ps-") as tmp:
        found = []
        for seed in range(1, args.repeats + 1):
            for backend, mode, trainers in jobs:
                run_dir = Path(tmp) / f"{backend}_{mode}_{trainers}_{seed}"
                summary = run(backend, mode, args.rows, args.val_rows, seed, run_dir, trainers)
                results[(backend, mode, trainers)].append(summary)
                if seed == 1:
                    found.append((run_dir, summary))
        ps_report.plot(found, out / "ps.png")
    (out / "ps.json").write_text(
        json.dumps({f"{b}:{m}:{t}": runs for (b, m, t), runs in results.items()}, indent=2) + "\n"
    )
    text = table(results, args.repeats)
    (out / "ps.md").write_text(text + "\n")
    print(f"\n{text}\n\nwritten: {out / 'ps.md'}, {out / 'ps.json'}, {out / 'ps.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
