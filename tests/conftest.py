from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

#: A test that takes longer (its setup included: a shared run it starts first) is marked slow, so
#: that `make test` stays short; a test not marked so fails when it takes longer. The fast tests
#: keep well under it (these machines vary by 1.6x).
SLOW_S = 15.0


def _slow_limit() -> float:
    """SLOW_S for a test alone on the machine. Under pytest-xdist (`make test` runs two workers)
    each test shares the machine with another, which makes it up to twice as long as alone."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return SLOW_S * min(max(workers, 1), 2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration
    elif report.when == "call" and report.passed and "slow" not in item.keywords:
        took, limit = item.stash.get(_SETUP_S, 0.0) + report.duration, _slow_limit()
        if took > limit:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} took {took:.1f} s (setup included), over {limit:g} s: mark it @pytest.mark.slow "
                "(`make test` leaves slow tests out, CI runs them) or make it quicker"
            )


_SETUP_S = pytest.StashKey[float]()

# The tests run two or three at a time, and many start jobs of several processes with two
# threads each, so the two cores are oversubscribed: OpenMP threads (libgomp's in torch, Intel's
# in Paddle's MKL) that spin while they wait for work then take the cores the other jobs need.
# Waiting asleep cut a pair of slow test files' CPU time by a tenth. Jobs a user starts keep the
# libraries' default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("KMP_BLOCKTIME", "0")
# Inductor checks each SIMD instruction set the CPU lists by building a library and loading it in
# a child Python that links libtorch: ten children, about 3 CPU s, in every process that compiles
# (unitrain.infer's and unitrain.quantize's torch.compile), and the answer on a given machine is
# always the same. The tests take the CPU's list as it is; a user's compiles keep the check.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

# Small and quick: a tiny ResNet on small images, one thread: the tests run two or three at a
# time on two cores, where a second thread per job cost more CPU than it saved (a tenth of
# test_vit's wall time).
FAST = ["model=tiny", "data.image_size=16", "trainer.threads=1", "trainer.progress=false"]
BACKENDS = ["paddle", "torch"]


#: Planted in the environment of every job the tests start: tokens live in the environment, and no
#: file a job (or its launcher) leaves may hold it (holding_the_environment).
PLANTED, PLANTED_VALUE = "UNITRAIN_TEST_PLANTED_TOKEN", "planted-token-5be1c0"


def holding_the_environment(folder: Path) -> List[str]:
    """The files under ``folder`` that hold the planted variable's value."""
    return sorted(str(p) for p in Path(folder).rglob("*") if p.is_file() and PLANTED_VALUE.encode() in p.read_bytes())


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path, args: List[str] = ()):
        self.returncode, self.stdout, self.stderr, self.run_dir = proc.returncode, proc.stdout, proc.stderr, run_dir
        self.args = list(args)  # the overrides it ran with

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def metrics(self) -> List[dict]:
        """The training steps (held-out evaluations are lines of their own, without "loss")."""
        return [r for r in map(json.loads, (self.run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


def run_unitrain(
    args: List[str],
    tmp_path: Path,
    module: str = "unitrain",
    timeout: int = 300,
    python: str | None = None,
    env: Dict[str, str] | None = None,
) -> CliResult:
    """Run ``python -m unitrain`` as a user would, from outside the source tree, into tmp_path
    (``python``: another environment's interpreter, e.g. the parameter-server one; ``env``:
    variables set for it)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    run_dir = tmp_path / "run"
    hydra_dirs = [f"hydra.run.dir={run_dir}", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", PLANTED: PLANTED_VALUE, **(env or {})}
    proc = subprocess.run(
        [python or sys.executable, "-m", module, *args, *hydra_dirs],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc, run_dir, args)


#: Data parallel compared with one process: the same samples per step, BatchNorm frozen (batch
#: statistics over 8 samples differ from those over 16 by design), the global batch and lr kept,
#: the final weights saved, one thread a process.
EXACT = ["model.freeze_bn=true", "optim.lr_scaling=keep_global", "trainer.save_final_weights=true", "trainer.threads=1"]
DP_JOB = [*FAST, *EXACT, "trainer.steps=4", "trainer.batch_size=16"]


@pytest.fixture(scope="session", autouse=True)
def conversion_cache(tmp_path_factory):
    """Converted models (model.paddle=convert) cached for the session, never in the user's cache."""
    if "UNITRAIN_CACHE" not in os.environ:
        os.environ["UNITRAIN_CACHE"] = str(tmp_path_factory.mktemp("unitrain-cache"))
    return Path(os.environ["UNITRAIN_CACHE"])


@pytest.fixture(scope="session")
def dp_run(tmp_path_factory):
    """``dp_run(backend, processes)``: DP_JOB run once per session on ``processes`` processes of
    one node, shared by the tests that compare against it (it asserts nothing itself)."""
    from unitrain.host.ports import free_port

    made = {}

    def run(backend: str, processes: int) -> CliResult:
        if (backend, processes) not in made:
            root = tmp_path_factory.mktemp(f"dp-{backend}-{processes}")
            extra = [f"dist.nproc_per_node={processes}", f"dist.master_port={free_port()}"] if processes > 1 else []
            made[backend, processes] = run_unitrain([f"backend={backend}", *DP_JOB, *extra], root)
        return made[backend, processes]

    return run


@pytest.fixture
def unitrain_cli(tmp_path):
    return lambda *args, **kw: run_unitrain(list(args), tmp_path, **kw)


def descendants(pid: int) -> Set[int]:
    """Every process below ``pid`` (children, grandchildren...), from /proc."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:  # it ended while we looked (glob raises then, in Python 3.11)
            continue
        for task in tasks:
            try:
                children = {int(c) for c in Path(f"/proc/{parent}/task/{task}/children").read_text().split()}
            except OSError:
                continue
            todo += list(children - found)
            found |= children
    return found


def alive(pids: Set[int]) -> Set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":  # a zombie has ended; only its parent has not collected it yet
            left.add(pid)
    return left


def refusal(args: List[str], tmp_path: Path, command: str = "unitrain") -> str | None:
    """The one line ``python -m <command> <args>`` refuses its command line with, before anything
    is written, found in this process (the command's own preflight, no subprocess); None if it
    would start."""
    from unitrain.config.schema import register_configs
    from unitrain.launch.hydra import refusal as preflight_refusal

    register_configs()  # as each command does when it is imported
    if command == "unitrain":
        from unitrain.jobs.select import validate

        config_name = "config"
    elif command == "unitrain.parity":
        from unitrain.train.parity import validate

        config_name = "parity"
    else:
        from unitrain.deploy.quantize import validate

        config_name = "quantize"
    dirs = [f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    problem = preflight_refusal([*args, *dirs], config_name, validate)
    return None if problem is None else f"{command}: error: {problem}"


@pytest.fixture
def hosts():
    """Two hosts made of network namespaces (scripts/netns_hosts.py), gone after the test."""
    import uuid

    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import netns_hosts

    name = f"t{uuid.uuid4().hex[:6]}"
    with netns_hosts.Hosts.up(name, 2) as made:
        yield made
    # Nothing left behind: no namespace, so no interface and no process in one.
    assert netns_hosts.namespaces(name) == []
