"""Paddle's GPT attention before (one 5-D transpose, then unbind) and after (one split of the
qkv projection, each part reshaped), alternating in one process on unitrain's gpt_mini.

    python benchmarks/results/gpt_paddle_split_2026-11-28/one_process_attention.py [ROUNDS]
"""

import statistics
import sys
import time

import numpy as np
import paddle
import paddle.nn.functional as F

from unitrain.backends.paddle import models as M
from unitrain.spec.models import MODELS

VOCAB, BATCH, BLOCK = 81, 12, 64
AFTER = M.Attention.forward


def unbind_forward(self, x):
    d = x.shape[-1]
    qkv = self.qkv(x).reshape([0, 0, 3, self.heads, d // self.heads]).transpose([2, 0, 3, 1, 4])
    q, k, v = paddle.unbind(qkv, axis=0)
    attn = self.attend((q @ k.transpose([0, 1, 3, 2])) * self.scale)
    return self.project((attn @ v).transpose([0, 2, 1, 3]).reshape([0, 0, d]))


def main(rounds: int) -> None:
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(2)
    paddle.seed(0)
    rng = np.random.default_rng(0)
    model = M.build_gpt(MODELS.get("gpt_mini"), VOCAB)
    opt = paddle.optimizer.AdamW(
        learning_rate=1e-3, parameters=model.parameters(), grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0)
    )

    def step() -> float:
        started = time.perf_counter()
        x = paddle.to_tensor(rng.integers(0, VOCAB, (BATCH, BLOCK)), dtype="int64")
        y = paddle.to_tensor(rng.integers(0, VOCAB, (BATCH, BLOCK)), dtype="int64")
        F.cross_entropy(model(x).reshape([-1, VOCAB]), y.reshape([-1])).backward()
        opt.step()
        opt.clear_grad()
        return time.perf_counter() - started

    variants = {"unbind (before)": unbind_forward, "split (after)": AFTER}
    times = {name: [] for name in variants}
    for r in range(rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            M.Attention.forward = variants[name]
            for _ in range(3):
                step()
            times[name].append(statistics.median(step() for _ in range(15)))
    ratios = [b / a for b, a in zip(*times.values())]
    print(
        "before/after step time per round:",
        [round(x, 3) for x in ratios],
        "median",
        round(statistics.median(ratios), 3),
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
