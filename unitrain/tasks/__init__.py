"""Tasks: what kind of learning a job does (images, language, click-through), each a part of
its own that the trainer, the report, export, quantization, generation and the sweeper ask
(``task.py`` says what a task provides, ``registry.py`` which one runs)."""

from unitrain.tasks.registry import TASKS, check, datasets, task_for_data, task_of, task_of_summary
from unitrain.tasks.task import Measure, Task, TaskData

__all__ = ["TASKS", "Measure", "Task", "TaskData", "check", "datasets", "task_for_data", "task_of", "task_of_summary"]
