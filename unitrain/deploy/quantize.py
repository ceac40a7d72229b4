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
by held-out next-token top-1 and loss per token.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from omegaconf import OmegaConf

from unitrain.config.schedule import BatchPlan
from unitrain.config.schema import QuantizeConfig
from unitrain.data.datasets import build_dataset
from unitrain.data.text import load_text, tokenizer_path
from unitrain.deploy import artifacts
from unitrain.deploy.export import export
from unitrain.deploy.infer import Timing, benchmark
from unitrain.deploy.onnx_quantize import quantize_onnx
from unitrain.deploy.speed_ratio import MAX_PAIRS, Side, measure_ratio
from unitrain.errors import ConfigError, Refusal, UnitrainError, framework_cause
from unitrain.host.atomic import replace_text
from unitrain.host.machine import cpu
from unitrain.interface.backend import Backend, get_backend
from unitrain.interface.quantize import QuantizeModule, Saved, quantize_module
from unitrain.model.build import build_model
from unitrain.model.conversion import checkpoint_model, weights_for
from unitrain.model.custom import CustomModel
from unitrain.model.weights import Arrays
from unitrain.report.quantize import RESULT, markdown, plot, table
from unitrain.spec.models import ViTSpec
from unitrain.train.checkpoint import checkpoint_run_dir, find_checkpoint, read_image_meta, read_model_arrays
from unitrain.train.trainer import Trainer


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


def calibration_batches(
    job_cfg: Any, count: Optional[int], batch: int, tokenizer: Optional[Path] = None
) -> List[np.ndarray]:
    """The first ``count`` x ``batch`` training images, unaugmented and without labels, from the
    training set as the job built it (synthetic sets are sized by the job, not by the request);
    a language model's: disjoint windows of its corpus's training split, tokenized by the run's
    ``tokenizer``."""
    if artifacts.is_text(job_cfg):
        dataset, unit = _training_windows(job_cfg, tokenizer), "token windows"
    else:
        plan = BatchPlan.from_config(job_cfg, job_cfg.dist.nproc_per_node * job_cfg.dist.nnodes)
        size = (job_cfg.trainer.steps or 1) * plan.global_batch
        dataset, unit = build_dataset(job_cfg.data, default_size=size, seed=job_cfg.trainer.seed), "images"
    if count is None:
        count = min(32, max(1, len(dataset) // batch))
    if count * batch > len(dataset):
        raise ConfigError(
            "calib_batches",
            count,
            f"at most {len(dataset) // batch} batches of calib_batch_size={batch} (the training set holds "
            f"{len(dataset)} {unit})",
        )
    batches = [artifacts.stack(dataset, range(i * batch, (i + 1) * batch))[0] for i in range(count)]
    if artifacts.is_text(job_cfg):  # token ids: the toolkits keep the time axis dynamic
        return [artifacts.token_ids(b, artifacts.text_block_size(job_cfg)) for b in batches]
    return batches


def _training_windows(job_cfg: Any, tokenizer: Optional[Path]) -> Any:
    """A language model's training split as disjoint windows of its block size."""
    block = artifacts.text_block_size(job_cfg)
    if tokenizer is None or not tokenizer.is_file():
        raise UnitrainError(
            f"calibrating a language model needs its run's tokenizer ({tokenizer}), which is missing; allowed: "
            "method=dynamic (no calibration data)"
        )
    try:
        data = artifacts.corpus_config(job_cfg, tokenizer)
        corpus = load_text(data, block_size=block, max_block_size=block, tokenizer_file=tokenizer)
    except ConfigError as err:
        raise UnitrainError(
            f"calibrating a language model reads its corpus's training split, which cannot be read again: {err}; "
            "allowed: method=dynamic (no calibration data)"
        ) from None
    return corpus.train.with_stride(block)


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """One quantize run, resolved: the checkpoint, the toolkit that quantizes, its settings."""

    cfg: QuantizeConfig
    checkpoint: Path
    meta: Dict[str, Any]
    job: Any  # the checkpoint's training config
    framework: str
    backend: Backend
    toolkit: QuantizeModule
    #: Calibration batches; none for ``dynamic``, which calibrates nothing.
    calibration: List[np.ndarray]
    #: What the toolkits trace the model with: the first calibration batch, else held-out data
    #: (a language model's token ids carry their context length: the time axis stays dynamic).
    example: np.ndarray
    threads: int
    reduce_range: bool
    out_dir: Path

    def model(self) -> "str | ViTSpec | CustomModel":
        """The checkpoint's model, as build_model takes it (a translated half: its run's copy)."""
        return checkpoint_model(self.meta, checkpoint_run_dir(self.checkpoint))

    @property
    def classes(self) -> int:
        if artifacts.is_text(self.job) and self.meta.get("num_classes"):
            return int(self.meta["num_classes"])  # the vocabulary: the check data may be random ids
        return artifacts.num_classes(self.job, artifacts.held_out(self.job, 8)[0])

    @property
    def samples(self) -> List[np.ndarray]:
        """What save_quantized reads: the calibration batches, or (dynamic) the example alone,
        traced and never observed for activation ranges."""
        return self.calibration or [self.example]

    @property
    def stem(self) -> str:
        return artifacts.stem(self.framework, None) + f".{self.cfg.method}"

    def settings(self) -> Dict[str, Any]:
        """How the artifacts were made, recorded beside each (``qat`` adds what training did)."""
        method = self.cfg.method
        return {
            "method": method,
            "calib_batches": len(self.calibration) if method != "dynamic" else 0,
            "calib_batch_size": self.cfg.calib_batch_size,
            "per_channel": self.cfg.per_channel,
            "reduce_range": self.reduce_range,
            **({"qat_steps": self.cfg.qat.steps} if method == "qat" else {}),
        }


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
    job = artifacts.job_config(meta["config"])
    threads = cfg.threads or len(os.sched_getaffinity(0))
    # 7-bit activations where the CPU lacks VNNI: the AVX2 int8 dot product saturates otherwise.
    has_vnni = any("vnni" in e for e in cpu()["extensions"] or [])
    tokenizer = tokenizer_path(checkpoint_run_dir(path)) if artifacts.is_text(job) else None
    calibration = (
        [] if cfg.method == "dynamic" else calibration_batches(job, cfg.calib_batches, cfg.calib_batch_size, tokenizer)
    )
    return Quantization(
        cfg=cfg,
        checkpoint=path,
        meta=meta,
        job=job,
        framework=framework,
        backend=get_backend(framework),
        toolkit=toolkit,
        calibration=calibration,
        example=_example(job, meta, calibration, tokenizer),
        threads=threads,
        reduce_range=cfg.reduce_range if cfg.reduce_range is not None else not has_vnni,
        out_dir=out_dir,
    )


def _example(job: Any, meta: Dict[str, Any], calibration: List[np.ndarray], tokenizer: Optional[Path]) -> np.ndarray:
    """The batch the toolkits trace: the first calibration batch, else 8 held-out samples (more
    than one: torch.export would take a batch of 1 for a fixed size)."""
    if calibration:
        example = calibration[0]
    else:
        data, _ = artifacts.held_out(job, 8, tokenizer, meta.get("num_classes"))
        example = artifacts.stack(data, range(8))[0]
    return artifacts.token_ids(example, artifacts.text_block_size(job)) if artifacts.is_text(job) else example


def quantize(cfg: QuantizeConfig, out_dir: Path) -> Dict[str, Any]:
    q = _resolve(cfg, out_dir)
    meta = q.meta
    print(f"fp32 baseline: exporting {meta['framework']} {meta['model']} step {meta['step']} ...", flush=True)
    formats = ["native", "onnx"] if cfg.onnx else ["native"]
    fp32_dir = export(str(q.checkpoint), formats, [q.framework], [None], str(out_dir / "fp32"))
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
    for name in artifacts.TOKENIZER_FILES:  # a language model's tokenizer, beside its int8 artifacts too
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


def qat_job_config(q: Quantization) -> Any:
    """The training job of the checkpoint, as a short fine-tuning run: same data, batch, optimizer
    and augmentation; ``qat.steps`` steps in one process at ``qat.lr``, no checkpoints."""
    job, cfg = q.job, q.cfg
    qat = OmegaConf.merge(job, {})
    qat.backend.name = q.framework
    qat.amp.level = "O0"
    qat.trainer.update(
        steps=cfg.qat.steps,
        epochs=1,
        checkpoint_every=0,
        eval_every=0,
        resume=None,
        repeats=1,
        threads=q.threads,
        loggers=[],
    )
    qat.dist.nproc_per_node, qat.dist.nnodes = 1, 1
    qat.optim.update(
        lr=cfg.qat.lr if cfg.qat.lr is not None else job.optim.lr * 0.01, warmup_steps=0, schedule="constant"
    )
    qat.profiler.mode, qat.profiler.warmup_steps = "timer", 0  # a few steps: no timing is reported
    return qat


def quantization_aware_training(q: Quantization, weights: Arrays, int8_dir: Path) -> tuple[Saved, Dict[str, Any]]:
    """Fine-tunes the checkpoint's weights with fake quantization in unitrain's training loop,
    then converts and saves it; returns the files and what the loop recorded."""
    example = q.example
    prepared = []

    def prepare(model: Any) -> Any:
        q.backend.load_state_arrays(model, weights)
        prepared.append(q.toolkit.prepare_qat(model, example, q.reduce_range))
        return prepared[-1]

    run_dir = q.out_dir / "qat"
    run_dir.mkdir(parents=True, exist_ok=True)
    qat_cfg = qat_job_config(q)
    print(
        f"quantization-aware training in {q.framework}: {q.cfg.qat.steps} steps at lr {qat_cfg.optim.lr:g} ...",
        flush=True,
    )
    # A user's pair as the checkpoint records it (a translated half: the run's copy); else the config's.
    model = q.model() if q.meta.get("custom") else None
    summary = Trainer(qat_cfg, q.backend, run_dir, q.threads, prepare_model=prepare, model=model).fit()
    saved = q.toolkit.save_qat(prepared[0], int8_dir / q.stem, example, q.cfg.batches)
    final = summary.get("final") or {}
    record = {
        "steps": summary["steps"],
        "lr": qat_cfg.optim.lr,
        "final_loss": final.get("loss"),
        "held_out": summary.get("eval"),
        "run_dir": "qat",
    }
    return saved, record
