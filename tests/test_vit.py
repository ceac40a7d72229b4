"""The built-in Vision Transformers: one spec, the same parameter names on both frameworks, so
shared initial weights, parity, conversion and export hold as for the ResNets."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import BACKENDS, run_unitrain
from unitrain.interface.backend import get_backend
from unitrain.model.build import build_model
from unitrain.model.custom import sized
from unitrain.model.weights import convert

VIT = ["model=vit_tiny", "data.image_size=16", "trainer.threads=1", "trainer.progress=false"]


def test_both_frameworks_build_the_same_vit_and_compute_the_same_logits():
    import paddle
    import torch

    spec = sized("vit_tiny", 16)
    t, p = get_backend("torch"), get_backend("paddle")
    mt, mp = build_model(t, spec, 10, init="shared", seed=3), build_model(p, spec, 10, init="shared", seed=3)
    torch_state, paddle_state = t.state_arrays(mt), convert(p.state_arrays(mp), "paddle", "torch")
    assert list(torch_state) == list(paddle_state)  # the same names, in the same order
    assert all(np.array_equal(torch_state[k], paddle_state[k]) for k in torch_state)
    x = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    mt.eval(), mp.eval()
    got, want = mp(paddle.to_tensor(x)).numpy(), mt(torch.from_numpy(x)).detach().numpy()
    assert np.abs(got - want).max() < 1e-5 * max(1.0, np.abs(want).max())


def test_vit_parity_within_tolerance(tmp_path):
    result = run_unitrain(["model=vit_tiny", "data.image_size=16", "steps=4"], tmp_path, module="unitrain.parity")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((result.run_dir / "parity.json").read_text())
    assert report["passed"] and report["max_rel_loss_diff"] < 1e-5
    assert report["first_batch_activations"]["first_beyond_tolerance"] is None
    assert report["first_batch_activations"]["layers_compared"] >= 15


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    runs = {}
    for backend in BACKENDS:
        root = tmp_path_factory.mktemp(f"vit_{backend}")
        args = [f"backend={backend}", *VIT, "trainer.steps=6", "trainer.checkpoint_every=6", "model.init=shared"]
        runs[backend] = run_unitrain(args, root)
        assert runs[backend].returncode == 0, runs[backend].stderr[-3000:]
    return runs


def test_vit_trains_on_both_from_the_same_weights(trained):
    first = {b: trained[b].metrics()[0]["loss"] for b in BACKENDS}
    assert abs(first["paddle"] - first["torch"]) < 1e-5 * abs(first["torch"]), first
    assert all(np.isfinite(r["loss"]) for b in BACKENDS for r in trained[b].metrics())


@pytest.mark.slow
def test_a_paddle_vit_exports_to_torch_and_onnx_checked(trained):
    run = trained["paddle"].run_dir
    done = subprocess.run(
        [sys.executable, "-m", "unitrain.export", str(run), "--format", "native,onnx", "--to", "torch,paddle"],
        cwd=run.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((run / "export" / "export.json").read_text())
    diffs = {name: a["max_abs_diff"] for name, a in manifest["artifacts"].items()}
    assert len(diffs) == 4 and max(diffs.values()) < 1e-4, diffs
    # Every runtime serves the exported ViT and classifies the held-out images alike.
    out = run.parent / "bench"
    args = ["--batch", "2", "--threads", "1", "--warmup", "1", "--min-iters", "2", "--min-time", "0", "--pairs", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "unitrain.infer", str(run), *args, "--eval-samples", "16", "--out", str(out)],
        cwd=run.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((out / "inference.json").read_text())["rows"]
    assert len(rows) == 7 and all("error" not in r for r in rows), rows
    top1 = {r["accuracy"]["top1"] for r in rows}
    assert max(top1) - min(top1) <= 1 / 16, top1


def test_an_image_size_the_patches_do_not_divide_is_refused(tmp_path):
    result = run_unitrain(["model=vit_tiny", "data.image_size=30", "trainer.steps=2"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "unitrain: error: data.image_size=30 is not allowed: a multiple of vit_tiny's patch size 4"
    ), result.stderr[-2000:]


#: What each quantize sweep below times and scores: little, as the tests assert kernels, not speed.
QUICK = ["pairs=0", "min_time_s=0.1", "min_iters=2", "eval_samples=32", "batches=[8]", "qat.steps=3"]
#: The methods quantized with each framework's toolkit, from the torch-trained ViT.
METHODS = {"torch": "dynamic,qat", "paddle": "static,qat"}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, trained):
    """``quantized(backend)``: the backend's methods quantized as one ``-m`` sweep, so that one
    quantize process (torch, Paddle and Hydra imported once) serves the tests of both methods;
    run when a test first asks for it. Returns the finished command and its sweep directory."""

    @functools.cache
    def sweep(backend: str) -> tuple:
        run = trained["torch"].run_dir
        folder = tmp_path_factory.mktemp(f"vit-quantize-{backend}") / "multirun"
        done = subprocess.run(
            [sys.executable, "-m", "unitrain.quantize", "-m", str(run), f"method={METHODS[backend]}"]
            + [f"backend={backend}", *QUICK, f"hydra.sweep.dir={folder}"],
            cwd=run.parent,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        return done, folder

    return sweep


def swept(quantized, backend: str, method: str) -> tuple:
    """The sweep job of ``method`` (its directory, named as conf/quantize.yaml's sweep subdir)
    and its quantize.json."""
    done, folder = quantized(backend)
    assert done.returncode == 0, done.stderr[-3000:]
    out = folder / f"{METHODS[backend].split(',').index(method)}_{backend}_{method}"
    return out, json.loads((out / "quantize.json").read_text())


@pytest.mark.slow
def test_a_vit_quantizes_in_paddle_and_onnx_runtime(quantized):
    # Attention's activation-by-activation matmuls and GELU go through Paddle's legacy program
    # and ONNX Runtime's pre-processing, which the ResNets never asked of them.
    _, result = swept(quantized, "paddle", "static")
    int8 = {r["runtime"]: r for r in result["rows"] if r["precision"] == "static"}
    assert "onnxruntime" in int8 and any("int8" in r["runtime"] for r in int8.values()), list(int8)
    assert all(r["effective"].startswith("int8") or "simulated" in r["effective"] for r in int8.values())


@pytest.mark.slow
def test_dynamic_int8_runs_a_vits_matmuls_in_integer_kernels_in_onnx_runtime(quantized):
    # Dynamic quantization is the transformer's method: its Linear layers become MatMulInteger.
    _, result = swept(quantized, "torch", "dynamic")
    rows = {r["runtime"]: r for r in result["rows"] if r["precision"] == "dynamic"}
    assert rows["onnxruntime"]["effective"].startswith("int8 kernels"), rows["onnxruntime"]
    assert rows["onnxruntime"]["kernels"]["int8"] >= 4 * 2  # at least the blocks' Linears: 4 a block, 2 blocks
    assert rows["torch.compile (inductor)"]["effective"] == "int8 weights, fp32 compute"
    assert rows["onnxruntime"]["size_vs_fp32"] < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_vit_fine_tunes_with_fake_quantization_and_runs_int8(quantized, backend):
    out, result = swept(quantized, backend, "qat")
    assert (out / "qat" / "metrics.jsonl").exists()
    assert result["settings"]["qat"]["steps"] == 3 and np.isfinite(result["settings"]["qat"]["final_loss"])
    int8 = [r for r in result["rows"] if r["precision"] == "qat" and "error" not in r]
    # Every runtime that ran the QAT model said what it computed with, read from its kernels.
    assert int8 and all(r["effective"].startswith(("int8", "simulated")) for r in int8), result["rows"]
    assert any(r["effective"].startswith("int8") for r in int8), [(r["runtime"], r["effective"]) for r in int8]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_vit_trains_data_parallel_as_one_process_on_the_doubled_batch(backend, tmp_path):
    # No BatchNorm: two workers on 8 images each are one process on 16, to rounding.
    common = [f"backend={backend}", *VIT, "trainer.threads=1", "trainer.steps=3", "trainer.batch_size=16"]
    common += ["optim.lr_scaling=keep_global"]
    one = run_unitrain(common, tmp_path / "one")
    two = run_unitrain([*common, "dist.nproc_per_node=2"], tmp_path / "two")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr + two.stderr)[-3000:]
    assert two.summary()["world_size"] == 2 and two.summary()["ranks_in_sync"] is True
    np.testing.assert_allclose([r["loss"] for r in two.metrics()], [r["loss"] for r in one.metrics()], rtol=1e-4)


def test_the_vit_runs_appear_in_the_comparison_report(trained, tmp_path):
    runs = [str(trained[b].run_dir) for b in BACKENDS]
    done = subprocess.run(
        [sys.executable, "-m", "unitrain.compare", *runs, "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "report" / "comparison.md").read_text()
    rows = [line for line in table.splitlines() if "vit_tiny" in line]
    assert len(rows) >= 2 and any("paddle" in r for r in rows) and any("torch" in r for r in rows), table[:3000]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_vit_with_amp_profiling_evaluation_and_a_checkpoint_resumes_exactly(backend, tmp_path):
    job = [
        f"backend={backend}",
        *VIT,
        "trainer.steps=6",
        "trainer.checkpoint_every=3",
        "trainer.save_final_weights=true",
    ]
    job += ["data.val_samples=32", "trainer.eval_every=3"]
    job += ["amp=O1", "amp.dtype=bfloat16"]
    traced = run_unitrain([*job, "profiler.mode=trace", "profiler.start=2"], tmp_path)
    assert traced.returncode == 0, traced.stderr[-3000:]
    summary = traced.summary()
    # What ran is read back: bf16 where the framework computes it, never copied from the request.
    assert summary["precision"]["requested"] == "O1 bfloat16" and summary["precision"]["effective"]
    assert summary["trace"]["top_operators"] and (traced.run_dir / "trace.rank0.json").exists()
    records = [json.loads(line) for line in (traced.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_top1" in r] == [3, 6]

    # The traced run is the uninterrupted one the resumed run must match: the profiler only
    # watches, so one run shows both (and the resume is exact under mixed precision too).
    resumed = run_unitrain([*job, f"trainer.resume={traced.run_dir / 'checkpoints' / 'step3'}"], tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with (
        np.load(traced.run_dir / "final_weights.rank0.npz") as a,
        np.load(resumed.run_dir / "final_weights.rank0.npz") as b,
    ):
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
