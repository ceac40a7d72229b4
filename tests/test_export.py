"""Export and inference: every artifact, from either framework's checkpoint, computes what the
checkpoint's model computes, in the runtime that deploys it; the benchmark runs them all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BACKENDS, FAST, run_unitrain
from unitrain.model.build import build_model

TRAIN = [*FAST, "data=learnable", "data.val_samples=24", "trainer.steps=4", "trainer.checkpoint_every=4"]
FOUR = {"model.torch.pt2", "model.torch.onnx", "model.paddle.json", "model.paddle.onnx"}


def cli(module: str, *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[-1]


# Its export takes 10 s and more: every test that uses it is marked slow.
@pytest.fixture(scope="module", params=BACKENDS)
def exported(request, tmp_path_factory):
    """A short run of each backend, exported to both formats for both frameworks."""
    backend = request.param
    root = tmp_path_factory.mktemp(f"export-{backend}")
    trained = run_unitrain([f"backend={backend}", *TRAIN], root)
    assert trained.returncode == 0, trained.stderr[-2000:]
    proc = cli("unitrain.export", str(trained.run_dir), "--format", "native,onnx", "--to", "torch,paddle", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return backend, trained.run_dir, trained.run_dir / "export"


def checkpoint_logits(backend_name: str, run_dir: Path, images: np.ndarray) -> np.ndarray:
    """The checkpoint's model in its own framework, in inference mode (the export's reference)."""
    from unitrain.interface.backend import get_backend

    backend = get_backend(backend_name)
    step = (run_dir / "checkpoints" / "latest").read_text().strip()
    with np.load(run_dir / "checkpoints" / step / "model.npz") as f:
        arrays = {k: f[k] for k in f.files}
    model = build_model(backend, "tiny", 10)
    backend.load_state_arrays(model, arrays)
    model.eval()
    if backend_name == "torch":
        import torch

        with torch.no_grad():
            return model(torch.from_numpy(images)).numpy()
    import paddle

    with paddle.no_grad():
        return model(paddle.to_tensor(images)).numpy()


def artifact_logits(name: str, directory: Path, images: np.ndarray) -> np.ndarray:
    """Each artifact in its deployment runtime, with plain framework code only."""
    path = directory / name
    if name.endswith(".onnx"):
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: images})[0]
    if name.endswith(".pt2"):
        import torch

        with torch.no_grad():
            return torch.export.load(str(path)).module()(torch.from_numpy(images)).numpy()
    from paddle import inference

    predictor = inference.create_predictor(inference.Config(str(path), str(path.with_suffix(".pdiparams"))))
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    handle.reshape(list(images.shape))
    handle.copy_from_cpu(images)
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


@pytest.mark.slow
def test_one_checkpoint_gives_four_artifacts_that_compute_what_it_computes(exported):
    backend, run_dir, directory = exported
    manifest = json.loads((directory / "export.json").read_text())
    assert set(manifest["artifacts"]) == FOUR
    assert manifest["source"]["framework"] == backend and manifest["cpu"]["extensions"] is not None
    # A batch size the export's own check did not use (1 and 8): the batch dimension is dynamic.
    images = np.random.default_rng(5).standard_normal((5, 3, 16, 16)).astype(np.float32)
    expected = checkpoint_logits(backend, run_dir, images)
    for name, entry in manifest["artifacts"].items():
        assert entry["batch"] is None and entry["relative_diff"] <= entry["tolerance"], (name, entry)
        got = artifact_logits(name, directory, images)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * max(1.0, np.abs(expected).max()), err_msg=name)
        assert (got.argmax(1) == expected.argmax(1)).all(), name


@pytest.mark.slow
def test_fixed_batch_export_and_refusals_keep_what_exists(exported, tmp_path):
    backend, run_dir, directory = exported
    out = tmp_path / "fixed"
    proc = cli("unitrain.export", str(run_dir), "--format", "onnx", "--batch", "3", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    name = f"model.{backend}.b3.onnx"
    import onnxruntime as ort

    assert ort.InferenceSession(str(out / name)).get_inputs()[0].shape[0] == 3
    if backend != "paddle":
        # Refusing is the export's, whichever framework trained: one source framework is enough,
        # and each refusal costs a whole export first (the name is found taken only when moved in).
        return
    before = (out / "export.json").read_text()
    # The same artifact again: refused, nothing overwritten.
    again = cli("unitrain.export", str(run_dir), "--format", "onnx", "--batch", "3", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in one_line(again.stderr)
    # A tolerance no fp32 runtime meets: the artifact is refused and not kept, nor any after it
    # (the first refused ends the export: Paddle's first, so that torch is never imported).
    strict = cli(
        "unitrain.export",
        str(run_dir),
        "--format",
        "onnx",
        "--to",
        "paddle,torch",
        "--tolerance",
        "1e-30",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert strict.returncode == 1 and "computes something else than the checkpoint" in one_line(strict.stderr)
    assert (out / "export.json").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == sorted(["export.json", name])


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, says",
    [
        (["--format", "tflite"], "--format='tflite' is not allowed"),
        (["--to", "jax"], "--to='jax' is not allowed"),
        (["--batch", "0"], "--batch='0' is not allowed"),
        (["--tolerance", "nan"], "--tolerance=nan is not allowed"),
    ],
)
def test_export_bad_options_are_one_line(exported, tmp_path, args, says):
    _, run_dir, _ = exported
    proc = cli("unitrain.export", str(run_dir), *args, "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert proc.returncode == 2 and says in one_line(proc.stderr)
    assert not (tmp_path / "x" / "export.json").exists()


def test_export_of_a_run_without_checkpoints_is_one_line(tmp_path):
    run = run_unitrain(["backend=torch", *FAST, "trainer.steps=1"], tmp_path)
    assert run.returncode == 0
    proc = cli("unitrain.export", str(run.run_dir), cwd=tmp_path)
    assert proc.returncode == 2 and "is not a checkpoint" in one_line(proc.stderr)


@pytest.mark.slow
def test_infer_runs_every_artifact_in_every_runtime_and_reports(exported, tmp_path):
    backend, run_dir, directory = exported
    if backend != "torch":
        pytest.skip("one source framework is enough: the artifacts are the same four kinds")
    timing = ["--threads", "1", "--warmup", "1", "--min-iters", "3", "--min-time", "0"]
    out = tmp_path / "bench"
    # The ONNX file named first is the reference (the first row): each ratio process then loads
    # ONNX Runtime beside its candidate, not torch or Paddle too; the run directory brings the rest.
    # Two pairs, one process per row: the spread over processes is shown below, on ONNX alone.
    proc = cli(
        "unitrain.infer",
        str(directory / "model.torch.onnx"),
        str(run_dir),
        "--batch",
        "1,4",
        *timing,
        "--pairs",
        "2",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "inference.json").read_text())
    # Every row's speed against the first row is a ratio of interleaved pairs, with its interval.
    first = result["reference"]
    assert (first["name"], first["runtime"]) == ("model.torch.onnx", "onnxruntime")
    for row in result["rows"]:
        if (row["name"], row["runtime"]) != (first["name"], first["runtime"]):
            pair = row["vs_reference"]
            assert pair["pairs"] == 2 and pair["low"] <= pair["median"] <= pair["high"], row
    runtimes = {(r["name"], r["runtime"]) for r in result["rows"]}
    assert {name for name, _ in runtimes} == FOUR
    assert len(runtimes) == 7  # 2 torch, 3 paddle, ONNX Runtime on each ONNX file
    for row in result["rows"]:
        assert "error" not in row, row
        assert set(row["latency"]) == {"1", "4"} and row["latency"]["1"]["p50_ms"] > 0
        assert row["accuracy"]["samples"] == 24
    # The same model everywhere: every runtime classifies the held-out set the same way.
    top1 = {r["accuracy"]["top1"] for r in result["rows"]}
    assert max(top1) - min(top1) <= 1 / 24
    compiled = next(r for r in result["rows"] if r["runtime"].startswith("torch.compile"))
    assert compiled["observed"]["compiled_graphs"] >= 1
    optimized = next(r for r in result["rows"] if r["runtime"] == "paddle.inference (IR + oneDNN)")
    assert optimized["observed"]["ir_optim"] is True
    assert result["cpu"]["extensions"] is not None
    assert (out / "inference.png").stat().st_size > 0 and "held-out top-1" in (out / "inference.md").read_text()
    # The comparison report of the run shows the inference table too.
    shutil.copytree(out, run_dir / "inference" / "bench")
    report = cli("unitrain.compare", str(run_dir), "--out", str(tmp_path / "report"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "torch.compile (inductor)" in (tmp_path / "report" / "comparison.md").read_text()
    # An existing result is never overwritten.
    again = cli("unitrain.infer", str(run_dir), "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "already holds inference.json" in one_line(again.stderr)
    # Two pairs to a process: the interval sees what differs between processes too.
    onnx = [str(directory / name) for name in ("model.torch.onnx", "model.paddle.onnx")]
    spread = cli(
        "unitrain.infer", *onnx, "--batch", "1", *timing, "--pairs", "4", "--out", str(tmp_path / "s"), cwd=tmp_path
    )
    assert spread.returncode == 0, spread.stderr[-3000:]
    (row,) = [r for r in json.loads((tmp_path / "s" / "inference.json").read_text())["rows"] if "vs_reference" in r]
    pair = row["vs_reference"]
    assert pair["pairs"] == 4 and pair["low"] <= pair["median"] <= pair["high"], row
    assert pair["processes"] == 2 and [len(p) for p in pair["by_process"]] == [2, 2], row


@pytest.mark.slow
def test_infer_corrupt_or_missing_artifact_is_one_line(exported, tmp_path):
    backend, _, directory = exported
    if backend != "paddle":
        pytest.skip("one copy is enough")
    copy = shutil.copytree(directory, tmp_path / "export")
    missing = cli("unitrain.infer", str(copy / "model.none.onnx"), cwd=tmp_path)
    assert missing.returncode == 2 and "does not exist" in one_line(missing.stderr)
    (copy / "model.torch.onnx").write_bytes(b"not a model")
    corrupt = cli(
        "unitrain.infer",
        str(copy / "model.torch.onnx"),
        "--batch",
        "1",
        "--min-iters",
        "1",
        "--min-time",
        "0",
        "--out",
        str(tmp_path / "o"),
        cwd=tmp_path,
    )
    # No runtime reads it: the artifact is refused in one line, and nothing is written.
    assert corrupt.returncode == 2 and corrupt.stderr.count("\n") == 1, corrupt.stderr
    assert "model.torch.onnx could not be read by any runtime (onnxruntime" in one_line(corrupt.stderr)
    assert not (tmp_path / "o").exists()
    os.remove(copy / "model.paddle.pdiparams")
    gone = cli("unitrain.infer", str(copy), cwd=tmp_path)
    assert gone.returncode == 2 and "model.paddle.pdiparams is missing" in one_line(gone.stderr)


@pytest.mark.slow
def test_a_missing_runtime_names_the_extra_to_install(exported, tmp_path):
    """onnxruntime and paddle2onnx shadowed by packages that fail to import, as when the
    ``export`` extra is not installed."""
    backend, run_dir, directory = exported
    if backend != "paddle":
        pytest.skip("one source framework is enough")
    blocked = tmp_path / "blocked"
    for name in ("onnxruntime", "paddle2onnx"):
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(
            f"raise ImportError({f'No module named {name}'!r}, name={name!r})\n"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")])}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    export = run("unitrain.export", str(run_dir), "--format", "onnx", "--out", str(tmp_path / "x"))
    assert export.returncode == 2 and "pip install 'unitrain[export]'" in one_line(export.stderr)
    assert not (tmp_path / "x" / "export.json").exists()
    infer = run(
        "unitrain.infer",
        str(directory / "model.torch.onnx"),
        "--batch",
        "1",
        "--min-iters",
        "1",
        "--min-time",
        "0",
        "--out",
        str(tmp_path / "o"),
    )
    assert infer.returncode == 1 and "pip install 'unitrain[export]'" in one_line(infer.stderr)
