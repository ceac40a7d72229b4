"""Profiling (timer and trace) and the comparison report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import BACKENDS, FAST, run_unitrain

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_timer_summary_adds_up_to_the_loop_time(backend, unitrain_cli):
    result = unitrain_cli(f"backend={backend}", *FAST, "trainer.steps=12", "profiler.warmup_steps=0")
    assert result.returncode == 0, result.stderr[-2000:]
    s, records = result.summary(), result.metrics()
    assert sum(r["batch_cost"] for r in records) == pytest.approx(s["wall_time_s"], rel=0.1)
    assert s["profiler"]["measured_steps"] == 12
    for key in ("reader_cost", "batch_cost", "ips", "steps_per_s"):
        assert set(s["profiler"][key]) == {"avg", "max", "min", "median"}
    assert "Reader Ratio" in result.stdout and "Perf Summary" in result.stdout
    assert s["memory"]["peak_host_rss_mb"][0] > 50 and s["memory"]["peak_device_mb"] is None


# Seconds of simulated decoding per sample. resnet18 at 32x32 computes for ~40 ms a step on
# torch and ~130 ms on paddle here. Paddle's single-process loader already prefetches the next
# batch in a thread (use_buffer_reader, on by default), so a slow dataset only shows there once
# a batch takes longer to make than a step to compute: 16 x 12 ms does, 16 x 2 ms is enough
# for torch, whose single-process loader reads inline.
DELAY = {"paddle": 0.012, "torch": 0.002}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_slow_data_shows_in_reader_cost_and_loader_workers_hide_it(backend, tmp_path):
    common = [f"backend={backend}", "model=resnet18", "data=synthetic", "data.image_size=32", "trainer.threads=2",
              "trainer.progress=false", "trainer.steps=12", "profiler.warmup_steps=3"]  # fmt: skip
    slow_data = f"data.sample_delay_s={DELAY[backend]}"
    fast = run_unitrain(common, tmp_path / "fast")
    slow = run_unitrain([*common, slow_data], tmp_path / "slow")
    workers = run_unitrain([*common, slow_data, "data.num_workers=2"], tmp_path / "workers")
    for r in (fast, slow, workers):
        assert r.returncode == 0, r.stderr[-2000:]
    reader = {name: r.summary()["profiler"] for name, r in (("fast", fast), ("slow", slow), ("workers", workers))}
    assert reader["slow"]["reader_cost"]["median"] > 5 * reader["fast"]["reader_cost"]["median"]
    assert reader["slow"]["reader_ratio"] > reader["fast"]["reader_ratio"] + 0.05
    assert reader["workers"]["reader_ratio"] < reader["slow"]["reader_ratio"] / 2, reader


@pytest.mark.parametrize("backend", BACKENDS)
def test_trace_mode_writes_a_chrome_trace_and_an_operator_table(backend, unitrain_cli):
    result = unitrain_cli(f"backend={backend}", *FAST, "trainer.steps=6", "profiler.mode=trace", "profiler.start=2", "profiler.steps=2")
    assert result.returncode == 0, result.stderr[-2000:]
    trace = json.loads((result.run_dir / "trace.rank0.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert len(events) > 100
    top = result.summary()["trace"]["top_operators"]
    assert top and all(set(r) == {"name", "calls", "self_ms", "total_ms", "self_share"} for r in top)
    assert any("conv" in r["name"].lower() for r in top[:5])
    assert sum(r["self_share"] for r in top) <= 1.0 + 1e-9
    assert (result.run_dir / "top_ops.rank0.md").read_text().startswith("| operator | calls | self ms")


def test_trace_window_beyond_the_run_is_said(unitrain_cli):
    result = unitrain_cli("backend=torch", *FAST, "trainer.steps=3", "profiler.mode=trace", "profiler.start=10")
    assert result.returncode == 0
    assert "was not reached" in result.stdout + result.stderr
    assert result.summary()["trace"] is None and not (result.run_dir / "trace.rank0.json").exists()


@pytest.mark.slow
def test_multirun_report_has_table_plots_and_html(tmp_path):
    result = run_unitrain(["-m", "backend=paddle,torch", "amp=O0,O1", "amp.dtype=bfloat16", *FAST, "trainer.steps=6"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = tmp_path / "multirun"
    table = (sweep / "comparison.md").read_text()
    assert table.startswith("| backend | amp requested | amp effective | world |")
    assert "| paddle | O1 bfloat16 | fp32 |" in table and "| torch | O1 bfloat16 | O1 bfloat16 |" in table
    assert "not be fair" not in table  # backend and amp were swept on purpose
    assert table.splitlines()[2] in result.stdout
    for name in ("curves.png", "throughput.png", "step_time.png"):
        data = (sweep / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    page = (sweep / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<table>" in page and "torch 2.13.0" in page


def test_unfair_comparison_is_flagged(tmp_path):
    one = run_unitrain(["backend=torch", *FAST, "trainer.steps=4", "trainer.threads=1"], tmp_path / "a")
    two = run_unitrain(["backend=paddle", *FAST, "trainer.steps=4", "trainer.threads=2"], tmp_path / "b")
    assert one.returncode == 0 and two.returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "unitrain.compare", str(one.run_dir), str(two.run_dir), "--out", str(tmp_path / "cmp"), "--target-loss", "50"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: runs differ in trainer.threads (1 vs 2): the comparison would not be fair" in proc.stdout
    assert "Not a fair comparison" in (tmp_path / "cmp" / "report.html").read_text()
    assert "time to loss" in proc.stdout.splitlines()[0]


def test_swept_threads_are_not_unfair_and_repeats_make_one_row(tmp_path):
    args = ["-m", "backend=torch", "trainer.threads=1,2", "model=tiny", "data.image_size=16", "trainer.progress=false"]
    result = run_unitrain([*args, "trainer.steps=4", "trainer.repeats=2"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / "multirun" / "comparison.md").read_text()
    assert "not be fair" not in table
    rows = [line for line in table.splitlines() if line.startswith("| torch")]
    assert len(rows) == 2 and all("(2 repeats)" in r for r in rows)


def test_compare_rejects_a_directory_without_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "unitrain.compare", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"unitrain.compare: error: no summary.json in {tmp_path} or below it: not a unitrain run or multirun directory"


def test_tensorboard_events_and_missing_visualdl(unitrain_cli, tmp_path):
    result = unitrain_cli("backend=torch", *FAST, "trainer.steps=3", "trainer.loggers=[tensorboard]")
    assert result.returncode == 0, result.stderr[-2000:]
    (events,) = (result.run_dir / "tensorboard").glob("events.out.tfevents.*")
    assert events.stat().st_size > 100
    missing = run_unitrain(["backend=torch", *FAST, "trainer.steps=3", "trainer.loggers=[visualdl]"], tmp_path / "vdl")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == "unitrain: error: trainer.loggers=[visualdl] needs VisualDL: pip install 'unitrain[visualdl]'"
