"""``python -m unitrain.generate RUN_DIR [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]``

Samples text from a language model's latest checkpoint (or ``--checkpoint``), on the framework
that trained it or the other (``--backend``), and streams it as it is written; the work is
:mod:`unitrain.deploy.generate`'s.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from unitrain.deploy.generate import Sampling, generate, load_generator, prompt_ids
from unitrain.errors import UnitrainError
from unitrain.interface.modules import available_backends
from unitrain.launch.arguments import OneLineParser


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m unitrain.generate", description=__doc__.split("\n\n")[0].strip("`"))
    parser.add_argument("run", nargs="?", help="a run directory (its latest checkpoint), or latest")
    parser.add_argument("--checkpoint", help="a checkpoint directory (instead of a run directory)")
    parser.add_argument("--backend", help=f"the framework that runs the model: {', '.join(available_backends())}")
    parser.add_argument("--prompt", default="", help="the text to continue (default: none)")
    parser.add_argument("--tokens", type=int, default=200, help="new tokens to sample (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0: the most likely token (default 0.8)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens only")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    os.environ.setdefault("GLOG_minloglevel", "2")  # Paddle's C++ start-up notes
    try:
        if bool(args.run) == bool(args.checkpoint):
            raise UnitrainError("give a run directory (or latest), or --checkpoint DIR: one of the two")
        if args.backend is not None and args.backend not in available_backends():
            raise UnitrainError(f"--backend={args.backend!r} is not allowed: one of {', '.join(available_backends())}")
        sampling = Sampling(tokens=args.tokens, temperature=args.temperature, top_k=args.top_k, seed=args.seed)
        sampling.check()
        roots = [Path.cwd() / "runs", Path.cwd() / "multirun"]
        generator = load_generator(args.checkpoint or args.run, args.backend, roots)
        prompt_ids(generator, args.prompt)  # a prompt the tokenizer cannot read: one line, before any output
        print(
            f"{generator.framework}, checkpoint {generator.checkpoint}, temperature {sampling.temperature:g}",
            file=sys.stderr,
        )
        sys.stdout.write(args.prompt)
        generate(generator, args.prompt, sampling, _stream)
    except UnitrainError as err:
        print(f"unitrain.generate: error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write("\n")
    return 0


def _stream(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main, stop_when_unread=True)
