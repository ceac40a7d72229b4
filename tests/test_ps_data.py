"""Criteo files of any size for the parameter-server job: read as a stream, sharded across
trainers, never whole in memory; the generator of teacher-labelled files; bad files in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from conftest import run_unitrain
from unitrain.data import criteo, criteo_files, multislot
from unitrain.errors import UnitrainError

SMALL = ["experiment=wide_deep_ps", "trainer.log_every=10", "data=criteo"]


def _write(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _rows_of(segments) -> list:
    return [line.rstrip("\n") for _, _, line in criteo_files.numbered_lines(segments)]


@pytest.mark.parametrize("files,trainers", [(1, 2), (1, 3), (2, 3), (3, 2), (4, 2), (5, 5)])
def test_trainer_shares_are_disjoint_and_cover_the_training_rows(files, trainers, tmp_path):
    lines = criteo.synthetic_lines(101, seed=1)
    cut = np.linspace(0, len(lines), files + 1).astype(int)
    for j in range(files):
        _write(tmp_path / f"part-{j}.tsv", lines[cut[j] : cut[j + 1]])
    parts = criteo_files.find_parts(str(tmp_path if files > 1 else tmp_path / "part-0.tsv"))
    assert sum(p.lines for p in parts) == 101
    shares = criteo_files.shares(parts, 0, 90, trainers)  # the last 11 rows held out
    read = [_rows_of(s) for s in shares]
    assert sorted(r for share in read for r in share) == sorted(lines[:90])
    if files >= trainers and files > 1:
        # By file: no trainer reads a line another trains on, and each reads whole files.
        assert all(seg.step == 1 for share in shares for seg in share)
    else:
        # By line, as CtrData.shard takes rows: trainer i reads rows i, i+T, ...
        assert read == [lines[:90][i::trainers] for i in range(trainers)]


def test_a_file_without_a_last_newline_counts_its_last_line(tmp_path):
    path = tmp_path / "day.tsv"
    path.write_text("\n".join(criteo.synthetic_lines(3, seed=0)))
    assert criteo_files.count_lines(str(path)) == 3


def _peak_bytes(path: Path, batch_size: int) -> int:
    parts = criteo_files.find_parts(str(path))
    share = criteo_files.FileRows(
        segments=tuple(criteo_files.shares(parts, 0, parts[-1].lines, 1)[0]),
        buckets=1000,
        standardize=criteo_files.Standardize(mean=np.zeros(13, np.float32), std=np.ones(13, np.float32)),
    )
    tracemalloc.start()
    try:
        rows = sum(len(b) for b in share.batches(batch_size))
        return tracemalloc.get_traced_memory()[1], rows
    finally:
        tracemalloc.stop()


def test_the_reader_holds_one_batch_not_the_file(tmp_path):
    lines = criteo.synthetic_lines(criteo.BLOCK, seed=2)
    small, large = tmp_path / "small.tsv", tmp_path / "large.tsv"
    _write(small, lines[:1000])
    _write(large, lines * 5)
    peak_small, rows_small = _peak_bytes(small, 100)
    peak_large, rows_large = _peak_bytes(large, 100)
    assert (rows_small, rows_large) == (1000, 5 * criteo.BLOCK // 100 * 100)
    # 20x the rows, the same memory: what is held is a batch (100 rows of about 250 bytes as
    # text, then as arrays), never the 5 MB file.
    assert peak_large < 1.5 * peak_small + 100_000, (peak_small, peak_large)
    assert peak_large < 1_000_000


def test_a_bad_line_in_a_folder_names_its_file_and_line(tmp_path):
    lines = criteo.synthetic_lines(60, seed=3)
    _write(tmp_path / "part-0.tsv", lines[:30])
    bad = lines[30:]
    bad[7] = bad[7].replace("\t", " ", 3)
    _write(tmp_path / "part-1.tsv", bad)
    parts = criteo_files.find_parts(str(tmp_path))
    share = criteo_files.FileRows(
        segments=tuple(criteo_files.shares(parts, 0, 60, 1)[0]),
        buckets=1000,
        standardize=criteo_files.Standardize(mean=np.zeros(13, np.float32), std=np.ones(13, np.float32)),
    )
    with pytest.raises(UnitrainError) as err:
        list(share.batches(10))
    message = str(err.value)
    assert "part-1.tsv" in message and "line 8 has 37 fields" in message and "\n" not in message


@pytest.mark.parametrize("make", ["missing", "empty folder", "empty file"])
def test_missing_or_empty_data_is_one_line(make, tmp_path):
    path = tmp_path / "data"
    if make == "empty folder":
        path.mkdir()
    elif make == "empty file":
        path.write_text("")
    with pytest.raises(UnitrainError, match="data.path=.* is not allowed: .*Criteo TSV file") as err:
        criteo_files.find_parts(str(path))
    assert "\n" not in str(err.value)


def _make_criteo(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "unitrain.make_criteo", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_generator_writes_teacher_labelled_parts_and_reports_the_ceiling(tmp_path):
    out = tmp_path / "criteo"
    result = _make_criteo("--rows", "5000", "--parts", "3", "--held-out", "2000", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    files = sorted((out / "train").iterdir())
    assert [f.name for f in files] == ["part-00000.tsv", "part-00001.tsv", "part-00002.tsv"]
    # The same rows as the synthetic set of that seed, in Criteo's format.
    written = [line for f in files for line in f.read_text().splitlines()]
    assert written == criteo.synthetic_lines(5000, seed=2024)
    report = json.loads((out / "teacher.json").read_text())
    held_out = criteo.parse_lines((out / "held_out.tsv").read_text().splitlines(), 1000)
    # The teacher's AUC is a real ceiling: well above chance, and above what the dense
    # features alone give.
    assert 0.8 < report["teacher_auc"] < 1.0 and len(held_out) == 2000
    assert f"{report['teacher_auc']:.4f}" in result.stdout and "data.val_path=" in result.stdout
    again = _make_criteo("--rows", "10", "--out", str(out), cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "it exists" in again.stderr
    assert sorted((out / "train").iterdir()) == files  # nothing overwritten
    nowhere = _make_criteo("--rows", "10", "--out", "/proc/criteo", cwd=tmp_path)
    assert nowhere.returncode == 2 and nowhere.stderr.count("\n") == 1, nowhere.stderr
    assert (
        "--out='/proc/criteo' is not allowed: /proc: " in nowhere.stderr and "a folder you can write" in nowhere.stderr
    )


def test_criteos_own_cardinalities_make_tables_that_grow_with_the_rows(tmp_path):
    """--cardinality criteo: Criteo's slot sizes (three above 5 million values), so new ids keep
    coming as rows do, where the small profile's slots are exhausted in a few thousand rows;
    the same rows from the generator and the synthetic set, and a learnable teacher."""
    out = tmp_path / "criteo"
    made = _make_criteo(
        "--rows", "8192", "--held-out", "2000", "--cardinality", "criteo", "--out", str(out), cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    lines = (out / "train" / "part-00000.tsv").read_text().splitlines()
    assert lines == criteo.synthetic_lines(8192, seed=2024, cardinality="criteo")
    report = json.loads((out / "teacher.json").read_text())
    assert report["cardinality"] == "criteo" and 0.75 < report["teacher_auc"] < 1.0

    def distinct(rows, slot):
        return len({row.split("\t")[1 + criteo.DENSE_FEATURES + slot] for row in rows})

    big = criteo.CRITEO_CARDINALITIES.index(max(criteo.CRITEO_CARDINALITIES))
    small = criteo.synthetic_lines(8192, seed=2024)
    # The second 4,096 rows bring almost as many new values of the biggest slot as the first.
    assert distinct(lines, big) > 1.8 * distinct(lines[:4096], big) > 1.8 * 2000
    assert max(distinct(small, s) for s in range(criteo.SPARSE_SLOTS)) < 2000


def test_hashed_teacher_weights_are_standard_normal_and_the_same_in_every_call():
    values = np.arange(200_000)
    draws = criteo.hashed_normal(2024, 3, values)
    assert abs(draws.mean()) < 0.01 and abs(draws.std() - 1) < 0.01
    assert np.array_equal(draws[::7], criteo.hashed_normal(2024, 3, values[::7]))
    assert not np.array_equal(draws, criteo.hashed_normal(2024, 4, values))


def test_cardinality_is_criteo_synthetics_alone(tmp_path):
    from conftest import refusal

    said = refusal(["model=tiny", "data=synthetic", "data.cardinality=criteo"], tmp_path)
    expected = "data.cardinality='criteo' is not allowed: small with data=synthetic (only criteo_synthetic draws"
    assert said == f"unitrain: error: {expected} its values)"


@pytest.mark.slow
def test_torch_job_streams_a_folder_with_loader_workers_in_the_same_order(tmp_path):
    out = tmp_path / "criteo"
    assert (
        _make_criteo("--rows", "6000", "--parts", "3", "--held-out", "1000", "--out", str(out), cwd=tmp_path).returncode
        == 0
    )
    data = [f"data.path={out / 'train'}", f"data.val_path={out / 'held_out.tsv'}", "data.val_samples=1000"]
    results = {}
    for workers in (0, 2):
        result = run_unitrain(
            [*SMALL, *data, "backend=torch", "dist.ps.sync=sync", f"data.num_workers={workers}"],
            tmp_path / str(workers),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        results[workers] = result.summary()
    # Parsed by two loader processes, taken in turn: the same batches in the same order.
    assert results[0]["final_loss"] == results[2]["final_loss"]
    assert results[0]["eval"]["val_auc"] == results[2]["eval"]["val_auc"] > 0.7
    # Three files over two trainers: by file, the smallest share (one file) sets the steps.
    assert results[0]["steps"] == 2000 // 64


@pytest.mark.slow
def test_a_bad_line_read_by_a_loader_worker_is_one_line(tmp_path):
    lines = criteo.synthetic_lines(600, seed=4)
    lines[333] = "1\tnot a row"
    path = _write(tmp_path / "day.tsv", lines)
    args = [*SMALL, f"data.path={path}", "data.val_samples=100", "backend=torch", "data.num_workers=2"]
    result = run_unitrain(args, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "day.tsv" in lines[0] and "line 334 has 2 fields" in lines[0], result.stderr[-3000:]


# --- MultiSlot text for Paddle's dataset reader (dist.ps.feed=engine) ------------------------------
def test_multislot_lines_carry_exactly_the_rows_unitrain_parses(tmp_path):
    lines = criteo.synthetic_lines(300, seed=3)
    rows = criteo.parse_lines(lines, 1000)
    standardize = criteo_files.Standardize.of(rows)
    source = tmp_path / "part.tsv"
    source.write_text("".join(f"{x}\n" for x in lines))
    command = multislot.command(sys.executable, 1000, standardize, tmp_path / "errors")
    with open(source) as stdin:
        out = subprocess.run(command, shell=True, stdin=stdin, capture_output=True, text=True, check=True).stdout
    expected = standardize(criteo.parse_lines(lines, 1000))
    got = [line.split(" ") for line in out.splitlines()]
    assert len(got) == 300 and all(len(fields) == 1 + 13 + 1 + 26 + 1 + 1 for fields in got)
    assert {(f[0], f[14], f[41]) for f in got} == {("13", "26", "1")}
    # Float32 values survive the text exactly: the engine trains on the same numbers.
    np.testing.assert_array_equal(np.asarray([f[1:14] for f in got], np.float32), expected.dense)
    np.testing.assert_array_equal(np.asarray([f[15:41] for f in got], np.int64), expected.sparse)
    np.testing.assert_array_equal(np.asarray([f[42] for f in got], np.float32), expected.label)


def test_multislot_names_the_file_and_line_it_refuses(tmp_path):
    source = tmp_path / "part.tsv"
    source.write_text("".join(f"{x}\n" for x in criteo.synthetic_lines(5, seed=3)) + "2\t1\n")
    standardize = criteo_files.Standardize(mean=np.zeros(13, np.float32), std=np.ones(13, np.float32))
    errors = tmp_path / "errors"
    errors.mkdir()
    with open(source) as stdin:
        done = subprocess.run(
            multislot.command(sys.executable, 1000, standardize, errors), shell=True, stdin=stdin, capture_output=True
        )
    assert done.returncode == 1
    assert multislot.first_error(errors) == (
        f"the Criteo file {str(source)!r} is not allowed: line 6 has 2 fields; Criteo rows are 40 tab-separated "
        "fields (label 0/1, I1..I13 integers or empty, C1..C26)"
    )


@pytest.mark.parametrize(
    "backend,files,message",
    [
        ("torch", 2, "dist.ps.feed='engine' is not allowed: steps with backend=torch"),
        ("paddle", 1, "is not allowed: a folder of at least dist.ps.trainers=2 files with dist.ps.feed=engine"),
    ],
)
def test_engine_feed_is_refused_where_it_cannot_run_in_one_line(backend, files, message, tmp_path):
    """torch has no engine that runs passes; Paddle's gives each trainer whole files."""
    (tmp_path / "train").mkdir()
    lines = "".join(f"{x}\n" for x in criteo.synthetic_lines(200, seed=3))
    for j in range(files):
        (tmp_path / "train" / f"part-{j}.tsv").write_text(lines)
    (tmp_path / "held_out.tsv").write_text(lines)
    args = [
        "experiment=wide_deep_ps",
        f"backend={backend}",
        "data=criteo",
        f"data.path={tmp_path / 'train'}",
        f"data.val_path={tmp_path / 'held_out.tsv'}",
        "dist.ps.feed=engine",
    ]
    result = run_unitrain(args, tmp_path / "job")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
