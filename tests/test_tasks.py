"""Tasks are parts of their own (unitrain/tasks/): every data= choice belongs to one task, each
task provides what the Task Protocol lists, and no code outside the task registry learns which
task runs by comparing a name, as tests/test_layers.py keeps framework names out of the core."""

from __future__ import annotations

import ast
import inspect
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from unitrain.config.schema import DATASET_NAMES, PS_DATASETS, UnitrainConfig
from unitrain.data.datasets import DATASETS
from unitrain.errors import ConfigError, UnitrainError
from unitrain.tasks import TASKS, Task, datasets, task_for_data, task_of, task_of_summary
from unitrain.tasks import check as check_task
from unitrain.train.objective import direction, seconds_to, value

ROOT = Path(__file__).resolve().parents[1]
#: Where a task may be learned from a name: the tasks themselves, and the datasets they own.
MAY_NAME_TASKS = ("unitrain/tasks/", "unitrain/data/")
#: What "which task runs" was learned from before the tasks: their names, their data= choices,
#: and what their exports take.
NAMES = frozenset(TASKS.names()) | frozenset(datasets()) | {"tokens"}
ASKING = {"is_text", "_is_text"}


def _named(node: ast.AST) -> bool:
    """A string constant that names a task, or a tuple/list/set holding one (``in`` tests)."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_named(e) for e in node.elts)
    return False


def name_comparisons(source: str) -> list:
    """Lines comparing something with a task's name, and calls that ask "is this text?"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_named(n) for n in (node.left, *node.comparators)):
            found.append(node.lineno)
        elif isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in ASKING:
                found.append(node.lineno)
    return found


def test_the_check_sees_each_way_code_asked_which_task_ran():
    asked = (
        'if cfg.data.name == "text": pass\n'
        'if data != "text": pass\n'
        'if name in ("criteo", "criteo_synthetic"): pass\n'
        'if entry.get("kind") == "tokens": pass\n'
        "if artifacts.is_text(cfg): pass\n"
        'if cfg.data.name == "synthetic_images": pass\n'  # not a task's name
        'key = "text"\n'  # no comparison
    )
    assert name_comparisons(asked) == [1, 2, 3, 4, 5]


def test_no_code_outside_the_tasks_learns_which_task_runs_by_comparing_a_name():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("unitrain", "backends", "hydra_plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(MAY_NAME_TASKS)
        for line in name_comparisons(path.read_text())
    ]
    assert found == []


def test_every_data_choice_belongs_to_one_task():
    choices = {p.stem for p in (ROOT / "conf" / "data").glob("*.yaml")}
    assert set(datasets()) == choices == set(DATASET_NAMES) | set(PS_DATASETS)
    assert set(TASKS.get("images").datasets) == set(DATASETS)  # every image dataset the registry builds
    owners = [name for name in TASKS for _ in TASKS.get(name).datasets]
    assert len(owners) == len(datasets())  # none claimed twice
    assert task_for_data("text").name == "language" and task_for_data("criteo").name == "click_through"
    with pytest.raises(UnitrainError, match="unknown data 'mnist'; available: criteo, criteo_synthetic"):
        task_for_data("mnist")


@pytest.mark.parametrize("name", TASKS.names())
def test_each_task_provides_what_the_protocol_lists(name):
    task = TASKS.get(name)
    wanted = {n for n, f in vars(Task).items() if inspect.isfunction(f) and not n.startswith("_")}
    wanted |= set(Task.__annotations__)
    assert {m for m in wanted if not hasattr(task, m)} == set()
    for member in wanted:
        expected = getattr(Task, member, None)
        if inspect.isfunction(expected):
            mine = list(inspect.signature(getattr(task, member)).parameters)
            assert mine == list(inspect.signature(expected).parameters)[1:], f"{name}.{member}"


def _job(**overrides) -> UnitrainConfig:
    base = {"backend": {"name": "torch"}, "data": {"name": "synthetic"}, "model": {"name": "tiny"}}
    return OmegaConf.merge(OmegaConf.structured(UnitrainConfig), base, overrides)


def test_a_job_runs_the_task_its_data_belongs_to_and_each_task_refuses_the_others_keys():
    assert task_of(_job()).name == "images"
    assert task_of(_job(data={"name": "text", "path": "corpus.txt"}, model={"name": "gpt_nano"})).name == "language"
    with pytest.raises(ConfigError, match=r"data.block_size=8 is not allowed: .*unset with data=synthetic"):
        check_task(_job(data={"block_size": 8}))
    with pytest.raises(ConfigError, match=r"data.cardinality='criteo' is not allowed: small with data=text"):
        check_task(_job(data={"name": "text", "path": "c.txt", "cardinality": "criteo"}, model={"name": "gpt_nano"}))
    with pytest.raises(ConfigError, match=r"data='synthetic' is not allowed: text with model=gpt_nano"):
        check_task(_job(model={"name": "gpt_nano"}))


def test_a_runs_task_is_read_from_its_summary_or_its_held_out_result():
    assert task_of_summary({"task": "language"}).name == "language"
    assert task_of_summary({"data": "text"}).name == "language"
    assert task_of_summary({"data": {"name": "criteo"}}).name == "click_through"  # a checkpoint's config
    assert task_of_summary({"eval": {"val_auc": 0.8}}).name == "click_through"
    assert task_of_summary({}).name == "images"


def test_the_objective_goes_the_way_of_the_tasks_measure(tmp_path):
    heldout, timed = OmegaConf.create({"metric": "heldout"}), OmegaConf.create({"metric": "time_to_target"})
    language, images = TASKS.get("language").measure, TASKS.get("images").measure
    assert direction(heldout, language) == "minimize" and direction(heldout, images) == "maximize"
    assert direction(timed, images) == "minimize"
    assert value(heldout, {"data": "text", "eval": {"val_loss": 1.5}}, tmp_path) == 1.5
    assert value(heldout, {"data": "text", "eval": {"val_loss": math.nan}}, tmp_path) == math.inf
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 0.1, "elapsed_s": 1}\n{"step": 2, "val_loss": 0.9, "elapsed_s": 4}\n')
    assert seconds_to(1.0, metrics, language) == 4.0 and seconds_to(0.5, metrics, language) is None
    with pytest.raises(ConfigError, match=r"the held-out top-1 to reach, a number in \(0, 1\]"):
        images.check_target(1.5)
    with pytest.raises(ConfigError, match="the held-out loss to reach, a finite number > 0"):
        language.check_target(-1.0)
    language.check_target(3.0)


def test_the_unused_values_the_tasks_declare_are_the_schemas_defaults():
    from unitrain.config.schema import DataConfig
    from unitrain.tasks.language import _UNREAD

    defaults = DataConfig()
    declared = [key for name in TASKS for key in TASKS.get(name).own_keys] + list(_UNREAD)
    assert {k.name: k.unused for k in declared} == {k.name: getattr(defaults, k.name) for k in declared}


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"val_path": "held.txt"}, "data.val_path='held.txt' is not allowed: unset with data=text (its held-out set"),
        ({"num_classes": 5}, "data.num_classes=5 is not allowed: unset with data=text (its classes are the tokenizer"),
        ({"image_size": 16}, "data.image_size=16 is not allowed: unset with data=text (a sample is data.block_size"),
        ({"skip_bad_files": True}, "data.skip_bad_files=True is not allowed: false with data=text"),
        ({"vocab_size": 256}, "data.vocab_size=256 is not allowed: unset with data.tokenizer=char"),
    ],
)
def test_a_text_job_refuses_the_settings_it_would_not_read(data, said):
    """Each of these was silently ignored on text: data.val_path above all, whose held-out loss was
    then the corpus's last tenth without a word."""
    cfg = _job(data={"name": "text", "path": "c.txt", **data}, model={"name": "gpt_nano"})
    with pytest.raises(ConfigError) as refused:
        check_task(cfg)
    assert str(refused.value).startswith(said)
    check_task(
        _job(data={"name": "text", "path": "c.txt", "tokenizer": "bpe", "vocab_size": 512}, model={"name": "gpt_nano"})
    )


def test_refusals_of_text_data_say_what_text_allows(tmp_path):
    from unitrain.config.validation import check_groups

    text = {"name": "text", "path": "c.txt"}
    with pytest.raises(ConfigError, match=r"data.val_samples=-1 is not allowed: .*0: every held-out window"):
        check_groups(_job(data={**text, "val_samples": -1}, model={"name": "gpt_nano"}))
    # An empty path is refused as text refuses null: not "unset (null) or not empty".
    with pytest.raises(ConfigError, match=r"data.path='' is not allowed: a UTF-8 text file, or a folder"):
        check_groups(_job(data={**text, "path": ""}, model={"name": "gpt_nano"}))
    with pytest.raises(ConfigError, match=r"data.val_samples=-1 is not allowed: .*0: no held-out set"):
        check_groups(_job(data={"val_samples": -1}))
