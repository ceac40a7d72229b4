"""What the parameter servers hold and how the modes behave, with real jobs on both engines:
rows created on first sight, the optimizers' rules, checkpoints and resume, sync equal to one
process, async that does not wait for a frozen trainer."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_ps import MIN_AUC, SMALL, paddle_ps_python

from conftest import run_unitrain

TORCH = ["backend=torch"]


def _python(backend: str) -> str:
    return paddle_ps_python() if backend == "paddle" else sys.executable


def _job(args, tmp_path, backend="torch"):
    result = run_unitrain([*SMALL, f"backend={backend}", *args], tmp_path, python=_python(backend))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _table(checkpoint: Path) -> dict:
    """Every saved table file of a torch checkpoint, rows sorted by id."""
    out = {}
    for path in sorted(checkpoint.glob("table.*.npz")):
        with np.load(path) as saved:
            order = np.argsort(saved["ids"])
            for key in saved.files:
                out.setdefault(key, []).append(saved[key][order])
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "paddle"])
def test_tables_create_rows_when_ids_are_first_seen_whatever_the_buckets(backend, tmp_path):
    summaries = {}
    for buckets in (10**6, 10**9):
        # One trainer: it sees every id the two would (the rows are the same), a process fewer.
        args = [f"model.sparse_buckets={buckets}", "dist.ps.sync=async", "dist.ps.trainers=1"]
        result = _job(args, tmp_path / str(buckets), backend)
        summaries[buckets] = result.summary()
    small, large = summaries[10**6], summaries[10**9]
    # A row per id seen, whatever the buckets: a thousand times more of them adds only the
    # ids that collided in a million (a few in a hundred), not a thousand times the memory.
    assert 0 < small["tables"]["rows"] <= large["tables"]["rows"] < 1.03 * small["tables"]["rows"]
    assert large["tables"]["rows"] < 3000 * 26
    assert all(v and v < 1500 for v in large["memory"]["server_peak_rss_mb"])
    assert large["memory"]["server_peak_rss_mb"][0] < 1.3 * small["memory"]["server_peak_rss_mb"][0]
    assert large["eval"]["val_auc"] > MIN_AUC


#: A torch sync job checkpointed every 10 steps (10, 20 and the last, 23, all kept), run once per
#: optimizer for the module: the tests that compare it with one process, resume it or refuse to
#: resume it read the same run. SGD at its own rate, the adaptive rules at 0.01.
SYNC_CHECKPOINTED = ["dist.ps.sync=sync", "trainer.checkpoint_every=10", "trainer.keep_checkpoints=0"]
SYNC_RATES = {"sgd": [], "adagrad": ["optim.lr=0.01"], "adam": ["optim.lr=0.01"]}


@pytest.fixture(scope="module")
def torch_sync(tmp_path_factory):
    made = {}

    def run(optim: str):
        if optim not in made:
            args = [f"optim={optim}", *SYNC_RATES[optim], *SYNC_CHECKPOINTED]
            made[optim] = (args, _job(args, tmp_path_factory.mktemp(f"sync-{optim}")))
        return made[optim]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["adagrad", "adam"])
def test_torch_sync_with_adaptive_rules_equals_one_process_at_the_combined_batch(optim, tmp_path, torch_sync):
    common = [f"optim={optim}", "optim.lr=0.01", "trainer.checkpoint_every=1000"]
    sync = torch_sync(optim)[1].summary()
    local = _job([*common, "dist.ps.servers=0", "dist.ps.trainers=1", "trainer.batch_size=128"], tmp_path / "local")
    local = local.summary()
    assert sync["observed"]["sparse_rule"] == local["observed"]["sparse_rule"] == optim
    assert sync["tables"]["rows"] == local["tables"]["rows"]
    # The same steps on the same rows; only the order of float additions differs (a mean of
    # two trainers' means against one mean), which Adam's normalised steps amplify on
    # parameters whose gradients are near zero: the model's quality is equal.
    assert sync["eval"]["val_auc"] == pytest.approx(local["eval"]["val_auc"], abs=2e-4)
    assert sync["eval"]["val_logloss"] == pytest.approx(local["eval"]["val_logloss"], abs=5e-4)
    assert sync["eval"]["val_auc"] > MIN_AUC


@pytest.mark.slow
def test_torch_sync_sgd_equals_one_process_to_rounding(tmp_path, torch_sync):
    sync = torch_sync("sgd")[1].run_dir / "checkpoints" / "step23"
    _job(
        ["trainer.checkpoint_every=1000", "dist.ps.servers=0", "dist.ps.trainers=1", "trainer.batch_size=128"], tmp_path
    )
    local = tmp_path / "run" / "checkpoints" / "step23"
    a, b = _table(sync), _table(local)
    assert np.array_equal(a["ids"], b["ids"])
    assert np.abs(a["weights"] - b["weights"]).max() < 1e-6
    dense = [torch.load(d / "dense.pt") for d in (sync, local)]
    assert max((dense[0]["tower"][k] - dense[1]["tower"][k]).abs().max().item() for k in dense[0]["tower"]) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["sgd", "adam"])
def test_torch_sync_resumed_from_a_checkpoint_ends_bit_for_bit_as_an_uninterrupted_run(optim, tmp_path, torch_sync):
    common, whole = torch_sync(optim)
    assert sorted(p.name for p in (whole.run_dir / "checkpoints").glob("step*")) == ["step10", "step20", "step23"]
    resumed = _job([*common, f"trainer.resume={whole.run_dir / 'checkpoints' / 'step10'}"], tmp_path / "resumed")
    summary = resumed.summary()
    assert summary["resumed_from"]["step"] == 10 and summary["steps"] == 13
    a, b = (r.run_dir / "checkpoints" / "step23" for r in (whole, resumed))
    ta, tb = _table(a), _table(b)
    assert ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)
    da, db = (torch.load(p / "dense.pt") for p in (a, b))
    assert all(torch.equal(da["tower"][k], db["tower"][k]) for k in da["tower"])
    assert summary["eval"] == {
        **whole.summary()["eval"],
        "eval_s": summary["eval"]["eval_s"],
        "elapsed_s": summary["eval"]["elapsed_s"],
    }


@pytest.mark.slow
def test_a_checkpoint_of_other_tables_is_refused_in_one_line(tmp_path, torch_sync):
    common, whole = torch_sync("sgd")
    result = run_unitrain(
        [*SMALL, *TORCH, "optim=adam", f"trainer.resume={whole.run_dir}"], tmp_path / "other", python=sys.executable
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "optim.name='sgd'" in lines[0] and "this job has 'adam'" in lines[0]
    # The end of the job: nothing left to run, said once by the trainers that found it.
    done = run_unitrain(
        [*SMALL, *TORCH, *common, f"trainer.resume={whole.run_dir}"],
        tmp_path / "again",
        python=sys.executable,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "nothing is left to run" in lines[0], done.stderr[-2000:]


@pytest.mark.slow
def test_paddle_geo_refuses_checkpoints_in_one_line(tmp_path):
    result = run_unitrain(
        [*SMALL, "backend=paddle", "dist.ps.sync=geo", "trainer.checkpoint_every=5"],
        tmp_path,
        python=paddle_ps_python(),
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "trainer.checkpoint_every" in lines[0] and "geo" in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["local", "sync"])
def test_paddle_resumes_its_servers_tables_and_dense_tower(layout, tmp_path):
    # Few checkpoints: each costs Fleet's servers seconds (sync: 23 steps; local: 47).
    common = ["trainer.checkpoint_every=12", "trainer.keep_checkpoints=0"]
    # Adam where resuming is exact; SGD on the servers, whose two trainers' Adam updates land in
    # either order, and then move the end by more than the resume is to be judged by.
    common += (
        ["optim=adam", "optim.lr=0.01", "dist.ps.servers=0", "dist.ps.trainers=1"]
        if layout == "local"
        else ["dist.ps.sync=sync"]
    )
    whole = _job(common, tmp_path / "whole", "paddle")
    resumed = _job([*common, f"trainer.resume={whole.run_dir / 'checkpoints' / 'step12'}"], tmp_path / "r", "paddle")
    losses = [
        {
            r["step"]: r["loss"]
            for r in map(json.loads, (run.run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r
        }
        for run in (whole, resumed)
    ]
    assert min(losses[1]) == 13
    a, b = whole.summary(), resumed.summary()
    if layout == "local":
        # One process: the saved program state is everything; the rest is exact.
        assert losses[1][13] == losses[0][13] and b["eval"]["val_auc"] == a["eval"]["val_auc"]
    else:
        # Fleet: the servers' saved tables and dense tables are loaded back; what differs is
        # the order the two trainers' pushes land in, as between two uninterrupted runs.
        assert losses[1][13] == pytest.approx(losses[0][13], rel=1e-3)
        assert b["eval"]["val_auc"] == pytest.approx(a["eval"]["val_auc"], abs=1e-3)
        assert b["tables"]["rows"] == a["tables"]["rows"]
        _a_checkpoint_in_other_shards_is_refused(whole.run_dir / "checkpoints" / "step12", common, tmp_path)


def _a_checkpoint_in_other_shards_is_refused(checkpoint: Path, common: list, tmp_path: Path) -> None:
    """Fleet loads a table saved in another number of shards (its default 1000, as unitrain's
    earlier checkpoints hold them) only in part, without a word: refused in one line."""
    other = tmp_path / "other-shards"
    shutil.copytree(checkpoint, other)
    number = json.loads((other / "tables.json").read_text())["deep_table"]
    shutil.copy(next((other / f"{number:03d}").glob("part-*")), other / f"{number:03d}" / "part-000-00999.gz")
    refused = run_unitrain(
        [*SMALL, "backend=paddle", *common, f"trainer.resume={other}"], tmp_path / "refused", python=_python("paddle")
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "holds deep_table in 17 shards, and this job's servers hold it in 16" in refused.stderr.splitlines()[-1]
    assert not refused.run_dir.exists()


def _worker_pid(run_dir: Path, name: str) -> int:
    for f in (run_dir / ".workers").glob("rank*.json"):
        status = json.loads(f.read_text())
        if status.get("name") == name:
            return status["pid"]
    raise AssertionError(f"no {name} in {run_dir}")


def _logged_step(log: Path) -> int:
    steps = re.findall(r"trainer \d step (\d+)/", log.read_text(errors="replace")) if log.exists() else []
    return int(steps[-1]) if steps else 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "paddle"])
def test_async_trainers_do_not_wait_for_a_frozen_one(backend, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *SMALL,
        f"backend={backend}",
        "dist.ps.sync=async",
        # 250 steps a trainer: enough for trainer 0 to go on past 20 + 50 while its peer is
        # frozen, little enough that the thawed one ends soon after.
        "data.num_samples=4000",
        "trainer.batch_size=8",
        "trainer.log_every=1",
    ]
    proc = subprocess.Popen(
        [_python(backend), "-m", "unitrain", *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    frozen = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and _logged_step(run_dir / "workerlog.1") < 20:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        frozen = _worker_pid(run_dir, "trainer 1")
        os.kill(frozen, signal.SIGSTOP)
        before, stuck = _logged_step(run_dir / "workerlog.0"), _logged_step(run_dir / "workerlog.1")
        time.sleep(8)
        during = _logged_step(run_dir / "workerlog.0") - before
        assert _logged_step(run_dir / "workerlog.1") == stuck  # it was frozen
    finally:
        if frozen:
            os.kill(frozen, signal.SIGCONT)
    # Thawed, it catches up and the job ends as any other.
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    # A trainer that waited for its frozen peer would take at most one step in those 8 s.
    assert during > 50, during


def _criteo_files(tmp_path: Path) -> list:
    from unitrain.data import criteo

    (tmp_path / "train").mkdir(parents=True)
    lines = criteo.synthetic_lines(3000, seed=2024)
    for j in range(2):
        (tmp_path / "train" / f"part-{j}.tsv").write_text("".join(f"{x}\n" for x in lines[j * 1500 : (j + 1) * 1500]))
    held_out = tmp_path / "held_out.tsv"
    held_out.write_text("".join(f"{x}\n" for x in criteo.synthetic_lines(1000, seed=2024, stream=criteo.HELD_OUT)))
    return ["data=criteo", f"data.path={tmp_path / 'train'}", f"data.val_path={held_out}", "data.val_samples=1000"]


#: What each layout's export writes (--format, --to): all four models once, and from Paddle's
#: Fleet checkpoint both frameworks' native ones.
SERVED = {
    ("torch", "sync"): ("native,onnx", "torch,paddle"),
    ("paddle", "async"): ("native", "torch,paddle"),
    ("paddle", "local"): ("native,onnx", "paddle"),
}


@pytest.mark.slow
@pytest.mark.parametrize("backend,layout", list(SERVED))
def test_a_trained_wide_deep_is_served_by_both_frameworks_and_scores_criteo_lines(backend, layout, tmp_path):
    data = _criteo_files(tmp_path / "data")
    mode = ["dist.ps.servers=0", "dist.ps.trainers=1"] if layout == "local" else [f"dist.ps.sync={layout}"]
    if layout == "async":
        # Fleet's own merging: 23 steps of Adam at lr 0.01, each an update of the tower with two
        # trainers' stale pulls between them, ended above the base rate's log loss once (0.710
        # against 0.672, AUC 0.826); what this test checks is serving, not that rate.
        mode.append("dist.ps.merge_pushes=null")
    job = _job([*data, *mode, "optim=adam", "optim.lr=0.01", "trainer.checkpoint_every=1000"], tmp_path, backend)
    trained = job.summary()["eval"]
    # What a layout changes is the checkpoint the export reads (torch's tables, Fleet's servers'
    # text tables, paddle.static.save's one program); each writer is the same code whatever the
    # source. So every writer runs once over the layouts, a Paddle model served by torch among
    # them, and every layout's export is scored (torch's writers cost 7-9 CPU s an export).
    formats, targets = SERVED[backend, layout]
    export = subprocess.run(
        [sys.executable, "-m", "unitrain.export", str(job.run_dir), "--format", formats, "--to", targets],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert export.returncode == 0, export.stderr[-3000:]
    manifest = json.loads((job.run_dir / "export" / "export.json").read_text())
    suffix = {
        ("torch", "native"): "pt2",
        ("paddle", "native"): "json",
        ("torch", "onnx"): "onnx",
        ("paddle", "onnx"): "onnx",
    }
    written = {f"wide_deep.{t}.{suffix[t, f]}" for t in targets.split(",") for f in formats.split(",")}
    assert sorted(manifest["artifacts"]) == sorted(written)
    assert all(a["max_abs_diff"] < 1e-5 for a in manifest["artifacts"].values())
    held_out = data[2].split("=", 1)[1]
    scored = subprocess.run(
        [sys.executable, "-m", "unitrain.infer", str(job.run_dir), "--criteo", held_out],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert scored.returncode == 0, scored.stderr[-3000:]
    aucs = [float(m) for m in re.findall(r"AUC (\d\.\d+)", scored.stdout)]
    # Every runtime, one model: the AUC the job itself measured on these rows (ids it never
    # trained on read as zero rows when served, as initial rows when the job evaluated).
    assert len(aucs) == len(manifest["artifacts"]) and all(
        a == pytest.approx(trained["val_auc"], abs=2e-3) for a in aucs
    ), scored.stdout
    assert len((job.run_dir / "export" / "scores.tsv").read_text().splitlines()) == 1000
    # Asynchronous training is not the same run twice (the trainers' pushes land as they come), and
    # over 23 steps it ended above the base rate's log loss now and then (0.688 and 0.710 against
    # 0.672): the rate is checked where the run is deterministic, serving everywhere.
    beats = job.summary()["beats_base_rate"]
    assert isinstance(beats, bool) and (beats or layout == "async"), job.summary()
    if layout == "sync":
        # Refused after the manifest, before any exported model loads: one layout shows it for all.
        missing = subprocess.run(
            [sys.executable, "-m", "unitrain.infer", str(job.run_dir), "--criteo", str(tmp_path / "nope.tsv")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "--criteo=" in missing.stderr
        _other_commands_say_what_takes_a_parameter_server_run(job.run_dir, tmp_path)


def _other_commands_say_what_takes_a_parameter_server_run(run_dir: Path, cwd: Path) -> None:
    """The image models' commands, given a parameter-server run or its export: one line that
    names what takes it, and nothing written."""
    checkpoint = next((run_dir / "checkpoints").glob("step*"))
    for command, says in (
        (["unitrain.convert", str(checkpoint), "--to", "torch"], "is a parameter-server job's (wide&deep)"),
        (["unitrain.quantize", str(checkpoint)], "is a parameter-server job's (wide&deep)"),
        (["unitrain.infer", str(run_dir / "export")], "is a parameter-server job's export (wide&deep)"),
    ):
        before = sorted(p.name for p in run_dir.rglob("*"))
        done = subprocess.run([sys.executable, "-m", *command], cwd=cwd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr[-2000:]
        assert sorted(p.name for p in run_dir.rglob("*")) == before


# --- dist.ps.feed=engine: Fleet's dataset API runs whole passes ------------------------------------
def _even_files(tmp_path: Path, parts: int = 4, rows_per_part: int = 768) -> list:
    """Part files of whole batches of 64: the engine's reader and unitrain's then cut the same batches."""
    from unitrain.data import criteo

    (tmp_path / "train").mkdir(parents=True)
    lines = criteo.synthetic_lines(parts * rows_per_part, seed=2024)
    for j in range(parts):
        chunk = lines[j * rows_per_part : (j + 1) * rows_per_part]
        (tmp_path / "train" / f"part-{j}.tsv").write_text("".join(f"{x}\n" for x in chunk))
    held_out = tmp_path / "held_out.tsv"
    held_out.write_text("".join(f"{x}\n" for x in criteo.synthetic_lines(1000, seed=2024, stream=criteo.HELD_OUT)))
    return [
        "data=criteo",
        f"data.path={tmp_path / 'train'}",
        f"data.val_path={held_out}",
        "data.val_samples=1000",
        "data.num_samples=null",
    ]


@pytest.mark.slow
def test_paddle_engine_pass_trains_the_same_model_as_unitrain_steps(tmp_path):
    """One thread of Fleet's QueueDataset reads the files through unitrain's parsing (as
    MultiSlot text) and train_from_dataset steps them: the model is the stepped one. The engine's
    C++ ops and the Python steps take different oneDNN/MKL paths on some CPUs (AVX-512: the log
    loss 1e-9 apart), so the loss agrees to rounding, the ranking (AUC) exactly."""
    data = _even_files(tmp_path / "data")
    local = ["dist.ps.servers=0", "dist.ps.trainers=1"]
    steps = _job([*data, *local], tmp_path / "steps", "paddle").summary()
    engine = _job([*data, *local, "dist.ps.feed=engine"], tmp_path / "engine", "paddle").summary()
    assert engine["observed"]["fed"]["threads"] == 1 and engine["observed"]["fed"]["files"] == 4
    assert steps["observed"]["fed"] is None
    assert engine["steps"] == steps["steps"] == 4 * 768 // 64
    assert engine["eval"]["val_auc"] == steps["eval"]["val_auc"]
    assert engine["eval"]["val_logloss"] == pytest.approx(steps["eval"]["val_logloss"], rel=1e-7, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "geo"])
def test_paddle_engine_passes_on_parameter_servers_in_threads(mode, tmp_path):
    data = _even_files(tmp_path / "data")
    result = _job([*data, f"dist.ps.sync={mode}", "dist.ps.feed=engine", "dist.ps.threads=2"], tmp_path, "paddle")
    summary = result.summary()
    # Each trainer's two files, one reader and trainer thread each, as Fleet reports them.
    assert summary["observed"]["fed"] == {
        "by": "Fleet QueueDataset (MultiSlotDataFeed) + Executor.train_from_dataset",
        "threads": 2,
        "files": 2,
    }
    assert summary["rows"] == 4 * 768 and summary["eval"]["val_auc"] > MIN_AUC
    assert "pass 1: 1536 rows" in (tmp_path / "run" / "workerlog.1").read_text()


@pytest.mark.slow
def test_paddle_engine_pass_names_a_bad_line(tmp_path):
    """Past the rows read for the standardization, so the engine's reader meets it: Fleet goes
    on past a pipe command that failed, and the job must not."""
    data = _even_files(tmp_path / "data", rows_per_part=2560)
    part = tmp_path / "data" / "train" / "part-3.tsv"
    lines = part.read_text().splitlines(keepends=True)
    lines[2499] = "1\tnot a count\n"
    part.write_text("".join(lines))
    result = run_unitrain(
        [*SMALL, "backend=paddle", *data, "dist.ps.feed=engine"], tmp_path / "job", python=paddle_ps_python()
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"unitrain: error: the Criteo file '{part}' is not allowed: line 2500 has 2 fields; Criteo rows are 40 "
        "tab-separated fields (label 0/1, I1..I13 integers or empty, C1..C26) (dist.ps.feed=engine: the pass "
        "skipped the rest of that file)"
    ]
