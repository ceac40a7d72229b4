"""A user's language model written once (model=custom with data=text): a torch factory taking
vocab_size= and block_size=, its Paddle half converted (model.paddle=convert), trained on both
frameworks from the same weights, compared by unitrain.parity, and one line for a factory whose
model does not give the logits the data needs. The gallery's char LM (causal attention, tied
embedding) and char-rnn (Embedding -> 2-layer LSTM -> Linear: Paddle's LSTM names every weight
twice, unitrain.model.pairing pairs it through the aliases)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BACKENDS, refusal, run_unitrain


@pytest.fixture(autouse=True)
def _own_bad_nets(monkeypatch):
    """test_custom_text.py and test_write_once.py each write a module named bad_nets: one that the
    other file's tests imported first (both may run in one pytest worker) is not this file's."""
    monkeypatch.delitem(sys.modules, "bad_nets", raising=False)


ROOT = Path(__file__).resolve().parents[1]
GALLERY = ROOT / "examples" / "gallery"
#: The two gallery language models, copied into a user's package of their own (lm_nets).
LM_FILES = ("char_lm.py", "char_rnn.py")
BLOCK = 16
TEXT = ["model=custom", "model.paddle=convert", "data=text", f"data.block_size={BLOCK}"]
QUIET = ["trainer.threads=1", "trainer.progress=false"]
CHAR_LM = [*TEXT, "model.torch=lm_nets.char_lm:build"]
CHAR_RNN = [*TEXT, "model.torch=lm_nets.char_rnn:build", "model.kwargs={hidden: 32, layers: 2}"]
#: The same job on both frameworks from shared weights: every step's loss within this (relative).
LOSS_REL = 1e-4
STEPS = 10

#: Factories a user gets wrong: logits of the wrong count or rank, a name that is no function.
BAD_NETS = '''
import torch
import torch.nn as nn


class Classes(nn.Module):
    def __init__(self, outputs, keep_spatial=False):
        super().__init__()
        self.conv = nn.Conv2d(3, outputs, 3, padding=1)
        self.keep_spatial = keep_spatial

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.conv(x), 1)
        return x if self.keep_spatial else x.flatten(1)


class LastPosition(nn.Module):
    """A language model that predicts the next token after the block only: [batch, vocab]."""

    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 8)
        self.head = nn.Linear(8, vocab_size)

    def forward(self, idx):
        return self.head(self.emb(idx)[:, -1])


class LogitsAndLoss(nn.Module):
    """nanoGPT's form: forward(idx, targets=None) returns (logits, loss), the loss None without targets."""

    def __init__(self, vocab_size):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 8)
        self.head = nn.Linear(8, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.emb(idx))
        loss = None if targets is None else nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def three(num_classes, image_size):
    return Classes(3)


def thirteen(num_classes, image_size):
    return Classes(13)


def spatial(num_classes, image_size):
    return Classes(num_classes, keep_spatial=True)


def good(num_classes, image_size):
    return Classes(num_classes)


def last_position(vocab_size, block_size):
    return LastPosition(vocab_size)


def logits_and_loss(vocab_size, block_size):
    return LogitsAndLoss(vocab_size)


not_callable = 5
'''


def corpus_text(chars: int = 6000) -> str:
    """A few KB of this repository's own docs: prose, code and tables."""
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    return text[:chars]


def project(root: Path) -> Path:
    """A user's folder: their language models (lm_nets), some bad factories, and a corpus."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "lm_nets").exists():
        (root / "lm_nets").mkdir()
        (root / "lm_nets" / "__init__.py").write_text("")
        for name in LM_FILES:
            shutil.copy(GALLERY / name, root / "lm_nets" / name)
        (root / "bad_nets.py").write_text(BAD_NETS)
        (root / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
    return root


def data_path(root: Path) -> str:
    return f"data.path={root / 'corpus.txt'}"


def losses(result) -> list:
    return [r["loss"] for r in result.metrics()]


def largest_rel(a: list, b: list) -> float:
    assert len(a) == len(b) == STEPS, (a, b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def lm_root(tmp_path_factory) -> Path:
    return project(tmp_path_factory.mktemp("custom-text"))


@pytest.fixture(scope="module")
def trained(lm_root):
    """``trained(model, backend)``: the gallery model trained STEPS steps from shared weights,
    once per module, with a checkpoint at the end."""
    runs = {}

    def run(model: str, backend: str):
        if (model, backend) not in runs:
            args = CHAR_LM if model == "char_lm" else CHAR_RNN
            root = project(lm_root / f"{model}-{backend}")  # run from the user's folder
            result = run_unitrain(
                [
                    f"backend={backend}",
                    *args,
                    data_path(root),
                    *QUIET,
                    "model.init=shared",
                    f"trainer.steps={STEPS}",
                    f"trainer.checkpoint_every={STEPS}",
                ],
                root,
            )
            assert result.returncode == 0, result.stderr[-3000:]
            runs[model, backend] = result
        return runs[model, backend]

    return run


# --- the gallery's language models, trained as jobs on both frameworks -----------------------
@pytest.mark.slow
@pytest.mark.parametrize("model", ["char_lm", "char_rnn"])
def test_a_language_model_written_once_trains_alike_on_both_frameworks(model, trained):
    runs = {b: trained(model, b) for b in BACKENDS}
    assert largest_rel(losses(runs["paddle"]), losses(runs["torch"])) <= LOSS_REL
    for result in runs.values():
        summary = result.summary()
        assert summary["model"] == "custom" and summary["text"]["block_size"] == BLOCK, summary["text"]
        meta = json.loads(next((result.run_dir / "checkpoints").glob("step*/meta.json")).read_text())
        # What export, quantize and generate rebuild the text factory's model from.
        assert meta["custom"]["block_size"] == BLOCK and meta["custom"]["factories"]["torch"].startswith("lm_nets.")
        assert meta["num_classes"] == summary["text"]["vocab_size"]
    # The translated half was checked against the torch half on token ids before it trained.
    log = (runs["paddle"].run_dir / "unitrain.log").read_text()
    assert "model.paddle=convert" in log and "layer outputs within" in log


@pytest.mark.slow
def test_the_lstm_pair_passes_parity(lm_root):
    root = project(lm_root / "parity")
    result = run_unitrain([*CHAR_RNN, data_path(root), "steps=5", "trainer.threads=1"], root, module="unitrain.parity")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((result.run_dir / "parity.json").read_text())
    assert report["passed"] and report["data"] == "text" and report["max_rel_loss_diff"] < 1e-5, report["per_step"]
    # The embedding and the head (Paddle runs its LSTM as one fused operator, with no layer
    # output of its own to compare; torch's LSTM output is the head's input).
    assert report["first_batch_activations"]["layers_compared"] >= 2
    assert report["first_batch_activations"]["layers_unpaired"] == 0


@pytest.mark.slow
def test_a_text_factorys_checkpoint_generates_the_same_text_on_either_framework(trained):
    import subprocess
    import sys

    run = trained("char_lm", "torch").run_dir
    texts = {}
    for backend in BACKENDS:
        done = subprocess.run(
            [sys.executable, "-m", "unitrain.generate", str(run), "--backend", backend, "--tokens", "40"],
            cwd=run.parent,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        texts[backend] = done.stdout
    assert texts["paddle"] == texts["torch"] and len(texts["torch"].strip()) > 0


@pytest.mark.slow
def test_a_broken_mapping_on_a_cross_framework_resume_is_one_line(trained, lm_root, tmp_path):
    torch_run = trained("char_lm", "torch").run_dir
    broken = tmp_path / "pairs.json"
    broken.write_text('{"tok_emb.weight": ')
    args = ["backend=paddle", *CHAR_LM, data_path(lm_root), *QUIET, f"trainer.resume={torch_run}"]
    line = refusal([*args, f"model.mapping={broken}", f"trainer.steps={STEPS + 2}"], tmp_path)
    assert line is not None and "model.mapping=" in line and "a JSON file of {name: name} pairs" in line, line
    assert not (tmp_path / "run").exists()


# --- Paddle's LSTM: one tensor, two names ---------------------------------------------------
@pytest.fixture(scope="module")
def lstm_pair(lm_root):
    """The char-rnn's torch half and converted Paddle half, built by unitrain from shared weights."""
    import unitrain
    from unitrain.model.build import build_model

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(lm_root)
        mp.syspath_prepend(str(lm_root))
        pair = unitrain.CustomModel(
            factories={"torch": "lm_nets.char_rnn:build", "paddle": "convert"},
            kwargs={"hidden": 8, "layers": 2},
            block_size=BLOCK,
        )
        built = {}
        for name in BACKENDS:
            backend = unitrain.get_backend(name)
            built[name] = (backend, build_model(backend, pair, 11, init="shared", seed=3))
    return built


def test_paddles_lstm_aliases_are_found_and_one_tensor(lstm_pair):
    from unitrain.model.pairing import tied

    backend, model = lstm_pair["paddle"]
    aliases = tied(backend, model, known=False)
    # Two layers, four weights each: lstm.<layer>.cell.<weight> is lstm.<weight>_l<layer>.
    assert aliases == {
        f"lstm.{layer}.cell.{w}": f"lstm.{w}_l{layer}"
        for layer in (0, 1)
        for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    }
    # The same storage: writing one name writes the other.
    state = backend.state_arrays(model)
    changed = dict(state, **{"lstm.weight_hh_l1": np.full_like(state["lstm.weight_hh_l1"], 0.5)})
    changed["lstm.1.cell.weight_hh"] = changed["lstm.weight_hh_l1"]
    backend.load_state_arrays(model, changed)
    assert np.all(backend.state_arrays(model)["lstm.1.cell.weight_hh"] == 0.5)
    backend.load_state_arrays(model, state)
    torch_backend, torch_model = lstm_pair["torch"]
    assert tied(torch_backend, torch_model, known=False) == {}  # torch names each tensor once


def test_the_lstm_halves_start_from_the_same_weights_and_compute_the_same(lstm_pair):
    from unitrain.model.conversion import pair_tables
    from unitrain.model.pairing import convert_pair

    (pb, paddle_model), (tb, torch_model) = lstm_pair["paddle"], lstm_pair["torch"]
    torch_state, paddle_state = tb.state_arrays(torch_model), pb.state_arrays(paddle_model)
    # model.init=shared: each torch weight is Paddle's weight of that name, and its alias too.
    for name, array in torch_state.items():
        assert np.array_equal(paddle_state[name], array), name
    assert np.array_equal(paddle_state["lstm.0.cell.weight_ih"], torch_state["lstm.weight_ih_l0"])
    # torch's trained-looking weights into Paddle through the pairing, aliases included.
    rng = np.random.default_rng(0)
    moved = {k: (v + rng.normal(0, 0.1, v.shape)).astype(v.dtype) for k, v in torch_state.items()}
    source, target, counters = pair_tables("torch", moved, [], pb, paddle_model)
    pb.load_state_arrays(paddle_model, convert_pair(moved, source, target, {}, counters))
    loaded = pb.state_arrays(paddle_model)
    assert np.array_equal(loaded["lstm.1.cell.bias_hh"], moved["lstm.bias_hh_l1"])
    ids = rng.integers(0, 11, (2, BLOCK)).astype(np.int64)
    import paddle
    import torch

    tb.load_state_arrays(torch_model, moved)
    torch_model.eval(), paddle_model.eval()
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids)).numpy()
    got = paddle_model(paddle.to_tensor(ids)).numpy()
    assert got.shape == want.shape == (2, BLOCK, 11)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_a_text_pair_is_recorded_for_export_and_generate():
    from unitrain.model.conversion import checkpoint_model
    from unitrain.model.custom import CustomModel, from_record

    pair = CustomModel(factories={"torch": "lm_nets.char_rnn:build"}, kwargs={"hidden": 8}, block_size=BLOCK)
    assert pair.arguments(40) == {"vocab_size": 40, "block_size": BLOCK, "hidden": 8}
    again = checkpoint_model({"custom": pair.record(), "model": "custom"})
    assert again == from_record(pair.record()) == pair and again.text
    image = CustomModel(factories={"torch": "my_nets.torch_net:build"}, image_size=16)
    assert not from_record(image.record()).text and image.arguments(10) == {"num_classes": 10, "image_size": 16}


# --- one line for a factory that does not fit, before anything is written -------------------
IMAGE = ["backend=torch", "model=custom", "data.image_size=16", "trainer.steps=2", *QUIET]


@pytest.mark.parametrize(
    "args,said",
    [
        (["model.torch=bad_nets:three"], "a model giving logits [batch, classes] = [2, 10] (one per class)"),
        (["model.torch=bad_nets:thirteen"], "it gave [2, 13]"),
        (["model.torch=bad_nets:spatial"], "it gave [2, 10, 1, 1]"),
        (["model.torch=bad_nets:good", "model.kwargs=5"], "model.kwargs=5 is not allowed: a mapping"),
        (["model.torch=bad_nets:good", "model.kwargs=[8]"], "model.kwargs=[8] is not allowed: a mapping"),
        (["model.torch=bad_nets:not_callable"], "bad_nets.not_callable is an int, not a function"),
    ],
    ids=["3-of-10", "13-of-10", "BC11", "kwargs-int", "kwargs-list", "not-callable"],
)
def test_an_image_factory_that_does_not_fit_is_one_line(args, said, tmp_path):
    result = run_unitrain([*IMAGE, *args], project(tmp_path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and said in lines[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not result.run_dir.exists()


@pytest.mark.parametrize(
    "factory,said",
    [
        (
            "bad_nets:last_position",
            f"a model giving logits [batch, time, vocab] = [2, {BLOCK}, ",  # the corpus's characters
        ),
        ("bad_nets:good", "a factory taking vocab_size=, block_size= and model.kwargs (none) (data=text)"),
    ],
    ids=["last-position-only", "an-image-factory"],
)
def test_a_text_factory_that_does_not_fit_is_one_line(factory, said, tmp_path):
    root = project(tmp_path)
    args = ["backend=torch", "model=custom", f"model.torch={factory}", "data=text", f"data.block_size={BLOCK}"]
    result = run_unitrain([*args, data_path(root), "trainer.steps=2", *QUIET], root)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and said in lines[0], result.stderr[-3000:]
    if factory.endswith("last_position"):
        assert lines[0].endswith(f"it gave [2, {len(set(corpus_text()))}]"), lines[0]
    assert "Traceback" not in result.stderr and not result.run_dir.exists()


# --- a language model's own forms ------------------------------------------------------------
def test_a_language_model_returning_logits_and_loss_is_taken(lm_root, monkeypatch, tmp_path):
    # nanoGPT's (logits, loss): its logits picked on both halves, the conversion checked with them.
    monkeypatch.chdir(lm_root)
    monkeypatch.syspath_prepend(str(lm_root))
    args = [*TEXT, "backend=paddle", "model.torch=bad_nets:logits_and_loss", data_path(lm_root), "trainer.steps=2"]
    assert refusal([*args, *QUIET], tmp_path) is None
    assert not (tmp_path / "run").exists()


def test_an_lstm_with_dropout_between_its_layers_passes_the_conversions_training_check(lm_root, monkeypatch):
    """char-rnn's usual form, nn.LSTM(..., num_layers=2, dropout=0.1): its dropout is turned off
    in both halves alike, in torch's nn.LSTM and in the paddle.nn.LSTM of the translated half (a
    list of cells, where torch's is one layer); it moved the translated half's weights by 0.6."""
    from hydra import compose, initialize_config_module

    from unitrain.config.schema import register_configs
    from unitrain.train.parity import check_converted

    monkeypatch.chdir(lm_root)
    monkeypatch.syspath_prepend(str(lm_root))
    register_configs()
    overrides = [*CHAR_RNN[:-1], "model.kwargs={hidden: 16, layers: 2, dropout: 0.1}", "trainer.threads=1"]
    with initialize_config_module("unitrain.conf", version_base=None):
        cfg = compose("config", overrides=[*overrides, data_path(lm_root)])
    training = check_converted(cfg, "paddle", 11)["training"]
    assert training["compared"] and training["random_layers_off"] == ["lstm"], training
    assert training["loss_rel_diff"] <= 1e-4 and training["largest_change"]["rel_diff"] <= 1e-2, training
