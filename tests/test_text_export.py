"""Export, inference and dynamic int8 of a language model: a gpt_nano run on a few KB of this
repository's docs, exported for both frameworks with int64 ids ``[batch, time]`` whose batch and
time axes are dynamic, each artifact checked at the full context and at half of it; timed in
every runtime with tokens/s; quantized to int8 dynamically by torchao, Paddle and ONNX Runtime,
what ran observed from the runtimes, the logits close to fp32's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import numpy as np
import pytest

from conftest import refusal, run_unitrain

pytestmark = pytest.mark.filterwarnings(
    # Paddle's PIR tracer on the converted gallery model's .contiguous() (model=custom).
    "ignore:Tensor do not have '.*' interface:UserWarning",
)

ROOT = Path(__file__).resolve().parents[1]
#: gpt_nano's context (the export's example and its dynamic time axis' upper end) and vocabulary
#: (the characters of the corpus below).
BLOCK = 32
#: About 6 KB of the docs, whole lines: the 10% held out is 18 windows of 32 characters.
CORPUS_BYTES = 6000
TRAIN = [
    "backend=torch",
    "model=gpt_nano",
    "data=text",
    "optim=adamw",
    "trainer.steps=10",
    "trainer.checkpoint_every=10",
    "trainer.threads=1",
    "trainer.progress=false",
]
FOUR = {"model.torch.pt2", "model.torch.onnx", "model.paddle.json", "model.paddle.onnx"}
#: The quantize runs, short: one batch size (torch.compile compiles once per batch size).
QUICK = ["batches=[4]", "min_time_s=0", "min_iters=2", "warmup=1", "eval_samples=16"]
#: gpt_nano's Linears: qkv, proj, fc1, fc2 in each of its 2 blocks, and the tied head (torch
#: F.linear on the token embedding; Paddle a matmul of the embedding, not a Linear layer).
LINEARS = 9
#: The attention's two matmuls of activations (q.k and p.v) per block: no weight, never int8.
ACTIVATION_MATMULS = 4

#: max |int8 - fp32| / max |fp32| over 16 held-out windows, the int8 and fp32 artifacts run by
#: the same runtime. Measured on this test's run (10 steps, held-out loss about 3.8) with
#: trainer.seed=0 and 1: torchao's int8 weights (per channel, dequantized for fp32 compute)
#: 3.4e-3 and 4.3e-3; Paddle's PTQ (per-tensor absmax weights, simulated) 2.6e-3 and 4.0e-3;
#: ONNX Runtime's dynamic int8 (uint8 activations quantized per tensor at run time, int8
#: weights) 7.5e-3 and 8.1e-3, the same from either framework's ONNX. Bounded at 3.5-4x the
#: larger; below the floor nothing was quantized (fp32 rounding alone is about 1e-6).
INT8_REL = {"torch": 1.5e-2, "paddle": 1.5e-2, "onnx": 3e-2}
INT8_FLOOR = 1e-4
#: Held-out loss (nats per token) of int8 against fp32, same runs: within 3e-4 in every runtime
#: (next-token top-1 within 0.2 points); bounded at 5e-3.
LOSS_DELTA = 5e-3


def cli(module: str, *args: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[-1]


def write_corpus(path: Path) -> Path:
    """Whole lines of the docs, in name order, up to CORPUS_BYTES."""
    lines, size = [], 0
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for line in doc.read_text(encoding="utf-8").splitlines(keepends=True):
            if size + len(line.encode()) > CORPUS_BYTES:
                break
            lines.append(line)
            size += len(line.encode())
    path.write_text("".join(lines), encoding="utf-8")
    return path


def rel(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / np.abs(want).max())


# --- fast: the exporters' dynamic time axis, the check data, the refusals -------------------------
def test_torch_export_keeps_the_time_axis_dynamic_up_to_the_context(tmp_path):
    """An example whose ids carry their context length: the ExportedProgram takes any batch and
    1 to BLOCK tokens, and computes what the model does at each length."""
    import torch

    from unitrain.interface.export import export_module
    from unitrain.interface.infer import infer_module
    from unitrain.tasks.language_export import token_ids

    model = build("torch")
    ids = np.random.default_rng(0).integers(0, 50, (4, BLOCK)).astype(np.int64)
    (path,) = export_module("torch").save_native(model, tmp_path / "m", token_ids(ids, BLOCK), None)
    eager = infer_module("torch").runtimes(path, 2)[0]
    eager.load()
    assert eager.input_dtype == np.int64
    for rows, length in ((4, BLOCK), (1, BLOCK // 2), (3, 1)):
        with torch.no_grad():
            want = model(torch.from_numpy(ids[:rows, :length])).numpy()
        assert rel(eager.run(eager.prepare(ids[:rows, :length])), want) <= 1e-5, (rows, length)


def test_paddle_export_keeps_the_time_axis_dynamic_natively_and_in_onnx(tmp_path):
    """The program's input is [None, None] int64; Paddle Inference and ONNX Runtime (paddle2onnx)
    run it at every length up to the context, and nothing was pip-installed on the way (paddle2onnx's
    optimizer would fetch onnx_graphsurgeon: unitrain turns it off)."""
    import paddle

    from unitrain.deploy.runtimes import OnnxRuntime
    from unitrain.interface.export import export_module
    from unitrain.interface.infer import infer_module
    from unitrain.tasks.language_export import token_ids

    before = installed()
    model = build("paddle")
    ids = np.random.default_rng(0).integers(0, 50, (4, BLOCK)).astype(np.int64)
    exporters = export_module("paddle")
    native = exporters.save_native(model, tmp_path / "m", token_ids(ids, BLOCK), None)
    (onnx,) = exporters.save_onnx(model, tmp_path / "m", token_ids(ids, BLOCK), None)
    predictor = infer_module("paddle").runtimes(native[0], 2)[0]
    session = OnnxRuntime(onnx, 2)
    for runtime in (predictor, session):
        runtime.load()
    assert [i.shape for i in session.session.get_inputs()][0][1] != BLOCK  # a named, dynamic axis
    for rows, length in ((4, BLOCK), (1, BLOCK // 2), (3, 1)):
        with paddle.no_grad():
            want = model(paddle.to_tensor(ids[:rows, :length])).numpy()
        for runtime in (predictor, session):
            assert rel(runtime.run(runtime.prepare(ids[:rows, :length])), want) <= 1e-5, (runtime.name, length)
    assert installed() == before


def installed() -> set:
    from importlib.metadata import distributions

    return {d.metadata["Name"] for d in distributions()}


def build(framework: str):
    from unitrain.interface.backend import get_backend
    from unitrain.model.build import build_model

    model = build_model(get_backend(framework), "gpt_nano", 50)
    model.eval()
    return model


def test_a_gone_corpus_checks_on_seeded_random_ids_and_says_so(tmp_path):
    """Without the corpus (or the tokenizer) the check data are random ids in [0, vocab), the
    same ones every time, and the description says which and why."""
    from unitrain.deploy import artifacts

    cfg = artifacts.job_config(
        {"model": {"name": "gpt_nano"}, "data": {"name": "text", "path": str(tmp_path / "gone.txt")}}
    )
    data, said = artifacts.held_out(cfg, 8, tmp_path / "tokenizer.json", 50)
    ids, labels = artifacts.stack(data, range(8))
    assert ids.dtype == np.int64 and ids.shape == (8, BLOCK) and labels.shape == (8, BLOCK)
    assert ids.min() >= 0 and ids.max() < 50 and (ids[:, 1:] == labels[:, :-1]).all()
    assert (artifacts.stack(artifacts.held_out(cfg, 8, None, 50)[0], range(8))[0] == ids).all()
    assert said.startswith("random token ids in [0, 50)") and "tokenizer" in said


@pytest.mark.parametrize(
    "overrides, says",
    [
        # Dynamic quantization calibrates nothing: its calibration settings are not read.
        (["method=dynamic", "calib_batch_size=0", "calib_batches=0"], None),
        (["method=static", "calib_batch_size=0"], "calib_batch_size=0 is not allowed: an integer >= 1"),
    ],
)
def test_dynamic_quantization_reads_no_calibration_setting(tmp_path, overrides, says):
    said = refusal([f"source={tmp_path}", *overrides], tmp_path, "unitrain.quantize")
    assert (said is None) if says is None else (says in said), said


@pytest.mark.parametrize(
    "module, args, says",
    [
        ("export", ["--batch=0"], "--batch='0' is not allowed: positive integers"),
        ("export", ["--format=pt2"], "--format='pt2' is not allowed"),
        ("infer", ["--batch=0"], "--batch='0' is not allowed: positive integers"),
    ],
)
def test_bad_options_are_one_line(tmp_path, capsys, module, args, says):
    import importlib

    main = importlib.import_module(f"unitrain.{module}").main
    assert main([str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


# --- slow: one trained run, exported, timed and quantized ----------------------------------------
@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("text-run")
    corpus = write_corpus(root / "docs.txt")
    trained = run_unitrain([*TRAIN, f"data.path={corpus}"], root)
    assert trained.returncode == 0, trained.stderr[-3000:]
    return trained.run_dir


@pytest.fixture(scope="module")
def exported(text_run):
    proc = cli("unitrain.export", str(text_run), "--format", "native,onnx", "--to", "torch,paddle", cwd=text_run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return text_run / "export", proc.stdout


def manifest_of(directory: Path) -> Dict:
    return json.loads((directory / "export.json").read_text())


def reference_logits(run_dir: Path, ids: np.ndarray) -> np.ndarray:
    """The checkpoint's model, in torch (it trained it), in inference mode."""
    import torch

    from unitrain.interface.backend import get_backend
    from unitrain.model.build import build_model

    step = (run_dir / "checkpoints" / "latest").read_text().strip()
    meta = json.loads((run_dir / "checkpoints" / step / "meta.json").read_text())
    with np.load(run_dir / "checkpoints" / step / "model.npz") as f:
        arrays = {k: f[k] for k in f.files}
    backend = get_backend("torch")
    model = build_model(backend, "gpt_nano", meta["num_classes"])
    backend.load_state_arrays(model, arrays)
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids)).numpy()


def loaded(directory: Path, name: str, runtime_name: str | None = None):
    from unitrain.deploy import artifacts
    from unitrain.deploy.runtimes import runtimes_for

    (artifact,) = [a for a in artifacts.locate(str(directory))[1] if a.name == name]
    runtime = next(r for r in runtimes_for(artifact, 2) if runtime_name in (None, r.name))
    runtime.load()
    return runtime


@pytest.mark.slow
def test_a_language_model_exports_natively_and_to_onnx_for_both_frameworks(exported, text_run):
    """Four artifacts, each checked by its own runtime at the full context and half of it, at
    batch 1 and 8, on held-out windows of the run's corpus; the manifest says what they take, and
    the run's tokenizer goes with them. Read back here at a length the export did not check (5),
    each gives the checkpoint's logits."""
    from unitrain.deploy import artifacts

    directory, said = exported
    manifest = manifest_of(directory)
    assert set(manifest["artifacts"]) == FOUR
    assert manifest["input"] == {
        "kind": "tokens",
        "dtype": "int64",
        "shape": [None, None],
        "axes": ["batch", "time"],
        "max_length": BLOCK,
        "vocab_size": manifest["input"]["vocab_size"],
        "tokenizer": "tokenizer.json",
    }
    assert manifest["check_data"].startswith("held-out token windows of ") and "docs.txt" in manifest["check_data"]
    assert (directory / "tokenizer.json").read_text() == (text_run / "tokenizer.json").read_text()
    for entry in manifest["artifacts"].values():
        assert entry["checked_lengths"] == [BLOCK, BLOCK // 2] and entry["checked_batches"] == [1, 8], entry
        assert entry["relative_diff"] <= 1e-5 and entry["top1_agreement"] == 1.0, entry
    assert said.count(f"at {BLOCK} and {BLOCK // 2} tokens") == 4, said

    data, _ = artifacts.evaluation_data(manifest, directory, 8)
    ids = artifacts.stack(data, range(3))[0][:, :5]
    want = reference_logits(text_run, ids)
    for name in FOUR:
        runtime = loaded(directory, name)
        assert runtime.input_dtype == np.int64, name
        assert rel(runtime.run(runtime.prepare(ids)), want) <= 1e-5, name


@pytest.mark.slow
def test_infer_times_every_artifact_in_tokens_per_second(exported, tmp_path):
    directory, _ = exported
    out = tmp_path / "inference"
    args = ["--batch", "4", "--min-time", "0", "--min-iters", "2", "--warmup", "1", "--pairs", "0"]
    proc = cli("unitrain.infer", str(directory), *args, "--eval-samples", "16", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "inference.json").read_text())
    assert result["inputs"] == ["tokens"]
    runtimes = {(r["name"], r["runtime"]) for r in result["rows"]}
    assert {n for n, _ in runtimes} == FOUR and len(runtimes) == 7  # 3 Paddle, 2 torch, 2 ONNX Runtime
    losses = []
    for row in result["rows"]:
        assert "error" not in row, row
        timed = row["latency"]["4"]
        assert timed["tokens_per_s"] == pytest.approx(timed["throughput_ips"] * BLOCK), row
        # Next-token top-1 and loss over every position of the 16 windows.
        assert row["accuracy"]["predictions"] == 16 * BLOCK and row["eval_data"].startswith("held-out token windows")
        losses.append(row["accuracy"]["loss"])
    assert max(losses) - min(losses) < 1e-4  # every runtime computes the same model
    table = (out / "inference.md").read_text()
    assert "tokens/s (batch 4)" in table and "held-out next-token top-1" in table and "img/s" not in table


def quantize(run_dir: Path, out: Path, *overrides: str, pairs: int = 0):
    """No speed-ups unless a test asserts them (``pairs``): each is a process of its own that
    loads, and torch.compile compiles, both models again."""
    args = [str(run_dir), "method=dynamic", *QUICK, *overrides, f"pairs={pairs}"]
    return run_unitrain(args, out, module="unitrain.quantize", timeout=900)


def quantized_rows(run_dir: Path) -> Dict:
    report = json.loads((run_dir / "quantize.json").read_text())
    return {(r["file"], r["runtime"]): r for r in report["rows"]}


def int8_against_fp32(out: Path, int8: str, fp32: str, runtime: str) -> float:
    """max |int8 - fp32| / max |fp32| over 16 held-out windows, both run by ``runtime``."""
    from unitrain.deploy import artifacts

    data, _ = artifacts.evaluation_data(manifest_of(out / "fp32"), out / "fp32", 16)
    ids = artifacts.stack(data, range(16))[0]
    a, b = loaded(out / "int8", int8, runtime), loaded(out / "fp32", fp32, runtime)
    return rel(a.run(a.prepare(ids)), b.run(b.prepare(ids)))


@pytest.mark.slow
def test_dynamic_int8_in_torch_and_onnx_runtime_is_observed_and_close_to_fp32(text_run, tmp_path):
    """torchao stores every Linear's weight int8 (the tied head's too) and computes in fp32 (the
    runtimes' graphs say so); ONNX Runtime's dynamic quantization runs every Linear as an integer
    kernel and leaves the attention's activation matmuls float. Logits and held-out loss stay
    close to fp32; every speed-up is an interval of interleaved pairs."""
    result = quantize(text_run, tmp_path, pairs=2)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.run_dir
    table = quantized_rows(out)
    for runtime in ("torch eager (torch.export.load)", "torch.compile (inductor)"):
        row = table[("model.torch.dynamic.pt2", runtime)]
        assert row["effective"] == "int8 weights, fp32 compute" and row["kernels"]["dequantize"] == LINEARS, row
    ort = table[("model.torch.dynamic.onnx", "onnxruntime")]
    assert ort["kernels"]["int8"] == LINEARS and ort["kernels"]["float"] == ACTIVATION_MATMULS, ort
    assert ort["effective"] == f"int8 kernels ({LINEARS} of {LINEARS + ACTIVATION_MATMULS} conv/linear)"
    for row in table.values():
        assert "FAILED" not in row["effective"], row
        assert abs(row["loss_delta"]) <= LOSS_DELTA, row
        if row["precision"] == "dynamic":
            speedup = row["speedup"]["4"]
            assert speedup["pairs"] == 2 and speedup["low"] <= speedup["median"] <= speedup["high"], row
    got = int8_against_fp32(out, "model.torch.dynamic.pt2", "model.torch.pt2", "torch eager (torch.export.load)")
    assert INT8_FLOOR < got <= INT8_REL["torch"], got
    got = int8_against_fp32(out, "model.torch.dynamic.onnx", "model.torch.onnx", "onnxruntime")
    assert INT8_FLOOR < got <= INT8_REL["onnx"], got
    report = json.loads((out / "quantize.json").read_text())
    assert report["settings"]["calib_batches"] == 0 and report["input"]["kind"] == "tokens"
    md = (out / "quantize.md").read_text()
    assert "held-out loss" in md and "tokens/s (batch 4)" in md and "calibration: none" in md


@pytest.mark.slow
def test_dynamic_int8_in_paddle_is_observed_as_simulated_and_close_to_fp32(text_run, tmp_path):
    """Paddle has no run-time activation quantization on a CPU: its PTQ with weight observers
    keeps the int8-rounded weights in float32 behind dequantize ops (8 Linear layers; the tied
    head is a matmul of the embedding), which the runtime reports as simulated. A torch
    checkpoint, quantized in Paddle; ONNX Runtime's row from Paddle's ONNX runs integer kernels."""
    result = quantize(text_run, tmp_path, "backend=paddle")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.run_dir
    table = quantized_rows(out)
    for runtime in ("paddle.inference (IR + oneDNN)", "paddle.inference (no IR optim)"):
        row = table[("model.paddle.dynamic.pdmodel", runtime)]
        assert row["effective"] == "simulated (fake-quant, fp32 kernels)", row
        assert row["kernels"]["quantize"] == LINEARS - 1 and row["kernels"]["int8"] == 0, row
    ort = table[("model.paddle.dynamic.onnx", "onnxruntime")]
    assert ort["effective"].startswith("int8 kernels") and ort["kernels"]["int8"] == LINEARS, ort
    for row in table.values():
        assert "FAILED" not in row["effective"] and abs(row["loss_delta"]) <= LOSS_DELTA, row
    native = ("model.paddle.dynamic.pdmodel", "model.paddle.json", "paddle.inference (no IR optim)")
    assert INT8_FLOOR < int8_against_fp32(out, *native) <= INT8_REL["paddle"]
    got = int8_against_fp32(out, "model.paddle.dynamic.onnx", "model.paddle.onnx", "onnxruntime")
    assert INT8_FLOOR < got <= INT8_REL["onnx"], got


@pytest.mark.slow
def test_static_calibration_past_the_corpus_is_one_line(text_run, tmp_path):
    """Static quantization calibrates on the corpus's training windows: asking for more than it
    holds is one line naming how many there are."""
    result = quantize(text_run, tmp_path, "method=static", "calib_batches=1000", "backend=paddle")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "calib_batches=1000 is not allowed: at most" in line and "token windows" in line, line


@pytest.mark.slow
def test_dynamic_quantization_of_a_short_image_run_needs_no_calibration_data(tmp_path):
    """The bug this fixed: 8 training images (fewer than one calibration batch of 32) made
    dynamic quantization refuse ``calib_batches=1``, though it calibrates nothing."""
    trained = run_unitrain(
        [
            "backend=paddle",
            "model=tiny",
            "data.image_size=16",
            "data.num_samples=8",
            "trainer.batch_size=8",
            "trainer.steps=1",
            "trainer.checkpoint_every=1",
            "trainer.threads=1",
            "trainer.progress=false",
        ],
        tmp_path / "train",
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    result = quantize(trained.run_dir, tmp_path / "quantize", "onnx=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((result.run_dir / "quantize.json").read_text())["settings"]["calib_batches"] == 0


@pytest.mark.slow
def test_a_custom_text_factory_exports_for_both_frameworks(tmp_path):
    """model=custom with the gallery's character LM (torch) and its converted Paddle half: the
    same export, int64 ids with a dynamic time axis up to data.block_size, checked at two lengths."""
    import shutil

    shutil.copytree(ROOT / "examples" / "gallery", tmp_path / "gallery", ignore=shutil.ignore_patterns("__pycache__"))
    corpus = write_corpus(tmp_path / "docs.txt")
    custom = ["model=custom", "model.torch=gallery.char_lm:build", "model.paddle=convert", "data.block_size=16"]
    args = [a for a in TRAIN if not a.startswith("model=")] + custom + [f"data.path={corpus}"]
    trained = run_unitrain(args, tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    proc = cli("unitrain.export", str(trained.run_dir), "--format", "native,onnx", "--to", "torch,paddle", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = manifest_of(trained.run_dir / "export")
    assert set(manifest["artifacts"]) == FOUR and manifest["input"]["max_length"] == 16
    for entry in manifest["artifacts"].values():
        assert entry["checked_lengths"] == [16, 8] and entry["relative_diff"] <= 1e-5, entry
