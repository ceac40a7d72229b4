"""What a task is: the kind of learning a job does (classifying images, modelling language,
predicting clicks), as the one training loop, the report, export, quantization, generation and
the sweeper ask it. Each task owns its datasets and held-out split, its measures and the
direction its objective goes, its fields in summary.json and the table, and the inputs an export
takes; no code outside ``unitrain/tasks/`` compares a name to learn which task runs (the
registry, ``tasks/registry.py``, is the one place a name is looked up).

As torchtitan's TrainSpec and Lightning's data module do, a task is a part of its own: a new
one is a module beside these and its line in the registry (docs/architecture.md shows one)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Literal, Mapping, Optional, Protocol, Tuple

from unitrain.errors import ConfigError

Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True)
class Measure:
    """A task's held-out measure: what objective.metric=heldout returns to a search, what
    objective.target means with time_to_target, and what the report plots over time."""

    #: The key in an evaluation's record (metrics.jsonl) and in summary.json's "eval".
    key: str
    #: How the report and the plots name it.
    label: str
    direction: Direction
    #: The largest target that makes sense (top-1: 1), None where it is unbounded.
    target_max: Optional[float] = None

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.direction == "maximize" else value <= target

    def worst(self) -> float:
        return -math.inf if self.direction == "maximize" else math.inf

    def check_target(self, target: Any) -> None:
        """objective.target with time_to_target: a finite number > 0, at most ``target_max``."""
        bounded = self.target_max is not None
        fits = target is not None and math.isfinite(target) and target > 0
        if fits and (not bounded or target <= self.target_max):
            return
        allowed = f"a number in (0, {self.target_max:g}]" if bounded else "a finite number > 0"
        raise ConfigError("objective.target", target, f"the {self.label} to reach, {allowed}")


@dataclass(frozen=True)
class OwnKey:
    """A data key only this task reads, the value that means "not used", and what other tasks'
    jobs are told when it is set ({data}: the job's data)."""

    name: str
    unused: Any
    allowed: str

    def check_unused(self, data: Any) -> None:
        value = getattr(data, self.name)
        if value != self.unused:
            raise ConfigError(f"data.{self.name}", value, self.allowed.format(data=data.name))


@dataclass
class TaskData:
    """What a task gives the training loop: its training samples, its held-out samples (None:
    the job has none), the predictions one sample makes (a language model: one per position)
    and the task's own state for its measures and summary."""

    train: Any
    held_out: Optional[Any]
    predictions_per_sample: int = 1
    state: Any = None
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConversionProbe:
    """What a translated model (model.<backend>=convert) is checked on: the check's data group
    and its batch size."""

    data: Dict[str, Any]
    batch_size: int


@dataclass(frozen=True)
class Deployed:
    """How the inference and quantization tables (unitrain/report/inference.py, quantize.py) show
    a task's exported models."""

    #: The throughput key of a timing at one batch ("throughput_ips": samples/s).
    rate_key: str
    #: Its unit in the tables ("img/s") and on the inference plot's axis ("images/s").
    rate_unit: str
    rate_axis: str
    #: The held-out top-1's column ("held-out top-1").
    top1_label: str
    #: What its samples are, plural ("images"): calibration counts "training images".
    sample_noun: str
    #: Whether every position of a sample is a prediction (a language model's tokens): the tables
    #: then add samples/s beside the rate, the held-out loss per token, and the positions a sample has.
    per_position: bool = False


class OnePrediction:
    """What a task whose every sample makes one prediction (a class, a click) has alike: no
    positions in a sample, no measures beside loss and top-1, no fields of its own in
    summary.json, its inputs exported as they are."""

    def block_size(self, cfg: Any) -> Optional[int]:
        return None

    def measures(self, data: TaskData, result: Mapping[str, float]) -> Dict[str, float]:
        return {}

    def summary(self, data: TaskData, samples_per_s: Optional[float]) -> Dict[str, Any]:
        return {}

    def summary_rate(self, summary: Mapping[str, Any]) -> int:
        return 1

    def export_example(self, cfg: Any, inputs: Any) -> Any:
        return inputs  # every axis but the batch as it is

    def input_positions(self, entry: Mapping[str, Any]) -> Optional[int]:
        return None

    def held_out_columns(self, summary: Mapping[str, Any]) -> Dict[str, Tuple[str, str]]:
        """The held-out loss and the task's measure."""
        measure: Measure = self.measure
        return {"held-out loss": ("val_loss", ".4f"), measure.label: (measure.key, ".4f")}

    #: The run's files an export carries beside the model (none: a sample is its own input).
    export_files: Tuple[str, ...] = ()


class Task(Protocol):
    """What every task provides; ``unitrain/tasks/images.py`` is the shortest example."""

    #: The registry's name for it.
    name: str
    #: The data= choices it trains on (each belongs to one task).
    datasets: Tuple[str, ...]
    #: The kind of job that trains it (dist.mode: collective, or ps for parameter servers).
    dist_mode: str
    #: Its held-out measure.
    measure: Measure
    #: Its throughput unit in the table and plots ("samples/s", "tokens/s").
    rate_unit: str
    #: Data keys only it reads (refused, by the registry, on every other task's data).
    own_keys: Tuple[OwnKey, ...]
    #: What data.val_samples=0 means for it ("0: no held-out set").
    val_samples_zero: str

    def check(self, cfg: Any) -> None:
        """Its rules for a job's config, read from the config alone (no file opened)."""

    def check_files(self, cfg: Any) -> None:
        """Its data's files, in the main process before a job starts (read, not loaded)."""

    def has_held_out(self, data: Any) -> bool:
        """Whether a data config gives this task a held-out set."""

    def data(self, cfg: Any, run_dir: Path, resumed_run: Optional[Path], default_size: int) -> TaskData:
        """The job's training and held-out samples; ``resumed_run``: the run whose checkpoint it
        resumes (its saved state, such as a tokenizer, is reused); ``default_size``: the samples
        a synthetic set makes when data.num_samples is unset."""

    def classes(self, data: Any) -> int:
        """The outputs a user's factory is built for, from the config and the data's files,
        without loading the data (a classifier's classes, a language model's vocabulary)."""

    def block_size(self, cfg: Any) -> Optional[int]:
        """Positions per sample (a language model's tokens), None for a task without them."""

    def conversion_check(self, data: Any, num_classes: Optional[int]) -> ConversionProbe:
        """The data a translated half is compared with its source on (``num_classes``: the
        model's outputs where the caller knows them)."""

    def measures(self, data: TaskData, result: Mapping[str, float]) -> Dict[str, float]:
        """The measures an evaluation adds to its loss and top-1 (a language model: perplexity,
        bits per character or byte)."""

    def evaluation_line(self, result: Mapping[str, float]) -> str:
        """An evaluation's log line after "step N/M  held-out: "."""

    def summary(self, data: TaskData, samples_per_s: Optional[float]) -> Dict[str, Any]:
        """The task's own fields of summary.json."""

    def summary_rate(self, summary: Mapping[str, Any]) -> int:
        """The predictions per sample a run's summary records (its rate's factor)."""

    def held_out_columns(self, summary: Mapping[str, Any]) -> Dict[str, Tuple[str, str]]:
        """The table's held-out columns: name -> (key of an evaluation record, format)."""

    # --- the report
    #: The "kind" of an export manifest's "input" its models take ("images", "tokens"), which
    #: inference.json's "inputs" and quantize.json's "input" record.
    input_kind: str
    #: How the inference and quantization tables show its exported models.
    deployed: Deployed

    # --- export and inference
    #: A run's files its export carries beside the models (a language model's tokenizer, then its
    #: corpus record); the first is what the held-out data are re-read with. () where none.
    export_files: Tuple[str, ...]

    def export_held_out(
        self, cfg: Any, samples: int, state: Optional[Path], vocab_size: Optional[int]
    ) -> Tuple[Any, str]:
        """The data an export is checked and its models judged on, and the sentence saying what
        they are (the manifest's "check_data"): the held-out set, else ``samples`` stand-ins that
        say so. ``state``: the run's first export file; ``vocab_size``: the checkpoint's outputs."""

    def export_classes(self, cfg: Any, meta: Mapping[str, Any], held_out: Any) -> int:
        """An exported model's outputs: as the checkpoint's ``meta`` records them, or as the
        trainer decided them (``held_out``: export_held_out's set)."""

    def export_example(self, cfg: Any, inputs: Any) -> Any:
        """What an exporter or quantizer traces, from a batch of inputs: the batch itself, or one
        whose time axis it keeps dynamic (a language model's token ids)."""

    def input_entry(self, cfg: Any, example: Any, vocab_size: int, tokenizer: Optional[str]) -> Dict[str, Any]:
        """The manifest's "input": what the export's models take, so that unitrain.infer makes
        inputs without the job's code (None in a shape: a dynamic axis; ``tokenizer``: the
        first export file's name in the export, None where the run had none)."""

    def calibration_set(self, cfg: Any, state: Optional[Path], default_size: int) -> Any:
        """The training samples (unaugmented) a quantizer calibrates on, as the job built them;
        ``default_size``: a synthetic set's size where data.num_samples is unset."""

    def input_positions(self, entry: Mapping[str, Any]) -> Optional[int]:
        """The predictions each timed sample of an export's ``input`` makes (a language model:
        its context length), None for one."""
