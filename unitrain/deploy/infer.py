"""Timing exported models side by side: one process per artifact, every runtime that reads it.

Warm-up is excluded, the input is in the runtime's own memory before the clock starts, the
output is read back into NumPy inside it, and every runtime gets the same number of threads.
Each artifact runs in a process of its own (OpenMP pools and caches of one runtime do not slow
the next; a crash costs one row). Held-out accuracy is measured in the same run for every row,
so a faster runtime that computes something else shows.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from unitrain.deploy import artifacts, ps_export
from unitrain.deploy.runtimes import accuracy, runtimes_for, thread_env, time_runtime
from unitrain.deploy.speed_ratio import Side, measure_ratio
from unitrain.errors import UnitrainError
from unitrain.host.atomic import replace_text
from unitrain.host.machine import cpu
from unitrain.host.processes import die_with_parent
from unitrain.report.inference import markdown, plot

RESULT = "inference.json"


# --- one process per artifact -----------------------------------------------------------------
def worker(spec_file: str) -> int:
    """Runs in a child process: every runtime of one artifact; writes a JSON list of rows."""
    die_with_parent()
    spec = json.loads(Path(spec_file).read_text())
    artifact = artifacts.Artifact(
        Path(spec["directory"]), spec["name"], spec["framework"], spec["format"], tuple(spec["files"]), spec["batch"]
    )
    export = {"config": spec["config"], "input": spec.get("input")}
    dataset, described = artifacts.evaluation_data(export, artifact.directory, spec["eval_samples"] or 512)
    tokens = artifacts.tokens_per_sample(export)
    samples = min(spec["eval_samples"] or len(dataset), len(dataset))
    rows = []
    for runtime in runtimes_for(artifact, spec["threads"]):
        row: Dict[str, Any] = {
            "runtime": runtime.name,
            "baseline_runtime": runtime.baseline or runtime.name,
            "latency": {},
            "eval_data": described,
        }
        try:
            started = time.perf_counter()
            runtime.load()
            row["load_s"] = round(time.perf_counter() - started, 3)
            for batch in spec["batches"]:
                if artifact.accepts(batch):
                    images, _ = artifacts.stack(dataset, range(batch))
                    row["latency"][str(batch)] = time_runtime(
                        runtime, images, spec["warmup"], spec["min_iters"], spec["min_time_s"], tokens
                    )
            eval_batch = artifact.batch or max(spec["batches"])
            row["accuracy"] = accuracy(runtime, dataset, samples, eval_batch, fixed=artifact.batch is not None)
            row["observed"] = runtime.observed()
        except Exception as err:  # noqa: BLE001 - a runtime that fails is a row that says why
            row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
            row["not_installed"] = isinstance(err, ImportError)
        rows.append(row)
        print(_row_line(artifact.name, row), flush=True)
    Path(spec["result"]).write_text(json.dumps(rows, default=str))
    return 0


ROW_PREFIX = "  | "


def _row_line(name: str, row: Dict[str, Any]) -> str:
    if "error" in row:
        return f"{ROW_PREFIX}{row['runtime']:<34} {name}: FAILED: {row['error']}"
    cells = ", ".join(
        f"batch {b}: p50 {v['p50_ms']:.2f} ms, "
        + (
            f"{v['throughput_ips']:.0f} samples/s = {v['tokens_per_s']:.0f} tokens/s"
            if "tokens_per_s" in v
            else f"{v['throughput_ips']:.0f} img/s"
        )
        for b, v in row["latency"].items()
    )
    scored = row["accuracy"]
    if scored["predictions"] != scored["samples"]:  # a language model: every position's next token
        held = f"held-out next-token top-1 {scored['top1']:.4f}, loss {scored['loss']:.4f}"
    else:
        held = f"held-out top-1 {scored['top1']:.4f}"
    return f"{ROW_PREFIX}{row['runtime']:<34} {name}: {cells}; {held}"


def _run_artifact(
    artifact: artifacts.Artifact, manifest: Dict[str, Any], options: Dict[str, Any], workdir: Path
) -> List[Dict[str, Any]]:
    spec = {
        "directory": str(artifact.directory),
        "name": artifact.name,
        "framework": artifact.framework,
        "format": artifact.format,
        "files": list(artifact.files),
        "batch": artifact.batch,
        "config": manifest["config"],
        "input": manifest.get("input"),
        "result": str(workdir / f"{artifact.name}.json"),
        **options,
    }
    spec_file = workdir / f"{artifact.name}.spec.json"
    spec_file.write_text(json.dumps(spec))
    env = thread_env(options["threads"])
    # The worker's rows are relayed as they come; what the frameworks print on import (Paddle's
    # OMP_NUM_THREADS advice for data-parallel training, say) is kept for a failure's message.
    with tempfile.TemporaryFile(mode="w+") as noise:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unitrain.infer", "--worker", str(spec_file)],
            env=env,
            preexec_fn=die_with_parent,
            stdout=subprocess.PIPE,
            stderr=noise,
            text=True,
        )
        for line in proc.stdout:
            if line.startswith(ROW_PREFIX):
                print(line, end="", flush=True)
            else:
                noise.write(line)
        proc.wait()
        noise.seek(0)
        said = [line.strip() for line in noise.read().splitlines() if line.strip()]
    if proc.returncode != 0 or not Path(spec["result"]).exists():
        last = f": {said[-1][:200]}" if said else ""
        return [
            {
                "runtime": "(all)",
                "error": f"the worker process for {artifact.name} ended with exit status {proc.returncode}{last}",
                "latency": {},
            }
        ]
    return json.loads(Path(spec["result"]).read_text())


@dataclass(frozen=True, kw_only=True)
class Timing:
    """How every runtime is timed and scored: the same for all of them."""

    batches: List[int]  # latency at the smallest, throughput at the largest
    threads: int
    eval_samples: int = 0  # held-out samples for the accuracy column (0: all)
    warmup: int = 5
    min_iters: int = 20
    min_time_s: float = 2.0
    # Interleaved pairs behind every ratio (0: no ratios).
    pairs: int = 10


def _artifacts_in(inputs: Sequence[str]) -> List[Tuple[artifacts.Artifact, Dict[str, Any]]]:
    """Every artifact the inputs name, each once, with its manifest."""
    found: List[Tuple[artifacts.Artifact, Dict[str, Any]]] = []
    for spec in inputs:
        directory, listed = artifacts.locate(spec)
        manifest = artifacts.read_manifest(directory)
        if manifest.get("kind") == ps_export.KIND:
            raise artifacts.ArtifactError(
                f"{directory} is a parameter-server job's export (wide&deep), which scores Criteo lines: python -m "
                f"unitrain.infer {directory} --criteo <file>; the benchmark times image and language models"
            )
        seen = {(b.directory, b.name) for b, _ in found}
        found += [(a, manifest) for a in listed if (a.directory, a.name) not in seen]
    return found


def benchmark(inputs: Sequence[str], timing: Timing, out: Optional[str]) -> Path:
    """Time and score every artifact in every runtime that reads it; inference.json, .md and .png."""
    found = _artifacts_in(inputs)
    out_dir = _out_dir(out, [a for a, _ in found])
    rows = []
    with tempfile.TemporaryDirectory(prefix="unitrain-infer-") as tmp:
        for artifact, manifest in found:
            source = manifest["source"]
            print(
                f"{artifact.describe()} from {source['framework']} {source['model']} step {source['step']}:", flush=True
            )
            for row in _run_artifact(artifact, manifest, asdict(timing), Path(tmp)):
                rows.append(
                    {
                        "artifact": str(artifact.path),
                        "name": artifact.name,
                        "framework": artifact.framework,
                        "format": artifact.format,
                        "artifact_batch": artifact.batch,
                        "trained_with": source["framework"],
                        "model": source["model"],
                        "tokens_per_sample": artifacts.tokens_per_sample(manifest),
                        **row,
                    }
                )
    _unreadable(rows)
    result = {
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": cpu(),
        "threads": timing.threads,
        "batches": timing.batches,
        "warmup": timing.warmup,
        "min_iters": timing.min_iters,
        "min_time_s": timing.min_time_s,
        "eval_samples": timing.eval_samples or "all",
        "timed": "one inference on an input already in the runtime's memory, logits read back as NumPy",
        "inputs": sorted({artifacts.input_task(m).input_kind for _, m in found}),
        "rows": rows,
        "pairs": timing.pairs,
    }
    _against_the_first(result, found, timing)
    out_dir.mkdir(parents=True, exist_ok=True)
    replace_text(out_dir / RESULT, json.dumps(result, indent=2, default=str))
    (out_dir / "inference.md").write_text(markdown(result) + "\n")
    plot(result, out_dir / "inference.png")
    return out_dir


def _unreadable(rows: List[Dict[str, Any]]) -> None:
    """An artifact no runtime could read is corrupt or truncated: one line, before anything is
    written (a runtime that fails where others read the artifact is the report's to show)."""
    by_artifact: Dict[str, List[Dict[str, Any]]] = {}
    for row in rows:
        by_artifact.setdefault(row["artifact"], []).append(row)
    for path, tried in by_artifact.items():
        # A runtime that is not installed says nothing about the artifact: its row says what to install.
        if all("error" in row and not row.get("not_installed") for row in tried):
            raise artifacts.ArtifactError(
                f"{path} could not be read by any runtime ({', '.join(r['runtime'] for r in tried)}): "
                f"{tried[0]['error']}; allowed: an artifact unitrain.export wrote, whole (export it again into a new "
                "--out directory)"
            )


def _against_the_first(
    result: Dict[str, Any], found: List[Tuple[artifacts.Artifact, Dict[str, Any]]], timing: Timing
) -> None:
    """Each row's speed against the first row that ran, at the smallest batch, as interleaved pairs
    (``vs_reference``): the ratio the table shows, never one of two runs minutes apart."""
    rows = [r for r in result["rows"] if "error" not in r]
    batch = min(timing.batches)
    by_name = {a.name: (a, m) for a, m in found}
    reference = next((r for r in rows if by_name[r["name"]][0].accepts(batch)), None)
    if not timing.pairs or reference is None:
        return
    result["reference"] = {"name": reference["name"], "runtime": reference["runtime"], "batch": batch}
    first = Side(artifact=by_name[reference["name"]][0], runtime=reference["runtime"])
    for row in rows:
        artifact, manifest = by_name[row["name"]]
        if row is reference or not artifact.accepts(batch):
            continue
        against = f"{reference['runtime']} on {reference['name']}"
        print(f"{ROW_PREFIX}{row['runtime']} on {row['name']}: interleaved pairs against {against}", flush=True)
        second = Side(artifact=artifact, runtime=row["runtime"])
        row["vs_reference"] = measure_ratio(
            first, second, manifest["config"], batch, timing.threads, timing.pairs, timing.warmup, manifest.get("input")
        )


def _out_dir(out: Optional[str], found: List[artifacts.Artifact]) -> Path:
    if out:
        path = Path(out)
        if (path / RESULT).exists():
            raise UnitrainError(
                f"--out={out!r} already holds {RESULT}; allowed: a new directory (nothing is overwritten)"
            )
        if path.exists() and not path.is_dir():
            raise UnitrainError(f"--out={out!r} is a file; allowed: a directory (created if missing)")
        return path
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    parents = {a.directory.resolve().parent for a in found}
    # Beside the export of one run (where unitrain.compare finds it), else under the current directory.
    return (parents.pop() if len(parents) == 1 else Path.cwd()) / "inference" / stamp
