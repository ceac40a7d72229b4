"""MixedPrecision for paddle: paddle.amp.auto_cast, paddle.amp.decorate and GradScaler.

Levels mean what they mean on torch (see backends/torch/precision.py). Paddle has no O3:
it is O2 (paddle.amp.decorate, which keeps normalization layers in fp32) without master
weights. On a CPU, paddle.amp does nothing at all (auto_cast and GradScaler warn, decorate
leaves parameters fp32): what ran is observed, not assumed, and reported as fp32.
"""

from __future__ import annotations

import logging
import warnings

import paddle

from unitrain.config.schema import AmpConfig
from unitrain.interface.precision import MixedPrecision, ScaledMixedPrecision, loss_scaling_wanted, op_lists

__all__ = ["make_precision"]

log = logging.getLogger("unitrain")

# unitrain op names -> paddle op types (what paddle.amp's lists hold).
OPS = {
    "conv2d": ["conv2d"],
    "linear": ["matmul_v2", "matmul"],
    "batch_norm": ["batch_norm"],
    "relu": ["relu"],
    "max_pool2d": ["pool2d"],
    "adaptive_avg_pool2d": ["pool2d"],
    "softmax": ["softmax"],
    "layer_norm": ["layer_norm"],
    "gelu": ["gelu", "erf"],  # unitrain's ViT computes its GELU through erf (backends/paddle/models.py)
}
LOW = {"float16": paddle.float16, "bfloat16": paddle.bfloat16}


class PaddleMixedPrecision(ScaledMixedPrecision):
    def __init__(self, cfg: AmpConfig):
        super().__init__(cfg)
        white, black = op_lists(cfg)
        self.white = sorted({op for name in white for op in OPS[name]})
        self.black = sorted({op for name in black for op in OPS[name]} - set(self.white))
        self._effective = "fp32"

    def decorate(self, model: paddle.nn.Layer, optimizer):
        if self.level in ("O2", "O3"):
            model, optimizer = paddle.amp.decorate(
                models=model, optimizers=optimizer, level="O2", dtype=self.cfg.dtype, master_weight=self.level == "O2"
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.scaler = paddle.amp.GradScaler(
                enable=loss_scaling_wanted(self.cfg),
                init_loss_scaling=self.cfg.init_loss_scaling,
                incr_ratio=self.cfg.incr_ratio,
                decr_ratio=self.cfg.decr_ratio,
                incr_every_n_steps=self.cfg.incr_every_n_steps,
                decr_every_n_nan_or_inf=self.cfg.decr_every_n_nan_or_inf,
            )
            self._effective = self._observe(model)
        if self._effective == "fp32":
            reasons = sorted({str(w.message).split(",")[0] for w in caught if "no effect" in str(w.message)})
            self.fallback_reason = "; ".join(reasons) or "paddle.amp produced float32 here"
            log.warning(
                "amp=%s %s requested, but it cannot take effect on %s (%s): this run is fp32, and is reported as such",
                self.level,
                self.cfg.dtype,
                paddle.get_device(),
                self.fallback_reason,
            )
            # Said once, clearly, above; paddle would repeat it on every step.
            warnings.filterwarnings("ignore", message=".*can only be enabled on CUDAPlace.*")
        return model, optimizer

    def _observe(self, model) -> str:
        """The precision that really runs: low-precision parameters, or a matmul that autocast lowers."""
        params_low = any(p.dtype in LOW.values() for p in model.parameters())
        with paddle.no_grad(), self.autocast():
            out = paddle.matmul(paddle.ones([2, 2]), paddle.ones([2, 2]))
        if params_low or out.dtype in LOW.values():
            return f"{self.level} {self.cfg.dtype}"
        return "fp32"

    @property
    def effective(self) -> str:
        return self._effective

    def autocast(self):
        return paddle.amp.auto_cast(
            enable=True,
            custom_white_list=self.white,
            custom_black_list=self.black,
            level="O1" if self.level == "O1" else "O2",
            dtype=self.cfg.dtype,
        )

    def backward(self, loss) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer) -> bool:
        scale = self.loss_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # An overflow lowers the scale; paddle keeps its found-inf flag private.
        skipped = self.scaler.is_enable() and self.loss_scale() < scale
        self.skipped_steps += skipped
        return not skipped

    def loss_scale(self) -> float:
        return float(self.scaler._scale) if self.scaler.is_enable() else 1.0


def make_precision(cfg: AmpConfig) -> MixedPrecision:
    return MixedPrecision(cfg) if cfg.level == "O0" else PaddleMixedPrecision(cfg)
