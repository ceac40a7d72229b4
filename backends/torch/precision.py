"""MixedPrecision for torch: torch.amp autocast and GradScaler, O2 master weights, Apex.

Levels mean what they mean on paddle:
  O1  autocast; conv/linear in low precision, softmax (and the loss) in fp32; custom lists by
      wrapping the named modules.
  O2  parameters in low precision except normalization layers; the optimizer steps an fp32
      master copy, and the low-precision copy is refreshed from it after each step.
  O3  the whole model and its input in low precision, no master weights (fast, unstable).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

from unitrain.config.schema import AmpConfig
from unitrain.errors import BackendUnavailableError, ConfigError
from unitrain.interface.precision import MixedPrecision, ScaledMixedPrecision, loss_scaling_wanted, op_lists

from .validation import APEX_HELP

__all__ = ["make_precision"]

log = logging.getLogger("unitrain")

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# unitrain op names -> the torch modules that run them.
MODULES: Dict[str, Tuple[type, ...]] = {
    "conv2d": (nn.Conv2d,),
    "linear": (nn.Linear,),
    "batch_norm": (nn.modules.batchnorm._BatchNorm,),
    "relu": (nn.ReLU,),
    "max_pool2d": (nn.MaxPool2d,),
    "adaptive_avg_pool2d": (nn.AdaptiveAvgPool2d,),
    "softmax": (nn.Softmax, nn.LogSoftmax),
    "layer_norm": (nn.LayerNorm,),
    "gelu": (nn.GELU,),
}
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


def _cast(data: Any, dtype: torch.dtype) -> Any:
    if isinstance(data, torch.Tensor) and data.is_floating_point():
        return data.to(dtype)
    if isinstance(data, (list, tuple)):
        return type(data)(_cast(d, dtype) for d in data)
    return data


def _device_type(model: nn.Module) -> str:
    param = next(model.parameters(), None)
    return param.device.type if param is not None else "cpu"


def make_scaler(cfg: AmpConfig, device_type: str) -> torch.amp.GradScaler:
    """torch.amp.GradScaler with unitrain's (paddle's) knob names mapped onto torch's."""
    if cfg.decr_every_n_nan_or_inf != 1:
        raise ConfigError(
            "amp.decr_every_n_nan_or_inf",
            cfg.decr_every_n_nan_or_inf,
            "1 on backend=torch: torch.amp.GradScaler backs off on every overflowing step",
        )
    return torch.amp.GradScaler(
        device_type,
        init_scale=cfg.init_loss_scaling,
        growth_factor=cfg.incr_ratio,
        backoff_factor=cfg.decr_ratio,
        growth_interval=cfg.incr_every_n_steps,
        enabled=loss_scaling_wanted(cfg),
    )


class TorchMixedPrecision(ScaledMixedPrecision):
    def __init__(self, cfg: AmpConfig):
        super().__init__(cfg)
        self.low = DTYPES[cfg.dtype]
        self.white, self.black = op_lists(cfg)
        self.device_type = "cpu"
        self._masters: List[Tuple[nn.Parameter, nn.Parameter]] = []
        self._effective = "fp32"

    # --- set-up -------------------------------------------------------------------------------
    def decorate(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.device_type = _device_type(model)
        if self.level == "O1":
            self._wrap_listed_modules(model)
        elif self.level == "O2":
            for module in model.modules():
                if not isinstance(module, NORM_LAYERS):
                    for param in module.parameters(recurse=False):
                        param.data = param.data.to(self.low)
            self._use_master_weights(model, optimizer)
        elif self.level == "O3":
            model.to(self.low)
        self.scaler = make_scaler(self.cfg, self.device_type)
        self._effective = self._observe(model)
        return model, optimizer

    def _wrap_listed_modules(self, model: nn.Module) -> None:
        """O1 custom lists: black-listed modules run in fp32, white-listed ones in low precision."""
        for names, dtype, autocast_on in (
            (self.black, torch.float32, False),
            (self.white - {"conv2d", "linear"}, self.low, True),
        ):
            kinds = tuple(k for name in names for k in MODULES[name])
            for module in model.modules():
                if kinds and isinstance(module, kinds):
                    module.forward = self._cast_inputs(module.forward, dtype, autocast_on)

    def _cast_inputs(self, forward: Callable, dtype: torch.dtype, autocast_on: bool) -> Callable:
        device_type, low = self.device_type, self.low

        def wrapped(*args, **kwargs):
            with torch.autocast(device_type, dtype=low, enabled=autocast_on):
                return forward(*_cast(args, dtype), **kwargs)

        return wrapped

    def _use_master_weights(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Let the optimizer step fp32 copies of the low-precision parameters."""
        low_params = {id(p) for p in model.parameters() if p.dtype == self.low}
        for group in optimizer.param_groups:
            masters = []
            for param in group["params"]:
                if id(param) in low_params:
                    master = nn.Parameter(param.detach().float().clone())
                    self._masters.append((param, master))
                    masters.append(master)
                else:
                    masters.append(param)
            group["params"] = masters

    def _observe(self, model: nn.Module) -> str:
        """What precision really runs: the dtype a conv produces under this level's autocast."""
        probe = nn.Conv2d(3, 4, 1).to(next(model.parameters()).device)
        if self.level in ("O2", "O3"):
            probe.to(self.low)
        with torch.no_grad(), self.autocast():
            out = probe(self.convert_input(torch.zeros(1, 3, 2, 2, device=next(model.parameters()).device)))
        if out.dtype == torch.float32:
            self.fallback_reason = f"torch autocast produced float32 on {self.device_type}"
            log.warning(
                "amp=%s %s requested, but %s: this run is fp32, and is reported as such",
                self.level,
                self.cfg.dtype,
                self.fallback_reason,
            )
            return "fp32"
        return f"{self.level} {self.cfg.dtype}"

    @property
    def effective(self) -> str:
        return self._effective

    # --- the step -----------------------------------------------------------------------------
    def convert_input(self, data: Any) -> Any:
        return _cast(data, self.low) if self.level == "O3" else data

    def autocast(self):
        if self.level in ("O1", "O2"):
            return torch.autocast(self.device_type, dtype=self.low)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        for param, master in self._masters:
            master.grad = None if param.grad is None else param.grad.float()
            param.grad = None
        scale = self.scaler.get_scale()
        self.scaler.step(optimizer)  # unscales, and skips the step if a gradient is inf/nan
        self.scaler.update()
        skipped = self.scaler.is_enabled() and self.scaler.get_scale() < scale
        self.skipped_steps += skipped
        with torch.no_grad():
            for param, master in self._masters:
                param.copy_(master)
        return not skipped

    def loss_scale(self) -> float:
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0

    def state_dict(self) -> Dict[str, Any]:
        # O2's fp32 master weights hold what the low-precision model copy has rounded away.
        return {**super().state_dict(), "master_weights": [m.detach().cpu().numpy() for _, m in self._masters]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            for (param, master), saved in zip(self._masters, state.get("master_weights", []), strict=True):
                master.copy_(torch.from_numpy(saved))
                param.copy_(master)


class ApexMixedPrecision(TorchMixedPrecision):
    """The same levels through NVIDIA Apex's amp (apex.amp.initialize / amp.scale_loss)."""

    def __init__(self, cfg: AmpConfig):
        super().__init__(cfg)
        self.amp = _import_apex_amp()

    def decorate(self, model, optimizer):
        self.device_type = _device_type(model)
        if self.device_type != "cuda":
            raise ConfigError(
                "amp.impl",
                "apex",
                "native on a CPU: Apex's amp needs a CUDA device (amp.initialize refuses CPU parameters)",
            )
        model, optimizer = self.amp.initialize(
            model, optimizer, opt_level=self.level, loss_scale="dynamic" if loss_scaling_wanted(self.cfg) else 1.0
        )
        self._optimizer, self._effective = optimizer, f"{self.level} float16 (apex)"
        return model, optimizer

    def autocast(self):
        return contextlib.nullcontext()  # apex patches the model itself

    def backward(self, loss) -> None:
        with self.amp.scale_loss(loss, self._optimizer) as scaled:
            scaled.backward()

    def step(self, optimizer) -> bool:
        optimizer.step()  # apex skips overflowing steps inside the patched step
        return True

    def metrics(self) -> Dict[str, float]:
        return {}

    def state_dict(self) -> Dict[str, Any]:
        return {"apex_amp": self.amp.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if "apex_amp" in state:
            self.amp.load_state_dict(state["apex_amp"])


def _import_apex_amp():
    try:
        from apex import amp  # noqa: PLC0415 - optional, and only for amp.impl=apex
    except ImportError as err:
        raise BackendUnavailableError(f"NVIDIA Apex is not installed ({err}); {APEX_HELP}") from None
    if not hasattr(amp, "initialize"):
        raise BackendUnavailableError(f"the installed apex has no amp.initialize (a release after 25.04?); {APEX_HELP}")
    return amp


def make_precision(cfg: AmpConfig) -> MixedPrecision:
    if cfg.level == "O0":
        return MixedPrecision(cfg)
    return ApexMixedPrecision(cfg) if cfg.impl == "apex" else TorchMixedPrecision(cfg)
