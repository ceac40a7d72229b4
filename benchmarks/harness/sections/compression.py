"""What fp16 gradient compression costs in held-out accuracy: the same 2-process job on
Fashion-MNIST (or, with --quick or without the dataset, held-out synthetic data) with and
without it, over the repeats' seeds."""

from __future__ import annotations

import statistics
from typing import Dict, List

from ..markdown import spread_text
from ..settings import Size
from .base import Section, say, with_spread


class Compression(Section):
    def measure(self) -> List[Dict]:
        from unitrain.data.fashion_mnist import available

        if "torch" not in self.bench.backends:  # the fp16 hook is torch's; Paddle's dynamic graph has none
            return []
        data = ["data=fashion_mnist"] if available() and not self.quick else ["data=learnable", "data.val_samples=256"]
        size = self.bench.size if self.quick else Size("resnet18", 32, 300, 5)
        return [self.row(compression, data, size) for compression in ("none", "fp16")]

    def row(self, compression: str, data: List[str], size: Size) -> Dict:
        runs = [
            self.bench.unitrain(
                "torch",
                *data,
                f"dist.grad_compression={compression}",
                f"trainer.seed={seed}",
                "optim.lr=0.05",
                world=2,
                threads=1,
                size=size,
            )
            for seed in range(self.bench.repeats)
        ]
        row = {
            "backend": "torch",
            "data": data[0].split("=")[1],
            "steps": size.steps,
            "grad_compression": compression,
            **with_spread("val_top1", [r["val_top1"] for r in runs]),
            "ips": statistics.median(r["ips"] for r in runs),
        }
        say(f"  torch grad_compression={compression}: held-out top-1 {spread_text('val_top1', 4)(row)}")
        return row
