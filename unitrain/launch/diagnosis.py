"""Which process brought a job down, said in one line that ends with the log holding the rest
(never a framework's dump on the user's screen)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from unitrain.config.schema import DistConfig
from unitrain.errors import Refusal, UnitrainError
from unitrain.host import processes
from unitrain.interface.launch import Launcher
from unitrain.launch.workers import DEATH_POLL_S, worker_statuses, zombie

LOG_TAIL_LINES = 20


class WorkerFailedError(UnitrainError):
    """A data-parallel worker failed; the message names the rank and ends with its log's path."""

    exit_code = 1


def _last_lines(path: Path, lines: int = LOG_TAIL_LINES) -> List[str]:
    return (
        path.read_text(encoding="utf-8", errors="replace").rstrip("\n").splitlines()[-lines:] if path.exists() else []
    )


def _log_of(status: Dict[str, Any]) -> str:
    return status.get("log") or f"workerlog.{status['local_rank']}"


def _name_of(status: Dict[str, Any]) -> str:
    return status.get("name") or f"rank {status['rank']}"


def _lost_a_peer(run_dir: Path, status: Dict[str, Any], launcher: Launcher) -> bool:
    # Far enough back to get past a C++ stack dump printed after the error.
    text = status.get("error", "") + "\n".join(_last_lines(run_dir / _log_of(status), 400))
    return any(marker in text for marker in launcher.peer_loss_markers)


class DeathWatch:
    """When each worker still marked running was first seen gone, polled from the main process:
    of two ranks that both ended without a word, the first to go brought the job down, the
    other was stopped after it (by the launcher, whose SIGTERM a rank blocked in a collective
    cannot act on)."""

    def __init__(self, run_dir: Path):
        # rank -> when first seen gone, in the clock of the workers' own reports (time.time())
        self.run_dir, self.gone = run_dir, {}

    def poll(self) -> None:
        for s in worker_statuses(self.run_dir):
            if s["status"] == "running" and s["rank"] not in self.gone:
                start = processes.start_time(s["pid"])
                if start is None or s.get("start", start) != start or zombie(s["pid"]):
                    self.gone[s["rank"]] = time.time()


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


def _plural(names: List[str]) -> str:
    """``rank(s) 0, 1``, or the names themselves when they are not ranks (parameter servers)."""
    if any(not n.startswith("rank ") for n in names):
        return ", ".join(names)
    return "rank(s) " + ", ".join(n[5:] for n in names)


def _roles(
    statuses: List[Dict[str, Any]], run_dir: Path, gone: Dict[int, float], launcher: Launcher
) -> Dict[str, List[Dict[str, Any]]]:
    """Who brought the job down (culprits), who lost the connection to them (followers), who the
    launcher stopped after (stopped), and who ended in a later poll than the first (after).

    A worker still marked "running" ended without a word (killed by a signal, or crashed hard).
    Ranks whose log says a peer went away died of another's death, not their own. A rank
    "terminated" was stopped by the launcher after another one failed."""
    ended = [s for s in statuses if s["status"] in ("running", "failed")]
    causes = [s for s in ended if not _lost_a_peer(run_dir, s, launcher)]
    vanished = [s for s in causes if s["status"] == "running"]
    after: List[Dict[str, Any]] = []
    if len(vanished) > 1 and all(s["rank"] in gone for s in vanished):
        # Seen gone in different polls: the later ones died of the first one's death.
        first = min(gone[s["rank"]] for s in vanished)
        after = [s for s in vanished if gone[s["rank"]] > first + 2 * DEATH_POLL_S]
        vanished = [s for s in vanished if s not in after]
    culprits = _failed_first(causes, vanished, gone) or vanished or sorted(causes, key=_when)[:1] or ended
    return {
        "culprits": culprits,
        "followers": [s for s in ended if s not in culprits and s not in after],
        "stopped": [s for s in statuses if s["status"] == "terminated"],
        "after": after,
    }


def _first_stopped(roles: Dict[str, List[Dict[str, Any]]]) -> Dict[str, List[Dict[str, Any]]]:
    """Where every rank was stopped by a signal (SIGTERM), the first to be: the launcher stops the
    others only after one ended, so that one was stopped from outside the job."""
    if not roles["culprits"] and roles["stopped"]:
        first, *rest = sorted(roles["stopped"], key=_when)
        return {**roles, "culprits": [first], "stopped": rest}
    return roles


def _why(status: Dict[str, Any]) -> str:
    """How a rank that brought the job down ended, in its own words where it said any."""
    if status["status"] == "failed":
        return f"failed: {status['error']}"
    if status["status"] == "terminated":
        return f"was stopped first, by {status.get('error') or 'SIGTERM'} from outside the job"
    return "stopped without reporting (killed by a signal?)"


def _when(status: Dict[str, Any]) -> float:
    return status.get("time", 0)


def _failed_first(
    causes: List[Dict[str, Any]], vanished: List[Dict[str, Any]], gone: Dict[int, float]
) -> List[Dict[str, Any]]:
    """A rank that failed (and said why) before any of the vanished ones was seen gone: they
    died of its leaving (a Paddle parameter server crashes when a trainer leaves mid-job)."""
    if not vanished or not all(v["rank"] in gone for v in vanished):
        return []
    first_gone = min(gone[v["rank"]] for v in vanished)
    failed = [s for s in causes if s["status"] == "failed" and _when(s) < first_gone]
    return sorted(failed, key=_when)[:1]


def _shared_refusal(processes: List[Dict[str, Any]]) -> Optional[UnitrainError]:
    """The one setting or file every one of ``processes`` refused, or None."""
    errors = {s.get("error") for s in processes}
    if not processes or len(errors) != 1 or not all(s["status"] == "failed" and s.get("user_error") for s in processes):
        return None
    kind = Refusal if all(s.get("refusal") for s in processes) else UnitrainError
    return kind(errors.pop())


def _another_node(
    run_dir: Path, launcher: Launcher, returncode: int, dist: DistConfig, culprits: List[Dict[str, Any]]
) -> UnitrainError:
    """Every rank of this node only lost a peer: the cause is on another node."""
    worst = run_dir / _log_of(culprits[0])
    return WorkerFailedError(
        f"dist.nnodes={dist.nnodes}: {_plural([_name_of(s) for s in culprits])} of node {dist.node_rank} lost the "
        "connection to another node mid-run (it stopped, or the network between the nodes went away: its own run "
        f"directory says which); {launcher.module} exited with code {returncode}; see {worst}"
    )


def _known_failure(
    run_dir: Path, launcher: Launcher, dist: DistConfig, started: bool, workers: int
) -> Optional[UnitrainError]:
    """A failure the launcher can name from its own log and this node's ``workers`` worker logs."""
    worker_logs = [_read(run_dir / f"workerlog.{i}") for i in range(workers)]
    return launcher.known_failure(dist, _read(run_dir / "launcher.log"), worker_logs, started)


def diagnose(
    run_dir: Path,
    launcher: Launcher,
    returncode: int,
    dist: Optional[DistConfig] = None,
    gone: Optional[Dict[int, float]] = None,
    workers: int = 0,
) -> UnitrainError:
    """Name the rank that brought the job down, and its log (``workers``: this
    node's processes that write workerlog.<i>, where a launcher's own failure shows)."""
    statuses = worker_statuses(run_dir)
    known = _known_failure(run_dir, launcher, dist, bool(statuses), workers) if dist is not None else None
    if known is not None:
        return known
    failed = [s for s in statuses if s["status"] == "failed"]
    # Every process that failed refused the same setting or file, and the others were stopped
    # after it (or had finished): the refusal is the whole story.
    others_stopped = all(s["status"] in ("terminated", "done") for s in statuses if s["status"] != "failed")
    refused = _shared_refusal(failed) if others_stopped else None
    if refused is not None:
        return refused
    roles = _first_stopped(_roles(statuses, run_dir, gone or {}, launcher))
    culprits = roles["culprits"]
    refused = _shared_refusal(culprits)
    if refused is not None:
        # The others only lost the connection to the refusing rank (or were stopped after it),
        # which the user cannot act on: the refusal is still the whole story.
        return refused
    if not culprits:
        launcher_log = run_dir / "launcher.log"
        last = next((line.strip() for line in reversed(_last_lines(launcher_log)) if line.strip()), "(no output)")
        return WorkerFailedError(
            f"{launcher.module} exited with code {returncode} before any worker reported, its last line: "
            f"{last[:300]}; see {launcher_log}"
        )
    if dist is not None and dist.nnodes > 1 and all(_lost_a_peer(run_dir, s, launcher) for s in culprits):
        return _another_node(run_dir, launcher, returncode, dist, culprits)
    lines = [f"{_name_of(s)} {_why(s)}" for s in culprits]
    for role, what in (
        ("followers", "then lost the connection to it"),
        ("stopped", "were then stopped by the launcher"),
        ("after", "ended after it (the launcher stops the others when one fails)"),
    ):
        if roles[role]:
            lines.append(f"{_plural([_name_of(s) for s in roles[role]])} {what}")
    worst = run_dir / _log_of(culprits[0])
    return WorkerFailedError(f"{'; '.join(lines)}; {launcher.module} exited with code {returncode}; see {worst}")
