"""A user's own model pair (examples/my_nets): every capability on both frameworks, weights
matched between two halves that name their layers differently, and one line for what cannot be."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BACKENDS, run_unitrain
from unitrain.model.build import build_model
from unitrain.model.pairing import PairingError, Param, convert_pair, match

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "my_nets"
PAIR = [
    "model=custom",
    "model.torch=my_nets.torch_net:build",
    "model.paddle=my_nets.paddle_net:build",
    "model.kwargs={width:8}",
    "data.image_size=16",
    "trainer.threads=1",
    "trainer.progress=false",
]


def project(root: Path) -> Path:
    """A user's folder: their package beside where they run the commands."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "my_nets").exists():
        shutil.copytree(EXAMPLE, root / "my_nets", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def command(module: str, *args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def p(name: str, shape: tuple, canonical: str | None = None, transposed: bool = False) -> Param:
    return Param(name=name, canonical=canonical or name, shape=shape, transposed=transposed)


# --- matching, without a framework -----------------------------------------------------------
def test_same_names_match_by_name_whatever_the_order():
    source = [p("b", (3,)), p("a", (2, 4))]
    target = [p("a", (2, 4)), p("b", (3,))]
    assert match(source, target) == {"a": "a", "b": "b"}


def test_different_names_match_by_order_and_shape_and_linear_weights_are_transposed():
    # Paddle's [in, out] Linear weight against torch's [out, in]: the same canonical shape.
    source = [p("hidden.weight", (4, 2), transposed=True), p("hidden.bias", (4,))]
    target = [p("fc1.weight", (4, 2)), p("fc1.bias", (4,))]
    arrays = {"hidden.weight": np.arange(8, dtype=np.float32).reshape(2, 4), "hidden.bias": np.ones(4, np.float32)}
    out = convert_pair(arrays, source, target)
    assert np.array_equal(out["fc1.weight"], arrays["hidden.weight"].T) and np.array_equal(out["fc1.bias"], np.ones(4))


def test_an_unmatched_parameter_is_named_in_one_line():
    source = [p("x.weight", (4, 2)), p("y.weight", (3, 3))]
    target = [p("a.weight", (4, 2)), p("b.weight", (3, 4))]
    with pytest.raises(PairingError) as err:
        match(source, target)
    assert str(err.value).startswith("b.weight (3, 4) cannot be matched: names differ, and the parameter in the same")
    assert "y.weight" in str(err.value) and "model.mapping" in str(err.value)
    with pytest.raises(PairingError, match="has no counterpart"):
        match(source[:1], target)


def test_a_mapping_file_pairs_what_order_cannot():
    # Registered in another order on one side: the order would pair the wrong tensors.
    source = [p("second", (3, 3)), p("first", (3, 3))]
    target = [p("one", (3, 3)), p("two", (3, 3))]
    assert match(source, target, {"first": "one", "second": "two"}) == {"one": "first", "two": "second"}
    assert match(source, target, {"one": "first"}) == {"one": "first", "two": "second"}  # either way round


# --- real frameworks -------------------------------------------------------------------------
def test_embeddings_are_not_transposed_and_the_converted_halves_compute_the_same():
    import paddle
    import torch

    from unitrain.interface.backend import get_backend
    from unitrain.interface.models import models_module
    from unitrain.model.conversion import pair_tables

    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.proj = torch.nn.Embedding(7, 5), torch.nn.Linear(5, 5)

        def forward(self, ids):
            return self.proj(self.emb(ids))

    class P(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.table, self.out = paddle.nn.Embedding(7, 5), paddle.nn.Linear(5, 5)

        def forward(self, ids):
            return self.out(self.table(ids))

    tb, pb = get_backend("torch"), get_backend("paddle")
    t, pd = T(), P()
    assert models_module("paddle").linear_weights(pd) == ["out.weight"]
    state = pb.state_arrays(pd)
    source, target, counters = pair_tables("paddle", state, ["out.weight"], tb, t)
    tb.load_state_arrays(t, convert_pair(state, source, target, None, counters))
    ids = np.array([[0, 3, 6]])
    got = t(torch.from_numpy(ids)).detach().numpy()
    want = pd(paddle.to_tensor(ids)).numpy()
    assert np.abs(got - want).max() < 1e-6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The pair trained a few steps on each framework, with a checkpoint."""
    runs = {}
    for backend in BACKENDS:
        root = project(tmp_path_factory.mktemp(f"pair_{backend}"))
        result = run_unitrain(
            [f"backend={backend}", *PAIR, "trainer.steps=6", "trainer.checkpoint_every=6", "model.init=shared"], root
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[backend] = result
    return runs


def test_the_pair_trains_on_both_frameworks_from_the_same_weights(trained):
    first = {b: trained[b].metrics()[0]["loss"] for b in BACKENDS}
    # Same initial weights (model.init=shared), same first batch: the first losses agree.
    assert abs(first["paddle"] - first["torch"]) < 1e-4 * abs(first["torch"]), first
    for b in BACKENDS:
        assert trained[b].summary()["model"] == "custom"
        meta = json.loads(next((trained[b].run_dir / "checkpoints").glob("step*/meta.json")).read_text())
        assert meta["custom"]["factories"]["torch"] == "my_nets.torch_net:build"


def test_parity_of_the_pair_within_tolerance(tmp_path):
    root = project(tmp_path)
    result = run_unitrain([*PAIR[:-2], "steps=4"], root, module="unitrain.parity")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((result.run_dir / "parity.json").read_text())
    assert report["passed"] and report["max_rel_loss_diff"] < 1e-5
    assert report["first_batch_activations"]["layers_compared"] == 7  # paired in execution order


@pytest.mark.slow
def test_the_other_frameworks_checkpoint_converts_exports_and_resumes(trained, tmp_path):
    paddle_run = trained["paddle"].run_dir
    root = paddle_run.parent
    done = command("unitrain.convert", str(paddle_run), "--to", "torch", cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    state = __import__("torch").load(next((paddle_run / "checkpoints").glob("step*/model.torch.pt")))
    assert "fc1.weight" in state and tuple(state["fc1.weight"].shape) == (64, 16)
    done = command("unitrain.export", str(paddle_run), "--format", "native,onnx", "--to", "torch", cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((paddle_run / "export" / "export.json").read_text())
    checks = [a["max_abs_diff"] for a in manifest["artifacts"].values()]
    assert len(checks) == 2 and max(checks) < 1e-4, checks
    resumed = run_unitrain(
        ["backend=torch", *PAIR, "trainer.steps=8", f"trainer.resume={paddle_run}"], project(root / "resumed")
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "converted to torch exactly" in resumed.stdout + resumed.stderr
    assert resumed.metrics()[-1]["step"] == 8


@pytest.mark.slow
def test_quantize_the_pair_in_the_other_framework(trained):
    torch_run = trained["torch"].run_dir
    done = command(
        "unitrain.quantize",
        str(torch_run),
        "method=dynamic",
        "backend=paddle",
        "pairs=0",
        "min_time_s=0.1",
        "min_iters=2",
        "eval_samples=32",
        "onnx=false",
        f"hydra.run.dir={torch_run.parent / 'q'}",
        cwd=torch_run.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next((torch_run.parent / "q").rglob("quantize.json")).read_text())
    assert any(r.get("precision") == "dynamic" for r in result["rows"]), result["rows"]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["backend=torch", "model=custom", "model.paddle=my_nets.paddle_net:build"],
            "model.torch=None is not allowed",
        ),
        (["backend=torch", "model=custom", "model.torch=no_such_pkg.nets:build"], "no module 'no_such_pkg.nets'"),
        (
            ["backend=torch", "model=custom", "model.torch=my_nets.torch_net:build", "model.kwargs={depth:3}"],
            "a factory taking num_classes=, image_size= and model.kwargs (depth)",
        ),
    ],
)
def test_a_pair_that_cannot_be_built_is_one_line(args, message, tmp_path):
    result = run_unitrain([*args, "trainer.steps=2", "trainer.progress=false"], project(tmp_path))
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr[-3000:]


def test_halves_that_do_not_match_are_one_line_naming_the_parameter(tmp_path):
    root = project(tmp_path)
    # The Paddle half twice as wide in its hidden layer: no conversion can be right.
    nets = root / "my_nets" / "paddle_net.py"
    nets.write_text(
        nets.read_text()
        .replace("paddle.nn.Linear(2 * width, 64)", "paddle.nn.Linear(2 * width, 32)")
        .replace("paddle.nn.Linear(64, num_classes)", "paddle.nn.Linear(32, num_classes)")
    )
    result = run_unitrain([*PAIR[:-2], "steps=2"], root, module="unitrain.parity")
    assert result.returncode == 2, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert "hidden.weight (32, 16) cannot be matched" in line and "fc1.weight, is (64, 16)" in line, line


# Slow by the fast suite's budget (10 s each, two processes starting): make test stays under 12 minutes.
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pair_trains_data_parallel_with_amp(backend, tmp_path):
    # The launchers start workers by script path: the user's package is still found from the
    # folder the command ran in.
    args = [f"backend={backend}", *PAIR[:-2], "dist.nproc_per_node=2", "trainer.threads=1", "amp=O1"]
    result = run_unitrain([*args, "data.image_size=32", "amp.dtype=bfloat16", "trainer.steps=3"], project(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary()
    assert summary["world_size"] == 2 and len(result.metrics()) == 3


def test_the_library_builds_a_pair_with_the_same_initial_weights(monkeypatch):
    import unitrain

    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    pair = unitrain.CustomModel(
        factories={"torch": "my_nets.torch_net:build", "paddle": "my_nets.paddle_net:build"},
        kwargs={"width": 8},
        image_size=16,
    )
    states = {}
    for name in BACKENDS:
        backend = unitrain.get_backend(name)
        states[name] = backend.state_arrays(build_model(backend, pair, num_classes=10, init="shared", seed=5))
    # Same draws in the same order: the torch fc1 weight is the transpose of Paddle's hidden weight.
    assert np.array_equal(states["torch"]["fc1.weight"], states["paddle"]["hidden.weight"].T)
    assert np.array_equal(states["torch"]["conv1.weight"], states["paddle"]["stem.weight"])
