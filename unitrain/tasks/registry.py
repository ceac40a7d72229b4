"""The tasks by name, and which one a job runs: the one place a task is learned from a name
(a job's data=, a run's summary, an export's input). A new task registers here."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Tuple

from unitrain.errors import UnknownNameError
from unitrain.registry import Registry
from unitrain.tasks.click_through import ClickThrough
from unitrain.tasks.images import Images
from unitrain.tasks.language import Language
from unitrain.tasks.task import Task

TASKS: Registry[Task] = Registry("task")
for _task in (Images(), Language(), ClickThrough()):
    TASKS.register(_task.name, _task)

#: The task of a config or summary that names no data.
DEFAULT = "images"
#: data= choice -> the task that trains on it.
_BY_DATA = {data: TASKS.get(name) for name in TASKS for data in TASKS.get(name).datasets}


def task_for_data(data_name: Any) -> Task:
    """The task a data= choice belongs to; an unknown one is one line listing them."""
    name = str(data_name)
    if name not in _BY_DATA:
        raise UnknownNameError("data", name, _BY_DATA)
    return _BY_DATA[name]


def task_of(cfg: Any) -> Task:
    """The task a job's config runs (its data=); a config that names no data (a conversion
    check's own) classifies images, as unitrain.convert's check does."""
    data = cfg.data
    name = data.get("name") if hasattr(data, "get") else getattr(data, "name", None)
    return task_for_data(name) if name else TASKS.get(DEFAULT)


def task_of_summary(summary: Mapping[str, Any]) -> Task:
    """The task a run's summary.json (or a checkpoint's meta) records: its "task", else its data."""
    if summary.get("task") in TASKS:
        return TASKS.get(summary["task"])
    data = summary.get("data")
    if isinstance(data, Mapping):  # a resolved config's data group
        data = data.get("name")
    if str(data) in _BY_DATA:
        return _BY_DATA[str(data)]
    # Without its data: the task whose measure its held-out result holds.
    held_out = summary.get("eval") or {}
    return next((TASKS.get(n) for n in TASKS if TASKS.get(n).measure.key in held_out), TASKS.get(DEFAULT))


def datasets(dist_mode: Optional[str] = None) -> Tuple[str, ...]:
    """Every data= choice a task trains on (with ``dist_mode``: the tasks that kind of job trains)."""
    return tuple(d for d, task in _BY_DATA.items() if dist_mode in (None, task.dist_mode))


def check(cfg: Any) -> None:
    """A job's task's rules, and every other task's own data keys left unset."""
    task = task_of(cfg)
    for other in (TASKS.get(n) for n in TASKS):
        if other is not task:
            for key in other.own_keys:
                key.check_unused(cfg.data)
    task.check(cfg)


# --- the report
#: An export's input kind -> the task whose models take it.
_BY_INPUT = {TASKS.get(name).input_kind: TASKS.get(name) for name in TASKS}
#: What a record that names no task, or several, is read as: a classifier's top-1 and samples/s,
#: which a language model's evaluations and timings hold too.
_PLAIN = TASKS.get(DEFAULT)


def task_of_input(kind: Any) -> Task:
    """The task whose exported models take input of ``kind`` (an export manifest's
    "input"/"kind"); an unknown one is one line listing them."""
    if str(kind) not in _BY_INPUT:
        raise UnknownNameError("input kind", str(kind), _BY_INPUT)
    return _BY_INPUT[str(kind)]


def task_of_inputs(kinds: Iterable[Any]) -> Task:
    """The task of every one of ``kinds`` (inference.json's "inputs", quantize.json's "input"
    kind); images' where they name none, several or an unknown one."""
    found = {str(kind) for kind in kinds}
    return task_of_input(found.pop()) if len(found) == 1 and found <= _BY_INPUT.keys() else _PLAIN


def common_task(tasks: Iterable[Task]) -> Task:
    """The task all of ``tasks`` are (the rows of one comparison), images' where they differ."""
    found = {task.name: task for task in tasks}
    return next(iter(found.values())) if len(found) == 1 else _PLAIN
