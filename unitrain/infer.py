"""``python -m unitrain.infer <export dirs | run dirs | model files> [--batch 1,32] [--threads N]``

Runs every exported model in each runtime that reads it and times it side by side: Paddle
Inference (with and without its IR and oneDNN optimizations) and ``paddle.jit.load`` on Paddle
programs, torch eager and ``torch.compile`` on ExportedPrograms, ONNX Runtime on either
framework's ONNX. Warm-up is excluded, the input is in the runtime's own memory before the clock
starts, the output is read back into NumPy inside it, and every runtime gets the same number of
threads. Each artifact runs in a process of its own (OpenMP pools and caches of one runtime do
not slow the next; a crash costs one row). Held-out accuracy is measured in the same run for
every row, so a faster runtime that computes something else shows. Writes ``inference.json``,
``inference.md`` and ``inference.png``.

The framework-neutral parts live here: what a runtime is, the clock, accuracy, the report, and
ONNX Runtime; ``backends/<name>/infer.py`` provide the framework's own runtimes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from unitrain import artifacts
from unitrain.errors import UnitrainError
from unitrain.files import replace_text
from unitrain.machine import cpu, describe_cpu

RESULT = "inference.json"


class Runtime:
    """One way to run an artifact. ``load`` and ``prepare`` are outside the clock; ``run`` is
    what is timed: one inference on a prepared input, its logits read back as NumPy."""

    name = "runtime"
    #: The runtime of the fp32 model this one is set against (None: its own name).
    baseline: Optional[str] = None

    def __init__(self, path: Path, threads: int):
        self.path, self.threads = path, threads

    def load(self) -> None: ...

    def prepare(self, images: np.ndarray) -> Any:
        return np.ascontiguousarray(images, dtype=np.float32)

    def run(self, prepared: Any) -> np.ndarray:
        raise NotImplementedError

    def observed(self) -> Dict[str, Any]:
        """What really ran, as the runtime itself reports it after loading (never the request)."""
        return {}


#: ONNX Runtime operators that compute in integers (static: QLinear*, QGemm; dynamic:
#: ConvInteger, MatMulInteger and its fused form), and the float ones they replace.
ORT_INT8 = {"QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger", "DynamicQuantizeMatMul"}
ORT_FLOAT = {"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul"}


def onnx_kernels(op_types: List[str]) -> Dict[str, int]:
    """Integer and float conv/linear kernels, activation quantize and weight dequantize ops."""
    return {
        "int8": sum(op in ORT_INT8 for op in op_types), "float": sum(op in ORT_FLOAT for op in op_types),
        "quantize": sum(op in ("QuantizeLinear", "DynamicQuantizeLinear") for op in op_types),
        "dequantize": op_types.count("DequantizeLinear"),
    }  # fmt: skip


def onnx_session(path: Path, threads: Optional[int], optimize: bool = True, optimized_copy: Optional[Path] = None):
    """An ONNX Runtime session on the CPU with ``threads`` intra-op threads (None: its default)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise UnitrainError("running ONNX models needs onnxruntime, which is not installed; install it with: pip install 'unitrain[export]'") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if optimized_copy:
        options.optimized_model_filepath = str(optimized_copy)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(session, images: np.ndarray) -> np.ndarray:
    return session.run(None, {session.get_inputs()[0].name: np.ascontiguousarray(images, dtype=np.float32)})[0]


class OnnxRuntime(Runtime):
    name = "onnxruntime"

    def load(self) -> None:
        import onnx

        # The graph ONNX Runtime really runs (after its fusions) is written out once and read
        # back for the kernels it uses: QLinearConv is int8, Conv with DequantizeLinear is not.
        with tempfile.TemporaryDirectory(prefix="unitrain-ort-") as tmp:
            copy = Path(tmp) / "optimized.onnx"
            self.session = onnx_session(self.path, self.threads, optimized_copy=copy)
            self.kernels = onnx_kernels([n.op_type for n in onnx.load(str(copy)).graph.node])

    def run(self, prepared):
        return run_onnx(self.session, prepared)

    def observed(self):
        import onnxruntime as ort

        options = self.session.get_session_options()
        return {
            "providers": self.session.get_providers(),  # the ones the session really uses
            "graph_optimization_level": str(options.graph_optimization_level).split(".")[-1],
            "intra_op_threads": options.intra_op_num_threads,
            "kernels": self.kernels,
            "version": ort.__version__,
        }


def runtimes_for(artifact: artifacts.Artifact, threads: int) -> List[Runtime]:
    if artifact.format == "onnx":
        return [OnnxRuntime(artifact.path, threads)]
    from unitrain.backend import capability, get_backend

    backend = get_backend(artifact.framework)
    backend.set_threads(threads)
    return capability(backend, "infer").runtimes(artifact.path, threads)


# --- the clock --------------------------------------------------------------------------------
def time_runtime(runtime: Runtime, images: np.ndarray, warmup: int, min_iters: int, min_time_s: float) -> Dict[str, float]:
    """Latency percentiles and throughput of ``runtime`` on one batch; warm-up not counted."""
    prepared = runtime.prepare(images)
    started = time.perf_counter()
    for _ in range(warmup):
        runtime.run(prepared)
    warmup_s = time.perf_counter() - started
    times: List[float] = []
    begin = time.perf_counter()
    while len(times) < min_iters or (time.perf_counter() - begin < min_time_s and len(times) < 10_000):
        t0 = time.perf_counter()
        runtime.run(prepared)
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)), "p90_ms": float(np.percentile(ms, 90)), "p99_ms": float(np.percentile(ms, 99)),
        "iters": len(times), "throughput_ips": float(len(images) * len(times) / (ms.sum() / 1e3)), "warmup_s": round(warmup_s, 3),
    }  # fmt: skip


def accuracy(runtime: Runtime, dataset, samples: int, batch: int, fixed: bool) -> Dict[str, float]:
    """Top-1 over the first ``samples`` held-out samples, in batches of ``batch``; a fixed-batch
    artifact gets its last batch padded (the padding is not counted)."""
    correct = 0
    for start in range(0, samples, batch):
        indices = list(range(start, min(start + batch, samples)))
        images, labels = artifacts.stack(dataset, indices)
        if fixed and len(indices) < batch:
            images = np.concatenate([images, np.zeros((batch - len(indices), *images.shape[1:]), np.float32)])
        logits = runtime.run(runtime.prepare(images))[: len(indices)]
        correct += int((np.asarray(logits).argmax(1) == labels).sum())
    return {"top1": correct / samples, "samples": samples}


# --- one process per artifact -----------------------------------------------------------------
def worker(spec_file: str) -> int:
    """Runs in a child process: every runtime of one artifact; writes a JSON list of rows."""
    from unitrain.lifeline import die_with_parent

    die_with_parent()
    spec = json.loads(Path(spec_file).read_text())
    artifact = artifacts.Artifact(Path(spec["directory"]), spec["name"], spec["framework"], spec["format"], tuple(spec["files"]), spec["batch"])
    cfg = artifacts.job_config(spec["config"])
    dataset, _ = artifacts.held_out(cfg, spec["eval_samples"] or 512)
    samples = min(spec["eval_samples"] or len(dataset), len(dataset))
    rows = []
    for runtime in runtimes_for(artifact, spec["threads"]):
        row: Dict[str, Any] = {"runtime": runtime.name, "baseline_runtime": runtime.baseline or runtime.name, "latency": {}}
        try:
            started = time.perf_counter()
            runtime.load()
            row["load_s"] = round(time.perf_counter() - started, 3)
            for batch in spec["batches"]:
                if artifact.accepts(batch):
                    images, _ = artifacts.stack(dataset, range(batch))
                    row["latency"][str(batch)] = time_runtime(runtime, images, spec["warmup"], spec["min_iters"], spec["min_time_s"])
            eval_batch = artifact.batch or max(spec["batches"])
            row["accuracy"] = accuracy(runtime, dataset, samples, eval_batch, fixed=artifact.batch is not None)
            row["observed"] = runtime.observed()
        except Exception as err:  # noqa: BLE001 - a runtime that fails is a row that says why
            row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
        rows.append(row)
        print(_row_line(artifact.name, row), flush=True)
    Path(spec["result"]).write_text(json.dumps(rows, default=str))
    return 0


ROW_PREFIX = "  | "


def _row_line(name: str, row: Dict[str, Any]) -> str:
    if "error" in row:
        return f"{ROW_PREFIX}{row['runtime']:<34} {name}: FAILED: {row['error']}"
    cells = ", ".join(f"batch {b}: p50 {v['p50_ms']:.2f} ms, {v['throughput_ips']:.0f} img/s" for b, v in row["latency"].items())
    return f"{ROW_PREFIX}{row['runtime']:<34} {name}: {cells}; held-out top-1 {row['accuracy']['top1']:.4f}"


def _run_artifact(artifact: artifacts.Artifact, manifest: Dict[str, Any], options: Dict[str, Any], workdir: Path) -> List[Dict[str, Any]]:
    spec = {
        "directory": str(artifact.directory), "name": artifact.name, "framework": artifact.framework, "format": artifact.format,
        "files": list(artifact.files), "batch": artifact.batch, "config": manifest["config"], "result": str(workdir / f"{artifact.name}.json"),
        **options,
    }  # fmt: skip
    spec_file = workdir / f"{artifact.name}.spec.json"
    spec_file.write_text(json.dumps(spec))
    # Every runtime's OpenMP/MKL pool gets the same size, whichever library reads which variable.
    env = {**os.environ, "OMP_NUM_THREADS": str(options["threads"]), "MKL_NUM_THREADS": str(options["threads"]), "GLOG_minloglevel": "2"}
    from unitrain.lifeline import die_with_parent

    # The worker's rows are relayed as they come; what the frameworks print on import (Paddle's
    # OMP_NUM_THREADS advice for data-parallel training, say) is kept for a failure's message.
    with tempfile.TemporaryFile(mode="w+") as noise:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unitrain.infer", "--worker", str(spec_file)], env=env, preexec_fn=die_with_parent,
            stdout=subprocess.PIPE, stderr=noise, text=True,
        )  # fmt: skip
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
        return [{"runtime": "(all)", "error": f"the worker process for {artifact.name} ended with exit status {proc.returncode}{last}", "latency": {}}]
    return json.loads(Path(spec["result"]).read_text())


def benchmark(inputs: Sequence[str], batches: List[int], threads: int, out: Optional[str], eval_samples: int, warmup: int, min_iters: int, min_time_s: float) -> Path:
    found = []
    for spec in inputs:
        directory, listed = artifacts.locate(spec)
        manifest = artifacts.read_manifest(directory)
        found += [(a, manifest) for a in listed if (a.directory, a.name) not in {(b.directory, b.name) for b, _ in found}]
    out_dir = _out_dir(out, [a for a, _ in found])
    options = {"batches": batches, "threads": threads, "eval_samples": eval_samples, "warmup": warmup, "min_iters": min_iters, "min_time_s": min_time_s}
    rows = []
    with tempfile.TemporaryDirectory(prefix="unitrain-infer-") as tmp:
        for artifact, manifest in found:
            print(f"{artifact.describe()} from {manifest['source']['framework']} {manifest['source']['model']} step {manifest['source']['step']}:", flush=True)
            for row in _run_artifact(artifact, manifest, options, Path(tmp)):
                rows.append({
                    "artifact": str(artifact.path), "name": artifact.name, "framework": artifact.framework, "format": artifact.format,
                    "artifact_batch": artifact.batch, "trained_with": manifest["source"]["framework"], "model": manifest["source"]["model"],
                    **row,
                })  # fmt: skip
    result = {
        "time": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": cpu(), "threads": threads, "batches": batches,
        "warmup": warmup, "min_iters": min_iters, "min_time_s": min_time_s, "eval_samples": eval_samples or "all",
        "timed": "one inference on an input already in the runtime's memory, logits read back as NumPy", "rows": rows,
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    replace_text(out_dir / RESULT, json.dumps(result, indent=2, default=str))
    (out_dir / "inference.md").write_text(markdown(result) + "\n")
    plot(result, out_dir / "inference.png")
    return out_dir


def _out_dir(out: Optional[str], found: List[artifacts.Artifact]) -> Path:
    if out:
        path = Path(out)
        if (path / RESULT).exists():
            raise UnitrainError(f"--out={out!r} already holds {RESULT}; allowed: a new directory (nothing is overwritten)")
        if path.exists() and not path.is_dir():
            raise UnitrainError(f"--out={out!r} is a file; allowed: a directory (created if missing)")
        return path
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S-%f")
    parents = {a.directory.resolve().parent for a in found}
    # Beside the export of one run (where unitrain.compare finds it), else under the current directory.
    return (parents.pop() if len(parents) == 1 else Path.cwd()) / "inference" / stamp


# --- the report -------------------------------------------------------------------------------
def table_rows(result: Dict[str, Any]) -> List[Dict[str, str]]:
    small, large = min(result["batches"]), max(result["batches"])
    p50s = [r["latency"][str(small)]["p50_ms"] for r in result["rows"] if str(small) in r.get("latency", {})]
    fastest = min(p50s) if p50s else None
    rows = []
    for r in result["rows"]:
        lat = r.get("latency", {})
        b1, bn = lat.get(str(small)), lat.get(str(large))
        rows.append({
            "runtime": r["runtime"], "model file": r["name"], "trained with": r["trained_with"],
            f"p50 ms (batch {small})": f"{b1['p50_ms']:.2f}" if b1 else "-",
            f"p90 ms (batch {small})": f"{b1['p90_ms']:.2f}" if b1 else "-",
            f"p99 ms (batch {small})": f"{b1['p99_ms']:.2f}" if b1 else "-",
            "p50 / fastest": f"{b1['p50_ms'] / fastest:.2f}" if b1 and fastest else "-",
            f"img/s (batch {large})": f"{bn['throughput_ips']:.1f}" if bn else "-",
            "held-out top-1": f"{r['accuracy']['top1']:.4f}" if "accuracy" in r else "-",
            "what ran": _what_ran(r),
        })  # fmt: skip
    return rows


def _what_ran(row: Dict[str, Any]) -> str:
    if "error" in row:
        return f"FAILED: {row['error']}"
    seen = row.get("observed", {})
    return "; ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in seen.items() if k not in ("version", "kernels"))


def markdown(result: Dict[str, Any]) -> str:
    from unitrain.compare import markdown as md_table

    return (
        md_table(table_rows(result))
        + f"\n\nCPU: {describe_cpu(result['cpu'], {})}; "
        f"{result['threads']} thread(s) for every runtime. Timed: {result['timed']}; warm-up excluded; medians over "
        f"at least {result['min_iters']} runs. Held-out top-1 over {result['eval_samples']} samples."
    )


def plot(result: Dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in result["rows"] if "error" not in r]
    small, large = str(min(result["batches"])), str(max(result["batches"]))
    colors = {"torch": "#ee4c2c", "paddle": "#2932e1"}
    fig, axes = plt.subplots(1, 2, figsize=(12, max(3, 0.45 * len(ok) + 1.5)))
    labels = [f"{r['runtime']}\n{r['name']}" for r in ok]
    for ax, batch, key, title in ((axes[0], small, "p50_ms", f"latency at batch {small} (ms; p50, bar to p99)"), (axes[1], large, "throughput_ips", f"throughput at batch {large} (images/s)")):
        values = [r["latency"].get(batch, {}).get(key, 0.0) for r in ok]
        err = None
        if key == "p50_ms":
            err = [[0.0] * len(ok), [max(0.0, r["latency"].get(batch, {}).get("p99_ms", 0.0) - v) for r, v in zip(ok, values)]]
        ax.barh(
            range(len(ok)), values, xerr=err, color=[colors.get(r["framework"], "grey") for r in ok], alpha=0.85,
            hatch=[("//" if r["format"] == "onnx" else "") for r in ok],
        )  # fmt: skip
        ax.set_yticks(range(len(ok)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9)
    axes[1].set_yticks([])
    fig.suptitle(f"inference, {result['threads']} thread(s); colour: framework that wrote the model file (torch red, paddle blue; ONNX hatched)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ints(value: str, key: str) -> List[int]:
    try:
        items = sorted(dict.fromkeys(int(v) for v in value.split(",")))
    except ValueError:
        items = [0]
    if not items or items[0] < 1:
        raise UnitrainError(f"{key}={value!r} is not allowed: positive integers, comma-separated")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    parser = argparse.ArgumentParser(prog="python -m unitrain.infer", description="Time exported models in every runtime that reads them, side by side.")
    parser.add_argument("inputs", nargs="+", help="export directories, run directories (their export/), or exported model files")
    parser.add_argument("--batch", default="1,32", help="batch sizes, comma-separated: latency at the smallest, throughput at the largest (default 1,32)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads for every runtime (default: the CPUs this process may use)")
    parser.add_argument("--eval-samples", type=int, default=0, help="held-out samples for the accuracy column (default 0: all)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per batch size first (default 5; torch.compile compiles in them)")
    parser.add_argument("--min-iters", type=int, default=20, help="timed runs at least (default 20)")
    parser.add_argument("--min-time", type=float, default=2.0, help="and at least this many seconds of timed runs (default 2)")
    parser.add_argument("--out", help="output directory (default: <run dir>/inference/<time> for one run's models, else ./inference/<time>)")
    args = parser.parse_args(argv)
    try:
        batches = _ints(args.batch, "--batch")
        cores = len(os.sched_getaffinity(0))
        if not 1 <= args.threads <= cores:
            raise UnitrainError(f"--threads={args.threads} is not allowed: 1 to {cores} (the CPUs this process may use)")
        for key, value in (("--eval-samples", args.eval_samples), ("--warmup", args.warmup), ("--min-time", args.min_time)):
            if not (value >= 0 and np.isfinite(value)):
                raise UnitrainError(f"{key}={value} is not allowed: a number >= 0")
        if args.min_iters < 1:
            raise UnitrainError(f"--min-iters={args.min_iters} is not allowed: an integer >= 1")
        out = benchmark(args.inputs, batches, args.threads, args.out, args.eval_samples, args.warmup, args.min_iters, args.min_time)
    except UnitrainError as err:
        print(f"unitrain.infer: error: {err}", file=sys.stderr)
        return 2
    result = json.loads((out / RESULT).read_text())
    print("\n" + markdown(result) + f"\n\n{RESULT}: {out / RESULT}\nplot: {out / 'inference.png'}")
    failed = [r for r in result["rows"] if "error" in r]
    if failed:
        print(f"unitrain.infer: error: {len(failed)} runtime(s) failed: " + "; ".join(f"{r['runtime']} on {r['name']}: {r['error']}" for r in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
