"""Write it once: a model written in plain PyTorch (examples/gallery) trains and compares on Paddle
too, its Paddle half converted by PaConvert (``model.paddle=convert``) and checked."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import refusal, run_unitrain


@pytest.fixture(autouse=True)
def _own_bad_nets(monkeypatch):
    """test_custom_text.py and test_write_once.py each write a module named bad_nets: one that the
    other file's tests imported first (both may run in one pytest worker) is not this file's."""
    monkeypatch.delitem(sys.modules, "bad_nets", raising=False)


GALLERY = Path(__file__).resolve().parents[1] / "examples" / "gallery"
IMAGE_MODELS = ["convmixer", "mobilenetv2", "vit", "unet", "mlp_mixer", "resnet18"]
TEXT = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def converted(name: str) -> str:
    return f"model.torch=gallery.{name}:build"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's folder: the gallery package, and a package of models that do not convert."""
    root = tmp_path_factory.mktemp("write-once")
    shutil.copytree(GALLERY, root / "gallery", ignore=shutil.ignore_patterns("__pycache__"))
    bad = root / "bad_nets"
    bad.mkdir()
    (bad / "__init__.py").write_text("")
    head = "import torch\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self, n):\n"
    head += "        super().__init__()\n        self.fc = nn.Linear(3, n)\n        self.head = nn.Linear(n, n)\n\n"
    forward = {
        "unconverted": "        x = torch._foreach_add([x.mean((2, 3))], 1)[0]\n"
        "        torch.nn.utils.parametrize.is_parametrized(self.fc)\n        return self.head(self.fc(x))\n",
        "missing": "        return self.head(self.fc(torch.special.i0(x.mean((2, 3)))))\n",
        "noisy": "        h = self.fc(x.mean((2, 3)))\n        return self.head(h + torch.randn_like(h))\n",
        # Only training runs these two.
        "training_only": "        h = self.fc(x.mean((2, 3)))\n        if self.training:\n"
        "            h = h - h.fmod(2.0)\n        return self.head(h)\n",
        "training_crash": "        h = self.fc(x.mean((2, 3)))\n        if self.training:\n"
        "            h = h * h.maximum(torch.zeros_like(h)).bool()\n        return self.head(h)\n",
    }
    for name, body in forward.items():
        factory = "\n\ndef build(num_classes, image_size):\n    return Net(num_classes)\n"
        (bad / f"{name}.py").write_text(head + "    def forward(self, x):\n" + body + factory)
    (bad / "not_a_model.py").write_text("def build(num_classes, image_size):\n    return [num_classes]\n")
    (bad / "syntax.py").write_text(
        "import torch\n\n\ndef build(num_classes, image_size):\n    return torch.nn.Linear(3,\n"
    )
    (bad / "raises.py").write_text(
        'import torch\n\n\n"""Its own error."""\ndef build(num_classes, image_size, width=8):\n'
        '    raise ValueError("width must be even")\n'
    )
    return root


@pytest.fixture
def in_project(project, monkeypatch):
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    return project


def _parity(name: str, steps: int = 5):
    from hydra import compose, initialize_config_module

    from unitrain.config.schema import register_configs
    from unitrain.train.parity import run_parity

    register_configs()
    with initialize_config_module("unitrain.conf", version_base=None):
        cfg = compose(
            "parity",
            overrides=[
                "model=custom",
                converted(name),
                "model.paddle=convert",
                "data.image_size=16",
                f"steps={steps}",
                # A smaller lr than the ResNets' recipe: the torch-style ResNet18 and MobileNetV2
                # amplify a 1e-7 change of their weights 1000-fold in 5 steps at 0.02, in torch alone.
                "optim.lr=0.001",
                "trainer.batch_size=16",
                "trainer.threads=1",
            ],
        )
    out = Path.cwd() / f"parity-{name}"
    out.mkdir(exist_ok=True)
    return cfg, run_parity(cfg, out)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_a_gallery_model_converts_whole_and_trains_alike_on_both_frameworks(in_project, name):
    from unitrain.model.custom import custom_model
    from unitrain.train.parity import check_converted

    cfg, report = _parity(name)
    translation = custom_model(cfg.model, 16).translation("paddle")
    per_file = json.loads((translation.directory / "translation.json").read_text())["per_file"]
    assert translation.unconverted == [] and per_file[f"gallery/{name}.py"]["converted"] > 0
    # The forward pass from the same weights, layer by layer in evaluation mode.
    forward = check_converted(cfg, "paddle")
    assert forward["layers_compared"] > 0 and forward["layers_unpaired"] == 0
    assert forward["loss_rel_diff"] <= 1e-5 and forward["largest"]["rel_diff"] <= 1e-4
    # Five training steps from the same weights on the same batches.
    activations = report["first_batch_activations"]
    assert activations["layers_compared"] > 0 and activations["layers_unpaired"] == 0
    assert report["max_rel_loss_diff"] <= 1e-4 and report["passed"], report["per_step"]


def _text_pair(name: str, **kwargs):
    """The torch model and its converted Paddle half with the torch weights (the same names)."""
    import paddle
    import torch

    from unitrain.model.translate import find_source, translate

    torch.manual_seed(0)
    module = importlib.import_module(f"gallery.{name}")
    torch_model = module.build(**kwargs)
    paddle_model = translate(find_source("model.torch", f"gallery.{name}:build"), "paddle").factory()(**kwargs)
    state = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    mine = paddle_model.state_dict()
    shared = [k for k in mine if k in state]
    # Paddle's RNN layers keep each weight twice (flat and per cell, one storage): the flat
    # names are torch's.
    assert set(state) <= set(mine) and all(tuple(mine[k].shape) == state[k].shape for k in shared)
    with warnings.catch_warnings():  # the per-cell aliases are not in torch's state: Paddle says so
        warnings.filterwarnings("ignore", message="Skip loading for")
        paddle_model.set_state_dict({k: paddle.to_tensor(state[k]) for k in shared})
    return torch_model, paddle_model


def _train_alike(torch_model, paddle_model, batches, loss_of, steps: int = 5) -> float:
    """The largest relative loss difference over ``steps`` SGD steps on the same batches."""
    import paddle
    import torch

    t_opt = torch.optim.SGD(torch_model.parameters(), lr=0.05)
    p_opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=paddle_model.parameters())
    worst = 0.0
    for inputs, targets in batches[:steps]:
        t_loss = loss_of(torch_model(torch.from_numpy(inputs)), torch.from_numpy(targets), torch)
        p_loss = loss_of(paddle_model(paddle.to_tensor(inputs)), paddle.to_tensor(targets), paddle)
        t_loss.backward(), p_loss.backward()
        t_opt.step(), p_opt.step()
        t_opt.zero_grad(), p_opt.clear_grad()
        t_value, p_value = float(t_loss.detach()), float(p_loss.detach())
        worst = max(worst, abs(t_value - p_value) / abs(t_value))
    return worst


def _cross_entropy(logits, targets, framework):
    if framework.__name__ == "torch":
        return framework.nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), targets.reshape([-1]))
    return framework.nn.functional.cross_entropy(logits.reshape([-1, logits.shape[-1]]), targets.reshape([-1]))


def test_a_character_language_model_with_tied_weights_trains_alike_on_a_text_file(in_project):
    import paddle
    import torch

    chars = sorted(set(TEXT))
    ids = np.array([chars.index(c) for c in TEXT], dtype=np.int64)
    torch_model, paddle_model = _text_pair("char_lm", vocab_size=len(chars), block_size=32)
    assert paddle_model.head.weight is paddle_model.tok_emb.weight  # tied, as in torch
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(5):
        starts = rng.integers(0, len(ids) - 33, 8)
        batches.append((np.stack([ids[s : s + 32] for s in starts]), np.stack([ids[s + 1 : s + 33] for s in starts])))
    torch_model.eval(), paddle_model.eval()
    a = torch_model(torch.from_numpy(batches[0][0])).detach().numpy()
    b = paddle_model(paddle.to_tensor(batches[0][0])).numpy()
    assert np.max(np.abs(a - b)) / np.max(np.abs(a)) <= 1e-5
    torch_model.train(), paddle_model.train()
    assert _train_alike(torch_model, paddle_model, batches, _cross_entropy) <= 1e-4


def test_an_lstm_gru_text_classifier_trains_alike(in_project):
    import paddle
    import torch

    torch_model, paddle_model = _text_pair("rnn_classifier", vocab_size=50, num_classes=4)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 50, (8, 12)), rng.integers(0, 4, 8)) for _ in range(5)]
    a = torch_model(torch.from_numpy(batches[0][0])).detach().numpy()
    b = paddle_model(paddle.to_tensor(batches[0][0])).numpy()
    assert np.max(np.abs(a - b)) / np.max(np.abs(a)) <= 1e-5
    assert _train_alike(torch_model, paddle_model, batches, _cross_entropy) <= 1e-4


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["model.torch=bad_nets.unconverted:build"],
            "model.paddle=convert: torch._foreach_add at bad_nets/unconverted.py:12 did not convert, nor 1 other "
            "call(s)",
        ),
        (
            ["model.torch=bad_nets.missing:build"],
            "model.paddle=convert: the converted bad_nets/missing.py uses paddle.special.i0, which the installed "
            "paddle does not have",
        ),
        (
            ["model.torch=bad_nets.noisy:build"],
            "model.paddle=convert: from the same weights, on one batch, the converted half's head differs from the "
            "torch half's",
        ),
        (
            ["model.torch=bad_nets.training_only:build"],
            # PaConvert writes Paddle's remainder for torch's fmod: the sign differs, evaluation never sees it.
            "model.paddle=convert: one training step from the same weights (random layers off: none) moves the "
            "converted half's head.weight by",
        ),
        (
            ["model.torch=bad_nets.training_crash:build"],
            "model.paddle=convert: in training mode (random layers on) the converted half failed at training_crash.py:",
        ),
        (
            ["model.torch=bad_nets.not_a_model:build"],
            "model.paddle='convert' is not allowed: a factory that returns a paddle model (it returned builtins.list)",
        ),
        (
            ["model.torch=gallery.vit:buld"],
            "model.torch='gallery.vit:buld' is not allowed: a function of gallery.vit (no 'buld' there; did you mean "
            "'build'?)",
        ),
        (["model.torch=null"], "model.paddle='convert' is not allowed: convert with model.torch=pkg.module:function"),
        (
            ["model.torch=gallery.nope:build"],
            "model.torch='gallery.nope:build' is not allowed: an import path pkg.module:function of your model's "
            "factory",
        ),
    ],
    ids=[
        "unconverted call",
        "name paddle lacks",
        "computes otherwise",
        "differs in training",
        "fails in training",
        "not a model",
        "typo",
        "nothing",
        "no module",
    ],
)
def test_what_does_not_convert_is_one_line_before_anything_runs(in_project, tmp_path, args, expected):
    said = refusal(["backend=paddle", "model=custom", "model.paddle=convert", *args], tmp_path)
    assert said is not None and said.startswith(f"unitrain: error: {expected}"), said
    assert "\n" not in said and not (tmp_path / "run").exists()


def test_shared_initial_weights_refuse_a_mapping_they_would_ignore(in_project, tmp_path):
    mapping = tmp_path / "pairs.json"
    mapping.write_text('{"fc.weight": "hidden.weight"}')
    args = ["backend=torch", "model=custom", converted("vit"), "model.paddle=convert", "model.init=shared"]
    said = refusal([*args, f"model.mapping={mapping}"], tmp_path)
    assert said.startswith("unitrain: error: model.init='shared' is not allowed: framework with model.mapping")


def test_torch_is_never_the_converted_half(in_project, tmp_path):
    said = refusal(["backend=torch", "model=custom", "model.torch=convert", "model.paddle=gallery.vit:build"], tmp_path)
    assert said == (
        "unitrain: error: model.torch='convert' is not allowed: an import path pkg.module:function of your torch "
        "model (no converter writes torch code)"
    )


def test_convert_writes_the_paddle_code_and_checks_it_without_training(in_project, tmp_path, capsys):
    from unitrain.convert import main

    out = tmp_path / "paddle-code"
    assert main(["--model", "gallery.convmixer:build", "--out", str(out), "--image-size", "16"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("gallery -> paddle: 20 calls converted, 0 left"), said
    assert "paddle.nn.BatchNorm2D x3" in said and "forward check" in said
    code = next(out.rglob("convmixer.py")).read_text()
    assert "import paddle" in code and "torch" not in code.replace("torch_", "")
    check = json.loads((out / "check.json").read_text())
    assert check["factory"] == "gallery.convmixer:build" and check["training"]["compared"]
    assert check["layers_compared"] >= 10 and check["largest"]["rel_diff"] <= 1e-4
    assert json.loads((out / "translation.json").read_text())["unconverted"] == []


def test_two_factories_of_one_module_keep_a_folder_and_a_check_each(in_project, capsys):
    from unitrain.convert import main

    module = "import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self, n, bias):\n"
    module += "        super().__init__()\n        self.fc = torch.nn.Linear(3, n, bias=bias)\n\n"
    module += "    def forward(self, x):\n        return self.fc(x.mean((2, 3)))\n\n\n"
    module += "def build_a(num_classes, image_size):\n    return Net(num_classes, True)\n\n\n"
    module += "def build_b(num_classes, image_size):\n    return Net(num_classes, False)\n"
    (in_project / "two_nets.py").write_text(module)
    for factory in ("two_nets:build_a", "two_nets:build_b"):
        assert main(["--model", factory, "--image-size", "8"]) == 0, capsys.readouterr().err
    folders = sorted((in_project / "converted").iterdir())
    checks = [json.loads((folder / "check.json").read_text())["factory"] for folder in folders]
    assert checks == ["two_nets:build_a", "two_nets:build_b"]
    assert [f.name.split("-")[0] for f in folders] == ["two_nets.build_a", "two_nets.build_b"]
    shutil.rmtree(in_project / "converted")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("unconverted", "unitrain.convert: model.paddle=convert: torch._foreach_add at bad_nets/unconverted.py:12"),
        ("noisy", "unitrain.convert: model.paddle=convert: from the same weights, on one batch, the converted half's"),
    ],
)
def test_convert_reports_what_did_not_convert_and_keeps_the_code_to_read(in_project, tmp_path, capsys, name, expected):
    from unitrain.convert import main

    out = tmp_path / "paddle-code"
    assert main(["--model", f"bad_nets.{name}:build", "--out", str(out)]) == 1
    said = capsys.readouterr()
    assert said.err.startswith(expected) and said.err.count("\n") == 1, said.err
    assert list(out.rglob(f"{name}.py")) and not (out / "check.json").exists()
    if name == "unconverted":
        assert "bad_nets/unconverted.py:12: torch._foreach_add" in (out / "unconverted.txt").read_text()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--model", "gallery.vit:buld"], "--model='gallery.vit:buld' is not allowed: a function of gallery.vit (no "),
        (["--model", "gallery.vit:build", "--to", "torch"], "--to='torch' is not allowed with --model"),
        (["--model", "gallery.vit:build", "--kwarg", "depth"], "--kwarg='depth' is not allowed; allowed: NAME=VALUE"),
        (["--model", "gallery.vit:build", "--kwarg", "widht=3"], "got an unexpected keyword argument 'widht'"),
        (["--model", "gallery.vit:build", "--image-size", "0"], "--image-size=0 is not allowed; allowed: 2 to 4096"),
        (
            ["--model", "gallery.vit:build", "--out", "README.md"],
            "is not allowed: it exists and is not an empty folder",
        ),
        # A folder that cannot be written, said before the conversion runs.
        (["--model", "gallery.vit:build", "--out", "/proc/x"], "--out='/proc/x' is not allowed: /proc: "),
        (
            ["latest", "--model", "gallery.vit:build"],
            "give a checkpoint or --model=pkg.module:function, one of the two",
        ),
        (["runs"], "--to is missing; allowed: --to paddle|torch with a checkpoint"),
        # The user's own errors, with the user's file and line (not the translated copy's, not blamed on conversion).
        (["--model", "bad_nets.syntax:build"], "bad_nets/syntax.py:5: SyntaxError: '(' was never closed"),
        (
            ["--model", "bad_nets.raises:build"],
            "model.torch='bad_nets.raises:build' is not allowed: a factory that builds the model; it failed at "
            'raises.py:6 (raise ValueError("width must be even")): ValueError: width must be even',
        ),
    ],
    ids=[
        "typo",
        "to torch",
        "kwarg form",
        "kwarg name",
        "image size",
        "out exists",
        "out unwritable",
        "both",
        "no --to",
        "syntax",
        "own",
    ],
)
def test_convert_refuses_bad_input_in_one_line_and_writes_nothing(in_project, tmp_path, capsys, args, expected):
    from unitrain.convert import main

    (in_project / "README.md").write_text("not a folder")
    before = sorted(p.name for p in in_project.iterdir())
    try:
        rc = main(args)
    except SystemExit as exit:  # argparse's own refusals
        rc = exit.code
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and err.count("\n") == 1, err
    assert sorted(p.name for p in in_project.iterdir()) == before


def test_parity_fails_when_layer_outputs_cannot_be_paired(tmp_path):
    from unitrain.train.parity import activations_pass, first_divergence

    ones = np.ones((2, 3), np.float32)
    # One half calls GELU as a layer, the other as a function: nothing of it is compared.
    found = first_divergence([("fc", ones), ("act", ones)], [("fc", ones)], 1e-4)
    assert found["layers_unpaired"] == 1 and found["first_unpaired"] == "act" and not activations_pass(found)
    assert activations_pass(first_divergence([("fc", ones)], [("fc", ones)], 1e-4))


@pytest.mark.slow
def test_one_pytorch_file_trains_on_both_frameworks_and_every_capability_takes_it(project, tmp_path):
    """The comparison, shared initial weights, the translated code kept, and a Paddle checkpoint
    resumed in torch (export and quantization: the gallery test below)."""
    root = tmp_path / "user"
    shutil.copytree(project, root)
    model = ["model=custom", converted("convmixer"), "model.paddle=convert", "model.init=shared"]
    job = [*model, "data.image_size=16", "trainer.batch_size=8", "trainer.threads=1", "trainer.progress=false"]
    both = run_unitrain(["-m", "backend=paddle,torch", *job, "trainer.steps=4", "trainer.checkpoint_every=4"], root)
    assert both.returncode == 0, both.stderr[-2000:]
    runs = {p.name.split("_")[1]: p for p in (root / "multirun").iterdir() if (p / "summary.json").exists()}
    assert set(runs) >= {"paddle", "torch"}
    first = [json.loads((runs[b] / "metrics.jsonl").read_text().splitlines()[0])["loss"] for b in ("paddle", "torch")]
    assert abs(first[0] - first[1]) <= 1e-5 * abs(first[1])
    kept = runs["paddle"] / "converted"
    assert (kept / "translation.json").exists() and list(kept.rglob("convmixer.py"))
    shutil.copytree(project, root / "r")  # another folder of the user's with the same package
    resumed = run_unitrain(["backend=torch", *job, "trainer.steps=6", f"trainer.resume={runs['paddle']}"], root / "r")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.summary()["steps"] == 6
    # Exported from a folder without the user's code: the Paddle half is the run's own copy.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = elsewhere / "export"
    export = run_unitrain_module(elsewhere, "unitrain.export", str(runs["paddle"]), "--format=native", f"--out={out}")
    assert export.returncode == 0, export.stderr[-2000:]
    assert json.loads((out / "export.json").read_text())["artifacts"]


def test_a_run_without_its_converted_copy_converts_the_source_again_and_says_so(in_project, tmp_path, caplog):
    from unitrain.model.custom import from_record

    pair = from_record({"factories": {"torch": "gallery.convmixer:build", "paddle": "convert"}}, tmp_path)
    with caplog.at_level("WARNING", logger="unitrain"):
        translation = pair.translation("paddle")
    assert f"{tmp_path} holds no converted/ copy" in caplog.text
    assert translation.directory.parent.name == "converted" and translation.source.module == "gallery.convmixer"


def _refused_as_expected(done, expected) -> bool:
    """Whether the command was refused with ``expected`` in its one line (None: it must succeed)."""
    if expected is None:
        assert done.returncode == 0, done.stderr[-2000:]
        return False
    assert done.returncode == 2 and expected in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    return True


def run_unitrain_module(cwd: Path, module: str, *args: str):
    import subprocess

    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["convmixer", "vit"])
def test_a_converted_model_trains_data_parallel_with_amp_and_resumes(project, tmp_path, name):
    from unitrain.host.ports import free_port

    root = tmp_path / "user"
    shutil.copytree(project, root)
    job = ["backend=paddle", "model=custom", converted(name), "model.paddle=convert", "data.image_size=16"]
    job += ["trainer.batch_size=8", "trainer.threads=1", "trainer.progress=false", "amp=O1"]
    job += ["dist.nproc_per_node=2", "trainer.checkpoint_every=2"]
    first = run_unitrain([*job, "trainer.steps=2", f"dist.master_port={free_port()}"], root)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.summary()["world_size"] == 2 and (first.run_dir / "converted").is_dir()
    shutil.copytree(project, root / "again")
    resumed = run_unitrain(
        [*job, "trainer.steps=4", f"trainer.resume={first.run_dir}", f"dist.master_port={free_port()}"], root / "again"
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # The resumed run keeps the first run's steps and adds its own.
    assert [r["step"] for r in resumed.metrics()] == [1, 2, 3, 4] and resumed.summary()["steps"] == 4


#: unitrain.quantize kept short: one batch size, few iterations, no speed-ups (each a process that
#: loads and compiles both models again; tests/test_quantize.py asserts them).
QUICK_QUANTIZE = ["batches=[4]", "min_time_s=0", "min_iters=3", "warmup=1", "pairs=0", "eval_samples=64", "onnx=false"]
QUICK_QUANTIZE += ["calib_batches=1", "calib_batch_size=8"]


#: Paddle's int8 path first exports the fp32 model, checked as ``NOT_EXPORTED_FOR_PADDLE`` says;
#: the ViT's converted attention traces into its legacy program through unitrain's bridge.
NOT_QUANTIZED_BY_PADDLE: dict = {}
#: What Paddle's inference runtime does not take of the translated code (the U-Net's interpolate
#: runs there as unitrain's bridge traces it: gathers and weighted sums, no interpolation op).
NOT_EXPORTED_FOR_PADDLE: dict = {}


#: One model of each outcome: a convolutional net written as torchvision writes one (partial batch
#: norms, in-place activations and dropout, stochastic depth; the ConvMixer, MobileNetV2, the
#: MLP-Mixer and ResNet18 go as it does: measured, left out of CI for its 40 minutes), attention
#: through the bridge, interpolation through the bridge. The Swin: tests/test_gallery_idioms.py.
EXPORTED_IN_CI = ["efficientnet", "vit", "unet"]
#: Whose torch half goes through export and int8 too. The torch half is the user's own code with
#: the Paddle checkpoint's weights converted back, the same path for every model; what differs
#: between the models is what Paddle's tracers make of the translated code.
BOTH_HALVES = {"efficientnet"}


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPORTED_IN_CI)
def test_a_converted_gallery_model_exports_and_quantizes_in_both_frameworks(project, tmp_path, name):
    """A Paddle checkpoint of the translated half: exported natively and to ONNX for both
    frameworks (each artifact checked against the checkpoint's logits by the command), and
    dynamic int8 in both frameworks' toolkits (the torch half: ``BOTH_HALVES``), or one line
    where Paddle's cannot take it."""
    root = tmp_path / "user"
    shutil.copytree(project, root)
    job = ["backend=paddle", "model=custom", converted(name), "model.paddle=convert", "data.image_size=16"]
    trained = run_unitrain([*job, "trainer.batch_size=8", "trainer.steps=2", "trainer.checkpoint_every=2"], root)
    assert trained.returncode == 0, trained.stderr[-2000:]
    run = str(trained.run_dir)
    frameworks = ("torch", "paddle") if name in BOTH_HALVES else ("paddle",)
    for framework in frameworks:
        out = root / f"export-{framework}"
        export = run_unitrain_module(
            root, "unitrain.export", run, "--format=native,onnx", f"--to={framework}", f"--out={out}"
        )
        if not _refused_as_expected(export, NOT_EXPORTED_FOR_PADDLE.get(name) if framework == "paddle" else None):
            assert len(json.loads((out / "export.json").read_text())["artifacts"]) == 2
    for backend in frameworks:
        out = root / f"q-{backend}"
        args = [run, "method=dynamic", f"backend={backend}", *QUICK_QUANTIZE, f"hydra.run.dir={out}"]
        done = run_unitrain_module(root, "unitrain.quantize", *args)
        if _refused_as_expected(done, NOT_QUANTIZED_BY_PADDLE.get(name) if backend == "paddle" else None):
            continue
        assert done.returncode == 0, done.stderr[-2000:]
        rows = json.loads((out / "quantize.json").read_text())["rows"]
        int8 = [r for r in rows if r["precision"] == "dynamic"]
        assert int8 and not any(r["effective"].startswith("FAILED") for r in int8), int8


def test_torchs_shape_arguments_are_rewritten_to_what_paddles_tracers_take():
    from unitrain.backends.paddle.translate import _traceable_shapes

    code = "import numpy as np\ny = x.view(x.size(0), -1)\nz = self.cls.expand(n, -1, -1)\nw = x.view(d)\n"
    code += "v = self.expand(a, b)\nu = t.reshape(B, N, 3, h, d)\na = np.reshape(a, s)\n"
    rewritten, counts = _traceable_shapes(code)
    assert rewritten.splitlines()[2:] == [
        "y = x.reshape([x.shape[0], -1])",
        "z = self.cls.expand([n, -1, -1])",
        "w = unitrain_paddle.view(x, d)",  # one argument: a size, a shape or a dtype, known when it runs
        "v = self.expand(a, b)",  # the module's own method
        "u = t.reshape([B, N, 3, h, d])",
        "a = np.reshape(a, s)",  # a module's function
    ]
    assert counts == {
        "Tensor.size(dim)": 1,
        "Tensor.view(*sizes)": 1,
        "Tensor.expand(*sizes)": 1,
        "Tensor.view(size or shape)": 1,
        "Tensor.reshape(*sizes)": 1,
    }
    code = "q, k = x.split(C, dim=2)\np = paddle.arange(T, device=idx.device)\nd = paddle.device.get_device()\n"
    rewritten, counts = _traceable_shapes(code)
    assert rewritten.splitlines()[1:] == [
        "q, k = unitrain_paddle.split(x, C, dim=2)",
        "p = paddle.arange(T, device=unitrain_paddle.device_of(idx))",
        "d = paddle.device.get_device()",
    ]
    assert rewritten.startswith("from unitrain.backends.paddle import translate as unitrain_paddle\n")
    assert counts == {"Tensor.split(size, dim=)": 1, "device=Tensor.device": 1}


def test_the_split_bridge_splits_as_torch_does_with_a_remainder():
    import paddle
    import torch

    from unitrain.backends.paddle import translate

    x = np.arange(2 * 7 * 3, dtype=np.float32).reshape(2, 7, 3)
    for size in (3, [2, 5]):
        ours = translate.split(paddle.to_tensor(x), size, dim=1)
        theirs = torch.from_numpy(x).split(size, dim=1)
        assert [t.shape[1] for t in ours] == [t.shape[1] for t in theirs]
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("self_attention", [True, False])
def test_the_attention_bridge_computes_torchs_multihead_attention(batch_first, self_attention):
    """unitrain's MultiheadAttention (what translated code gets for torch's, traceable into
    Paddle's int8 program) gives torch's outputs and weights from torch's parameters."""
    import paddle
    import torch

    from unitrain.backends.paddle import translate

    torch.manual_seed(0)
    ours = translate.MultiheadAttention(16, 4, batch_first=batch_first)
    theirs = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    ours.eval()
    ours.set_state_dict({k: paddle.to_tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    shape = (2, 5, 16) if batch_first else (5, 2, 16)
    q, k, v = (np.random.default_rng(i).standard_normal(shape).astype(np.float32) for i in range(3))
    # One tensor three times: self-attention, which both compute with one packed projection.
    t_in = (torch.from_numpy(q),) * 3 if self_attention else tuple(map(torch.from_numpy, (q, k, v)))
    p_in = (paddle.to_tensor(q),) * 3 if self_attention else tuple(map(paddle.to_tensor, (q, k, v)))
    for need_weights, average in ((False, True), (True, True), (True, False)):
        a = theirs(*t_in, need_weights=need_weights, average_attn_weights=average)
        # The form a legacy program (Paddle's int8 path) traces; dygraph runs the compat layer's.
        b = ours.written_out(*p_in, need_weights=need_weights, average_attn_weights=average)
        np.testing.assert_allclose(b[0].numpy(), a[0].detach().numpy(), atol=1e-6)
        if need_weights:
            np.testing.assert_allclose(b[1].numpy(), a[1].detach().numpy(), atol=1e-6)


#: torch's interpolate arguments the bridge is checked on: (mode, align_corners, argument, value),
#: on 7x8 maps, where 1.5 is not out/in (7 * 1.5 = 10.5 -> 10) and torch maps with 1.5 itself.
INTERPOLATIONS = [
    (mode, corners, arg, value)
    for mode, corners in [("nearest", None), ("bilinear", False), ("bilinear", True)]
    for arg, value in [("scale_factor", 2), ("scale_factor", 1.5), ("size", (11, 13))]
] + [("bicubic", False, "scale_factor", 1.5), ("nearest-exact", None, "scale_factor", 1.5)]


def test_interpolate_samples_as_torch_in_dygraph_and_in_paddle_inferences_onednn(tmp_path):
    """The bridge for torch's interpolate, in dygraph and traced: a program PaConvert's
    paddle.nn.functional.interpolate would fill with an op Paddle Inference's oneDNN cannot run."""
    import paddle
    import torch

    from unitrain.backends.paddle import translate
    from unitrain.backends.paddle.export import save_native
    from unitrain.backends.paddle.infer import PaddleInference

    class Resized(paddle.nn.Layer):
        def __init__(self, calls):
            super().__init__()
            self.calls = calls
            # jit.save writes no .pdiparams for a model without parameters
            self.w = self.create_parameter([1], default_initializer=paddle.nn.initializer.Constant(1))

        def forward(self, x):
            return paddle.concat([translate.interpolate(x * self.w, **kw).flatten(1) for kw in self.calls], 1)

    x = np.random.RandomState(0).randn(2, 3, 7, 8).astype("float32")
    calls = [{"mode": mode, "align_corners": corners, arg: value} for mode, corners, arg, value in INTERPOLATIONS]
    torch_says = np.concatenate(
        [torch.nn.functional.interpolate(torch.from_numpy(x), **kw).flatten(1).numpy() for kw in calls], 1
    )
    model = Resized(calls)
    model.eval()
    assert np.abs(model(paddle.to_tensor(x)).numpy() - torch_says).max() < 1e-6
    program = save_native(model, tmp_path / "model", x, None)[0]
    assert "interp" not in program.read_text()
    runtime = PaddleInference(program, threads=2, optimized=True)
    runtime.load()
    assert np.abs(runtime.run(runtime.prepare(x)) - torch_says).max() < 1e-6
