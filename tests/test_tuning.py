"""backend.tuned (each framework's own speed settings) and the gradient all-reduce levers
(dist.bucket_cap_mb, dist.grad_compression): what ran is read back from the framework, the
results stay those of the same job, and what a framework cannot do is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from test_distributed import weights

from conftest import BACKENDS, EXACT, FAST, run_unitrain
from unitrain.backends.paddle import blas

# Paddle's MKL AVX2 kernels apply on a CPU that is not Intel's and has AVX2 and FMA (this
# project's machines have been AMD EPYCs); elsewhere tuned mode skips them and says why.
MKL_AVX2_NOT_APPLICABLE = blas.avx2_not_applicable()

STEPS = ["trainer.steps=4", "trainer.batch_size=16"]
EXPECTED = {"torch": ("channels_last", "torch.compile inductor"), "paddle": ("paddle.jit.to_static",)}
# On a CPU both leave their settings out by default (measured no faster); named, they apply.
NAMED = {"torch": ["backend.tuned_settings=[compile,channels_last]"], "paddle": ["backend.tuned_settings=[to_static]"]}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_tuned_run_reports_what_its_framework_did_and_trains_the_same_model(backend, tmp_path):
    common = [f"backend={backend}", *FAST, *STEPS, "model.init=shared"]
    same = run_unitrain(common, tmp_path / "same")
    tuned = run_unitrain([*common, "backend.tuned=true", *NAMED[backend]], tmp_path / "tuned")
    assert same.returncode == 0, same.stderr[-2000:]
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    s, t = same.summary()["tuning"], tuned.summary()["tuning"]
    assert s == {"settings": "same settings", "applied": [], "skipped": {}}
    assert t["settings"] == "tuned"
    for setting in EXPECTED[backend]:
        assert any(a.startswith(setting) for a in t["applied"]), t["applied"]
    if backend == "paddle":
        assert set(t["skipped"]) == {"oneDNN", "NHWC"} | ({"mkl_avx2"} if MKL_AVX2_NOT_APPLICABLE else set()), t[
            "skipped"
        ]
    # The same weights and batches: a compiled or static program computes the same losses, up
    # to the reordering of floating-point sums (a wrong layout or a frozen graph moves them).
    np.testing.assert_allclose([m["loss"] for m in tuned.metrics()], [m["loss"] for m in same.metrics()], rtol=2e-3)


@pytest.mark.parametrize(
    "backend,left_out", [("paddle", {"to_static", "oneDNN", "NHWC"}), ("torch", {"compile", "channels_last"})]
)
def test_tuned_on_a_cpu_applies_only_what_helped_and_says_why(backend, left_out, tmp_path):
    result = run_unitrain([f"backend={backend}", *FAST, "trainer.steps=2", "backend.tuned=true"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    tuning = result.summary()["tuning"]
    mkl_avx2 = backend == "paddle" and not MKL_AVX2_NOT_APPLICABLE
    assert tuning["settings"] == "tuned" and tuning["applied"] == (["MKL 2019.0.5 AVX2 kernels"] if mkl_avx2 else [])
    assert set(tuning["skipped"]) == left_out | ({"mkl_avx2"} if backend == "paddle" and not mkl_avx2 else set())
    assert all(
        "measured" in why
        for name, why in tuning["skipped"].items()
        if name in ("to_static", "compile", "channels_last")
    )


@pytest.mark.skipif(
    bool(MKL_AVX2_NOT_APPLICABLE), reason=f"Paddle's MKL AVX2 kernels do not apply here: {MKL_AVX2_NOT_APPLICABLE}"
)
def test_paddle_mkl_runs_its_generic_kernels_on_this_cpu_unless_tuned_and_the_report_says_so(tmp_path):
    common = ["backend=paddle", *FAST, *STEPS, "model.init=shared"]
    same = run_unitrain(common, tmp_path / "same")
    tuned = run_unitrain([*common, "backend.tuned=true", "backend.tuned_settings=[mkl_avx2]"], tmp_path / "tuned")
    assert same.returncode == 0 and tuned.returncode == 0, same.stderr[-2000:] + tuned.stderr[-2000:]
    # What MKL itself answers (mkl_serv_cpu_detect), not what was asked for.
    assert same.summary()["blas"] == "MKL 2019.0.5, generic kernels"
    assert tuned.summary()["blas"] == "MKL 2019.0.5, AVX2 kernels"
    assert tuned.summary()["tuning"]["applied"] == ["MKL 2019.0.5 AVX2 kernels"]
    # Other kernels, the same arithmetic up to rounding (FMA): the same model trains.
    np.testing.assert_allclose([m["loss"] for m in tuned.metrics()], [m["loss"] for m in same.metrics()], rtol=1e-4)
    from unitrain.report.fairness import fairness_warnings
    from unitrain.report.runs import load_runs

    warnings = fairness_warnings(load_runs([same.run_dir, tuned.run_dir]))
    assert any(
        w.startswith("paddle ran MKL 2019.0.5, generic kernels") and "backend.tuned=true" in w for w in warnings
    ), warnings


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["backend.tuned=true", "backend.tuned_settings=[xla]"],
            "backend.tuned_settings=['xla'] is not allowed: names from compile, channels_last",
        ),
        (
            ["backend.tuned_settings=[compile]"],
            "backend.tuned_settings=['compile'] is not allowed: null unless backend.tuned=true",
        ),
    ],
)
def test_unknown_or_orphan_tuned_settings_are_one_line(args, message, tmp_path):
    result = run_unitrain(["backend=torch", *FAST, "trainer.steps=2", *args], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"unitrain: error: {message}")


@pytest.mark.slow
def test_report_never_ranks_a_tuned_row_against_a_same_settings_row(tmp_path):
    common = ["backend=torch", *FAST, "trainer.steps=3"]
    for name, extra in (("same", []), ("tuned", ["backend.tuned=true"])):
        assert run_unitrain([*common, *extra], tmp_path / name).returncode == 0
    from unitrain.report.runs import group_repeats, load_runs
    from unitrain.report.stats import table_rows

    rows = table_rows(group_repeats(load_runs([tmp_path / "same" / "run", tmp_path / "tuned" / "run"])))
    by_settings = {r["settings"]: r for r in rows}
    assert by_settings["same settings"]["vs baseline"] == "baseline"
    assert by_settings["tuned"]["vs baseline"] == "baseline (tuned)"


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend,levers,hook,buckets",
    [
        # The tiny model's gradients are 0.3 MB: a 0.02 MB cap splits them; Paddle takes whole MB.
        ("torch", ["dist.bucket_cap_mb=0.02", "dist.grad_compression=fp16"], "fp16_compress_hook", 2),
        # Compiled around DDP, accumulating: no_sync must reach the DDP inside torch.compile's wrapper.
        (
            "torch",
            [
                "dist.bucket_cap_mb=1",
                "backend.tuned=true",
                "backend.tuned_settings=[compile]",
                "trainer.accumulate_steps=2",
            ],
            "none (float32 all-reduce)",
            1,
        ),
        ("paddle", ["dist.bucket_cap_mb=1"], "none (float32 all-reduce)", 1),
    ],
)
def test_all_reduce_levers_are_applied_and_keep_the_result(backend, levers, hook, buckets, tmp_path):
    from unitrain.host.ports import free_port

    common = [f"backend={backend}", *FAST, *EXACT, *STEPS]
    one = run_unitrain(common, tmp_path / "one")
    two = run_unitrain([*common, "dist.nproc_per_node=2", f"dist.master_port={free_port()}", *levers], tmp_path / "two")
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-3000:]
    sync = two.summary()["grad_sync"]
    assert sync["comm_hook"] == hook
    cap = float(levers[0].split("=")[1])
    assert sync["bucket_cap_mb"] == pytest.approx(cap, rel=1e-3)
    assert sync["buckets"] >= buckets and sum(sync["bucket_mb"]) == pytest.approx(0.3, abs=0.05), sync
    assert one.summary()["grad_sync"] is None
    # fp16 rounds each gradient to 11 significant bits on the way: close, not equal.
    tolerance = 2e-3 if "fp16" in hook else 1e-5
    a, b = weights(one.run_dir), weights(two.run_dir)
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=tolerance * 10, atol=tolerance, err_msg=key)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["backend=paddle", "dist.grad_compression=fp16"],
            "dist.grad_compression='fp16' is not allowed: none with backend=paddle",
        ),
        (
            ["backend=paddle", "dist.bucket_cap_mb=2.5"],
            "dist.bucket_cap_mb=2.5 is not allowed: a whole number of MB with backend=paddle",
        ),
        (["backend=torch", "dist.bucket_cap_mb=0"], "dist.bucket_cap_mb=0.0 is not allowed: a size in MB > 0"),
        (
            ["backend=torch", "dist.grad_compression=int8"],
            "dist.grad_compression='int8' is not allowed: one of none, fp16, bf16",
        ),
    ],
)
def test_bad_all_reduce_levers_are_refused_before_launch(args, message, tmp_path):
    result = run_unitrain([*args, *FAST, "trainer.steps=2", "dist.nproc_per_node=2"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"unitrain: error: {message}")
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_compiling_around_ddp_with_buckets_below_its_first_is_one_line(tmp_path):
    result = run_unitrain(
        [
            "backend=torch",
            *FAST,
            "trainer.steps=2",
            "dist.nproc_per_node=2",
            "dist.bucket_cap_mb=0.5",
            "backend.tuned=true",
            "backend.tuned_settings=[compile]",
        ],
        tmp_path,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("unitrain: error: dist.bucket_cap_mb=0.5 is not allowed: at least 1 with torch.compile")
    )


@pytest.mark.slow
def test_bf16_compression_on_gloo_is_refused_by_the_worker_in_one_line(tmp_path):
    result = run_unitrain(
        ["backend=torch", *FAST, "trainer.steps=2", "dist.nproc_per_node=2", "dist.grad_compression=bf16"], tmp_path
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("unitrain: error: dist.grad_compression='bf16' is not allowed: none or fp16 with gloo")
    )
