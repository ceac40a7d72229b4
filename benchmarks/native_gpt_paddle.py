"""A hand-written character-level GPT training script in PaddlePaddle, nanoGPT's way (its model.py
and train.py in Paddle's dygraph API, as PaddleNLP's GPT writes the layers): the baseline that
unitrain's `experiment=char_gpt backend=paddle` job is timed against.

    python benchmarks/native_gpt_paddle.py [--corpus data/corpus/austen] [--steps 2000] [--threads 2]

It imports nothing from unitrain. Its own data reading (nanoGPT's shakespeare_char prepare.py):
the corpus (one file, or a folder's *.txt files in name order, read as one stream), a vocabulary
of its sorted distinct characters, the last 10% held out; batches of random windows. Its own GPT
of gpt_mini's shape: 4 layers, 4 heads, width 128, context 64, learned position embeddings,
pre-norm blocks, biases, nn.GELU MLP, no dropout, head tied to the token embedding (logits =
x @ wte^T), N(0, 0.02) init with the residual projections scaled down; attention written out
(q k^T * scale + a causal mask buffer, softmax, @ v). Its own loop: paddle.optimizer.AdamW (betas
0.9/0.99, weight decay 0.1 on 2-D weights), ClipGradByGlobalNorm(1.0), linear warm-up then cosine
to a tenth of the peak set with set_lr each step, batch 12, paddle.base.core.set_num_threads.

Every step's wall time (from the end of the previous step: the batch's drawing included, as
unitrain's batch_cost) and CPU time are kept; the result is one line on stdout,
``RESULT {json}``, with tokens/s from the median step after --warmup steps (and --out writes
the same JSON with every step's times).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

warnings.filterwarnings("ignore", message="No ccache found")

import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from paddle import nn  # noqa: E402

# --- data (nanoGPT's data/shakespeare_char/prepare.py) ------------------------------------------


def read_corpus(path: str) -> str:
    where = Path(path)
    files = sorted(where.glob("*.txt"), key=lambda f: f.name) if where.is_dir() else [where]
    return "".join(f.read_text(encoding="utf-8") for f in files)


def prepare(path: str, val_fraction: float = 0.1):
    text = read_corpus(path)
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = len(data)
    cut = int(n * (1 - val_fraction))
    return data[:cut], data[cut:], len(chars)


def get_batch(data: np.ndarray, batch_size: int, block_size: int, rng: np.random.Generator):
    ix = rng.integers(0, len(data) - block_size, batch_size)
    x = np.stack([data[i : i + block_size] for i in ix]).astype(np.int64)
    y = np.stack([data[i + 1 : i + 1 + block_size] for i in ix]).astype(np.int64)
    return paddle.to_tensor(x), paddle.to_tensor(y)


# --- model ------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Layer):
    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd
        mask = paddle.triu(paddle.full([block_size, block_size], float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistable=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = paddle.split(self.c_attn(x), 3, axis=2)
        q = q.reshape([B, T, self.n_head, C // self.n_head]).transpose([0, 2, 1, 3])
        k = k.reshape([B, T, self.n_head, C // self.n_head]).transpose([0, 2, 1, 3])
        v = v.reshape([B, T, self.n_head, C // self.n_head]).transpose([0, 2, 1, 3])
        att = paddle.matmul(q, k, transpose_y=True) * (1.0 / math.sqrt(C // self.n_head))
        att = F.softmax(att + self.mask[:T, :T], axis=-1)
        y = paddle.matmul(att, v).transpose([0, 2, 1, 3]).reshape([B, T, C])
        return self.c_proj(y)


class MLP(nn.Layer):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Layer):
    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Layer):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        normal = nn.initializer.Normal(mean=0.0, std=0.02)
        self.wte = nn.Embedding(vocab_size, n_embd, weight_attr=paddle.ParamAttr(initializer=normal))
        self.wpe = nn.Embedding(block_size, n_embd, weight_attr=paddle.ParamAttr(initializer=normal))
        self.h = nn.LayerList([Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        residual = nn.initializer.Normal(mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
        zero = nn.initializer.Constant(0.0)
        for name, layer in self.named_sublayers():
            if isinstance(layer, nn.Linear):
                (residual if name.endswith("c_proj") else normal)(layer.weight)
                zero(layer.bias)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(paddle.arange(t, dtype="int64"))
        for block in self.h:
            x = block(x)
        logits = paddle.matmul(self.ln_f(x), self.wte.weight, transpose_y=True)  # tied head
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), targets.reshape([-1]))
        return logits, loss


# --- training ---------------------------------------------------------------------------------


def get_lr(it: int, total: int, lr: float, warmup: int, min_lr: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``lr`` to ``min_lr`` at ``total``."""
    if it < warmup:
        return lr * (it + 1) / warmup
    span = max(1, total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(it - warmup, span) / span))


@paddle.no_grad()
def estimate_loss(model, data, iters, batch_size, block_size, rng):
    model.eval()
    losses = [float(model(*get_batch(data, batch_size, block_size, rng))[1]) for _ in range(iters)]
    model.train()
    return statistics.fmean(losses)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default="data/corpus/austen")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of the median step time")
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-iters", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--eval-iters", type=int, default=200, help="held-out batches at the end (0: none)")
    p.add_argument("--out", help="also write the result, with every step's times, here (JSON)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    started = time.time()
    paddle.set_device("cpu")
    paddle.base.core.set_num_threads(args.threads)
    paddle.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    train_data, val_data, vocab_size = prepare(args.corpus)
    model = GPT(vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    decay = {p.name for p in model.parameters() if len(p.shape) >= 2}
    optimizer = paddle.optimizer.AdamW(
        learning_rate=args.lr,
        beta1=0.9,
        beta2=args.beta2,
        parameters=model.parameters(),
        weight_decay=args.weight_decay,
        apply_decay_param_fun=lambda name: name in decay,
        grad_clip=nn.ClipGradByGlobalNorm(args.grad_clip) if args.grad_clip else None,
    )
    model.train()
    step_times, cpu_times, losses = [], [], []
    loop_started_at = time.time()
    last, last_cpu = time.perf_counter(), time.process_time()
    for it in range(args.steps):
        optimizer.set_lr(get_lr(it, args.steps, args.lr, args.warmup_iters, args.lr * args.min_lr_ratio))
        x, y = get_batch(train_data, args.batch_size, args.block_size, rng)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        if it % args.log_interval == 0 or it == args.steps - 1:
            losses.append((it + 1, float(loss)))
        now, cpu = time.perf_counter(), time.process_time()
        step_times.append(now - last)
        cpu_times.append(cpu - last_cpu)
        last, last_cpu = now, cpu
    measured = step_times[args.warmup :] or step_times
    step_s = statistics.median(measured)
    tokens = args.batch_size * args.block_size
    result = {
        "framework": f"paddle {paddle.__version__}",
        "tokens_per_s": tokens / step_s,
        "step_s": step_s,
        "cpu_s": statistics.median(cpu_times[args.warmup :] or cpu_times),
        "steps": args.steps,
        "warmup": args.warmup,
        "tokens_per_step": tokens,
        "threads": args.threads,
        "parameters": sum(int(np.prod(p.shape)) for p in model.parameters()),
        "vocab_size": vocab_size,
        "train_tokens": len(train_data),
        "val_tokens": len(val_data),
        "last_loss": losses[-1][1],
        "val_loss": estimate_loss(model, val_data, args.eval_iters, args.batch_size, args.block_size, rng)
        if args.eval_iters
        else None,
        "startup_s": loop_started_at - started,
        "loop_started_at": loop_started_at,
    }
    print("RESULT " + json.dumps(result), flush=True)
    if args.out:
        Path(args.out).write_text(
            json.dumps({**result, "step_times": step_times, "cpu_times": cpu_times, "losses": losses}) + "\n"
        )


if __name__ == "__main__":
    main()
