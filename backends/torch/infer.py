"""Inference runtimes in torch for an ExportedProgram (.pt2): eager, and torch.compile of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

from unitrain.errors import UnitrainError
from unitrain.interface.infer import Runtime

__all__ = ["runtimes"]


#: Graph operators of a quantized ExportedProgram (torchao's PT2E): activation quantization,
#: weight dequantization (int8 weights are per channel); and the float conv/linear they feed.
QUANTIZE = "quantize_per_tensor"
WEIGHT_DEQUANTIZE = "dequantize_per_channel"
FLOAT = ("aten.conv2d", "aten.linear", "aten.convolution", "aten.addmm")


def _needs_torchao(path: Path) -> bool:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return any(
            b"quantized_decomposed" in archive.read(n)
            for n in archive.namelist()
            if n.endswith(".json") and "/models/" in n
        )


def load_program(path: Path):
    """``torch.export.load``; a quantized program's operators (quantized_decomposed.*) are
    registered by torchao, imported only for a program that uses them."""
    if _needs_torchao(path):
        try:
            import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401
        except ImportError:
            raise UnitrainError(
                f"{path.name} is a quantized program; loading it needs torchao: pip install 'unitrain[quantize]'"
            ) from None
    return torch.export.load(str(path))


def input_dtype(program) -> np.dtype:
    """The dtype the program was exported for: its (first) user input's, as the graph declares it."""
    name = program.graph_signature.user_inputs[0]
    declared = next(n.meta["val"].dtype for n in program.graph.nodes if n.op == "placeholder" and n.name == name)
    return torch.empty(0, dtype=declared).numpy().dtype


def _graph_counts(module) -> Dict[str, int]:
    targets = [str(n.target) for n in module.graph.nodes if n.op == "call_function"]
    # Without integer kernels in eager mode: dequantized weights feed float conv/linear, and
    # quantize-dequantize pairs on activations only simulate int8.
    return {
        "int8": 0,
        "float": sum(any(f in t for f in FLOAT) for t in targets),
        "quantize": sum(QUANTIZE in t for t in targets),
        "dequantize": sum(WEIGHT_DEQUANTIZE in t for t in targets),
    }


class TorchEager(Runtime):
    name = "torch eager (torch.export.load)"

    def load(self) -> None:
        torch.set_num_threads(self.threads)
        program = load_program(self.path)
        self.input_dtype, self.module = input_dtype(program), program.module()
        self.graph_kernels = _graph_counts(self.module)

    def prepare(self, images: np.ndarray):
        self.last = torch.from_numpy(np.ascontiguousarray(images, dtype=self.input_dtype))
        return self.last

    def run(self, prepared) -> np.ndarray:
        with torch.inference_mode():
            return self.module(prepared).numpy()

    def observed(self) -> Dict[str, Any]:
        return {
            "threads": torch.get_num_threads(),
            "mkldnn": torch.backends.mkldnn.is_available(),
            "kernels": self.graph_kernels,
        }


class TorchCompile(TorchEager):
    """``torch.compile`` (Inductor) of the loaded program; it compiles during warm-up, once per
    batch size. If Dynamo fell back to eager or split the graph, ``observed`` says so.
    Inductor freezing (constant weights folded at compile time, PyTorch's inference setting) is
    what lets it replace a quantized program's quantize/dequantize pairs with oneDNN int8
    kernels; fp32 programs get it too, so both are compiled alike."""

    name = "torch.compile (inductor)"

    def load(self) -> None:
        super().load()
        import torch._dynamo
        import torch._inductor.config

        torch._dynamo.reset()
        torch._inductor.config.freezing = True
        self.module = torch.compile(self.module)

    def _profiled_kernels(self) -> Dict[str, int]:
        """The conv/linear kernels one compiled run really called, from torch.profiler."""
        from torch.profiler import profile

        with torch.inference_mode(), profile() as prof:
            self.module(self.last)
        names = [e.name for e in prof.events()]
        int8 = sum(("qconv" in n or "qlinear" in n) for n in names)
        flt = sum(
            n
            in (
                "aten::convolution",
                "aten::addmm",
                "aten::mm",
                "mkldnn::_convolution_pointwise",
                "mkldnn::_linear_pointwise",
                "aten::mkldnn_convolution",
            )
            for n in names
        )
        return {"int8": int8, "float": flt, "quantize": 0, "dequantize": self.graph_kernels["dequantize"]}

    def observed(self) -> Dict[str, Any]:
        from torch._dynamo.utils import counters

        graphs = int(counters["stats"]["unique_graphs"])
        breaks = int(sum(counters["graph_break"].values()))
        ran = "inductor" if graphs and not breaks else "eager fallback" if not graphs else "inductor with graph breaks"
        return {
            **super().observed(),
            "compiled_graphs": graphs,
            "graph_breaks": breaks,
            "ran": ran,
            "freezing": True,
            "kernels": self._profiled_kernels(),
        }


def runtimes(path: Path, threads: int) -> List[Runtime]:
    return [TorchEager(path, threads), TorchCompile(path, threads)]
