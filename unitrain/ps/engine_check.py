"""Whether the installed framework can run a parameter-server job, asked once per installation.

The answer comes from a child process that imports the framework (this one imports none), which
costs seconds of start-up before every job. It depends only on the interpreter, the installed
framework and unitrain's backend module, so it is kept in the cache (``cache_root()/engines``)
under a key made of those: a reinstalled or upgraded framework, or an edited backend, asks again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from unitrain.errors import ConfigError
from unitrain.host.atomic import replace_text
from unitrain.host.cache import cache_dir
from unitrain.interface.modules import module_path


@dataclass(frozen=True)
class Answer:
    """The probe's answer: ``problem`` (None: the engine is there) and whether it may be kept
    (a probe that could not load the backend at all is asked again next time)."""

    problem: Optional[str]
    lasting: bool


def engine_problem(backend: str, env: Mapping[str, str]) -> Optional[str]:
    """Why ``backend``'s framework cannot run a parameter-server job here, or None."""
    key = _key(backend, env)
    cached = _read(key)
    if cached is not None:
        return cached.problem
    answer = _probe(backend, env)
    if answer.lasting:
        _write(key, answer)
    return answer.problem


def _probe(backend: str, env: Mapping[str, str]) -> Answer:
    probe = f"import {module_path(backend, 'ps')} as m; print(m.engine_problem() or '')"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Answer(f"backend={backend} could not be loaded for a parameter-server job: {tail}", lasting=False)
    return Answer(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None, lasting=True)


def _stamp(path: Optional[str]) -> str:
    if not path:
        return "missing"
    try:
        stat = os.stat(path)
    except OSError:
        return "missing"
    return f"{path}:{stat.st_mtime_ns}:{stat.st_size}"


def _key(backend: str, env: Mapping[str, str]) -> Optional[str]:
    """What the answer depends on: the interpreter, the framework's installed files (the backend
    is named after the package it imports) and unitrain's module that asks it; None where one of
    them cannot be found (then nothing is kept)."""
    try:
        framework = importlib.util.find_spec(backend)
        ours = importlib.util.find_spec(module_path(backend, "ps"))
    except (ImportError, ValueError):
        return None
    if framework is None or ours is None:
        return None
    parts = [os.path.realpath(sys.executable), _stamp(framework.origin), _stamp(ours.origin), *sorted(env.items())]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _file(key: str) -> Optional[Path]:
    try:
        return cache_dir("engines") / f"{key}.json"
    except ConfigError:
        return None  # an unwritable cache: ask every time


def _read(key: Optional[str]) -> Optional[Answer]:
    path = _file(key) if key else None
    try:
        return Answer(json.loads(path.read_text())["problem"], lasting=True) if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(key: Optional[str], answer: Answer) -> None:
    path = _file(key) if key else None
    if path:
        try:
            replace_text(path, json.dumps({"problem": answer.problem}))
        except OSError:
            pass
