"""A reader that stops reading (``| head -c 20``) is no error: the command says nothing of it, a
training job runs on to its own outcome and status, and ``unitrain.generate`` stops, with 0."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unitrain.host.console import _Unread

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def unread_pipe():
    """The write end of a pipe whose reader is gone."""
    read, write = os.pipe()
    os.close(read)
    yield write
    os.close(write)


def test_a_console_whose_reader_is_gone_drops_what_is_written_from_then_on(unread_pipe):
    raw = _Unread(unread_pipe, "<stdout>", stop=False)
    assert raw.write(b"nobody reads this\n") == len(b"nobody reads this\n")
    assert raw.unread and os.readlink(f"/proc/self/fd/{unread_pipe}") == os.devnull
    assert raw.write(b"nor this") == 8  # the descriptor (and a child's copy of it) is /dev/null's


def test_a_command_that_stops_when_unread_gets_broken_pipe_once(unread_pipe):
    out = io.TextIOWrapper(io.BufferedWriter(_Unread(unread_pipe, "<stdout>", stop=True)), line_buffering=True)
    with pytest.raises(BrokenPipeError):
        out.write("a token\n")
    out.write("what it still writes as it ends\n")
    out.flush()


def test_a_log_line_to_a_console_nobody_reads_is_no_logging_error(unread_pipe, capsys):
    stream = io.TextIOWrapper(io.BufferedWriter(_Unread(unread_pipe, "<stdout>", stop=False)), line_buffering=True)
    logger = logging.getLogger("unitrain.test_closed_pipe")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        for step in range(3):
            logger.warning("step %d", step)
    finally:
        logger.removeHandler(handler)
    assert "Logging error" not in capsys.readouterr().err


# --- end to end: a real pipe, closed after 20 bytes --------------------------------------------

#: A GPT on this repository's docs, two steps and a checkpoint: the job and the text generated
#: from it.
JOB = [
    "backend=torch",
    "model=gpt_nano",
    "data=text",
    "trainer.steps=2",
    "trainer.checkpoint_every=2",
    "trainer.threads=1",
    "trainer.progress=false",
]


def read_20_bytes_then_close(command: list, cwd: Path) -> tuple:
    """``command | head -c 20``: its exit status and what it wrote to stderr."""
    with open(cwd / "stderr.txt", "w+") as err:
        proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=err)
        try:
            assert len(proc.stdout.read(20)) == 20
            proc.stdout.close()
            status = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return status, err.read()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("closed-pipe")
    corpus = root / "docs.txt"
    corpus.write_text("\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))))
    run = root / "run"
    command = [sys.executable, "-m", "unitrain", *JOB, f"data.path={corpus}", f"hydra.run.dir={run}"]
    status, err = read_20_bytes_then_close(command, root)
    return run, status, err


def test_a_job_whose_output_nobody_reads_finishes_quietly_with_its_own_status(trained):
    run, status, err = trained
    assert (status, err) == (0, "")  # no traceback, no "Logging error", no "Broken pipe"
    assert (run / "summary.json").is_file() and (run / "checkpoints" / "step2").is_dir()


def test_generated_text_nobody_reads_stops_quietly_with_status_0(trained, tmp_path):
    run = trained[0]
    status, err = read_20_bytes_then_close(
        [sys.executable, "-m", "unitrain.generate", str(run), "--tokens", "3000"], tmp_path
    )
    assert status == 0 and err.startswith("torch, checkpoint ") and len(err.splitlines()) == 1, err
