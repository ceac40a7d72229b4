"""The benchmark harness runs on a tiny configuration and writes its files (timings are not checked)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import alive, descendants

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.mark.slow
def test_quick_benchmark_writes_json_and_markdown(tmp_path):
    proc = subprocess.run(
        # One layout: the 2 x 1 overhead row has a test of its own (below).
        [sys.executable, str(HARNESS), "--quick", "--repeats", "1", "--pairs", "1", "--layouts", "1x2"]
        + ["--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["backend"], r["processes"], r["threads"]) for r in results["overhead"]] == [
        ("paddle", 1, 2),
        ("torch", 1, 2),
    ]
    for row in results["overhead"]:
        assert row["model"] == "resnet18" and row["unitrain_startup_s"] > 0 and row["native_startup_s"] > 0
        assert (
            row["ratio_ci"][0] <= row["ratio"] <= row["ratio_ci"][1]
            and row["cpu_ratio_ci"][0] <= row["cpu_ratio"] <= row["cpu_ratio_ci"][1]
        )
    assert results["machine"]["extensions"]
    assert [(r["backend"], r["data"], r["workers"]) for r in results["data"]] == [
        (backend, data, 0) for backend in ("paddle", "torch") for data in ("synthetic", "imagefolder")
    ]
    variants = {(r["backend"], r["variant"]) for r in results["scaling"]}
    for backend in ("paddle", "torch"):
        assert {(backend, "default"), (backend, "no all-reduce (2 independent jobs)")} <= variants
    # Each 2-process row reads the all-reduce its job really ran (the levers' rows: a full run).
    assert all(r["buckets"] for r in results["scaling"] if r["variant"] == "default")
    # backend.tuned=true gets a scaling row only where it applies something: never torch on a CPU.
    tuned_scaling = [r for r in results["scaling"] if r["variant"].startswith("backend.tuned=true")]
    assert all(r["backend"] == "paddle" and "MKL" in r["variant"] and r["ips_1x1"] > 0 for r in tuned_scaling), (
        tuned_scaling
    )
    assert [r["grad_compression"] for r in results["compression"]] == ["none", "fp16"]
    assert all(0 <= r["val_top1"] <= 1 for r in results["compression"])
    tuned = {(r["backend"], r["variant"]): r["applied"] for r in results["tuned"]}
    assert tuned[("torch", "channels_last")] and tuned[("paddle", "to_static")], tuned
    assert [r["backend"] for r in results["maxbatch"]] == ["paddle", "torch"] and all(
        r["max_batch_size"] >= 64 for r in results["maxbatch"]
    )
    assert {r["model"] for r in results["loop"]} == {"resnet18"} and {r["backend"] for r in results["loop"]} == {
        "paddle",
        "torch",
    }
    amp = {(r["backend"], r["amp"]): r["effective"] for r in results["amp"]}
    assert amp[("paddle", "O2")] == "fp32" and amp[("torch", "O2")] == "O2 bfloat16"
    assert (tmp_path / "results.png").stat().st_size > 0
    text = (tmp_path / "results.md").read_text()
    for heading in (
        "## Overhead",
        "## The loop alone",
        "## Start-up",
        "## Data loading",
        "## Data-parallel scaling",
        "## What fp16 gradient compression costs",
        "## Each framework at its best",
        "## Largest batch that fits",
        "## Mixed precision",
    ):
        assert heading in text


def test_bn_variance_reproduces_paddles_held_out_result_and_times_the_correction(tmp_path):
    """A Paddle run's checkpoint, evaluated in torch with the running variance it recorded
    (torch's unbiased one since unitrain's Paddle models follow it), gives Paddle's own held-out
    result; the biased definition gives another loss. The cost section runs and writes its files."""
    from conftest import FAST, run_unitrain

    run = run_unitrain(
        [
            "backend=paddle",
            *FAST,
            "trainer.batch_size=4",
            "trainer.steps=30",
            "data.val_samples=64",
            "trainer.checkpoint_every=30",
        ],
        tmp_path / "job",
    )
    assert run.returncode == 0, run.stderr[-2000:]
    script = str(HARNESS.parent / "bn_variance.py")
    proc = subprocess.run(
        [sys.executable, script, "accuracy", str(run.run_dir), "--out", str(tmp_path / "acc")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads((tmp_path / "acc" / "results.json").read_text())["rows"]
    held_out = run.summary()["eval"]
    assert row["step"] == 30 and row["smallest_n"] == 4  # batch 4, 1x1 maps in the last stages
    assert (
        abs(row["unbiased"]["val_loss"] - held_out["val_loss"]) < 1e-4
        and row["unbiased"]["val_top1"] == held_out["val_top1"]
    )
    assert abs(row["biased"]["val_loss"] - row["unbiased"]["val_loss"]) > 1e-4
    proc = subprocess.run(
        [sys.executable, script, "cost", "--quick", "--steps", "2", "--out", str(tmp_path / "cost")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (cost,) = json.loads((tmp_path / "cost" / "cost.json").read_text())["rows"]
    assert (
        cost["model"] == "tiny 16x16 batch 8"
        and cost["wall_ratio"][1] <= cost["wall_ratio"][0] <= cost["wall_ratio"][2]
    )
    assert "| tiny 16x16 batch 8 |" in (tmp_path / "cost" / "cost.md").read_text()


@pytest.mark.slow
def test_malloc_benchmark_runs_all_four_variants_and_writes_their_ratios(tmp_path):
    script = HARNESS.parent / "malloc.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--pairs", "1", "--backend", "paddle", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["backend"] == "paddle" and results["model"] == "resnet18" and results["pairs"] == 1
    assert set(results["step_ms"]) == {"unitrain dynamic", "native dynamic", "unitrain fixed", "native fixed"}
    assert all(v > 0 for v in results["step_ms"].values())
    assert [r["ratio"] for r in results["ratios"]][1] == "unitrain fixed / native fixed"
    assert all(r["ci"][0] <= r["median"] <= r["ci"][1] for r in results["ratios"])
    assert "| unitrain fixed / native fixed |" in (tmp_path / "results.md").read_text()


@pytest.mark.slow
def test_overhead_rows_can_be_measured_alone_and_a_wrong_one_is_named(tmp_path):
    args = [
        sys.executable,
        str(HARNESS),
        "--quick",
        "--sections",
        "overhead",
        "--backends",
        "torch",
        "--pairs",
        "1",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(
        [*args, "--layouts", "2x1", "--models", "resnet18"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "results.json").read_text())["overhead"]
    assert [(r["model"], r["backend"], r["processes"], r["threads"]) for r in rows] == [("resnet18", "torch", 2, 1)]
    assert "resnet18 torch 2x1 pair 1/1: unitrain" in proc.stdout  # a long row shows each pair as it ends
    wrong = subprocess.run([*args, "--layouts", "3x1"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "3x1 is not allowed" in wrong.stderr and "--layouts takes 1x2, 2x1" in wrong.stderr


RESULTS = HARNESS.parent / "results"


def test_report_only_draws_a_committed_run_and_leaves_its_numbers_alone(tmp_path):
    shutil.copy(RESULTS / "tuned_paddle_mkl_avx2" / "results.json", tmp_path)
    before = (tmp_path / "results.json").read_bytes()
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--report-only", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "results.json").read_bytes() == before
    text = (tmp_path / "results.md").read_text()
    for row in json.loads(before)["tuned"]:
        assert f"| {row['model']} {row['image_size']}x{row['image_size']} | paddle | mkl_avx2 |" in text
        assert f"| {row['speedup']:.3f} [{row['speedup_ci'][0]:.3f}, {row['speedup_ci'][1]:.3f}] |" in text
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rows_measured_apart_combine_into_one_report_that_names_each_rows_run(tmp_path):
    """A noisy row measured again alone (more pairs, its own --out) replaces its row of the full
    run in the combined report; the other rows stay, and each row names the run it came from."""
    full, alone = RESULTS / "overhead_paddle", RESULTS / "overhead_paddle_resnet50_2x1"
    out = tmp_path / "combined"
    args = [sys.executable, str(HARNESS), "--combine", str(full), str(alone), "--out", str(out)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())["overhead"]
    (replacement,) = json.loads((alone / "results.json").read_text())["overhead"]
    expected = [
        replacement if (r["model"], r["processes"]) == ("resnet50", 2) else r
        for r in json.loads((full / "results.json").read_text())["overhead"]
    ]
    assert [r["ratio"] for r in rows] == [r["ratio"] for r in expected] and len(rows) == 4
    assert [r["measured_at"] for r in rows] == [full.name, full.name, full.name, alone.name]
    assert (
        f"| {replacement['pairs']} | {alone.name} |" in (out / "results.md").read_text()
        and (out / "results.png").exists()
    )
    again = subprocess.run(args, capture_output=True, text=True, timeout=120)  # never over an earlier report
    assert (
        again.returncode == 2 and "one is there already" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    )


@pytest.mark.parametrize("found", [RESULTS / "malloc" / "results.json", RESULTS / "2026-11-22" / "results.json", None])
def test_results_it_cannot_keep_are_refused_before_anything_runs(tmp_path, found):
    """--out holding another script's results, an older harness's, or a garbled file: one line,
    exit 2, and the file as it was (a run would otherwise have written over it)."""
    if found:
        shutil.copy(found, tmp_path / "results.json")
    else:
        (tmp_path / "results.json").write_text('{"machine": {"cpu"')
    before = (tmp_path / "results.json").read_bytes()
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--quick", "--sections", "amp", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "is not results of this harness" in line and "nothing was run or written" in line
    assert (tmp_path / "results.json").read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "results.json"
    ]


QUICK_TORCH = ["--quick", "--repeats", "1", "--backends", "torch"]


@pytest.fixture(scope="module")
def earlier_maxbatch_run(tmp_path_factory) -> Path:
    """An earlier run's results.json (the maxbatch section alone), which each interrupted run
    below starts from a copy of: one run serves both ways of interrupting."""
    out = tmp_path_factory.mktemp("earlier")
    first = subprocess.run(
        [sys.executable, str(HARNESS), *QUICK_TORCH, "--sections", "maxbatch", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    return out / "results.json"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["Ctrl-C", "SIGTERM"])
def test_a_partial_run_keeps_the_other_sections_and_an_interrupt_keeps_the_finished_ones(
    tmp_path, how, earlier_maxbatch_run
):
    """An hour of benchmarks is not lost: a run of some sections keeps what --out held for the
    others (each row saying when it was measured), every finished section is written at once,
    and Ctrl-C (the terminal's whole job) or SIGTERM (the harness alone, as a scheduler sends
    it) ends every command the harness started and says what was kept."""
    base = [sys.executable, str(HARNESS), *QUICK_TORCH, "--out", str(tmp_path)]
    shutil.copy(earlier_maxbatch_run, tmp_path / "results.json")
    (kept,) = json.loads((tmp_path / "results.json").read_text())["maxbatch"]

    def terminal_job():  # SIGINT as a terminal's foreground job gets it, even under a backgrounded suite
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    second = subprocess.Popen(
        [*base, "--sections", "amp,data"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=terminal_job,
    )
    seen, deadline = set(), time.monotonic() + 240
    while time.monotonic() < deadline and not json.loads((tmp_path / "results.json").read_text())["amp"]:
        assert second.poll() is None, second.communicate()
        time.sleep(0.2)
    while time.monotonic() < deadline and not alive(seen):  # the data section's first job is up
        seen |= descendants(second.pid)
        time.sleep(0.1)
    assert alive(seen), "the data section started no command"
    if how == "Ctrl-C":
        os.killpg(second.pid, signal.SIGINT)
    else:
        os.kill(second.pid, signal.SIGTERM)
    _, stderr = second.communicate(timeout=60)
    signum = signal.SIGINT if how == "Ctrl-C" else signal.SIGTERM
    assert second.returncode == 128 + signum
    (line,) = stderr.strip().splitlines()
    assert f"stopped by {signum.name} during data" in line and "(amp)" in line
    deadline = time.monotonic() + 10
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(seen), [Path(f"/proc/{p}/cmdline").read_text() for p in alive(seen)]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["maxbatch"] == [kept] and results["data"] == []
    assert [r["amp"] for r in results["amp"]] == ["O0", "O2"] and {r["measured_at"] for r in results["amp"]} == {
        results["started"]
    }
    assert kept["measured_at"] != results["started"] and set(results["runs"]) == {
        kept["measured_at"],
        results["started"],
    }
    text = (tmp_path / "results.md").read_text()
    assert (
        "## Largest batch that fits" in text and f"| {kept['measured_at']} |" in text and "## Mixed precision" in text
    )
    assert (tmp_path / "results.png").stat().st_size > 0


@pytest.mark.slow
def test_a_failing_section_is_logged_and_the_others_still_run(tmp_path):
    """A command that fails costs its section only: one line naming it, its error in a file, the
    next section measured and written, exit status 1. The fault: maxbatch's interpreter cannot
    start (a sitecustomize that exits), as a broken environment would make it. The next section is
    loop: one command for torch where amp's are two jobs."""
    (tmp_path / "fault").mkdir()
    (tmp_path / "fault" / "sitecustomize.py").write_text(
        # At start-up `python -m unitrain.maxbatch ...` shows as ["-m", *its arguments]; only it takes --memory-limit.
        'import sys\nif sys.argv[:1] == ["-m"] and "--memory-limit" in sys.argv:\n'
        '    raise SystemExit("maxbatch cannot start here")\n'
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fault")}
    proc = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            "--quick",
            "--repeats",
            "1",
            "--backends",
            "torch",
            "--sections",
            "maxbatch,loop",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    first, last = proc.stderr.strip().splitlines()
    assert (
        "section maxbatch failed: maxbatch torch failed (exit status 1): SystemExit: maxbatch cannot start here"
        in first
        and "failed: maxbatch" in last
    )
    assert "maxbatch cannot start here" in (out / "failed_maxbatch.log").read_text()
    results = json.loads((out / "results.json").read_text())
    assert results["maxbatch"] == [] and [(r["model"], r["backend"]) for r in results["loop"]] == [
        ("resnet18", "torch")
    ]


@pytest.mark.slow
def test_hand_written_parameter_server_scripts_do_unitrains_work(tmp_path):
    """One pair per framework of unitrain's job and the hand-written script on the same rows:
    both run to the end, leave nothing running, and every trainer takes as many examples."""
    data = tmp_path / "data"
    made = subprocess.run(
        [sys.executable, "-m", "unitrain.make_criteo", "--rows", "512", "--parts", "2", "--out", str(data)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    script = HARNESS.parent / "ps_handwritten.py"
    # Two steps a trainer: the jobs' start-up (12 framework processes) is most of the test.
    args = [str(data), "--pairs", "1", "--rows", "256", "--batch", "128", "--out", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "ps_handwritten.json").read_text())
    for backend, (pair,) in record["pairs"].items():
        unitrain, written = pair["unitrain"]["detail"], pair["handwritten"]["detail"]
        assert unitrain["steps"] == 256 // 128, backend
        assert [t["examples"] for t in written["trainers"]] == [256, 256], backend
        assert pair["ratio_step"] > 0 and pair["ratio_loop"] > 0
    assert "| torch" in (tmp_path / "out" / "ps_handwritten.md").read_text()
    left = [p for p in Path("/proc").glob("[0-9]*") if str(tmp_path).encode() in _cmdline(p)]
    assert alive({int(p.name) for p in left}) == set()


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
