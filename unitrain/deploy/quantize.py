"""``python -m unitrain.quantize <run dir | checkpoint | latest> method=dynamic|static|qat [backend=torch]``

Quantization of a unitrain checkpoint, and a table of what it really achieved.
One run exports the fp32 baseline (``unitrain.export``: the framework's native format and
ONNX), quantizes it in the framework's own toolkit (``backends/<name>/quantize.py``) and, as
the neutral path, the ONNX model with ONNX Runtime's quantization tool, then times and scores
every artifact in every runtime that reads it (``unitrain.infer``, one process per artifact,
the full held-out set). The ``effective`` column comes from the kernels each runtime reports
(ONNX Runtime's optimized graph, the ops a torch.compile profile ran, the operators of a loaded
program), never from ``method``. Writes ``quantize.json`` and ``quantize.md`` into the run
directory, the artifacts into ``fp32/`` and ``int8/``, the timings into ``inference/``.

Methods (Paddle's definitions): ``dynamic`` needs no data, stores weights as integers and
dequantizes them (ONNX Runtime also quantizes activations on the fly: ConvInteger);
``static`` calibrates activation ranges on ``calib_batches`` unlabeled training batches and
runs integer kernels where the runtime has them; ``qat`` inserts fake quantization and
fine-tunes for ``qat.steps`` with unitrain's own training loop (``Trainer``, the job's data and
optimizer; its metrics.jsonl and summary.json go into ``qat/``), then converts like static. The
ONNX Runtime path quantizes the fp32 ONNX export (PTQ: static for ``qat``, as ONNX Runtime has
no training), so that every method has a neutral-runtime row to set against.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
from omegaconf import OmegaConf

from unitrain.deploy import artifacts
from unitrain.errors import ConfigError, UnitrainError
from unitrain.host.atomic import replace_text
from unitrain.host.machine import cpu
from unitrain.deploy.onnx_quantize import quantize_onnx
from unitrain.report.quantize import RESULT, markdown, plot, table

log = logging.getLogger("unitrain")
METHODS = ("dynamic", "static", "qat")






# --- one run ----------------------------------------------------------------------------------
def _validate(cfg) -> None:
    if cfg.method not in METHODS:
        raise ConfigError("method", cfg.method, f"one of {', '.join(METHODS)}")
    for key in ("calib_batches", "calib_batch_size"):
        if cfg[key] is not None and cfg[key] < 1:
            raise ConfigError(key, cfg[key], "an integer >= 1")
    if not cfg.batches or min(cfg.batches) < 1:
        raise ConfigError("batches", list(cfg.batches), "a list of positive batch sizes")
    if cfg.qat.steps < 1:
        raise ConfigError("qat.steps", cfg.qat.steps, "an integer >= 1 (fine-tuning steps with fake quantization)")
    if cfg.qat.lr is not None and not (0 < cfg.qat.lr < float("inf")):
        raise ConfigError("qat.lr", cfg.qat.lr, "a finite number > 0, or null for 1% of the job's lr")
    if cfg.min_iters < 1 or cfg.warmup < 0 or not 0 <= cfg.min_time_s < float("inf"):
        raise ConfigError("min_iters", cfg.min_iters, "min_iters >= 1, warmup >= 0 and a finite min_time_s >= 0")
    if cfg.eval_samples < 0:
        raise ConfigError("eval_samples", cfg.eval_samples, "an integer >= 0 (0: all)")
    cores = len(os.sched_getaffinity(0))
    if cfg.threads is not None and not 1 <= cfg.threads <= cores:
        raise ConfigError("threads", cfg.threads, f"1 to {cores} (the CPUs this process may use)")
    if cfg.source is None:
        raise ConfigError("source", None, "a run directory, a checkpoint directory or latest: python -m unitrain.quantize <run dir> method=static")


def _preflight(backend: str, onnx: bool) -> None:
    """What a method needs, before any work: one line naming what is missing. Imported, not
    just looked up: an installed package that fails to import is missing all the same."""
    import importlib

    needed = [("torchao.quantization.pt2e.quantize_pt2e", "torchao", "quantize")] if backend == "torch" else []
    if onnx:
        needed.append(("onnxruntime.quantization", "onnxruntime", "export"))
    for module, package, extra in needed:
        try:
            importlib.import_module(module)
        except ImportError:
            hint = " (or onnx=false)" if package == "onnxruntime" else ""
            raise UnitrainError(f"quantization with backend={backend} needs {package}, which is not installed; install it with: pip install 'unitrain[{extra}]'{hint}") from None


def calibration_batches(job_cfg, count: Optional[int], batch: int) -> List[np.ndarray]:
    """The first ``count`` x ``batch`` training images, unaugmented and without labels, from the
    training set as the job built it (synthetic sets are sized by the job, not by the request)."""
    from unitrain.data.datasets import build_dataset
    from unitrain.config.schedule import BatchPlan

    plan = BatchPlan.from_config(job_cfg, job_cfg.dist.nproc_per_node * job_cfg.dist.nnodes)
    dataset = build_dataset(job_cfg.data, default_size=(job_cfg.trainer.steps or 1) * plan.global_batch, seed=job_cfg.trainer.seed)
    if count is None:
        count = min(32, max(1, len(dataset) // batch))
    if count * batch > len(dataset):
        raise ConfigError("calib_batches", count, f"at most {len(dataset) // batch} batches of calib_batch_size={batch} (the training set holds {len(dataset)} images)")
    return [artifacts.stack(dataset, range(i * batch, (i + 1) * batch))[0] for i in range(count)]


def quantize(cfg, out_dir: Path) -> Dict[str, Any]:
    from unitrain.interface.backend import capability, get_backend
    from unitrain.train.checkpoint import find_checkpoint, read_meta, read_model_arrays
    from unitrain.deploy.export import export
    from unitrain.deploy.infer import benchmark
    from unitrain.model.weights import convert

    _validate(cfg)
    path = find_checkpoint(cfg.source, [Path.cwd() / "runs", Path.cwd() / "multirun"], key="source")
    meta = read_meta(path)
    framework = cfg.backend.name if cfg.backend else meta["framework"]
    _preflight(framework, cfg.onnx)
    if (out_dir / RESULT).exists():
        raise UnitrainError(f"{out_dir} already holds {RESULT}; allowed: a new run directory (nothing is overwritten)")
    job = artifacts.job_config(meta["config"])
    calibration = calibration_batches(job, cfg.calib_batches, cfg.calib_batch_size)
    threads = cfg.threads or len(os.sched_getaffinity(0))
    extensions = cpu()["extensions"] or []
    reduce_range = cfg.reduce_range if cfg.reduce_range is not None else not any("vnni" in e for e in extensions)
    if framework == "torch" and cfg.method == "static" and not cfg.per_channel:
        raise ConfigError("per_channel", False, "true with backend=torch method=static (torchao's X86InductorQuantizer quantizes weights per channel only)")

    print(f"fp32 baseline: exporting {meta['framework']} {meta['model']} step {meta['step']} ...", flush=True)
    fp32_dir = export(str(path), ["native", "onnx"] if cfg.onnx else ["native"], [framework], [None], str(out_dir / "fp32"))
    fp32 = artifacts.read_manifest(fp32_dir)

    int8_dir = out_dir / "int8"
    int8_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"source": fp32["source"], "config": fp32["config"], "check_data": fp32["check_data"], "artifacts": {}, "cpu": cpu()}
    backend = get_backend(framework)
    backend.set_threads(threads)
    stem = artifacts.stem(framework, None) + f".{cfg.method}"
    how = {"method": cfg.method, "calib_batches": len(calibration) if cfg.method != "dynamic" else 0, "calib_batch_size": cfg.calib_batch_size,
           "per_channel": cfg.per_channel, "reduce_range": reduce_range}  # fmt: skip
    toolkit = capability(backend, "quantize")
    weights = convert(read_model_arrays(path), meta["framework"], framework)
    if cfg.method == "qat":
        how.update(qat_steps=cfg.qat.steps)
        saved, how["qat"] = quantization_aware_training(cfg, job, framework, backend, toolkit, weights, calibration[0], reduce_range, threads, out_dir, stem, int8_dir)
    else:
        model = backend.build_model(meta["model"], artifacts.num_classes(job, artifacts.held_out(job, 8)[0]))
        backend.load_state_arrays(model, weights)
        print(f"{cfg.method} quantization in {framework} ...", flush=True)
        saved = toolkit.save_quantized(model, cfg.method, calibration, int8_dir / stem, reduce_range, cfg.per_channel, cfg.batches)
    for files, batch in saved:
        manifest["artifacts"][files[0].name] = {
            "framework": framework, "format": "native", "files": [f.name for f in files], "batch": batch,
            "bytes": sum(f.stat().st_size for f in files), "quantizer": toolkit.QUANTIZER[cfg.method], **how,
        }  # fmt: skip
    artifacts.write_manifest(int8_dir, manifest)
    if cfg.onnx:
        source_onnx = next(fp32_dir / name for name, e in fp32["artifacts"].items() if e["format"] == "onnx")
        # ONNX Runtime cannot train: for qat its row is static PTQ of the fp32 model, named so.
        onnx_method = "static" if cfg.method == "qat" else cfg.method
        print(f"{onnx_method} quantization of {source_onnx.name} with ONNX Runtime ...", flush=True)
        target = quantize_onnx(source_onnx, int8_dir / f"{artifacts.stem(framework, None)}.{onnx_method}.onnx", onnx_method, calibration, cfg.per_channel, reduce_range)
        manifest["artifacts"][target.name] = {
            "framework": framework, "format": "onnx", "files": [target.name], "batch": None, "bytes": target.stat().st_size,
            "quantizer": f"onnxruntime.quantization.quantize_{onnx_method}", **how, "method": onnx_method,
        }  # fmt: skip
        artifacts.write_manifest(int8_dir, manifest)

    print("timing and scoring every artifact in every runtime (one process each) ...", flush=True)
    inference_dir = benchmark([str(fp32_dir), str(int8_dir)], sorted(set(cfg.batches)), threads, str(out_dir / "inference"), cfg.eval_samples, cfg.warmup, cfg.min_iters, cfg.min_time_s)
    timed = json.loads((inference_dir / "inference.json").read_text())
    sizes = {**{n: e["bytes"] for n, e in fp32["artifacts"].items()}, **{n: e["bytes"] for n, e in manifest["artifacts"].items()}}
    methods = {n: e["method"] for n, e in manifest["artifacts"].items()}
    report = {
        "source": fp32["source"], "framework": framework, "method": cfg.method, "settings": how, "threads": threads, "cpu": cpu(),
        "held_out": timed["eval_samples"], "batches": timed["batches"], "rows": table(timed["rows"], sizes, methods),
        "made_by": {n: e["quantizer"] for n, e in manifest["artifacts"].items()},
    }  # fmt: skip
    replace_text(out_dir / RESULT, json.dumps(report, indent=2, default=str))
    (out_dir / "quantize.md").write_text(markdown(report) + "\n")
    plot(report["rows"], report["batches"], out_dir / "quantize.png")
    return report


def qat_job_config(job, cfg, framework: str, threads: int):
    """The training job of the checkpoint, as a short fine-tuning run: same data, batch, optimizer
    and augmentation; ``qat.steps`` steps in one process at ``qat.lr``, no checkpoints."""
    qat = OmegaConf.merge(job, {})
    qat.backend.name = framework
    qat.amp.level = "O0"
    qat.trainer.update(steps=cfg.qat.steps, epochs=1, checkpoint_every=0, eval_every=0, resume=None, repeats=1, threads=threads, loggers=[])
    qat.dist.nproc_per_node, qat.dist.nnodes = 1, 1
    qat.optim.update(lr=cfg.qat.lr if cfg.qat.lr is not None else job.optim.lr * 0.01, warmup_steps=0, schedule="constant")
    qat.profiler.mode = "timer"
    return qat


def quantization_aware_training(cfg, job, framework, backend, toolkit, weights, example, reduce_range, threads, out_dir, stem, int8_dir):
    """Fine-tunes the checkpoint's weights with fake quantization in unitrain's training loop,
    then converts and saves it; returns the files and what the loop recorded."""
    from unitrain.train.trainer import Trainer

    prepared = []

    def prepare(model):
        backend.load_state_arrays(model, weights)
        prepared.append(toolkit.prepare_qat(model, example, reduce_range))
        return prepared[-1]

    run_dir = out_dir / "qat"
    run_dir.mkdir(parents=True, exist_ok=True)
    qat_cfg = qat_job_config(job, cfg, framework, threads)
    print(f"quantization-aware training in {framework}: {cfg.qat.steps} steps at lr {qat_cfg.optim.lr:g} ...", flush=True)
    summary = Trainer(qat_cfg, backend, run_dir, threads, prepare_model=prepare).fit()
    saved = toolkit.save_qat(prepared[0], int8_dir / stem, example, cfg.batches)
    final = summary.get("final") or {}
    return saved, {"steps": summary["steps"], "lr": qat_cfg.optim.lr, "final_loss": final.get("loss"), "held_out": summary.get("eval"), "run_dir": "qat"}








