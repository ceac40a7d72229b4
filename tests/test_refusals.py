"""What a careless user tries is refused in one line and leaves nothing behind; what goes wrong
later (a diverging run, a full disk) never leaves a broken checkpoint or a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BACKENDS, FAST, refusal, run_unitrain


def one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    "args,message",
    [
        (["model.freeze_bn=2"], "model.freeze_bn=2 is not allowed: true or false"),
        (["model.zero_init_residual=3"], "model.zero_init_residual=3 is not allowed: true or false"),
        (["+foo=bar"], "foo is not a config key; allowed keys at the top level: backend, amp"),
        (["+trainer.stepz=5"], "trainer.stepz is not a config key; allowed keys under trainer: steps"),
        (["optim.schedule=step", "optim.gamma=0"], "optim.gamma=0.0 is not allowed: a number in (0, 1]"),
        (["data.sample_delay_s=nan"], "data.sample_delay_s=nan is not allowed: a number of seconds from 0 to 60"),
        (["trainer.seed=99999999999999"], "trainer.seed=99999999999999 is not allowed: an integer in [0, 2**32)"),
        (["data.num_workers=1000"], "data.num_workers=1000 is not allowed: at most"),
        (["dist.nproc_per_node=1000"], "dist.nproc_per_node=1000 is not allowed: at most"),
        (["data.num_classes=1000000000"], "data.num_classes=1000000000 is not allowed: at most"),
        (["amp.level=O5"], "amp.level='O5' is not allowed: one of O0, O1, O2, O3"),
        (
            ["experiment=wide_deep_ps", "dist.ps.trainers=64", "model=wide_deep"],
            "dist.ps.trainers=64 is not allowed: at most",
        ),
        (["foo"], "'foo' is not allowed: overrides are key=value"),
    ],
)
def test_nonsense_is_refused_before_anything_is_written(args, message, tmp_path):
    # In this process, through the command's own preflight (tests/test_cli_errors.py runs a few
    # as a user would).
    line = refusal([*FAST, "trainer.steps=2", *args], tmp_path)
    assert line is not None and line.startswith(f"unitrain: error: {message}"), line
    assert not (tmp_path / "run").exists()


def test_a_refusal_only_the_framework_can_make_leaves_no_run_directory(tmp_path):
    # torch decides that SyncBatchNorm needs a GPU once it has loaded, after Hydra wrote .hydra/.
    result = run_unitrain(["backend=torch", *FAST, "trainer.steps=2", "dist.sync_bn=true"], tmp_path)
    assert result.returncode == 2
    assert "dist.sync_bn=True is not allowed: false on cpu" in one_error(result)
    assert not result.run_dir.exists()


def test_parity_refuses_a_tolerance_that_could_only_report_a_false_failure(tmp_path):
    result = run_unitrain(["tolerance=-1", "model=tiny"], tmp_path, module="unitrain.parity")
    assert result.returncode == 2
    assert one_error(result) == (
        "unitrain.parity: error: tolerance=-1.0 is not allowed: a number in (0, 1] (the largest relative difference "
        "that passes)"
    )
    assert not result.run_dir.exists()


def test_argument_errors_are_one_line_without_a_usage_block(tmp_path):
    for command in (
        ["unitrain.convert", "x", "--to", "mxnet"],
        ["unitrain.compare"],
        ["unitrain.infer"],
        ["unitrain.infer", "x", "--pairs", "100000"],
    ):
        proc = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "usage:" not in proc.stderr, proc.stderr


def test_compare_refuses_a_target_that_is_not_a_number(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "unitrain.compare", str(tmp_path), "--target-loss", "nan"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "unitrain.compare: error: --target-loss=nan is not allowed: a finite number > 0 (a loss to reach)"
    )


@pytest.mark.parametrize("target", ["-1", "0"])
def test_compare_refuses_a_loss_no_run_can_reach(tmp_path, target, capsys):
    """Before: accepted, and every run reported "not reached"."""
    from unitrain.compare import main

    assert main([str(tmp_path), "--target-loss", target]) == 2
    said = capsys.readouterr().err.strip()
    allowed = "a finite number > 0 (a loss to reach)"
    assert said == f"unitrain.compare: error: --target-loss={float(target)} is not allowed: {allowed}"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished")
    result = run_unitrain(["backend=torch", *FAST, "trainer.steps=4", "trainer.checkpoint_every=2"], root)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.run_dir


def test_compare_skips_a_killed_run_with_a_warning_and_reports_the_others(finished_run, tmp_path):
    killed = tmp_path / "killed"
    shutil.copytree(finished_run, killed)
    (killed / "summary.json").unlink()  # killed before its end: metrics, no summary
    proc = subprocess.run(
        [sys.executable, "-m", "unitrain.compare", str(finished_run), str(killed), "--out", str(tmp_path / "report")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"unitrain.compare: warning: skipping {killed}: it has no summary.json (the run did not finish)"
    ]
    assert "| torch |" in proc.stdout
    alone = subprocess.run([sys.executable, "-m", "unitrain.compare", str(killed)], capture_output=True, text=True)
    assert alone.returncode == 2 and "no usable run" in alone.stderr and "Traceback" not in alone.stderr


@pytest.fixture()
def read_only_dir(tmp_path):
    """A directory nobody can write into, root included: a read-only file system."""
    locked = tmp_path / "locked"
    locked.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(locked)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    yield locked
    subprocess.run(["umount", str(locked)], check=True)


def test_read_only_outputs_are_one_line(finished_run, read_only_dir):
    compare = subprocess.run(
        [sys.executable, "-m", "unitrain.compare", str(finished_run), "--out", str(read_only_dir)],
        capture_output=True,
        text=True,
    )
    assert compare.returncode == 2 and "allowed: a directory this user can write" in one_error(compare)
    convert = subprocess.run(
        [
            sys.executable,
            "-m",
            "unitrain.convert",
            str(finished_run),
            "--to",
            "torch",
            "--out",
            str(read_only_dir / "m.pt"),
        ],
        capture_output=True,
        text=True,
    )
    assert convert.returncode == 2 and "allowed: a file path this user can write" in one_error(convert)


def test_resuming_non_finite_weights_names_the_checkpoint(finished_run, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(finished_run, broken)
    checkpoint = broken / "checkpoints" / (broken / "checkpoints" / "latest").read_text().strip()
    with np.load(checkpoint / "model.npz") as f:
        arrays = {k: f[k] for k in f.files}
    arrays["fc.weight"][0, 0] = np.nan
    np.savez(checkpoint / "model.npz", **arrays)
    result = run_unitrain(
        ["backend=torch", *FAST, "trainer.steps=6", "trainer.checkpoint_every=2", f"trainer.resume={checkpoint}"],
        tmp_path / "resume",
    )
    assert result.returncode == 2
    assert one_error(result) == (
        f"unitrain: error: checkpoint {checkpoint} holds weights that are not finite (fc.weight has nan or inf); "
        "allowed: a checkpoint written before the training diverged"
    )


def finite_checkpoints(run_dir: Path) -> list:
    kept = []
    for folder in sorted((run_dir / "checkpoints").glob("step*")):
        with np.load(folder / "model.npz") as f:
            assert all(np.isfinite(f[k]).all() for k in f.files if f[k].dtype.kind == "f"), folder
        kept.append(folder.name)
    return kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_diverging_run_never_writes_a_broken_checkpoint(backend, tmp_path):
    # lr 1e30: on Paddle step 2's loss is still finite while the update after it is not.
    result = run_unitrain(
        [f"backend={backend}", *FAST, "trainer.steps=6", "optim.lr=1e30", "trainer.checkpoint_every=1"], tmp_path
    )
    assert result.returncode == 1
    error = [line for line in result.stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(error) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "is not finite" in error[0] or "the loss is nan" in error[0]
    kept = finite_checkpoints(result.run_dir)
    latest = (result.run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest in kept and not list((result.run_dir / "checkpoints").glob(".tmp-*"))


@pytest.fixture()
def small_disk(tmp_path):
    """A file system of 1.2 MB: room for the tiny model's first checkpoint, not its second."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_latest(backend, small_disk, tmp_path):
    run_dir = small_disk / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "unitrain", f"backend={backend}", *FAST, "trainer.steps=6", "trainer.checkpoint_every=1"]
        + [f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0].startswith(
        f"unitrain: error: the checkpoint of step 2 could not be written into {run_dir / 'checkpoints'}: "
    )
    assert errors[0].endswith("; checkpoints/latest still names step1")
    assert ": the disk is full (" in errors[0], errors[0]  # said plainly, not in the framework's words
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step1"]
    assert json.loads((run_dir / "checkpoints" / "step1" / "meta.json").read_text())["step"] == 1


def test_an_unresolvable_master_address_is_said_before_waiting(tmp_path):
    result = run_unitrain(
        ["backend=torch", *FAST, "trainer.steps=2", "dist.nnodes=2", "dist.master_port=29431"]
        + ["dist.master_addr=no-such-host.invalid", "dist.timeout_s=600"],
        tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert "dist.master_addr='no-such-host.invalid' is not allowed: it does not resolve" in one_error(result)


def _criteo(path: Path, lines: list) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize(
    "command,args,message",
    [
        # A setting the job would read nothing of.
        ("unitrain", ["dist.interface=lo"], "dist.interface='lo' is not allowed: unset with one process"),
        (
            "unitrain",
            ["model.torch=my.nets:build"],
            "model.torch='my.nets:build' is not allowed: unset with model=tiny",
        ),
        (
            "unitrain",
            ["model=vit_tiny", "model.freeze_bn=true"],
            "model.freeze_bn=True is not allowed: false with vit_tiny",
        ),
        ("unitrain", ["trainer.eval_every=5"], "trainer.eval_every=5 is not allowed: 0 with data=learnable without"),
        (
            "unitrain",
            ["experiment=wide_deep_ps", "dist.ps.node_servers=[5]"],
            "dist.ps.node_servers=[5] is not allowed: [] or [1]",
        ),
        ("unitrain", ["experiment=wide_deep_ps", "optim.momentum=0.9"], "optim.momentum=0.9 is not allowed: 0 with"),
        ("unitrain.parity", ["model=vit_tiny", "data.image_size=10"], "data.image_size=10 is not allowed: a multiple"),
        ("unitrain.parity", ["model.name=vgg"], "model.name='vgg' is not allowed: one of"),
        # Nodes: node 0's address must be this host's; every parameter-server host must resolve.
        (
            "unitrain",
            ["dist.nnodes=2", "dist.master_port=29400", "dist.master_addr=192.0.2.1"],
            "dist.master_addr='192.0.2.1' is not allowed: an address of this host on node 0",
        ),
        (
            "unitrain",
            ["experiment=wide_deep_ps", "dist.nnodes=2", "dist.master_port=29400"]
            + ["dist.ps.hosts=[127.0.0.1,no-such-host.invalid]"],
            "dist.ps.hosts=['127.0.0.1', 'no-such-host.invalid'] is not allowed: every node's address",
        ),
        # Counts with a ceiling, a sweep launcher's jobs at a time.
        ("unitrain", ["dist.max_restarts=1000000"], "dist.max_restarts=1000000 is not allowed: at most 100"),
        ("unitrain", ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0 is not"),
        # A batch of images that alone would not fit in memory (before the framework's own error).
        ("unitrain", ["data.image_size=100000"], "data.image_size=100000 is not allowed: at most"),
    ],
)
def test_what_a_careless_user_tries_is_refused_before_anything_starts(command, args, message, tmp_path):
    context = [] if "experiment=wide_deep_ps" in args else [*FAST, "trainer.steps=2"]
    if command == "unitrain.parity":
        context = ["model=tiny", "data.image_size=16"]
    backend = ["backend=torch"] if command == "unitrain" else []
    line = refusal([*context, *backend, *args], tmp_path, command)
    assert line is not None and line.startswith(f"{command}: error: {message}"), line


@pytest.mark.parametrize(
    "lines,key,message",
    [
        ([], "data.val_path", "it holds no rows"),
        (["garbage", "more garbage"], "data.path", "line 1 has 1 fields"),
    ],
)
def test_criteo_files_that_cannot_train_are_refused_before_any_process_starts(lines, key, message, tmp_path):
    from unitrain.data import criteo

    good = _criteo(tmp_path / "good.tsv", criteo.synthetic_lines(200, seed=1))
    bad = _criteo(tmp_path / "bad.tsv", lines)
    paths = {"data.path": good, "data.val_path": good, key: bad}
    args = ["experiment=wide_deep_ps", "backend=torch", "data=criteo", *(f"{k}={v}" for k, v in paths.items())]
    line = refusal(args, tmp_path)
    assert line is not None and message in line and bad in line, line


def test_a_paddle_restart_job_without_etcd_is_refused_before_its_run_folder_is_made(tmp_path, monkeypatch):
    """Before: refused in one clear line by the launcher, after the run folder was made."""
    monkeypatch.setenv("PATH", str(tmp_path))  # a machine without etcd-server
    args = ["backend=paddle", "model=tiny", "dist.nproc_per_node=2", "dist.max_restarts=1"]
    said = refusal(args, tmp_path)
    assert said is not None and said.startswith(
        "unitrain: error: dist.max_restarts=1 is not allowed: 0 with backend=paddle"
    )
    assert "make etcd" in said and not (tmp_path / "run").exists()
    assert refusal(["backend=torch", "model=tiny", "dist.nproc_per_node=2", "dist.max_restarts=1"], tmp_path) is None
