"""PyTorch at its best on this device: torch.compile (Inductor) and channels-last memory format,
the two settings of torch's CPU and GPU performance-tuning guides that apply to a ResNet's
training step (cuDNN's benchmark mode as well on a GPU).

On a CPU neither is applied by default: neither measured faster there, alone or together
(benchmarks/README.md, "Each framework's own speed settings"). Named in
``backend.tuned_settings`` they are applied anywhere (an AVX-512 CPU may differ)."""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from torch.nn.parallel import DistributedDataParallel

from unitrain.errors import ConfigError
from unitrain.interface.speed_settings import TUNED, SpeedSettings

__all__ = ["Tuned"]


class Tuned(SpeedSettings):
    settings = TUNED
    SETTINGS = {
        "compile": "torch.compile (Inductor) around the training model",
        "channels_last": "channels-last memory format for weights and inputs",
    }

    @staticmethod
    def left_out(device: str) -> Dict[str, str]:
        if device != "cpu":
            return {}
        why = "measured no faster on a CPU ({}); name it in backend.tuned_settings to apply it"
        return {"compile": why.format("0.66x-1.01x"), "channels_last": why.format("0.76x-1.05x")}

    def __init__(self, device: str = "cpu", chosen=None):
        super().__init__(device, chosen)
        self._model: torch.nn.Module | None = None
        self._compiled = None
        if device.startswith("cuda"):
            torch.backends.cudnn.benchmark = True

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if "channels_last" in self.chosen:
            model = model.to(memory_format=torch.channels_last)
        self._model = model
        return model

    def wrap_model(self, model: Any) -> Any:
        if "compile" not in self.chosen:
            return model
        first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if torch.distributed.is_available() else 0
        if isinstance(model, DistributedDataParallel) and model.bucket_bytes_cap < first:
            # torch's DDPOptimizer asserts this deep inside the first compiled step otherwise.
            raise ConfigError(
                "dist.bucket_cap_mb",
                round(model.bucket_bytes_cap / 2**20, 6),
                f"at least {first / 2**20:g} with torch.compile (backend.tuned): its DDPOptimizer needs buckets no "
                "smaller than DDP's first",
            )
        # Compile around the DDP wrapper, as torch's DDP notes advise: DDPOptimizer splits the
        # graph at bucket boundaries so the all-reduces still overlap the backward pass.
        self._compiled = torch.compile(model)
        return self._compiled

    def convert_input(self, images: torch.Tensor) -> torch.Tensor:
        return images.contiguous(memory_format=torch.channels_last) if "channels_last" in self.chosen else images

    def observed(self) -> List[str]:
        done = []
        convs = [
            m.weight
            for m in (self._model.modules() if self._model is not None else ())
            if isinstance(m, torch.nn.Conv2d)
        ]
        if convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs):
            done.append(f"channels_last ({len(convs)} conv weights)")
        if self._compiled is not None:
            from torch._dynamo.utils import counters  # noqa: PLC0415 - only once compile has run

            graphs = counters["stats"]["unique_graphs"]
            if graphs:
                done.append(
                    f"torch.compile inductor ({graphs} graph(s), {sum(counters['graph_break'].values())} graph "
                    "break(s))"
                )
        if self.device.startswith("cuda") and torch.backends.cudnn.benchmark:
            done.append("cudnn.benchmark")
        return done
