"""Errors a user can act on: each renders as one line naming the problem and what is allowed."""

import json
import os
import re
from pathlib import Path


class UnitrainError(Exception):
    """Base class; the command line prints these as a single line and exits with status 2."""


class Refusal(UnitrainError):
    """A value or an input refused as it stands (a config value, a checkpoint that does not fit):
    the job leaves nothing behind. Not a failure of the job itself (a node that never came, a full
    disk), whose logs are kept."""


class ConfigError(Refusal):
    """A config value that is well-typed but not allowed (Hydra already rejects wrong keys and types)."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r} is not allowed: {allowed}")


class NothingLeftToRun(UnitrainError):
    """A resumed run whose checkpoint is already at its last step: not an error, nothing changes."""

    exit_code = 0


class Stopped(UnitrainError):
    """The job was stopped by a signal (a closed terminal, ``timeout``, a scheduler's cancel)."""

    def __init__(self, signum: int):
        import signal

        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}; nothing it started is left running")


class UnknownNameError(UnitrainError, KeyError):
    """A name looked up in a registry that does not hold it."""

    def __init__(self, kind: str, name: str, available):
        self.kind, self.name, self.available = kind, name, sorted(available)
        super().__init__(f"unknown {kind} {name!r}; available: {', '.join(self.available)}")

    # KeyError quotes its message; keep the readable one.
    __str__ = Exception.__str__


class BackendUnavailableError(Refusal, ImportError):
    """The backend (or an extension it was asked for, such as Apex) exists but is not installed:
    the job as configured cannot run here, and leaves nothing behind."""


def framework_cause(err: BaseException) -> str:
    """The line of a framework's error that names the cause, with where in the model it was:
    a tracer's report opens with "In transformed code:" and ends with the error itself."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if not lines:
        return ""
    named = [line for line in reversed(lines) if re.match(r"^\w+(Error|Exception)\b", line)]
    cause = named[0] if named else f"{type(err).__name__}: {lines[0]}"
    places = re.findall(r'File "([^"]+)", line (\d+)', str(err))
    own = [(f, n) for f, n in places if CONVERTED in f or ("site-packages" not in f and "/unitrain/" not in f)]
    return cause + (f" (at {_place(*own[-1])})" if own else "")


#: In the path of a translated copy of a user's code (model.<backend>=convert), which lives in
#: unitrain's cache: its lines are the copy's, mapped back to the user's by <copy>.lines.json.
CONVERTED = "unitrain_converted_"


def _place(path: str, line: str) -> str:
    """file.py:N of a place in a framework's report: a translated copy's line as the user's file
    and line where the translation mapped it (backends/paddle/translation/lines.py), else the
    copy's own path."""
    if CONVERTED not in path:
        return f"{os.path.basename(path)}:{line}"
    try:
        found = json.loads(Path(path + ".lines.json").read_text(encoding="utf-8"))
        return f"{os.path.basename(found['source'])}:{int(found['lines'][str(line)])}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"{path}:{line} of the converted copy"
