"""Quantization of a unitrain checkpoint, and a table of what it really achieved.

One run exports the fp32 baseline (:mod:`unitrain.deploy.export`: the framework's native format
and ONNX), quantizes it in the framework's own toolkit (``backends/<name>/quantize.py``) and, as
the neutral path, the ONNX model with ONNX Runtime's quantization tool, then times and scores
every artifact in every runtime that reads it (:mod:`unitrain.deploy.infer`, one process per
artifact, the full held-out set). The ``effective`` column comes from the kernels each runtime
reports (ONNX Runtime's optimized graph, the ops a torch.compile profile ran, the operators of a
loaded program), never from ``method``. Writes ``quantize.json`` and ``quantize.md`` into the
run directory, the artifacts into ``fp32/`` and ``int8/``, the timings into ``inference/``.

Methods (Paddle's definitions): ``dynamic`` needs no data, stores weights as integers and
dequantizes them (ONNX Runtime also quantizes activations on the fly: ConvInteger);
``static`` calibrates activation ranges on ``calib_batches`` unlabeled training batches and
runs integer kernels where the runtime has them; ``qat`` inserts fake quantization and
fine-tunes for ``qat.steps`` with unitrain's own training loop (``Trainer``, the job's data and
optimizer; its metrics.jsonl and summary.json go into ``qat/``), then converts like static. The
ONNX Runtime path quantizes the fp32 ONNX export (PTQ: static for ``qat``, as ONNX Runtime has
no training), so that every method has a neutral-runtime row to set against.

``dynamic`` reads no data and no calibration setting: the toolkits trace the model on one
held-out batch (an example, never observed for ranges). A language model (data=text) is
quantized from an example of its full context with the time axis kept dynamic, calibrated
(static, qat's ONNX Runtime row) on disjoint windows of its corpus's training split, and judged
by held-out next-token top-1 and loss per token: what it is calibrated and traced on is its
task's to say (the run resolved: :mod:`unitrain.deploy.quantization`; qat's fine-tuning:
:mod:`unitrain.deploy.qat`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

from unitrain.config.schema import QuantizeConfig
from unitrain.deploy import artifacts
from unitrain.deploy.export import export
from unitrain.deploy.export_check import ExportCheckError
from unitrain.deploy.infer import Timing, benchmark
from unitrain.deploy.onnx_quantize import quantize_onnx
from unitrain.deploy.qat import quantization_aware_training
from unitrain.deploy.quantization import Quantization, resolved
from unitrain.deploy.speed_ratio import MAX_PAIRS, Side, measure_ratio
from unitrain.errors import ConfigError, Refusal, UnitrainError, framework_cause
from unitrain.host.atomic import replace_text
from unitrain.host.machine import cpu
from unitrain.interface.modules import available_backends
from unitrain.interface.quantize import QuantizeModule, Saved, quantize_module
from unitrain.model.build import build_model
from unitrain.model.conversion import weights_for
from unitrain.model.weights import Arrays
from unitrain.report.quantize import RESULT, markdown, plot, table
from unitrain.train.checkpoint import find_checkpoint, read_image_meta, read_model_arrays


def validate(cfg: QuantizeConfig) -> None:
    """What a quantize run cannot do, refused before anything runs. Dynamic quantization reads
    no calibration setting (it calibrates nothing), so none is checked for it."""
    calibrated = cfg.method != "dynamic"
    for key, value in (("calib_batches", cfg.calib_batches), ("calib_batch_size", cfg.calib_batch_size)):
        if calibrated and value is not None and value < 1:
            raise ConfigError(key, value, "an integer >= 1")
    if not cfg.batches or min(cfg.batches) < 1:
        raise ConfigError("batches", list(cfg.batches), "a list of positive batch sizes")
    if cfg.qat.steps < 1:
        raise ConfigError("qat.steps", cfg.qat.steps, "an integer >= 1 (fine-tuning steps with fake quantization)")
    if cfg.qat.lr is not None and not (0 < cfg.qat.lr < float("inf")):
        raise ConfigError("qat.lr", cfg.qat.lr, "a finite number > 0, or null for 1% of the job's lr")
    if cfg.min_iters < 1 or cfg.warmup < 0 or not 0 <= cfg.min_time_s < float("inf"):
        raise ConfigError("min_iters", cfg.min_iters, "min_iters >= 1, warmup >= 0 and a finite min_time_s >= 0")
    if cfg.pairs != 0 and not 2 <= cfg.pairs <= MAX_PAIRS:
        raise ConfigError(
            "pairs", cfg.pairs, f"0 (no speed-ups) or 2 to {MAX_PAIRS} (interleaved pairs behind each speed-up)"
        )
    if cfg.eval_samples < 0:
        raise ConfigError("eval_samples", cfg.eval_samples, "an integer >= 0 (0: all)")
    cores = len(os.sched_getaffinity(0))
    if cfg.threads is not None and not 1 <= cfg.threads <= cores:
        raise ConfigError("threads", cfg.threads, f"1 to {cores} (the CPUs this process may use)")
    if cfg.source is None:
        raise ConfigError(
            "source",
            None,
            "a run directory, a checkpoint directory or latest: python -m unitrain.quantize <run dir> method=static",
        )


def _check_toolkits(framework: str, toolkit: QuantizeModule, cfg: QuantizeConfig) -> None:
    """What the method needs, before any work: one line naming what is missing. Imported, not
    just looked up: an installed package that fails to import is missing all the same."""
    toolkit.check(cfg.method, cfg.per_channel)
    if cfg.onnx:
        try:
            importlib.import_module("onnxruntime.quantization")
        except ImportError:
            raise UnitrainError(
                f"quantization with backend={framework} needs onnxruntime, which is not installed; "
                "install it with: pip install 'unitrain[export]' (or onnx=false)"
            ) from None


def _baseline_allowed(framework: str):
    """What a failed fp32 baseline artifact's line offers instead: quantize's own options (the
    ONNX half: ``onnx=false``; the native one: the other framework's toolkit)."""
    others = [b for b in available_backends() if b != framework]
    other = f"backend={others[0]} (that framework's toolkit, on the same checkpoint)" if others else ""

    def allowed(fmt: str) -> str:
        if fmt == "onnx":
            return "onnx=false (the framework's own int8 alone, no ONNX Runtime row)" + (
                f", or {other}" if other else ""
            )
        return other or "a model this framework exports (docs/export-and-inference.md)"

    return allowed


def _resolve(cfg: QuantizeConfig, out_dir: Path) -> Quantization:
    validate(cfg)
    # Before the toolkits are imported (a framework's import takes seconds): nothing is overwritten.
    if (out_dir / RESULT).exists():
        raise UnitrainError(f"{out_dir} already holds {RESULT}; allowed: a new run directory (nothing is overwritten)")
    path = find_checkpoint(cfg.source, [Path.cwd() / "runs", Path.cwd() / "multirun"], key="source")
    meta = read_image_meta(path, "unitrain.quantize")
    framework = cfg.backend.name if cfg.backend else meta["framework"]
    toolkit = quantize_module(framework)
    _check_toolkits(framework, toolkit, cfg)
    return resolved(cfg, path, meta, framework, toolkit, out_dir)


def quantize(cfg: QuantizeConfig, out_dir: Path) -> Dict[str, Any]:
    q = _resolve(cfg, out_dir)
    meta = q.meta
    print(f"fp32 baseline: exporting {meta['framework']} {meta['model']} step {meta['step']} ...", flush=True)
    formats = ["native", "onnx"] if cfg.onnx else ["native"]
    allowed = _baseline_allowed(q.framework)
    try:
        fp32_dir = export(str(q.checkpoint), formats, [q.framework], [None], str(out_dir / "fp32"), allowed=allowed)
    except ExportCheckError as err:  # an artifact computing something else: what to ask for instead
        raise ExportCheckError(f"the fp32 baseline: {err}; allowed: {allowed(err.fmt)}") from None
    fp32 = artifacts.read_manifest(fp32_dir)
    # After the export, whose check ran every runtime on all cores.
    q.backend.set_threads(q.threads)
    int8_dir = out_dir / "int8"
    int8_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "source": fp32["source"],
        "config": fp32["config"],
        "check_data": fp32["check_data"],
        "input": fp32.get("input"),
        "artifacts": {},
        "cpu": cpu(),
    }
    for name in q.task.export_files:  # a language model's tokenizer, beside its int8 artifacts too
        if (fp32_dir / name).is_file():
            shutil.copyfile(fp32_dir / name, int8_dir / name)
    how = q.settings()
    weights = weights_for(
        read_model_arrays(q.checkpoint), meta, q.backend, build_model(q.backend, q.model(), q.classes)
    )
    if cfg.method == "qat":
        saved, how["qat"] = quantization_aware_training(q, weights, int8_dir)
    else:
        saved = _post_training(q, weights, int8_dir)
    for files, batch in saved:
        manifest["artifacts"][files[0].name] = {
            "framework": q.framework,
            "format": "native",
            "files": [f.name for f in files],
            "batch": batch,
            "bytes": sum(f.stat().st_size for f in files),
            "quantizer": q.toolkit.QUANTIZER[cfg.method],
            **how,
        }
    artifacts.write_manifest(int8_dir, manifest)
    if cfg.onnx:
        _onnx_runtime_row(q, fp32_dir, fp32, int8_dir, manifest, how)
    return _measure(q, fp32_dir, fp32, int8_dir, manifest, how)


def _post_training(q: Quantization, weights: Arrays, int8_dir: Path) -> Saved:
    model = build_model(q.backend, q.model(), q.classes)
    q.backend.load_state_arrays(model, weights)
    print(f"{q.cfg.method} quantization in {q.framework} ...", flush=True)
    try:
        return q.toolkit.save_quantized(
            model, q.cfg.method, q.samples, int8_dir / q.stem, q.reduce_range, q.cfg.per_channel, q.cfg.batches
        )
    except (UnitrainError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - a quantizer that cannot take this model: one line
        said = framework_cause(err)
        raise Refusal(
            f"{q.cfg.method} quantization in {q.framework} ({q.toolkit.QUANTIZER[q.cfg.method]}) failed on this model: "
            f"{said[:300]}; allowed: another method or backend (the quantizer names what it could not take)"
        ) from None


def _onnx_runtime_row(
    q: Quantization, fp32_dir: Path, fp32: Dict[str, Any], int8_dir: Path, manifest: Dict[str, Any], how: Dict[str, Any]
) -> None:
    source = next(fp32_dir / name for name, e in fp32["artifacts"].items() if e["format"] == "onnx")
    # ONNX Runtime cannot train: for qat its row is static PTQ of the fp32 model, named so.
    method = "static" if q.cfg.method == "qat" else q.cfg.method
    print(f"{method} quantization of {source.name} with ONNX Runtime ...", flush=True)
    target = int8_dir / f"{artifacts.stem(q.framework, None)}.{method}.onnx"
    quantize_onnx(source, target, method, q.calibration or [q.example], q.cfg.per_channel, q.reduce_range)
    manifest["artifacts"][target.name] = {
        "framework": q.framework,
        "format": "onnx",
        "files": [target.name],
        "batch": None,
        "bytes": target.stat().st_size,
        "quantizer": f"onnxruntime.quantization.quantize_{method}",
        **how,
        "method": method,
    }
    artifacts.write_manifest(int8_dir, manifest)


def _measure(
    q: Quantization, fp32_dir: Path, fp32: Dict[str, Any], int8_dir: Path, manifest: Dict[str, Any], how: Dict[str, Any]
) -> Dict[str, Any]:
    """Every artifact timed and scored in every runtime; quantize.json, .md and .png written."""
    cfg, out_dir = q.cfg, q.out_dir
    print("timing and scoring every artifact in every runtime (one process each) ...", flush=True)
    timing = Timing(
        batches=sorted(set(cfg.batches)),
        threads=q.threads,
        eval_samples=cfg.eval_samples,
        warmup=cfg.warmup,
        min_iters=cfg.min_iters,
        min_time_s=cfg.min_time_s,
        pairs=0,  # the speed-ups below are this run's ratios
    )
    inference_dir = benchmark([str(fp32_dir), str(int8_dir)], timing, str(out_dir / "inference"))
    timed = json.loads((inference_dir / "inference.json").read_text())
    speedups = _speedups(q, timed["rows"], fp32_dir, int8_dir, manifest)
    sizes = {
        **{n: e["bytes"] for n, e in fp32["artifacts"].items()},
        **{n: e["bytes"] for n, e in manifest["artifacts"].items()},
    }
    methods = {n: e["method"] for n, e in manifest["artifacts"].items()}
    report = {
        "source": fp32["source"],
        "framework": q.framework,
        "method": cfg.method,
        "settings": how,
        "threads": q.threads,
        "cpu": cpu(),
        "held_out": timed["eval_samples"],
        "input": fp32.get("input"),
        "eval_data": next((r["eval_data"] for r in timed["rows"] if r.get("eval_data")), None),
        "batches": timed["batches"],
        "rows": table(timed["rows"], sizes, methods, speedups),
        "pairs": cfg.pairs,
        "made_by": {n: e["quantizer"] for n, e in manifest["artifacts"].items()},
    }
    replace_text(out_dir / RESULT, json.dumps(report, indent=2, default=str))
    (out_dir / "quantize.md").write_text(markdown(report) + "\n")
    plot(report["rows"], report["batches"], out_dir / "quantize.png")
    return report


def _speedups(
    q: Quantization, rows: List[Dict[str, Any]], fp32_dir: Path, int8_dir: Path, manifest: Dict[str, Any]
) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """(int8 file, runtime) -> its speed-up over the fp32 artifact of the same format in the same
    runtime, at the largest batch, as interleaved pairs in one process (``pairs=0``: none)."""
    if not q.cfg.pairs:  # the table's column shows "-", as for a row without a baseline
        return {}
    fp32 = {a.name: a for a in artifacts.locate(str(fp32_dir))[1]}
    int8 = {a.name: a for a in artifacts.locate(str(int8_dir))[1]}
    batch, found = max(q.cfg.batches), {}
    for row in rows:
        if row["name"] not in int8 or "error" in row:
            continue
        base = next(
            (
                b
                for b in rows
                if b["name"] in fp32 and b["format"] == row["format"] and b["runtime"] == row["baseline_runtime"]
            ),
            None,
        )
        if base is None or "error" in base:
            continue
        print(
            f"  | speed-up of {row['name']} in {row['runtime']}: {q.cfg.pairs} pairs with {base['name']} ...",
            flush=True,
        )
        reference = Side(artifact=fp32[base["name"]], runtime=base["runtime"])
        candidate = Side(artifact=int8[row["name"]], runtime=row["runtime"])
        found[(row["name"], row["runtime"])] = measure_ratio(
            reference, candidate, manifest["config"], batch, q.threads, q.cfg.pairs, q.cfg.warmup, manifest.get("input")
        )
    return found
