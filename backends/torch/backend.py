"""The torch Backend: the framework primitives the training loop needs (threads, seeds, the loss,
state as NumPy, hooks on layer outputs)."""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F

from unitrain.interface.backend import Backend, check_state

__all__ = ["create_backend"]


class TorchBackend(Backend):
    name = "torch"
    package = "torch"

    def version(self) -> str:
        return torch.__version__

    def set_threads(self, threads: int) -> None:
        torch.set_num_threads(threads)

    def threads(self) -> int:
        return torch.get_num_threads()

    def seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    def loss(self, logits, labels, label_smoothing: float = 0.0):
        # A language model's [batch, time, vocab] logits: every position is a prediction.
        logits = logits.reshape(-1, logits.shape[-1])
        return F.cross_entropy(logits.float(), labels.reshape(-1), label_smoothing=label_smoothing)

    def to_numpy(self, tensor):
        return tensor.detach().float().cpu().numpy()

    def num_parameters(self, model) -> int:
        return sum(p.numel() for p in model.parameters())

    def state_arrays(self, model):
        return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}

    def load_state_arrays(self, model, arrays) -> None:
        state = model.state_dict()
        check_state(state.keys(), {k: tuple(v.shape) for k, v in state.items()}, arrays)
        model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})

    def set_deterministic(self) -> dict:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        return {"torch.use_deterministic_algorithms": True, "cudnn.benchmark": False, "threads": self.threads()}

    def _leaf_layers(self, model):
        return [(name, m) for name, m in model.named_modules() if not list(m.children())]

    def _on_output(self, layer, callback):
        return layer.register_forward_hook(lambda module, inputs, output: callback(output))

    def save_training_state(self, path, optimizer, extra) -> None:
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng, "extra": extra}, path)

    def load_training_state(self, path, optimizer):
        # Our own file: it holds Python RNG states, which weights_only loading refuses.
        state = torch.load(path, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        torch.set_rng_state(state["rng"]["torch"])
        return state["extra"]

    def parameter_arrays(self, model):
        return {name: p.detach().float().cpu().numpy() for name, p in model.named_parameters()}

    def peak_device_memory_mb(self, device: str) -> float | None:
        return torch.cuda.max_memory_allocated(device) / 2**20 if device.startswith("cuda") else None

    def freeze_batchnorm(self, model) -> None:
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.eval()


def create_backend() -> TorchBackend:
    return TorchBackend()
