"""Quantization on both frameworks: every artifact loads and runs in its runtime, stays close to
the fp32 model on held-out data, and the ``effective`` column says what the runtime's kernels
really were (read from the optimized graph, a profile or the program Paddle Inference runs after
its passes; never from the method)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST, run_unitrain
from unitrain.host import contention, machine

pytest.importorskip("torchao", reason="quantization tests need the quantize extra (make test installs it)")
pytest.importorskip("onnxruntime", reason="quantization tests need the export extra (make test installs it)")

#: 120 steps, not fewer: after 30 the tiny model's held-out loss was 0.4-0.8 (top-1 0.77-0.90), so
#: many samples sat on a decision boundary that int8 rounding crosses either way; after 120 the
#: loss is about 0.03 (top-1 0.99) and ONNX Runtime and the simulations lose at most 0.4 points.
TRAIN = ["data=learnable", "data.val_samples=256", "trainer.steps=120", "trainer.checkpoint_every=120"]
#: One batch size: torch.compile compiles once per batch size, and that is most of a test's time.
QUICK = ["batches=[4]", "min_time_s=0", "min_iters=3", "warmup=1", "calib_batches=4", "calib_batch_size=8"]
#: Held-out top-1 a quantized model may lose against fp32 on the learnable data, in points
#: (256 held-out samples: one sample is 0.39 points). ONNX Runtime and the simulated programs
#: (torch eager, Paddle Inference without int8) lost at most 1.2.
TOLERANCE_POINTS = 5.0
#: oneDNN's int8 convolutions, which both torch.compile (Inductor) and Paddle Inference call,
#: compute something other than the same program's simulation on this tiny model (8 channels):
#: Inductor lost 0-24 points, Paddle Inference 4-21, where the simulation lost none; on
#: ResNet18 both lose nothing (docs/quantization.md). A known, unexplained gap, bounded here so
#: that a broken lowering (chance is 89 points down) still fails.
ONEDNN_INT8_TOLERANCE_POINTS = 40.0
ONEDNN_INT8_RUNTIMES = ("torch.compile (inductor)", "paddle.inference (IR + oneDNN int8)")


class _Runs(dict):
    """One trained run per framework, trained when a test first asks for it (a test of torch
    alone does not wait for Paddle's run)."""

    def __init__(self, factory):
        super().__init__()
        self.factory = factory

    def __missing__(self, backend: str) -> Path:
        root = self.factory.mktemp(f"quantize-{backend}")
        result = run_unitrain([f"backend={backend}", *FAST, *TRAIN], root)
        assert result.returncode == 0, result.stderr[-2000:]
        self[backend] = result.run_dir
        return result.run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return _Runs(tmp_path_factory)


#: What the toolkits print that a user cannot act on: in the log, never on the console (torchao's
#: CUDA libraries and Triton on a CPU, Paddle's progress bars and deprecation notes on its own
#: calls, ONNX Runtime's unused initializers).
QUANTIZER_NOISE = (
    "Failed to load",
    "Detected no triton",
    "register_constant",
    "Sampling stage",
    "Adding quant",
    "The old way to load",
    "full_graph=False",
    "To copy construct",
    "CleanUnusedInitializers",
    "leaves none of this run's",
)


def quantize(source: Path, out: Path, *overrides: str, pairs: int = 0):
    """No speed-ups unless a test asserts them (``pairs``): each is a process of its own that
    loads, and torch.compile compiles, both models again."""
    args = [str(source), *overrides, f"pairs={pairs}"]
    return run_unitrain(args, out, module="unitrain.quantize", timeout=900)


def rows(run_dir: Path):
    report = json.loads((run_dir / "quantize.json").read_text())
    return {(r["file"], r["runtime"]): r for r in report["rows"]}


def cpu_flags() -> str:
    """The int8 kernels oneDNN picks depend on these (VNNI or not), so a failure names them."""
    return " ".join(machine.cpu()["extensions"] or ["cpu flags unknown"])


def assert_close_to_fp32(table):
    for row in table.values():
        assert "FAILED" not in row["effective"], row
        onednn_int8 = row["runtime"] in ONEDNN_INT8_RUNTIMES and row["effective"].startswith("int8 kernels")
        limit = ONEDNN_INT8_TOLERANCE_POINTS if onednn_int8 else TOLERANCE_POINTS
        assert abs(row["top1_delta_points"]) <= limit, (row, cpu_flags())


@pytest.mark.slow
def test_static_torch_runs_int8_kernels_in_inductor_and_onnxruntime(trained, tmp_path):
    result = quantize(trained["torch"], tmp_path, "method=static", *QUICK, pairs=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [n for n in QUANTIZER_NOISE if n in result.stdout + result.stderr] == [], result.stderr[-3000:]
    table = rows(result.run_dir)
    assert_close_to_fp32(table)
    # The kernels, not the request: ONNX Runtime fused QDQ into QLinearConv, Inductor called oneDNN
    # int8 convolutions; torch eager runs the same program's quantize/dequantize around float convs.
    ort = table[("model.torch.static.onnx", "onnxruntime")]
    assert ort["effective"] == "int8 kernels" and ort["kernels"]["int8"] > 0 and ort["kernels"]["float"] == 0
    compiled = table[("model.torch.static.pt2", "torch.compile (inductor)")]
    assert compiled["effective"].startswith("int8 kernels") and compiled["kernels"]["int8"] > 0
    eager = table[("model.torch.static.pt2", "torch eager (torch.export.load)")]
    assert eager["effective"] == "simulated (fake-quant, fp32 kernels)"
    assert table[("model.torch.onnx", "onnxruntime")]["effective"] == "fp32"
    assert table[("model.torch.pt2", "torch.compile (inductor)")]["effective"] == "fp32"
    # Every speed-up is a ratio of interleaved pairs against the same job's fp32 artifact in the
    # same runtime, with its interval.
    for row in (ort, compiled, eager):
        speedup = row["speedup"]["4"]
        assert speedup["pairs"] == 2 and speedup["low"] <= speedup["median"] <= speedup["high"], row
        assert len(speedup["ratios"]) == 2 and speedup["batch"] == 4 and speedup["processes"] == 1
        # Timed at a raised priority (root here), with the CPU other work took meanwhile recorded.
        assert speedup["nice"] == (contention.PRIORITY if os.geteuid() == 0 else 0) and speedup["other_cpus"] >= 0
    assert "speed-up (batch 4, 95% CI)" in (result.run_dir / "quantize.md").read_text()
    # Smaller where the table says so: int8 weights (the tiny model's .pt2 is mostly its graph).
    assert ort["size_vs_fp32"] < 0.5 and compiled["size_vs_fp32"] < 0.8
    assert "| effective |" in (result.run_dir / "quantize.md").read_text()
    # Nothing is overwritten: the same run directory again is refused in one line.
    again = quantize(trained["torch"], tmp_path, "method=static", *QUICK)
    assert again.returncode == 2 and "already holds quantize.json" in again.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_dynamic_torch_stores_int8_weights_and_computes_in_fp32(trained, tmp_path):
    result = quantize(trained["torch"], tmp_path, "method=dynamic", "onnx=false", *QUICK)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(result.run_dir)
    assert_close_to_fp32(table)
    for runtime in ("torch eager (torch.export.load)", "torch.compile (inductor)"):
        row = table[("model.torch.dynamic.pt2", runtime)]
        assert row["effective"] == "int8 weights, fp32 compute" and row["kernels"]["dequantize"] > 0
        assert row["size_vs_fp32"] < 0.8
        assert row["speedup"] == {}  # pairs=0: no speed-up measured
    assert "No speed-ups measured (pairs=0)." in (result.run_dir / "quantize.md").read_text()


@pytest.mark.slow
def test_qat_torch_fine_tunes_in_the_training_loop_and_runs_int8(trained, tmp_path):
    result = quantize(trained["torch"], tmp_path, "method=qat", "qat.steps=6", "onnx=false", *QUICK)
    assert result.returncode == 0, result.stderr[-3000:]
    # The training job's own loop did the fine-tuning: its metrics and summary, 6 steps.
    steps = [json.loads(line) for line in (result.run_dir / "qat" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "loss" in s] == list(range(1, 7))
    assert json.loads((result.run_dir / "qat" / "summary.json").read_text())["eval"]["val_samples"] == 256
    table = rows(result.run_dir)
    assert_close_to_fp32(table)
    compiled = table[("model.torch.qat.pt2", "torch.compile (inductor)")]
    assert compiled["precision"] == "qat" and compiled["effective"].startswith("int8 kernels")


@pytest.mark.slow
def test_paddle_static_and_qat_run_onednn_int8_kernels(trained, tmp_path):
    """A multirun over two methods: one table, and Paddle Inference's int8 read from the program
    it runs after its passes (fused_conv2d with mkldnn_data_type=int8)."""
    args = [str(trained["paddle"]), "method=static,qat", "qat.steps=3", *QUICK, "pairs=0"]
    sweep = tmp_path / "multirun"
    proc = subprocess.run(
        [sys.executable, "-m", "unitrain.quantize", "-m", *args, f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Paddle's quantizers' progress bars and notes on their own calls stay in the jobs' logs.
    assert [n for n in QUANTIZER_NOISE if n in proc.stdout + proc.stderr] == [], proc.stderr[-3000:]
    assert "Sampling stage" in (sweep / "0_own_static" / "quantize.log").read_text()
    for job, method in (("0_own_static", "static"), ("1_own_qat", "qat")):
        table = rows(sweep / job)
        assert_close_to_fp32(table)
        name = f"model.paddle.{method}.pdmodel"
        int8 = table[(name, "paddle.inference (IR + oneDNN int8)")]
        # Static PTQ quantizes every conv and the classifier; ImperativeQuantAware leaves a few
        # convs in fp32 (4 of 21 on ResNet18), and the column counts them.
        assert int8["effective"].startswith("int8 kernels") and int8["kernels"]["int8"] > 0
        assert (
            int8["kernels"]["float"] == 0 if method == "static" else int8["kernels"]["int8"] > int8["kernels"]["float"]
        )
        assert int8["size_vs_fp32"] < 0.5  # int8 weights; the tiny model's program is a large part of it
        # The same program without int8 allowed only simulates it.
        assert table[(name, "paddle.inference (IR + oneDNN)")]["effective"] == "simulated (fake-quant, fp32 kernels)"
        assert table[("model.paddle.json", "paddle.inference (IR + oneDNN)")]["effective"] == "fp32"
    combined = (sweep / "quantize.md").read_text()
    assert "model.paddle.static.pdmodel" in combined and "model.paddle.qat.pdmodel" in combined
    assert (sweep / "quantize.png").stat().st_size > 0
    # The comparison report carries the same table (the QAT job's fine-tuning is its training row).
    compare = subprocess.run(
        [sys.executable, "-m", "unitrain.compare", str(sweep)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compare.returncode == 0, compare.stderr[-2000:]
    report = (sweep / "comparison.md").read_text()
    assert (
        "## Quantization" in report
        and "model.paddle.qat.pdmodel" in report
        and "Quantization" in (sweep / "report.html").read_text()
    )


@pytest.mark.slow
def test_paddle_dynamic_is_shown_as_simulated_not_int8(trained, tmp_path):
    """paddle.quantization's weight-only convert keeps float32 weights: the table must say so.
    Without quantized activations oneDNN has no int8 scales (its int8 mode gave chance-level
    logits on this program), so there is no int8 row."""
    result = quantize(trained["paddle"], tmp_path, "method=dynamic", *QUICK)
    assert result.returncode == 0, result.stderr[-3000:]
    table = rows(result.run_dir)
    assert_close_to_fp32(table)
    native = table[("model.paddle.dynamic.pdmodel", "paddle.inference (IR + oneDNN)")]
    assert native["effective"] == "simulated (fake-quant, fp32 kernels)" and native["size_vs_fp32"] > 0.9
    assert ("model.paddle.dynamic.pdmodel", "paddle.inference (IR + oneDNN int8)") not in table
    ort = table[("model.paddle.dynamic.onnx", "onnxruntime")]
    assert ort["effective"] == "int8 kernels" and ort["size_vs_fp32"] < 0.5  # ConvInteger


@pytest.mark.parametrize(
    "args,expected",
    [
        (["method=int4"], "method='int4' is not allowed: one of dynamic, static, qat"),
        (["method=qat", "qat.steps=0"], "qat.steps=0 is not allowed: an integer >= 1"),
        (["calib_batches=100000"], "calib_batches=100000 is not allowed: at most"),
        (["calib_batches=0"], "calib_batches=0 is not allowed: an integer >= 1"),
        (["backend=jax"], "backend='jax' is not allowed: one of paddle, torch"),
        (["calib_batchez=3"], "calib_batchez is not a config key"),
    ],
)
def test_bad_input_gives_one_line(trained, tmp_path, args, expected):
    result = quantize(trained["torch"], tmp_path, *args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert expected in lines[-1], lines[-1]
    assert not (result.run_dir / "quantize.json").exists() and not (result.run_dir / "int8").exists()


@pytest.mark.parametrize("pairs", [1, -2, 101])
def test_pairs_are_none_or_at_least_two(pairs):
    from unitrain.config.schema import QuantizeConfig
    from unitrain.deploy.quantize import validate
    from unitrain.errors import ConfigError

    with pytest.raises(ConfigError, match="0 .no speed-ups. or 2 to 100"):
        validate(QuantizeConfig(source="run", pairs=pairs))
    validate(QuantizeConfig(source="run", pairs=0))


def test_missing_source_is_one_line(tmp_path):
    result = run_unitrain(["method=static"], tmp_path, module="unitrain.quantize")
    assert result.returncode == 2 and "source=None is not allowed" in result.stderr.strip().splitlines()[-1]
    nowhere = run_unitrain([str(tmp_path / "no-such-run"), "method=static"], tmp_path, module="unitrain.quantize")
    assert (
        nowhere.returncode == 2
        and "Traceback" not in nowhere.stderr
        and "no-such-run" in nowhere.stderr.strip().splitlines()[-1]
    )


def test_missing_torchao_names_the_extra_before_any_work(trained, tmp_path):
    blocked = tmp_path / "blocked" / "torchao"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('No module named torchao', name='torchao')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked.parent), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "unitrain.quantize", str(trained["torch"]), "method=static", f"hydra.run.dir={out}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "pip install 'unitrain[quantize]'" in proc.stderr.strip().splitlines()[-1]
    assert not (out / "fp32").exists()
