"""Bad files in an image folder: one line naming the file, or skipped and counted; never a hang."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import BACKENDS, FAST

RUN = [*FAST, "data=imagefolder", "data.image_size=16", "trainer.batch_size=4", "trainer.steps=4", "trainer.epochs=2"]


def image_folder(root, bad: str | None = None):
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(8):
            Image.fromarray((np.random.default_rng(i).random((20, 20, 3)) * 255).astype("uint8")).save(
                root / c / f"{i}.jpg"
            )
    victim = root / "dog" / "3.jpg"
    if bad == "truncated":
        victim.write_bytes(victim.read_bytes()[:300])
    elif bad == "text":
        victim.write_text("this is not a JPEG")
    elif bad == "empty":
        victim.write_bytes(b"")
    return victim


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("bad", ["truncated", "text", "empty"])
def test_a_bad_file_ends_the_run_with_one_line_naming_it(backend, workers, bad, unitrain_cli, tmp_path):
    victim = image_folder(tmp_path / "data", bad)
    # The subprocess timeout is the hang check: Paddle's reader thread used to die and leave its
    # main process waiting forever.
    result = unitrain_cli(
        f"backend={backend}", *RUN, f"data.path={tmp_path / 'data'}", f"data.num_workers={workers}", timeout=120
    )
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("unitrain: error:")]
    assert len(errors) == 1 and str(victim) in errors[0] and "data.skip_bad_files=true" in errors[0], result.stderr[
        -3000:
    ]
    assert "Traceback" not in result.stderr
    # A refusal leaves nothing behind: the steps before it are no results (no checkpoint holds them).
    assert not result.run_dir.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_skip_bad_files_skips_and_counts_them(backend, unitrain_cli, tmp_path):
    victim = image_folder(tmp_path / "data", "truncated")
    result = unitrain_cli(
        f"backend={backend}", *RUN, f"data.path={tmp_path / 'data'}", "data.skip_bad_files=true", "data.num_workers=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary()
    assert summary["data_skipped_files"] == {"count": 1, "files": [str(victim)]}
    assert summary["num_samples"] == 15


def test_one_class_folder_is_refused_in_one_line(unitrain_cli, tmp_path):
    image_folder(tmp_path / "data")
    import shutil

    shutil.rmtree(tmp_path / "data" / "dog")
    result = unitrain_cli(*RUN, f"data.path={tmp_path / 'data'}")
    assert (
        result.returncode == 2
        and "at least 2 class sub-directories" in result.stderr
        and "Traceback" not in result.stderr
    )


# Slow by the fast suite's budget (two processes starting): make test stays under 12 minutes.
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_file_in_data_parallel_is_the_same_one_line_and_leaves_no_run_directory(backend, unitrain_cli, tmp_path):
    victim = image_folder(tmp_path / "data", "truncated")
    result = unitrain_cli(f"backend={backend}", *RUN, f"data.path={tmp_path / 'data'}", "dist.nproc_per_node=2")
    # The other rank only lost its peer: that is not news to the user, the file is.
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr[-3000:]
    assert str(victim) in result.stderr and "data.skip_bad_files=true" in result.stderr
    assert not result.run_dir.exists()
