"""Parameter servers at scale: one pass over Criteo-format files of growing size, memory and AUC.

    python -m unitrain.make_criteo --rows 1000000 --parts 4 --out /data/r1m     (and 10000000)
    python benchmarks/ps_scale.py /data/r1m /data/r10m [--backends torch,paddle] [--out ...]
    python benchmarks/ps_scale.py /data/r100m --layouts async --out <the same> --append

For each folder (``train/`` part files and ``held_out.tsv``, as make_criteo writes them) and each
framework: 1 server + 2 trainers (async) streaming one pass over the files, and the one-process
baseline at the same examples per step (the two trainers' batches combined). Records each
process's peak RSS, the rows the servers' tables created, held-out AUC and log loss against the
teacher's own (the ceiling), and the wall time. Writes ps_scale.json, ps_scale.md, ps_scale.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from ps import python_for  # noqa: E402 - benchmarks/ps.py, beside this file

from unitrain.host import machine  # noqa: E402 - after the path above

BATCH = 1024  # per trainer; the baseline takes two of them per step
LR = 0.001  # Adam
# Paddle's one-process baseline holds a whole [buckets, 8] table (with Adam's two moments): 10^7 fits.
BUCKETS = 10_000_000


def run(
    backend: str, layout: str, data: Path, held_out: int, run_dir: Path, buckets: int = BUCKETS, extra: tuple = ()
) -> dict:
    shape = ["dist.ps.servers=0", "dist.ps.trainers=1", f"trainer.batch_size={2 * BATCH}"]
    if layout != "local":
        shape = [f"dist.ps.sync={layout}", f"trainer.batch_size={BATCH}"]
    args = [
        "-m",
        "unitrain",
        "experiment=wide_deep_ps",
        f"backend={backend}",
        "data=criteo",
        f"data.path={data / 'train'}",
        f"data.val_path={data / 'held_out.tsv'}",
        f"data.val_samples={held_out}",
        "optim=adam",
        f"optim.lr={LR}",
        f"model.sparse_buckets={buckets}",
        "trainer.log_every=200",
        "trainer.eval_batch_size=10000",
        *shape,
        *extra,
        f"hydra.run.dir={run_dir}",
    ]
    print(f"{data.name}: {backend} {layout} {' '.join(extra)}", flush=True)
    started = time.monotonic()
    done = subprocess.run([python_for(backend), *args], cwd=run_dir.parent, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"benchmarks/ps_scale.py: {backend} {layout} on {data} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["bench_wall_s"] = time.monotonic() - started
    return summary


def table(results: list, buckets: int = BUCKETS) -> str:
    lines = [
        "| rows | backend | layout | held-out AUC (teacher) | log loss (teacher) | table rows | peak RSS MB: servers / "
        "trainers | wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s, teacher = r["summary"], r["teacher"]
        memory = s["memory"]
        servers = ", ".join(f"{v:.0f}" for v in memory["server_peak_rss_mb"] if v) or "-"
        trainers = ", ".join(f"{v:.0f}" for v in memory["trainer_peak_rss_mb"])
        layout = "local" if s["servers"] == 0 else f"{s['mode']} {s['servers']} x {s['trainers']}"
        evaluation, rows = s["eval"], (s.get("tables") or {}).get("rows") or 0
        lines.append(
            f"| {s['rows']:,} | {s['backend']} | {layout} | {evaluation['val_auc']:.4f} ({teacher['teacher_auc']:.4f}) "
            f"| {evaluation['val_logloss']:.4f} ({teacher['teacher_logloss']:.4f}) | {rows:,} | {servers} / "
            f"{trainers} | {s['bench_wall_s'] / 60:.1f} min |"
        )
    cpu = machine.cpu()
    lines += [
        "",
        f"One pass, Adam lr {LR}, batch {BATCH} per trainer (the one-process baseline: {2 * BATCH}), {buckets:,} hash "
        f"buckets, held-out rows from make_criteo's separate stream. Threads: the cores split over the processes. "
        f"CPU: {machine.describe_cpu(cpu, {})}. "
        + ", ".join(sorted({f"{r['summary']['framework']} {r['summary']['version']}" for r in results}))
        + ". Paddle's one-process job holds whole tables: its row count is the buckets.",
    ]
    return "\n".join(lines)


def plot(results: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for backend in sorted({r["summary"]["backend"] for r in results}):
        for role, key in (("server", "server_peak_rss_mb"), ("trainer", "trainer_peak_rss_mb")):
            points = [
                (r["summary"]["rows"], max(v for v in r["summary"]["memory"][key] if v))
                for r in results
                if r["summary"]["backend"] == backend and r["summary"]["servers"]
            ]
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="o", label=f"{backend} {role}")
    ax.set_xscale("log")
    ax.set_xlabel("training rows (one pass)")
    ax.set_ylabel("peak RSS, MB")
    ax.set_ylim(bottom=0)
    ax.set_title("Parameter servers: memory as the data grows (1 server + 2 trainers)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="make_criteo output folders, smallest first")
    parser.add_argument("--backends", default="torch,paddle")
    parser.add_argument("--layouts", default="async,local")
    parser.add_argument("--held-out", type=int, default=100_000)
    parser.add_argument("--buckets", type=int, default=BUCKETS, help=f"model.sparse_buckets (default {BUCKETS:,})")
    parser.add_argument("--out", default=str(HERE / "results" / "ps_scale"))
    parser.add_argument(
        "--append", action="store_true", help="add these folders' runs to --out's ps_scale.json instead of replacing it"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    earlier = out / "ps_scale.json"
    results = json.loads(earlier.read_text()) if args.append and earlier.exists() else []
    with tempfile.TemporaryDirectory(prefix="unitrain-bench-ps-scale-") as tmp:
        for folder in map(Path, args.folders):
            teacher = json.loads((folder / "teacher.json").read_text())
            for backend in args.backends.split(","):
                for layout in args.layouts.split(","):
                    run_dir = Path(tmp) / f"{folder.name}_{backend}_{layout}"
                    summary = run(backend, layout, folder, args.held_out, run_dir, args.buckets)
                    results.append({"summary": summary, "teacher": teacher})
                    (out / "ps_scale.json").write_text(json.dumps(results, indent=2) + "\n")
    text = table(results, args.buckets)
    (out / "ps_scale.md").write_text(text + "\n")
    plot(results, out / "ps_scale.png")
    print(f"\n{text}\n\nwritten: {out / 'ps_scale.md'}, {out / 'ps_scale.json'}, {out / 'ps_scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
