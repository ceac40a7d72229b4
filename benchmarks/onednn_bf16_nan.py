"""torch's oneDNN bf16 convolution backward on a one-pixel input: how often its weight gradient
is not finite (benchmarks/README.md, "oneDNN bf16 NaN").

    python benchmarks/onednn_bf16_nan.py [--threads 2] [--trials 50]

Each case is a 3x3 convolution (padding 1) run forward under CPU bf16 autocast and backward from
an fp32 sum; the count is of trials whose weight gradient holds NaN or infinity. Compare with
ONEDNN_MAX_CPU_ISA=AVX2 in the environment (oneDNN's AVX2 kernels) to see the AVX-512 kernels'
part.
"""

from __future__ import annotations

import argparse
import json

import torch

CASES = [(32, 64, 1, 2), (32, 64, 1, 1), (32, 64, 2, 2), (64, 64, 1, 1), (32, 64, 4, 2)]  # in, out, pixels, stride


def count(cin: int, cout: int, pixels: int, stride: int, trials: int) -> int:
    conv = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    bad = 0
    for _ in range(trials):
        x = torch.randn(32, cin, pixels, pixels, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv(x)
        y.float().sum().backward()
        bad += int(not torch.isfinite(conv.weight.grad).all())
        conv.weight.grad = None
    return bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trials", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    rows = [
        {"in": i, "out": o, "pixels": p, "stride": s, "non_finite": count(i, o, p, s, args.trials)}
        for i, o, p, s in CASES
    ]
    print(json.dumps({"torch": torch.__version__, "trials": args.trials, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
