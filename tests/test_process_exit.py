"""Every unitrain command ends through unitrain.host.processes.run_command, which skips Python's
teardown: nothing a normal exit finishes may be lost by it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

COMMAND = """
import atexit, sys, threading, time
from pathlib import Path
from unitrain.host.processes import run_command

out = Path(sys.argv[1])
log = open(out / "unflushed.txt", "w")  # never flushed nor closed, as a careless writer leaves it
for _ in range(10):
    log.write("a line\\n")
log.write("the last, without a newline")
atexit.register(lambda: (out / "atexit.txt").write_text("ran"))

def late():
    time.sleep(0.3)
    (out / "thread.txt").write_text("finished")

threading.Thread(target=late).start()
from concurrent.futures import ThreadPoolExecutor

ThreadPoolExecutor(2).submit(print, end="")  # left running, as Inductor's compile pool is
print("buffered stdout, no newline", end="")

def main():
    {body}

run_command(main)
"""


def end(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", COMMAND.format(body=body), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "body, status, stderr",
    [
        ("return None", 0, ""),
        ("return 3", 3, ""),
        ("sys.exit(2)", 2, ""),
        ("sys.exit('unitrain: error: said in one line')", 1, "unitrain: error: said in one line\n"),
        ("return 128 + 15", 143, ""),
    ],
)
def test_a_command_ends_with_its_status_and_nothing_it_wrote_is_lost(tmp_path, body, status, stderr):
    done = end(tmp_path, body)
    assert (done.returncode, done.stderr) == (status, stderr)
    assert done.stdout == "buffered stdout, no newline"
    assert (tmp_path / "unflushed.txt").read_text() == "a line\n" * 10 + "the last, without a newline"
    assert (tmp_path / "atexit.txt").read_text() == "ran"  # logging's flush, temporary folders, ...
    assert (tmp_path / "thread.txt").read_text() == "finished"  # a thread that is not a daemon


def test_an_unexpected_exception_ends_as_python_ends_it(tmp_path):
    done = end(tmp_path, "raise RuntimeError('a bug')")
    assert done.returncode == 1 and done.stderr.rstrip().endswith("RuntimeError: a bug")
    assert "Traceback" in done.stderr and (tmp_path / "atexit.txt").exists()
