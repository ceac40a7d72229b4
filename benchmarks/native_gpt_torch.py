"""A hand-written character-level GPT training script in PyTorch, nanoGPT's way (its model.py and
train.py, cut down): the baseline that unitrain's `experiment=char_gpt` job is timed against.

    python benchmarks/native_gpt_torch.py [--corpus data/corpus/austen] [--steps 2000] [--threads 2]

It imports nothing from unitrain. Its own data reading (nanoGPT's shakespeare_char prepare.py):
the corpus (one file, or a folder's *.txt files in name order, read as one stream), a vocabulary
of its sorted distinct characters, the last 10% held out; batches of random windows
(get_batch). Its own GPT of gpt_mini's shape: 4 layers, 4 heads, width 128, context 64, learned
position embeddings, pre-norm blocks, biases, GELU MLP, no dropout, head tied to the token
embedding, nanoGPT's N(0, 0.02) init with the residual projections scaled down; attention
written out as nanoGPT's slow path (q k^T * scale, masked_fill with a causal buffer, softmax,
@ v), not scaled_dot_product_attention, because unitrain writes it out too. Its own loop: AdamW
(betas 0.9/0.99, weight decay 0.1 on 2-D weights, nanoGPT's grouping), linear warm-up then cosine
to a tenth of the peak, gradient clipping at norm 1.0, batch 12, torch.set_num_threads.

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
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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


def get_batch(data: np.ndarray, batch_size: int, block_size: int):
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


# --- model (nanoGPT's model.py) ---------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


# --- training (nanoGPT's train.py) ------------------------------------------------------------


def get_lr(it: int, total: int, lr: float, warmup: int, min_lr: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``lr`` to ``min_lr`` at ``total``."""
    if it < warmup:
        return lr * (it + 1) / warmup
    span = max(1, total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(it - warmup, span) / span))


@torch.no_grad()
def estimate_loss(model, data, iters, batch_size, block_size):
    model.eval()
    losses = [model(*get_batch(data, batch_size, block_size))[1].item() for _ in range(iters)]
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
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_data, val_data, vocab_size = prepare(args.corpus)
    model = GPT(vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    optimizer = model.configure_optimizers(args.weight_decay, args.lr, (0.9, args.beta2))
    model.train()
    step_times, cpu_times, losses = [], [], []
    loop_started_at = time.time()
    last, last_cpu = time.perf_counter(), time.process_time()
    for it in range(args.steps):
        lr = get_lr(it, args.steps, args.lr, args.warmup_iters, args.lr * args.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x, y = get_batch(train_data, args.batch_size, args.block_size)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        if it % args.log_interval == 0 or it == args.steps - 1:
            losses.append((it + 1, loss.item()))
        now, cpu = time.perf_counter(), time.process_time()
        step_times.append(now - last)
        cpu_times.append(cpu - last_cpu)
        last, last_cpu = now, cpu
    measured = step_times[args.warmup :] or step_times
    step_s = statistics.median(measured)
    tokens = args.batch_size * args.block_size
    result = {
        "framework": f"torch {torch.__version__}",
        "tokens_per_s": tokens / step_s,
        "step_s": step_s,
        "cpu_s": statistics.median(cpu_times[args.warmup :] or cpu_times),
        "steps": args.steps,
        "warmup": args.warmup,
        "tokens_per_step": tokens,
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": vocab_size,
        "train_tokens": len(train_data),
        "val_tokens": len(val_data),
        "last_loss": losses[-1][1],
        "val_loss": estimate_loss(model, val_data, args.eval_iters, args.batch_size, args.block_size)
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
