"""Models of one's own that return more than their logits, and refusals that name the user's
mistake. A tuple ``(logits, ...)`` (only in training, too) and an object's ``.logits`` (Hugging
Face's outputs) are taken, in training and evaluation alike, on model=custom and on
model.paddle=convert; a tuple whose first item is no logits is refused at the check, naming what
training mode returned and blaming the torch model, not the conversion; a factory name bound to
an int, and model.kwargs a factory cannot take, are one line naming them and the user's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import refusal, run_unitrain

HEAD = """import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, num_classes)

"""
FACTORY = """

def build(num_classes, image_size):
    return Net(num_classes)
"""
#: One module each, so that each converts (and is checked) on its own.
MODELS = {
    # Its auxiliary output beside the logits, in training only: it failed at step 1 with
    # "'tuple' object has no attribute 'reshape'".
    "aux": HEAD
    + """    def forward(self, x):
        hidden = self.conv(x).mean((2, 3))
        logits = self.head(hidden)
        return (logits, hidden) if self.training else logits
"""
    + FACTORY,
    # The auxiliary output first: no logits to pick.
    "aux_first": HEAD
    + """    def forward(self, x):
        hidden = self.conv(x).mean((2, 3))
        logits = self.head(hidden)
        return (hidden, logits) if self.training else logits
"""
    + FACTORY,
    # As Hugging Face's ModelOutput: a mapping whose items are attributes too.
    "hf": HEAD.replace(
        "class Net",
        "class Output(dict):\n    def __getattr__(self, name):\n        return self[name]\n\n\nclass Net",
    )
    + """    def forward(self, x):
        hidden = self.conv(x).mean((2, 3))
        return Output(logits=self.head(hidden), hidden_states=hidden)
"""
    + FACTORY,
    # width='abc' fails inside torch (out_channels % groups); the user's line is this one.
    "wide": """import torch.nn as nn


def build(num_classes, image_size, width=8):
    conv = nn.Conv2d(3, width, 3)
    return nn.Sequential(conv, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))


not_callable = 5
""",
}
IMAGE = ["model=custom", "data.image_size=16", "trainer.steps=2", "trainer.threads=1", "trainer.progress=false"]
CONVERT = ["backend=paddle", "model.paddle=convert"]
#: What training mode of user_outs.aux_first returns, and what is allowed.
AUX_FIRST = (
    "model.torch='user_outs.aux_first:build' is not allowed: a model whose output is logits [batch, classes] = "
    "[2, 10] (one per class): one tensor, the first of a tuple (logits, ...) or an output's .logits; in training "
    "mode (random layers on) it returned a tuple ([2, 4], [2, 10])"
)
WIDE = (
    "model.torch='user_outs.wide:build' is not allowed: a factory that builds the model with model.kwargs "
    "width='abc'; it failed at wide.py:5 (conv = nn.Conv2d(3, width, 3)): TypeError: not all arguments converted "
    "during string formatting"
)
NOT_CALLABLE = (
    "model.torch='user_outs.wide:not_callable' is not allowed: an importable function (pkg.module:function); "
    "user_outs.wide.not_callable is an int, not a function"
)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user-models")
    package = root / "user_outs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, code in MODELS.items():
        (package / f"{name}.py").write_text(code)
    return root


@pytest.fixture
def in_project(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    return project


# --- the logits in what a model returns, without a framework --------------------------------
def test_the_logits_are_picked_from_a_tuple_or_an_output_object():
    from unitrain.model.user_code import describe_output, given, logits_of

    class Logits:
        def __init__(self, shape):
            self.shape = shape

    class Output:
        def __init__(self, logits):
            self.logits = logits

    logits = Logits([2, 10])
    assert logits_of(logits) is logits
    assert logits_of((logits, Logits([2]))) is logits and logits_of([logits]) is logits
    assert logits_of(Output(logits)) is logits
    assert logits_of({"x": logits}) == {"x": logits}  # nothing to pick: the check refuses it

    def shape_of(x):
        return x.shape if isinstance(x, Logits) else None

    assert describe_output((Logits([2, 4]), None), shape_of) == "a tuple ([2, 4], a NoneType)"
    assert describe_output(Output(Logits([2, 5])), shape_of) == "an Output whose .logits is [2, 5]"
    assert describe_output({"x": 1}, shape_of) == "a dict"
    assert given({"width": "abc", "depth": 3}) == " with model.kwargs width='abc', depth=3" and given({}) == ""


# --- checked before the job, in evaluation and training mode --------------------------------
@pytest.mark.parametrize(
    "args,said",
    [
        (["backend=torch", "model.torch=user_outs.aux:build"], None),
        (["backend=torch", "model.torch=user_outs.hf:build"], None),
        (["backend=torch", "model.torch=user_outs.aux_first:build"], AUX_FIRST),
        # Converted: the training check takes the tuple and the .logits; the torch model's own
        # tuple is the torch model's, not the conversion's.
        ([*CONVERT, "model.torch=user_outs.aux:build"], None),
        ([*CONVERT, "model.torch=user_outs.hf:build"], None),
        ([*CONVERT, "model.torch=user_outs.aux_first:build"], AUX_FIRST),
        # The key and value of model.kwargs, the user's line, then what torch said.
        (["backend=torch", "model.torch=user_outs.wide:build", "model.kwargs={width: abc}"], WIDE),
        ([*CONVERT, "model.torch=user_outs.wide:build", "model.kwargs={width: abc}"], WIDE),
        # One function for both paths (the converted one said "did you mean 'not_callable'?").
        (["backend=torch", "model.torch=user_outs.wide:not_callable"], NOT_CALLABLE),
        ([*CONVERT, "model.torch=user_outs.wide:not_callable"], NOT_CALLABLE),
    ],
    ids=[
        "tuple-in-training",
        "dot-logits",
        "tuple-without-logits",
        "converted-tuple-in-training",
        "converted-dot-logits",
        "converted-tuple-without-logits",
        "kwargs-value",
        "converted-kwargs-value",
        "int-factory",
        "converted-int-factory",
    ],
)
def test_what_a_model_returns_is_taken_or_refused_in_one_line(in_project, tmp_path, args, said):
    got = refusal([*IMAGE, *args], tmp_path)
    assert got == (None if said is None else f"unitrain: error: {said}"), got
    assert not (tmp_path / "run").exists()


# The Paddle job translates and checks first: 10 to 15 s on 2 cores.
@pytest.mark.parametrize("backend", ["torch", pytest.param("paddle", marks=pytest.mark.slow)])
def test_a_model_returning_a_tuple_in_training_trains_and_evaluates(project, tmp_path, backend):
    # The loop and the held-out evaluation take its logits, in torch and in its translated Paddle
    # half (it failed at step 1 with AttributeError: 'tuple' object has no attribute 'reshape').
    job = ["backend=torch"] if backend == "torch" else CONVERT
    args = [*IMAGE, *job, "model.torch=user_outs.aux:build", "trainer.eval_every=2", "data.val_samples=8"]
    result = run_unitrain(args, tmp_path, env={"PYTHONPATH": str(project)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.metrics()) == 2 and '"val_loss"' in (result.run_dir / "metrics.jsonl").read_text()
