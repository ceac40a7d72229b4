"""Write it once, for text: the gallery's two text models (char_lm, a decoder-only character LM
with tied embedding/head and causal SDPA; rnn_classifier, an LSTM/GRU classifier), their torch
half and the Paddle half PaConvert writes (the torch weights copied in), through unitrain's export
and quantize modules with token ids (int64) as they are: each artifact declares the example's
dtype, the runtime that reads it back takes that dtype from the artifact, and its logits are
compared with the eager model's.

Where the translated code stops a framework's tracer (Paddle's character LM), the test asserts the
one line unitrain reports (``framework_cause``) and, with the bridge set as it would be, what the
next step gives: a bridge, once written, fails that assertion and the test is updated with it."""

from __future__ import annotations

import importlib
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings(
    # torch.export on nn.LSTM/GRU; Paddle's PIR tracer on the translated code's .device/.contiguous();
    # paddle.split's pointer to its torch-difference page, said before it refuses ``dim``.
    "ignore:The tensor attributes .* were assigned during export:UserWarning",
    "ignore:Tensor do not have '.*' interface:UserWarning",
    "ignore:The API 'paddle.split' may behave differently:UserWarning",
    "ignore:The Attr\\(force_cpu\\) of Op\\(fill_constant\\) will be deprecated:UserWarning",
)

GALLERY = Path(__file__).resolve().parents[1] / "examples" / "gallery"
#: The model factories' arguments, and each model's sequence length.
MODELS = {"char_lm": dict(vocab_size=40, block_size=16), "rnn_classifier": dict(vocab_size=50, num_classes=4)}
LENGTH = {"char_lm": 16, "rnn_classifier": 12}
#: Rows of token ids read back (the artifacts are exported for any batch from an example of 4).
ROWS, EXAMPLE_ROWS, THREADS = 64, 4, 2
#: An artifact against the eager model it was written from: the same float32 arithmetic.
EXACT = 1e-4
#: unitrain's dynamic int8 (torch) stores each Linear weight per output channel, symmetric, and
#: computes in float32 from it: a weight moves by at most half a step, max|w_row| / 254, i.e.
#: 0.4% of its row's largest weight, and those errors add up mostly at random over the 32..128
#: inputs of each of the model's 1..9 Linears. Measured: 2.6e-3 (rnn_classifier), 4.0e-3 (char_lm),
#: max |int8 - fp32| / max |fp32| over 64 rows; bounded at 5x that. Below the floor nothing was
#: quantized (the logits would equal the fp32 ones within float32 reassociation).
INT8_REL, INT8_FLOOR, INT8_AGREE = 2e-2, 1e-4, 0.95
#: ONNX Runtime's dynamic int8 also quantizes each MatMul's input on the fly, per tensor to uint8
#: (half a step: 0.2% of that tensor's range), through char_lm's 9 stacked int8 MatMuls. Measured:
#: 1.2e-2 (char_lm), 5.1e-3 (rnn_classifier, either half's ONNX); bounded at 4x the larger.
ORT_INT8_REL = 5e-2
#: The Linears of each model (char_lm: qkv, proj and 2 MLP per block, 2 blocks, and the tied
#: head), and the MatMuls of two activations (attention's q.k and p.v per block) that stay float.
LINEARS, ACTIVATION_MATMULS = {"char_lm": 9, "rnn_classifier": 1}, {"char_lm": 4, "rnn_classifier": 0}


@dataclass
class Pair:
    torch: object
    paddle: object
    ids: np.ndarray  # int64 [ROWS, LENGTH]
    logits: Dict[str, np.ndarray]  # per framework: the eager model's, in evaluation mode

    @property
    def example(self) -> np.ndarray:
        return self.ids[:EXAMPLE_ROWS]


def text_pair(name: str, **kwargs):
    """The torch model and its converted Paddle half with the torch weights (the same names)."""
    import paddle
    import torch

    from unitrain.model.translate import find_source, translate

    torch.manual_seed(0)
    torch_model = importlib.import_module(f"gallery.{name}").build(**kwargs)
    paddle_model = translate(find_source("model.torch", f"gallery.{name}:build"), "paddle").factory()(**kwargs)
    state = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    assert set(state) <= set(paddle_model.state_dict())  # PaConvert keeps torch's names
    with warnings.catch_warnings():  # Paddle's per-cell RNN aliases are not in torch's state: it says so
        warnings.filterwarnings("ignore", message="Skip loading for")
        paddle_model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    torch_model.eval(), paddle_model.eval()
    return torch_model, paddle_model


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Both text models' torch and converted Paddle halves, built once for the module from a
    user's folder holding the gallery."""
    import paddle
    import torch

    root = tmp_path_factory.mktemp("write-once-text")
    shutil.copytree(GALLERY, root / "gallery", ignore=shutil.ignore_patterns("__pycache__"))
    built = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.syspath_prepend(str(root))
        for name, kwargs in MODELS.items():
            torch_model, paddle_model = text_pair(name, **kwargs)
            ids = np.random.default_rng(0).integers(0, kwargs["vocab_size"], (ROWS, LENGTH[name])).astype(np.int64)
            with torch.no_grad():
                t = torch_model(torch.from_numpy(ids)).numpy()
            with paddle.no_grad():
                p = paddle_model(paddle.to_tensor(ids)).numpy()
            assert rel(p, t) <= 1e-5  # the same weights: the halves agree before anything is exported
            built[name] = Pair(torch_model, paddle_model, ids, {"torch": t, "paddle": p})
    return built


@pytest.fixture(scope="module")
def onnx_of(pairs, tmp_path_factory):
    """``onnx_of(framework, name)``: that model's ONNX from the framework's exporter, written once."""
    from unitrain.interface.export import export_module

    written = {}

    def onnx(framework: str, name: str) -> Path:
        if (framework, name) not in written:
            pair, folder = pairs[name], tmp_path_factory.mktemp(f"onnx-{framework}")
            (written[framework, name],) = export_module(framework).save_onnx(
                getattr(pair, framework), folder / name, pair.example, None
            )
        return written[framework, name]

    return onnx


def rel(got, want) -> float:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def agreement(got, want) -> float:
    """The share of rows (positions, for the language model) whose arg max is the same."""
    return float(np.mean(np.asarray(got).argmax(-1) == want.argmax(-1)))


def runtimes(framework: str, path: Path) -> Dict[str, object]:
    """The runtimes unitrain reads a native artifact with, loaded, by name; torch.compile (13 s
    to compile the language model here) left out: it loads the same program as torch eager."""
    from unitrain.interface.infer import infer_module

    found = {}
    for runtime in infer_module(framework).runtimes(path, THREADS):
        if runtime.name != "torch.compile (inductor)":
            runtime.load()
            found[runtime.name] = runtime
    return found


def onnx_runtime(path: Path):
    from unitrain.deploy.runtimes import OnnxRuntime

    runtime = OnnxRuntime(path, THREADS)
    runtime.load()
    return runtime


def logits(runtime, ids: np.ndarray) -> np.ndarray:
    """What unitrain's benchmark runs: the runtime's own prepare() (which takes the artifact's
    declared input dtype: int64 here, nothing cast to float) and one run."""
    assert runtime.input_dtype == np.int64, runtime.name
    return runtime.run(runtime.prepare(ids))


# --- (a) export: native and ONNX ----------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_torch_exports_a_text_model_natively_with_int64_ids(pairs, tmp_path, name):
    """torch.export keeps the example's int64; the runtime reads it from the program and gives
    the eager logits, for any batch."""
    from unitrain.interface.export import export_module

    pair = pairs[name]
    (native,) = export_module("torch").save_native(pair.torch, tmp_path / name, pair.example, None)
    (eager,) = runtimes("torch", native).values()
    assert eager.name == "torch eager (torch.export.load)"
    assert rel(logits(eager, pair.ids), pair.logits["torch"]) <= EXACT
    assert eager.observed()["kernels"] == {"int8": 0, "float": LINEARS[name], "quantize": 0, "dequantize": 0}


@pytest.mark.parametrize("name", list(MODELS))
def test_torch_exports_a_text_model_to_onnx_with_int64_ids(pairs, onnx_of, name):
    """The dynamo ONNX exporter keeps the int64 input; ONNX Runtime gives the eager logits for any batch."""
    session = onnx_runtime(onnx_of("torch", name))
    inputs = session.session.get_inputs()
    assert [(i.name, i.type, i.shape[1]) for i in inputs] == [("images", "tensor(int64)", LENGTH[name])]
    assert rel(logits(session, pairs[name].ids), pairs[name].logits["torch"]) <= EXACT
    assert session.observed()["kernels"]["int8"] == 0 and session.observed()["kernels"]["float"] > 0


def test_paddle_exports_the_lstm_gru_classifier_natively_and_to_onnx_with_int64_ids(pairs, onnx_of, tmp_path):
    """Paddle's exporter declares the example's int64 (``InputSpec``); every Paddle runtime reads it
    from the program (Paddle Inference's input handle says float32 until fed), and paddle2onnx
    writes an int64 input straight into the embedding's Gather."""
    from unitrain.interface.export import export_module

    pair = pairs["rnn_classifier"]
    want = pair.logits["paddle"]
    native = export_module("paddle").save_native(pair.paddle, tmp_path / "ids", pair.example, None)
    assert [p.suffix for p in native] == [".json", ".pdiparams"]
    found = runtimes("paddle", native[0])
    assert sorted(found) == ["paddle.inference (IR + oneDNN)", "paddle.inference (no IR optim)", "paddle.jit.load"]
    for runtime in found.values():
        assert rel(logits(runtime, pair.ids), want) <= EXACT, runtime.name

    session = onnx_runtime(onnx_of("paddle", "rnn_classifier"))
    assert [i.type for i in session.session.get_inputs()] == ["tensor(int64)"]
    assert rel(logits(session, pair.ids), want) <= EXACT


def test_paddle_exports_the_character_lm_natively_and_to_onnx_with_int64_ids(pairs, tmp_path):
    """PaConvert writes torch's ``Tensor.split(size, dim=)`` as a helper set on ``paddle.Tensor``
    alone; traced, a tensor is a ``paddle.pir.Value``, whose ``split`` is ``paddle.split`` itself
    (paddle/pir/math_op_patch.py:1683), which refuses ``dim``. The translated code calls
    unitrain's split bridge instead: both formats take int64 ids and give the eager logits."""
    from unitrain.interface.export import export_module

    pair, export = pairs["char_lm"], export_module("paddle")
    code = Path(sys.modules[type(pair.paddle).__module__].__file__).read_text()
    assert "unitrain_paddle.split(self.qkv(x), C, dim=2)" in code
    want = pair.logits["paddle"]
    native = export.save_native(pair.paddle, tmp_path / "ids", pair.example, None)
    for runtime in runtimes("paddle", native[0]).values():
        assert rel(logits(runtime, pair.ids), want) <= EXACT, runtime.name
    (onnx,) = export.save_onnx(pair.paddle, tmp_path / "ids", pair.example, None)
    assert rel(logits(onnx_runtime(onnx), pair.ids), want) <= EXACT


# --- (b) dynamic int8 ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_torch_dynamic_int8_of_a_text_model_stores_every_linear_weight_int8(pairs, tmp_path, name):
    """From the int64 ids themselves: every nn.Linear's weight stored int8 (the tied head's
    included; the LSTM/GRU weights and the embeddings stay float32, by the quantizer's conv/linear
    annotation), dequantized for float32 compute, and the logits close to fp32."""
    import torch

    from unitrain.backends.torch.infer import load_program
    from unitrain.interface.quantize import quantize_module

    pair = pairs[name]
    saved = quantize_module("torch").save_quantized(
        pair.torch, "dynamic", [pair.example], tmp_path / "int8", False, True, [EXAMPLE_ROWS]
    )
    (([path], batch),) = saved
    assert path.suffix == ".pt2" and batch is None
    linears = [m for m in pair.torch.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == LINEARS[name]
    (eager,) = runtimes("torch", path).values()
    # What the runtime reports of the graph it runs: one weight dequantize per Linear, no int8 kernel.
    assert eager.observed()["kernels"] == {"int8": 0, "float": len(linears), "quantize": 0, "dequantize": len(linears)}
    program = load_program(path)
    stored = sorted(
        tuple(t.shape) for t in {**program.state_dict, **program.constants}.values() if t.dtype == torch.int8
    )
    assert stored == sorted(tuple(m.weight.shape) for m in linears)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert name != "rnn_classifier" or {"aten.lstm.input", "aten.gru.input"} <= targets  # float32 RNNs

    got, want = logits(eager, pair.ids), pair.logits["torch"]
    assert INT8_FLOOR < rel(got, want) <= INT8_REL and agreement(got, want) >= INT8_AGREE


@pytest.mark.parametrize(
    "framework, name", [("torch", "char_lm"), ("torch", "rnn_classifier"), ("paddle", "rnn_classifier")]
)
def test_onnx_runtime_dynamic_int8_of_a_text_onnx_runs_integer_kernels(
    pairs, onnx_of, tmp_path, monkeypatch, framework, name
):
    """ONNX Runtime's dynamic int8 (the neutral row of every quantize run) of the int64 ONNX:
    every MatMul with a weight (each Linear) runs as an integer kernel, the two of activations per
    attention block stay float, the LSTM/GRU are not counted (neither conv nor linear). Its shape
    inference, which stops short of the language model's attention, leaves nothing in the
    folder it runs from."""
    from unitrain.deploy.onnx_quantize import quantize_onnx

    pair, source = pairs[name], onnx_of(framework, name)
    fp32 = onnx_runtime(source).observed()["kernels"]
    assert fp32["int8"] == 0 and fp32["float"] == LINEARS[name] + ACTIVATION_MATMULS[name]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    target = quantize_onnx(source, tmp_path / "int8.onnx", "dynamic", [pair.example], True, False)
    assert not list((tmp_path / "cwd").iterdir())
    int8 = onnx_runtime(target)
    assert [i.type for i in int8.session.get_inputs()] == ["tensor(int64)"]
    assert {k: int8.observed()["kernels"][k] for k in ("int8", "float")} == {
        "int8": LINEARS[name],
        "float": ACTIVATION_MATMULS[name],
    }
    got, want = logits(int8, pair.ids), pair.logits[framework]
    assert INT8_FLOOR < rel(got, want) <= ORT_INT8_REL and agreement(got, want) >= INT8_AGREE


def test_paddle_dynamic_int8_quantizes_no_layer_of_the_converted_classifier(pairs, tmp_path):
    """The legacy program takes the int64 InputSpec (its tracer takes Paddle's LSTM and GRU as rnn
    ops), but PTQ swaps only layers whose type is in its mapping (paddle/quantization/quantize.py:98;
    paddle/quantization/config.py:31, nn.Linear and nn.Conv2D), and PaConvert writes
    paddle.compat.nn.Linear, a Layer of its own: no weight observed, no dequantize op, the logits
    the fp32 model's. The runtime reports it so."""
    import paddle

    from unitrain.interface.quantize import quantize_module

    pair = pairs["rnn_classifier"]
    linear = pair.paddle.fc
    assert isinstance(linear, paddle.compat.nn.Linear) and not isinstance(linear, paddle.nn.Linear)
    saved = quantize_module("paddle").save_quantized(
        pair.paddle, "dynamic", [pair.example], tmp_path / "int8", False, True, [EXAMPLE_ROWS]
    )
    (([path, params], batch),) = saved
    assert path.suffix == ".pdmodel" and params.suffix == ".pdiparams" and batch is None
    found = runtimes("paddle", path)
    assert sorted(found) == ["paddle.inference (IR + oneDNN)", "paddle.inference (no IR optim)"]  # no int8 row
    for runtime in found.values():
        assert runtime.observed()["kernels"] == {"int8": 0, "float": 1, "quantize": 0, "dequantize": 0}
        assert rel(logits(runtime, pair.ids), pair.logits["paddle"]) <= 1e-6, runtime.name


def test_paddle_dynamic_int8_of_the_character_lm_traces_through_the_bridges(pairs, tmp_path):
    """Paddle's dynamic int8 is a legacy program (OldIrGuard), whose ``Variable`` lacks what the
    converted model calls: ``idx.device`` (Variable has none), ``split(C, dim=2)`` (as in the
    export) and scaled_dot_product_attention, which asks ``query.shape.numel()``
    (paddle/nn/functional/sdpa.py:582) of Variable.shape, a tuple. unitrain's bridges take all
    three: the program saves and runs int64 ids with the fp32 logits, and, as for the classifier,
    PTQ quantizes none of PaConvert's compat Linears (the runtime says so)."""
    from unitrain.interface.quantize import quantize_module

    pair = pairs["char_lm"]
    saved = quantize_module("paddle").save_quantized(
        pair.paddle, "dynamic", [pair.example], tmp_path / "int8", False, True, [EXAMPLE_ROWS]
    )
    (([path, _], _),) = saved
    for runtime in runtimes("paddle", path).values():
        assert runtime.observed()["kernels"]["int8"] == 0 and runtime.observed()["kernels"]["dequantize"] == 0
        assert rel(logits(runtime, pair.ids), pair.logits["paddle"]) <= 1e-5, runtime.name
