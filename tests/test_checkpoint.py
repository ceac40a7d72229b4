"""Checkpoints: atomic, exact on resume, convertible, and refused clearly when they do not fit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import BACKENDS, FAST, run_unitrain
from unitrain.model.build import build_model

CKPT = [*FAST, "trainer.steps=8", "trainer.checkpoint_every=4", "trainer.save_final_weights=true"]


def losses(result):
    return [(r["step"], r["loss"]) for r in result.metrics()]


def held_out_lines(result):
    return [r for r in map(json.loads, (result.run_dir / "metrics.jsonl").read_text().splitlines()) if "val_top1" in r]


def final_weights(result):
    with np.load(result.run_dir / "final_weights.rank0.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module", params=BACKENDS)
def finished(request, tmp_path_factory):
    """An uninterrupted 8-step run that checkpointed at steps 4 and 8."""
    backend = request.param
    result = run_unitrain([f"backend={backend}", *CKPT], tmp_path_factory.mktemp(f"full-{backend}"))
    assert result.returncode == 0, result.stderr[-2000:]
    return backend, result


def test_checkpoints_are_complete_and_latest_points_to_the_newest(finished):
    _, full = finished
    root = full.run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step4", "step8"]  # no temporary leftovers
    assert (root / "latest").read_text() == "step8"
    for step in ("step4", "step8"):
        assert {p.name for p in (root / step).iterdir()} == {"meta.json", "model.npz", "training_state"}


def test_resumed_run_equals_the_uninterrupted_one(finished, tmp_path):
    backend, full = finished
    resumed = run_unitrain(
        [f"backend={backend}", *CKPT, f"trainer.resume={full.run_dir / 'checkpoints' / 'step4'}"], tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # Steps 1-4 are the history carried over from the checkpoint's run; 5-8 ran again, and in
    # fp32, one process, deterministic kernels, bit for bit.
    assert losses(resumed) == losses(full)
    a, b = final_weights(resumed), final_weights(full)
    assert all(np.array_equal(a[k], b[k]) for k in b)
    # The clock continues from the checkpoint's, so time to a target counts steps 1-4 too.
    elapsed = [r["elapsed_s"] for r in resumed.metrics()]
    assert elapsed[:4] == [r["elapsed_s"] for r in full.metrics()][:4]
    # One framework ran every step: nothing is marked as another's.
    assert resumed.summary()["steps_by_framework"] == {backend: 8}
    assert not any("framework" in r for r in resumed.metrics())
    assert all(later > earlier for earlier, later in zip(elapsed, elapsed[1:])), elapsed
    # summary.json describes the whole run too, not only the steps since the resume: its
    # throughput over the same steps as the uninterrupted run's, its wall time on that clock.
    summary = resumed.summary()
    assert (
        summary["steps"] == 8 and summary["profiler"]["measured_steps"] == full.summary()["profiler"]["measured_steps"]
    )
    assert summary["wall_time_s"] >= elapsed[-1] > elapsed[3]


def test_resumed_run_keeps_the_held_out_evaluations_and_their_clock(tmp_path):
    held_out = [*CKPT, "backend=torch", "data.val_samples=40", "trainer.eval_every=4"]
    full = run_unitrain(held_out, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    resumed = run_unitrain(
        [*held_out, f"trainer.resume={full.run_dir / 'checkpoints' / 'step4'}"], tmp_path / "resumed"
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    evals, before = held_out_lines(resumed), held_out_lines(full)
    assert [r["step"] for r in evals] == [4, 8]
    assert evals[0] == before[0] and evals[1]["elapsed_s"] > evals[0]["elapsed_s"]
    summary = json.loads((resumed.run_dir / "summary.json").read_text())["eval"]
    assert summary["evaluations"] == 2 and summary["eval_s_total"] == pytest.approx(sum(r["eval_s"] for r in evals))


def test_resume_latest_continues_the_newest_run(finished, tmp_path):
    backend, full = finished
    # "latest" searches ./runs and ./multirun below the working directory.
    shutil.copytree(full.run_dir, tmp_path / "runs" / "old")
    longer = run_unitrain([f"backend={backend}", *FAST, "trainer.steps=10", "trainer.resume=latest"], tmp_path)
    assert longer.returncode == 0, longer.stderr[-2000:]
    assert [s for s, _ in losses(longer)] == list(range(1, 11))
    assert losses(longer)[:8] == losses(full)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_data_parallel_resume_equals_the_uninterrupted_run(backend, tmp_path):
    dp = [f"backend={backend}", *CKPT, "dist.nproc_per_node=2", "trainer.threads=1"]
    full = run_unitrain(dp, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    resumed = run_unitrain([*dp, f"trainer.resume={full.run_dir / 'checkpoints' / 'step4'}"], tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert losses(resumed) == losses(full)


def test_truncated_checkpoint_is_refused_and_nothing_changes(finished, tmp_path):
    backend, full = finished
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("meta.json", "training_state"):
        (broken / name).write_bytes((full.run_dir / "checkpoints" / "step4" / name).read_bytes())
    original = (full.run_dir / "checkpoints" / "step4" / "model.npz").read_bytes()
    (broken / "model.npz").write_bytes(original[: len(original) // 2])
    before = sorted(p.name for p in broken.iterdir())
    result = run_unitrain([f"backend={backend}", *CKPT, f"trainer.resume={broken}"], tmp_path / "new")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"unitrain: error: checkpoint {broken} is corrupt or truncated: model.npz")
    )
    assert sorted(p.name for p in broken.iterdir()) == before
    assert not (result.run_dir / "metrics.jsonl").exists() and not (result.run_dir / "checkpoints").exists()


def test_checkpoint_of_another_model_is_refused(finished, tmp_path):
    backend, full = finished
    step4 = full.run_dir / "checkpoints" / "step4"
    wrong_model = run_unitrain(
        [f"backend={backend}", *CKPT, "model=resnet18", f"trainer.resume={step4}"], tmp_path / "model"
    )
    assert wrong_model.returncode == 2 and "holds model=tiny, not model=resnet18" in wrong_model.stderr


def test_checkpoint_of_the_other_framework_resumes_with_converted_weights(finished, tmp_path):
    backend, full = finished
    other = "torch" if backend == "paddle" else "paddle"
    step8 = full.run_dir / "checkpoints" / "step8"
    result = run_unitrain([f"backend={other}", *FAST, "trainer.steps=10", f"trainer.resume={step8}"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"was written by {backend}: its weights were converted to {other} exactly" in result.stdout + result.stderr
    assert [s for s, _ in losses(result)] == list(range(1, 11))
    # The converted weights carry on where the other framework stopped: the first resumed loss
    # is near the last trained ones, not back at an untrained model's ~ln(10).
    assert abs(losses(result)[8][1] - losses(full)[-1][1]) < 0.5 * np.log(10)
    # Its throughput is its own framework's: the other framework's step times are not mixed in.
    assert result.summary()["profiler"]["measured_steps"] == 2
    # metrics.jsonl says whose each step was, and so do the summary and the comparison.
    assert [r.get("framework") for r in result.metrics()] == [backend] * 8 + [None] * 2
    assert result.summary()["steps_by_framework"] == {backend: 8, other: 2}
    from unitrain.report.fairness import fairness_warnings
    from unitrain.report.runs import load_runs
    from unitrain.report.stats import throughput

    runs = load_runs([result.run_dir])
    assert throughput(runs)["over"] == "2 steps"
    [warning] = fairness_warnings(runs)
    assert (
        f"continued a {backend} run: steps 1-8" in warning and "time to target and curves mix two frameworks" in warning
    )


def test_converted_checkpoint_loads_in_plain_framework_code(finished, tmp_path):
    backend, full = finished
    other = "torch" if backend == "paddle" else "paddle"
    out = tmp_path / f"weights.{other}"
    proc = subprocess.run(
        [sys.executable, "-m", "unitrain.convert", str(full.run_dir), "--to", other, "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"step 8) -> {other}" in proc.stdout
    # Plain framework code, no unitrain: the file loads as a dict of named tensors.
    plain = {
        "torch": "import torch; sd = torch.load(r'{p}'); "
        "print(len(sd), tuple(sd['fc.weight'].shape), sd['bn1.running_var'].dtype)",
        "paddle": "import paddle; sd = paddle.load(r'{p}'); "
        "print(len(sd), tuple(sd['fc.weight'].shape), sd['bn1._variance'].dtype)",
    }[other].format(p=out)
    loaded = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert ("62 (64, 10)" if other == "paddle" else "74 (10, 64)") in loaded.stdout

    # And the converted weights compute what the original ones do.
    import paddle
    import torch

    import unitrain
    from unitrain.train.checkpoint import read_model_arrays

    source = unitrain.get_backend(backend)
    target = unitrain.get_backend(other)
    original = build_model(source, "tiny", 10)
    source.load_state_arrays(original, read_model_arrays(full.run_dir / "checkpoints" / "step8"))
    converted = build_model(target, "tiny", 10)
    if other == "torch":
        converted.load_state_dict(torch.load(out))
    else:
        converted.set_state_dict(paddle.load(str(out)))
    original.eval()
    converted.eval()
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    run = lambda b, m: b.to_numpy(m(paddle.to_tensor(x) if b.name == "paddle" else torch.from_numpy(x)))  # noqa: E731
    np.testing.assert_allclose(run(target, converted), run(source, original), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_resuming_a_finished_run_changes_nothing(finished, tmp_path):
    backend, full = finished
    before = {name: (full.run_dir / name).read_bytes() for name in ("metrics.jsonl", "summary.json")}
    for target in (full.run_dir, tmp_path / "new"):
        args = [
            sys.executable,
            "-m",
            "unitrain",
            f"backend={backend}",
            *CKPT,
            f"trainer.resume={full.run_dir}",
            f"hydra.run.dir={target}",
        ]
        proc = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "nothing left to run; earlier results are unchanged" in proc.stdout
        assert "Traceback" not in proc.stderr
    assert {name: (full.run_dir / name).read_bytes() for name in before} == before
    assert not (tmp_path / "new" / "metrics.jsonl").exists() and not (tmp_path / "new" / "summary.json").exists()


def test_resume_into_its_own_run_dir_keeps_the_history_and_cleans_partial_writes(finished, tmp_path):
    backend, full = finished
    run = tmp_path / "run"
    shutil.copytree(full.run_dir, run)
    (run / "checkpoints" / "latest").write_text("step4")
    leftover = run / "checkpoints" / ".tmp-step6-4242"  # what a write killed part-way leaves
    leftover.mkdir()
    (leftover / "model.npz").write_bytes(b"half")
    result = run_unitrain([f"backend={backend}", *CKPT, f"trainer.resume={run}"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert losses(result) == losses(full)  # steps 1-4 kept, 5-8 again, each once
    assert not leftover.exists()
    # A resumed run is the same job: comparing it with the uninterrupted one draws no warning.
    compare = subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain.compare",
            str(full.run_dir),
            str(result.run_dir),
            "--out",
            str(tmp_path / "cmp"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert compare.returncode == 0, compare.stderr[-2000:]
    assert "differ in" not in compare.stdout, compare.stdout


def test_keep_checkpoints_keeps_the_newest(tmp_path):
    result = run_unitrain(
        ["backend=torch", *FAST, "trainer.steps=8", "trainer.checkpoint_every=2", "trainer.keep_checkpoints=2"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    root = result.run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step6", "step8"]
    assert (root / "latest").read_text() == "step8"


@pytest.mark.slow
def test_resume_latest_skips_checkpoints_that_do_not_fit(finished, tmp_path):
    backend, full = finished
    shutil.copytree(full.run_dir, tmp_path / "runs" / "fits")
    # A newer checkpoint of another model: "latest" must not pick it.
    other = tmp_path / "runs" / "newer-other-model"
    shutil.copytree(full.run_dir, other)
    meta_file = other / "checkpoints" / "step8" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["model"] = "resnet18"
    meta_file.write_text(json.dumps(meta))
    result = run_unitrain([f"backend={backend}", *FAST, "trainer.steps=9", "trainer.resume=latest"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resumed from {tmp_path / 'runs' / 'fits'}" in result.stdout + result.stderr
    args = [
        f"backend={backend}",
        *FAST,
        "model=resnet50",
        "trainer.resume=latest",
        f"hydra.run.dir={tmp_path / 'none'}",
    ]
    nothing = subprocess.run(
        [sys.executable, "-m", "unitrain", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert (
        nothing.returncode == 2
        and "none of the 2 checkpoint(s)" in nothing.stderr
        and "model=resnet50" in nothing.stderr
    )


def test_convert_errors_are_one_line(finished, tmp_path):
    _, full = finished
    cases = [
        ([str(full.run_dir), "--to", "torch", "--out", str(tmp_path / "missing" / "w.pt")], "does not exist"),
        (["latest", "--to", "torch"], "checkpoint=latest: no checkpoint under"),
    ]
    for args, expected in cases:
        proc = subprocess.run(
            [sys.executable, "-m", "unitrain.convert", *args], capture_output=True, text=True, cwd=tmp_path
        )
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_chain_of_resumes_across_frameworks_keeps_whose_each_step_was():
    from unitrain.train.metrics import label_history, steps_by_framework

    torch_run = [{"step": s, "loss": 1.0} for s in (1, 2)]  # as torch wrote it: its own steps, unmarked
    on_paddle = label_history(torch_run, "torch", "paddle") + [{"step": 3, "loss": 1.0}]
    assert [r.get("framework") for r in on_paddle] == ["torch", "torch", None]
    back_on_torch = label_history(on_paddle, "paddle", "torch") + [{"step": 4, "loss": 1.0}]
    assert [r.get("framework") for r in back_on_torch] == [None, None, "paddle", None]
    assert steps_by_framework(back_on_torch, "torch") == {"torch": 3, "paddle": 1}
    assert torch_run[0] == {"step": 1, "loss": 1.0}  # the history read from disk is not changed in place
