"""Bad input: one line naming the key and what is allowed, a non-zero exit, no traceback, nothing lost."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import BACKENDS, FAST, refusal


@pytest.mark.parametrize(
    "args,expected",
    [
        (["backend=tensorflow"], "backend='tensorflow' is not allowed: one of paddle, torch"),
        (["-m", "backend=paddle,jax"], "backend='jax' is not allowed: one of paddle, torch"),
        (
            ["model=vgg"],
            "model='vgg' is not allowed: one of custom, gpt_mini, gpt_nano, hf, resnet18, resnet18_cifar, "
            "resnet18_stride2, resnet50, tiny, vit_small, vit_tiny",
        ),
        (["data=imagefolder"], "data.path=None is not allowed"),
        (
            ["data=imagefolder", "data.path=/no/such/dir"],
            "data.path='/no/such/dir' is not allowed: an existing directory",
        ),
        (["optim.lr=0"], "optim.lr=0.0 is not allowed: a finite number > 0"),
        (["optim.lr=-0.1"], "optim.lr=-0.1 is not allowed: a finite number > 0"),
        (["backend=paddle", "amp.impl=apex"], "amp.impl='apex' is not allowed: native with backend=paddle"),
        (["dist.node_rank=1"], "dist.node_rank=1 is not allowed: an integer in [0, 1) (dist.nnodes=1)"),
        (["dist.nnodes=2"], "dist.master_port=None is not allowed: a port number that every node uses"),
        (
            ["dist.max_restarts=1", "dist.nnodes=2", "dist.master_port=29561"],
            "dist.max_restarts=1 is not allowed: 0 with dist.nnodes > 1, unless dist.shared_dir names a directory "
            "every node reaches at the same path",
        ),
        (["dist.shared_dir=relative/dir"], "dist.shared_dir='relative/dir' is not allowed: an absolute path"),
        (["dist.shared_dir=''"], "dist.shared_dir='' is not allowed"),
        (
            ["dist.shared_dir=/no/such/dir", "trainer.checkpoint_every=1"],
            "dist.shared_dir='/no/such/dir' is not allowed: an absolute path",
        ),
        # Settings nothing would read: refused, not ignored.
        (["dist.shared_dir=/tmp"], "dist.shared_dir='/tmp' is not allowed: unset on one node without checkpoints"),
        (["dist.ps.merge_pushes=4"], "dist.ps.merge_pushes=4 is not allowed: unset with dist.mode=collective"),
        (["dist.ps.servers=3"], "dist.ps.servers=3 is not allowed: unset with dist.mode=collective"),
        (
            ["objective.metric=time_to_target", "objective.target=0.5"],
            "objective.metric='time_to_target' is not allowed without a search",
        ),
        (["objective.target=0.5"], "objective.target=0.5 is not allowed: null with objective.metric=heldout"),
        (["-m", "trainer.seed=1,2", "objective.metric=time_to_target", "objective.target=0.5"], "without a search"),
        (["dist.ps.shared_dir=/tmp"], "dist.ps.shared_dir is not a config key"),
        (["dist.max_restarts=-1"], "dist.max_restarts=-1 is not allowed: an integer >= 0"),
        (["dist.nproc_per_node=0"], "dist.nproc_per_node=0 is not allowed: a finite number > 0"),
        (["trainer.threads=1000"], "trainer.threads=1000 is not allowed: at most"),
        (["trainer.checkpoint_every=-1"], "trainer.checkpoint_every=-1 is not allowed: an integer >= 0"),
        (["trainer.keep_checkpoints=-2"], "trainer.keep_checkpoints=-2 is not allowed: an integer >= 0"),
        (["trainer.on_nonfinite=ignore"], "trainer.on_nonfinite='ignore' is not allowed: one of stop, warn"),
        (["trainer.malloc=tcmalloc"], "trainer.malloc='tcmalloc' is not allowed: one of fixed, dynamic"),
        (["data.num_classes=1"], "data.num_classes=1 is not allowed: an integer >= 2"),
        (["trainer.batch_size=1"], "trainer.batch_size=1 is not allowed: at least 2 samples per device"),
        (["profiler.start=-1"], "profiler.start=-1 is not allowed: a step number >= 0"),
        (["optim.lr=nan"], "optim.lr=nan is not allowed: a finite number > 0"),
        (["trainer.seed=-1"], "trainer.seed=-1 is not allowed: an integer in [0, 2**32)"),
        (["dist.timeout_s=0"], "dist.timeout_s=0.0 is not allowed: a finite number > 0"),
        (["trainer.stepz=3"], "trainer.stepz is not a config key; allowed keys under trainer: steps, epochs"),
        (["stepz=3"], "stepz is not a config key; allowed keys at the top level: backend, amp"),
        (["-m", "backend=paddle,torch", "trainer.stepz=3"], "trainer.stepz is not a config key"),
        (["trainer.steps=many"], "trainer.steps: Value 'many' of type 'str' could not be converted to Integer"),
        (["trainer.steps=["], "cannot parse the overrides"),
    ],
)
def test_bad_input_gives_one_line(args, expected, tmp_path):
    # The command's own preflight, in this process: the same line `python -m unitrain` prints and
    # exits 2 with before anything is written (test_a_refusal_ends_the_command_in_one_line runs
    # a few as a user would).
    line = refusal([*FAST, "trainer.steps=2", *args], tmp_path)
    assert line is not None and line.startswith("unitrain: error:") and expected in line, line
    assert "\n" not in line
    assert not (tmp_path / "run").exists() and not (tmp_path / "multirun").exists()


def test_a_shared_dir_that_holds_another_jobs_checkpoints_is_refused(tmp_path):
    """Its checkpoints would be pruned or overwritten by this job's: they stay as they are."""
    shared = tmp_path / "shared"
    (shared / "checkpoints" / "step10").mkdir(parents=True)
    line = refusal([*FAST, "trainer.steps=2", "trainer.checkpoint_every=1", f"dist.shared_dir={shared}"], tmp_path)
    assert line == (
        f"unitrain: error: dist.shared_dir={str(shared)!r} is not allowed: a directory that holds no checkpoints yet "
        "(one per job: resume another job's with trainer.resume)"
    )
    assert sorted(p.name for p in (shared / "checkpoints").iterdir()) == ["step10"]


@pytest.mark.parametrize(
    "args,expected",
    [
        (["backend=tensorflow"], "backend='tensorflow' is not allowed: one of paddle, torch"),
        (["-m", "backend=paddle,torch", "trainer.stepz=3"], "trainer.stepz is not a config key"),
        (["optim.lr=nan"], "optim.lr=nan is not allowed: a finite number > 0"),
        (["trainer.steps=["], "cannot parse the overrides"),
        (["trainer.batch_size=64", "data.num_samples=20"], "trainer.batch_size=64 is not allowed: at most 20"),
        (
            ["amp=O1", "amp.custom_white_list=[gemm]"],
            "amp.custom_white_list=['gemm'] is not allowed: op names from conv2d",
        ),
        (
            ["dist.nnodes=2", "dist.master_port=29561", "dist.interface=nosuch0"],
            "dist.interface='nosuch0' is not allowed: an interface of this host with an IPv4 address: ",
        ),
    ],
)
def test_a_refusal_ends_the_command_in_one_line(args, expected, unitrain_cli):
    """As a user would: exit 2, one line, no run directory; the last three are refused once the
    job has started (the data's size, the framework's op names, the node's interfaces)."""
    result = unitrain_cli(*FAST, "trainer.steps=2", *args)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not result.run_dir.exists() and not (result.run_dir.parent / "multirun").exists()


def test_empty_imagefolder(unitrain_cli, tmp_path):
    (tmp_path / "data" / "cls").mkdir(parents=True)
    result = unitrain_cli("data=imagefolder", f"data.path={tmp_path / 'data'}", *FAST)
    assert result.returncode == 2 and "none found" in result.stderr and "Traceback" not in result.stderr


def test_unwritable_run_dir_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "unitrain", *FAST, f"hydra.run.dir={blocker / 'run'}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"unitrain: error: hydra.run.dir='{blocker / 'run'}' is not allowed: Not a directory; allowed: a directory "
        "this user can write"
    ]


def test_run_dir_with_earlier_results_is_refused_and_kept(unitrain_cli):
    first = unitrain_cli(*FAST, "trainer.steps=2")
    assert first.returncode == 0, first.stderr[-2000:]
    kept = {
        p: p.read_bytes()
        for p in [
            first.run_dir / "metrics.jsonl",
            first.run_dir / "summary.json",
            first.run_dir / ".hydra" / "config.yaml",
        ]
    }
    again = unitrain_cli(*FAST, "trainer.steps=3")
    assert again.returncode == 2
    assert "it holds an earlier run's results (metrics.jsonl), which this run would replace" in again.stderr
    assert {p: p.read_bytes() for p in kept} == kept


@pytest.mark.slow
def test_default_run_dirs_of_simultaneous_runs_differ(tmp_path):
    args = [sys.executable, "-m", "unitrain", *FAST, "trainer.steps=2"]
    procs = [
        subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    summaries = list((tmp_path / "runs").glob("*/*/summary.json"))
    assert len(summaries) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_loss_stops_with_one_line(backend, unitrain_cli):
    result = unitrain_cli(f"backend={backend}", *FAST, "trainer.steps=6", "optim.lr=1e30")
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and "the loss is nan at step" in errors[0] and "trainer.on_nonfinite=warn" in errors[0], (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not (result.run_dir / "summary.json").exists()
    assert result.metrics(), "the steps before the stop are kept"


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_loss_warned_in_data_parallel_compares_ranks_nan_safely(backend, unitrain_cli):
    result = unitrain_cli(
        f"backend={backend}",
        *FAST,
        "trainer.steps=4",
        "optim.lr=1e30",
        "trainer.on_nonfinite=warn",
        "dist.nproc_per_node=2",
        "trainer.threads=1",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr + "".join(p.read_text() for p in result.run_dir.glob("workerlog.*"))
    assert "trainer.on_nonfinite=warn" in output
    assert "parameters differ across ranks" not in output
    assert result.summary()["ranks_in_sync"] is True and result.summary()["final"]["finite"] is False


def test_missing_framework_names_the_extra(tmp_path):
    import subprocess
    import sys

    # A fresh interpreter in which paddle cannot be imported, as on a machine without it.
    code = (
        "import sys; sys.modules['paddle'] = None\n"
        "import unitrain\n"
        "try:\n    unitrain.get_backend('paddle')\n"
        "except unitrain.BackendUnavailableError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path).stdout
    assert "backend 'paddle' needs the 'paddle' framework, which is not installed" in out
    assert "pip install 'unitrain[paddle]'" in out


def test_out_of_memory_is_one_line(tmp_path):
    """What preflight could not foresee (the activations): the process's address space is capped at
    2 GiB, which a batch of 1024x1024 images passes at start and the step then exceeds."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "unitrain", "backend=torch", *FAST, "data.image_size=1024", "trainer.steps=2"]
        + [f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=cap,
        timeout=300,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "unitrain: error: out of memory (data.image_size=1024, trainer.batch_size=16, model=tiny, "
        "data.num_classes=10); allowed: a smaller image size, batch, model or number of classes"
    ]
    assert not run_dir.exists()  # a refusal of the job's sizes leaves nothing behind


@pytest.mark.slow
def test_more_workers_than_cores_is_warned_in_one_line(unitrain_cli):
    from unitrain.host.threads import available_cores

    workers = available_cores() + 1
    result = unitrain_cli(
        *FAST[:-2], "trainer.progress=false", "trainer.steps=2", "trainer.threads=1", f"dist.nproc_per_node={workers}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [
        x
        for x in (result.stdout + result.stderr).splitlines()
        if f"dist.nproc_per_node={workers} is more than the" in x
    ]
    assert len(warnings) == 1
