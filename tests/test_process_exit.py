"""Every unitrain command ends as Python ends a program (unitrain.host.processes.run_command:
``sys.exit`` with its status, then the interpreter's own exit): what a user's code leaves to a
normal exit is finished, in the main process and in every worker, however the command started."""

from __future__ import annotations

import gzip
import os
import pstats
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import FAST

ROOT = Path(__file__).resolve().parents[1]

#: What a user's module may do at import and leave to the interpreter's exit: a gzip file (its
#: trailer) and a zip file (its central directory) never closed, a temporary file deleted when it
#: is freed, an atexit hook. Each process that imports it writes its own files, named by its pid.
LEFT_OPEN = """
import atexit, gzip, os, tempfile, zipfile
from pathlib import Path

OUT = Path(os.environ["EXIT_PROBE_DIR"])
ME = OUT / str(os.getpid())
GZ = gzip.open(f"{ME}.gz", "wt")
GZ.write("x" * 100_000)
ZIP = zipfile.ZipFile(f"{ME}.zip", "w")
ZIP.writestr("a.txt", "whole")
HELD = tempfile.NamedTemporaryFile(dir=OUT, prefix="held-", delete=True)
atexit.register(lambda: Path(f"{ME}.atexit").write_text("ran"))
"""

COMMAND = (
    LEFT_OPEN
    + """
import sys, threading, time
from unitrain.host.processes import run_command

log = open(OUT / "unflushed.txt", "w")  # never flushed nor closed, as a careless writer leaves it
for _ in range(10):
    log.write("a line\\n")
log.write("the last, without a newline")

def late():
    time.sleep(0.3)
    (OUT / "thread.txt").write_text("finished")

threading.Thread(target=late).start()
from concurrent.futures import ThreadPoolExecutor

ThreadPoolExecutor(2).submit(print, end="")  # left running, as Inductor's compile pool is
print("buffered stdout, no newline", end="")

def main():
    {body}

run_command(main)
"""
)


def left_whole(folder: Path) -> dict:
    """For each process that imported LEFT_OPEN into ``folder``: whether it left its gzip file
    whole, its zip file whole and ran its atexit hook; and the temporary files still there."""
    found = {}
    for gz in sorted(folder.glob("*.gz")):
        try:
            gz_whole = gzip.decompress(gz.read_bytes()) == b"x" * 100_000
        except (OSError, EOFError):
            gz_whole = False
        try:
            with zipfile.ZipFile(gz.with_suffix(".zip")) as z:
                zip_whole = z.read("a.txt") == b"whole"
        except (OSError, zipfile.BadZipFile, KeyError):
            zip_whole = False
        found[gz.stem] = {"gz": gz_whole, "zip": zip_whole, "atexit": gz.with_suffix(".atexit").exists()}
    return {"processes": found, "temporary files left": sorted(p.name for p in folder.glob("held-*"))}


def end(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", COMMAND.replace("{body}", body)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "EXIT_PROBE_DIR": str(tmp_path)},
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
    assert (tmp_path / "thread.txt").read_text() == "finished"  # a thread that is not a daemon
    found = left_whole(tmp_path)
    # atexit: logging's flush, temporary folders, ...
    assert list(found["processes"].values()) == [{"gz": True, "zip": True, "atexit": True}], found
    assert found["temporary files left"] == []


def test_an_unexpected_exception_ends_as_python_ends_it(tmp_path):
    done = end(tmp_path, "raise RuntimeError('a bug')")
    assert done.returncode == 1 and done.stderr.rstrip().endswith("RuntimeError: a bug")
    assert "Traceback" in done.stderr and list(tmp_path.glob("*.atexit"))


def test_the_console_script_is_python_m_unitrain():
    """``unitrain`` (pyproject's script, and the one installed) runs what ``python -m unitrain``
    runs, so that both end alike: a closed pipe quiet, the interpreter's exit whole."""
    from importlib.metadata import entry_points

    declared = re.search(r'^unitrain = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared and declared.group(1) == "unitrain.__main__:main"
    installed = [e.value for e in entry_points(group="console_scripts") if e.name == "unitrain"]
    assert installed == ["unitrain.__main__:main"], "reinstall: pip install -e ."


# --- a user's module in real jobs: the main process and every worker ---------------------------

#: LEFT_OPEN in a user's model factory (model=custom), so that every process that builds or
#: checks the model imports it.
FACTORY = (
    LEFT_OPEN
    + """
import torch


class Net(torch.nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)

    def forward(self, x):
        return self.fc(x.mean((2, 3)))


def build(num_classes, image_size):
    return Net(num_classes)
"""
)
JOB = ["backend=torch", *FAST, "model=custom", "model.torch=leaves_open:build", "trainer.steps=2"]
#: How each job starts: the console script on one process; ``python -m cProfile -m unitrain``
#: on two (the main process and two workers import the factory).
STARTS = ["unitrain, 1 process", "python -m cProfile -m unitrain, 2 processes"]
EACH_START = [STARTS[0], pytest.param(STARTS[1], marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    made = {}

    def run(start: str) -> Path:
        if start not in made:
            root = tmp_path_factory.mktemp("exit-job")
            (root / "leaves_open.py").write_text(FACTORY)
            probe = root / "probe"
            probe.mkdir()
            if start == STARTS[0]:
                command = [str(Path(sys.executable).with_name("unitrain")), *JOB]
            else:
                from unitrain.host.ports import free_port

                profile = ["-m", "cProfile", "-o", str(root / "p.out"), "-m", "unitrain"]
                command = [sys.executable, *profile, *JOB, "dist.nproc_per_node=2", f"dist.master_port={free_port()}"]
            done = subprocess.run(
                [*command, f"hydra.run.dir={root / 'run'}"],
                cwd=root,
                # The user's module on the path: a console script, unlike python -m, has no cwd on it.
                env={**os.environ, "EXIT_PROBE_DIR": str(probe), "PYTHONPATH": _path(root)},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            assert (root / "run" / "summary.json").is_file()
            made[start] = root
        return made[start]

    return run


def _path(first: Path) -> str:
    return os.pathsep.join(filter(None, [str(first), os.environ.get("PYTHONPATH")]))


def processes(job_root: Path, start: str) -> dict:
    found = left_whole(job_root / "probe")
    assert len(found["processes"]) == (1 if start == STARTS[0] else 3), found
    return found


@pytest.mark.parametrize("start", EACH_START)
def test_a_gzip_file_a_user_module_left_open_is_whole(job, start):
    found = processes(job(start), start)
    assert all(p["gz"] for p in found["processes"].values()), found


@pytest.mark.parametrize("start", EACH_START)
def test_a_zip_file_a_user_module_left_open_has_its_central_directory(job, start):
    found = processes(job(start), start)
    assert all(p["zip"] for p in found["processes"].values()), found


@pytest.mark.parametrize("start", EACH_START)
def test_a_named_temporary_file_held_by_a_user_module_is_deleted(job, start):
    assert processes(job(start), start)["temporary files left"] == []


@pytest.mark.parametrize("start", EACH_START)
def test_a_user_modules_atexit_hooks_run_however_the_command_started(job, start):
    found = processes(job(start), start)
    assert all(p["atexit"] for p in found["processes"].values()), found


@pytest.mark.slow
def test_python_m_cprofile_writes_the_profile_of_a_job(job):
    profile = pstats.Stats(str(job(STARTS[1]) / "p.out"))
    assert any(file.endswith(os.path.join("unitrain", "app.py")) for file, _, _ in profile.stats)


def test_the_frameworks_objects_leave_the_collectors_scans_unless_user_code_came_first():
    """get_backend takes the framework's objects out of the cyclic collector's scans (its exit
    collection was most of torch's teardown); a process that imported a user's module first
    keeps every object collectable, so that the module's files are closed at exit (tested above)."""
    code = (
        "import gc, sys\n"
        "from unitrain.host import processes\n"
        "from unitrain.interface.backend import get_backend\n"
        "if sys.argv[1] == 'user': processes.user_code_loaded()\n"
        "get_backend('torch')\n"
        "print(gc.get_freeze_count())\n"
    )
    frozen = [
        int(subprocess.run([sys.executable, "-c", code, who], capture_output=True, text=True, check=True).stdout)
        for who in ("framework", "user")
    ]
    assert frozen[0] > 10_000 and frozen[1] == 0
