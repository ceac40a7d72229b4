"""unitrain's Paddle GPT (gpt_mini) against benchmarks/native_gpt_paddle.py's GPT, alternating in
one process: the same AdamW, clipping and random batches, so that only the models differ.

    python benchmarks/results/gpt_paddle_split_2026-11-28/one_process_models.py [ROUNDS]
"""

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F

from unitrain.backends.paddle import models as M
from unitrain.spec.models import MODELS

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import native_gpt_paddle as N  # noqa: E402

VOCAB, BATCH, BLOCK = 81, 12, 64


def optimizer(model):
    decay = {p.name for p in model.parameters() if len(p.shape) >= 2}
    return paddle.optimizer.AdamW(
        learning_rate=1e-3,
        beta2=0.99,
        parameters=model.parameters(),
        weight_decay=0.1,
        apply_decay_param_fun=lambda name: name in decay,
        grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
    )


def main(rounds: int) -> None:
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(2)
    paddle.seed(0)
    rng = np.random.default_rng(0)
    models = {"unitrain": M.build_gpt(MODELS.get("gpt_mini"), VOCAB), "native": N.GPT(VOCAB, BLOCK, 4, 4, 128)}
    optimizers = {name: optimizer(model) for name, model in models.items()}

    def step(name: str) -> float:
        started = time.perf_counter()
        x = paddle.to_tensor(rng.integers(0, VOCAB, (BATCH, BLOCK)), dtype="int64")
        y = paddle.to_tensor(rng.integers(0, VOCAB, (BATCH, BLOCK)), dtype="int64")
        if name == "native":
            loss = models[name](x, y)[1]
        else:
            loss = F.cross_entropy(models[name](x).reshape([-1, VOCAB]), y.reshape([-1]))
        loss.backward()
        optimizers[name].step()
        optimizers[name].clear_grad()
        return time.perf_counter() - started

    times = {name: [] for name in models}
    for r in range(rounds):
        for name in list(models) if r % 2 == 0 else list(models)[::-1]:
            for _ in range(3):
                step(name)
            times[name].append(statistics.median(step(name) for _ in range(15)))
    ratios = [n / u for u, n in zip(times["unitrain"], times["native"])]
    print("unitrain's speed over the script's per round:", [round(x, 3) for x in ratios])
    print("median", round(statistics.median(ratios), 3))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
