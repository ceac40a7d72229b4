"""Every key of the schema, given what a careless user types: the wrong type, below its range,
absurdly large, not a number, infinite, empty. The command refuses it in one line before anything
is written, or the key is listed in ACCEPTED with why such a value is no mistake. A new key cannot
land without one or the other. Checked in this process, through the command's own preflight
(conftest.refusal), as `python -m unitrain` runs it."""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Dict, Iterator, Tuple

import pytest

from conftest import FAST, refusal
from unitrain.config.schema import ParityConfig, UnitrainConfig

#: What each kind of careless value is, as an override's right-hand side, by the key's type.
WRONG = {"type": "x", "negative": "-1", "huge": "1000000000000", "nan": "nan", "inf": "inf", "empty": "''"}

#: (key, kind) -> why that value is accepted.
STEPS = "a number of steps: past the run's end it means never"
LENGTH = "the length of a run is the user's to choose: a long run shows its progress, can be stopped and resumes"
ACCEPTED = {
    ("amp.incr_every_n_steps", "huge"): STEPS + " (the loss scale does not grow)",
    ("model.sparse_buckets", "huge"): "a hash space: the servers' tables create a row when an id is first seen "
    "(one Paddle process, which holds the whole table, is refused by its size)",
    ("data.num_samples", "huge"): LENGTH,
    ("data.val_samples", "huge"): LENGTH + " (its held-out set too)",
    ("trainer.steps", "huge"): LENGTH,
    ("trainer.epochs", "huge"): LENGTH,
    ("optim.warmup_steps", "huge"): STEPS + " (the lr ramps up all run long)",
    ("optim.step_size", "huge"): STEPS + " (the step schedule never steps)",
    ("trainer.log_every", "huge"): STEPS + " (the last step is logged)",
    ("trainer.checkpoint_every", "huge"): STEPS + " (the last step is checkpointed)",
    ("dist.ps.geo_k_steps", "huge"): STEPS + " (geo sends everything at the end)",
    ("profiler.warmup_steps", "huge"): STEPS + " (the run warns that none was timed after it)",
    ("profiler.start", "huge"): STEPS + " (the run warns that the trace window was not reached)",
    ("profiler.steps", "huge"): STEPS + " (the trace runs to the end)",
    ("optim.clip_grad_norm", "huge"): "a norm no gradient reaches clips nothing, as null does",
    ("trainer.eval_batch_size", "huge"): "a batch larger than the held-out set evaluates it in one",
    ("trainer.keep_checkpoints", "huge"): "more than the run writes keeps them all, as 0 does",
    ("dist.bucket_cap_mb", "huge"): "a bucket larger than the gradients all-reduces them in one",
}

#: unitrain.parity reads the trainer group's seed, batch size and threads only, and refuses the
#: others set at all; the rest of ACCEPTED holds there too.
PARITY_ACCEPTED = {case: why for case, why in ACCEPTED.items() if not case[0].startswith("trainer.")}

#: Keys that mean something only to a parameter-server job: tried in one.
PS_KEYS = ("dist.ps.", "model.sparse_buckets", "model.embedding_dim", "model.hidden_layers")
#: Keys no careless value reaches as a value of its own: free-form ones.
FREE = {"model.kwargs"}


def leaves(cls: type, prefix: str = "") -> Iterator[Tuple[str, type]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            yield from leaves(kind, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", kind


def careless(kind: type) -> Dict[str, str]:
    """The careless values a key of this type can be given, by kind."""
    if typing.get_origin(kind) is typing.Union:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is bool:
        return {"type": "2"}
    if kind is int:
        return {k: WRONG[k] for k in ("type", "negative", "huge")}
    if kind is float:
        return {k: WRONG[k] for k in ("type", "negative", "huge", "nan", "inf")} | {"huge": "1e300"}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return {"type": "no_such_choice"}
    if kind is str:
        return {"empty": WRONG["empty"]}
    if origin is list and args[0] is int:
        return {k: f"[{WRONG[k]}]" for k in ("type", "negative", "huge")}
    return {}


def cases(schema: type, command: str):
    for key, kind in leaves(schema):
        for what, value in careless(kind).items():
            if key not in FREE:
                yield pytest.param(command, key, what, value, id=f"{command}:{key}={what}")


@pytest.mark.parametrize(
    "command,key,what,value", [*cases(UnitrainConfig, "unitrain"), *cases(ParityConfig, "unitrain.parity")]
)
def test_a_careless_value_is_refused_in_one_line_or_is_no_mistake(command, key, what, value, tmp_path):
    if command == "unitrain.parity":
        if key.startswith(PS_KEYS):
            pytest.skip("parity compares the image models: the wide&deep model's keys configure nothing there")
        context = ["model=tiny", "data.image_size=16"]
    elif key.startswith(PS_KEYS):
        context = ["experiment=wide_deep_ps", "backend=torch"]
    else:
        context = [*FAST, "trainer.steps=2"]
    line = refusal([*context, f"{key}={value}"], tmp_path, command)
    accepted = ACCEPTED if command == "unitrain" else PARITY_ACCEPTED
    if (key, what) in accepted:
        assert line is None, f"{key}={value} is listed as no mistake ({accepted[key, what]}) but refused: {line}"
        return
    assert line is not None, f"{command} accepts {key}={value} ({what}); refuse it, or list it in ACCEPTED with why"
    assert line.startswith(f"{command}: error: ") and "\n" not in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["data.num_workers=100000"], "data.num_workers"),
        (["dist.nproc_per_node=100000"], "dist.nproc_per_node"),
        (["dist.nnodes=100000", "dist.master_port=29400"], "dist.nnodes"),
        (["dist.max_restarts=100000"], "dist.max_restarts"),
        (["trainer.threads=100000"], "trainer.threads"),
        (["trainer.repeats=100000"], "trainer.repeats"),
        (["trainer.accumulate_steps=100000"], "trainer.accumulate_steps"),
        (["experiment=wide_deep_ps", "backend=torch", "dist.ps.trainers=100000"], "dist.ps.trainers"),
        (["experiment=wide_deep_ps", "backend=torch", "dist.ps.servers=100000"], "dist.ps.trainers"),
        (["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=100000", "backend=torch"], "hydra.launcher.n_jobs"),
    ],
)
def test_every_count_a_user_sets_has_a_ceiling(overrides, key, tmp_path):
    ps = "experiment=wide_deep_ps" in overrides
    line = refusal([*([] if ps else FAST), "trainer.steps=2", *overrides], tmp_path)
    assert line is not None and f"{key}=" in line and "at most" in line, line
