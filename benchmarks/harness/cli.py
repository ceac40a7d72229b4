"""unitrain's benchmark harness: measured side by side, in one run, on this machine.

    python benchmarks/run.py [--quick] [--repeats N] [--out benchmarks/results]

Sections (each a table in results.md, all numbers in results.json):
  overhead  unitrain's median step time / a hand-written native script's (plain torch DDP with
            its own torchvision ResNet, plain Paddle Fleet with paddle.vision.models), same
            network, batch, data, threads, steps; 1 x 2 and 2 x 1 processes x threads; ResNet18
            at 32x32 and ResNet50 at 64x64; wall and CPU time per step, median ratio over pairs
            with a bootstrap 95% confidence interval
  loop      Trainer.train_step against a hand-written step, alternating in one process on the
            same model and batches (benchmarks/loop_overhead.py): the loop's own cost
  startup   seconds from launching the command to the first training step, same pairs
  data      reader ratio and samples/s against loader workers (0, 1, 2), synthetic and
            imagefolder data
  scaling   2 processes x 1 thread against 1 process x 1 thread: efficiency = ips2 / (2 ips1),
            with the frameworks' all-reduce levers (bucket sizes; torch's fp16 compression),
            the ceiling of two independent jobs at once, and each framework at its best
            (backend.tuned=true, from its own tuned 1 x 1) where that applies anything here
  compression  held-out top-1 with and without fp16 gradient compression (torch, 2 x 1)
  maxbatch  the largest batch each backend's ResNet50 job fits under a memory limit (unitrain.maxbatch)
  tuned     backend.tuned=true against the same settings (torch.compile + channels-last;
            Paddle's to_static and its MKL's AVX2 kernels), interleaved pairs, with what each
            framework reported it did
  amp       samples/s for O0-O3 (bfloat16) per backend, and the precision that really ran
Runs of a pair alternate, and which goes first alternates from pair to pair, so that drift hits
both alike; every figure is a median over repeats with its spread. Timings are never asserted
by the test suite; it only checks that --quick runs and writes its files.

Nothing measured is lost: each section is written (results.json, results.md, results.png) as it
ends; a run of some sections or backends keeps the rows --out already held for the others, each
row stamped with the run that measured it; a section whose command fails is logged in
failed_<section>.log and the others go on (exit status 1); Ctrl-C or SIGTERM ends every command
started and keeps the finished sections. --report-only draws results.md and results.png again;
--combine DIR... makes one report from rows measured in separate runs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Dict, List, NamedTuple

from unitrain.launch.arguments import OneLineParser

from .bench import Bench
from .results import load_previous, merge, save
from .sections.tuned import TUNED_VARIANTS
from .session import Session, new_results
from .settings import BACKENDS, BENCHMARKS, LAYOUTS, OVERHEAD_SIZES, SECTIONS


class Choices(NamedTuple):
    """The command line's lists, each checked against what the harness knows."""

    backends: List[str]
    sections: List[str]
    layouts: List[tuple]
    models: List[str] | None


def parser() -> OneLineParser:
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="the tiny model and few steps: checks the harness, measures little"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="interleaved unitrain/native pairs per overhead row (default 10; 2 with --quick)",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--backends", default=",".join(BACKENDS), help="which frameworks to measure (default: both)")
    parser.add_argument(
        "--tuned-settings",
        nargs="+",
        help="the tuned section measures only these variants, e.g. mkl_avx2 'compile,channels_last'",
    )
    parser.add_argument(
        "--models", help="the overhead section measures only these models, e.g. resnet50 (default: all)"
    )
    parser.add_argument(
        "--layouts", help="the overhead section measures only these processes x threads, e.g. 2x1 (default: 1x2,2x1)"
    )
    parser.add_argument("--out", default=str(BENCHMARKS / "results"))
    add_report_options(parser)
    return parser


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """The options that run nothing: a report drawn again, or several runs' rows as one."""
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write results.md and results.png again from --out's results.json",
    )
    parser.add_argument(
        "--combine",
        nargs="+",
        metavar="DIR",
        help="run nothing: one results.json, .md and .png in --out from the rows of "
        "these folders' results (a later folder's row replaces an earlier one's with the same key), each row saying "
        "where it came from",
    )


def checked(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Choices:
    """The lists asked for; one line naming every wrong name and exit status 2 if any is."""
    backends = args.backends.split(",")
    sections = args.sections.split(",")
    wrong = [b for b in backends if b not in BACKENDS] + [name for name in sections if name not in SECTIONS]
    known = sorted({v for variants in TUNED_VARIANTS.values() for _, v in variants})
    wrong += [v for v in args.tuned_settings or () if v not in known]
    layout_names = {f"{p}x{t}": (p, t) for p, t in LAYOUTS}
    models = sorted({s.model for s in OVERHEAD_SIZES[args.quick]})
    layouts = args.layouts.split(",") if args.layouts else list(layout_names)
    asked_models = args.models.split(",") if args.models else None
    wrong += [v for v in layouts if v not in layout_names] + [m for m in asked_models or () if m not in models]
    if wrong:
        parser.error(
            f"{', '.join(wrong)} is not allowed: --backends takes {', '.join(BACKENDS)}; --sections takes "
            f"{', '.join(SECTIONS)}; --tuned-settings takes {', '.join(known)}; --layouts takes "
            f"{', '.join(layout_names)}; --models takes {', '.join(models)}"
        )
    return Choices(backends, sections, [layout_names[v] for v in layouts], asked_models)


def main(argv=None) -> int:
    parser_ = parser()
    args = parser_.parse_args(argv)
    choices = checked(parser_, args)
    out = Path(args.out)
    # Read (and refused if not this harness's) before anything runs: a run would write over it.
    previous = load_previous(out / "results.json")
    if args.combine:
        return combine(parser_, [Path(folder) for folder in args.combine], out)
    if args.report_only:
        return report_only(parser_, out, previous)
    return measure(args, choices, out, previous)


def measure(args: argparse.Namespace, choices: Choices, out: Path, previous: Dict) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="unitrain-bench-"))
    pairs = args.pairs or (2 if args.quick else 10)
    bench = Bench(
        args.quick, args.repeats, work, pairs, choices.backends, args.tuned_settings, choices.layouts, choices.models
    )
    return Session(bench, choices.sections, out, new_results(bench, previous)).run()


def report_only(parser: argparse.ArgumentParser, out: Path, previous: Dict) -> int:
    if not previous:
        parser.error(f"--report-only needs {out / 'results.json'}, which does not exist")
    previous.setdefault("started", max(previous["runs"]))
    save(out, previous, with_json=False)
    print(f"written from {out}/results.json: results.md and results.png")
    return 0


def combine(parser: argparse.ArgumentParser, folders: List[Path], out: Path) -> int:
    """Rows measured in separate runs (a noisy row alone, with more pairs) as one report."""
    if (out / "results.json").exists():
        parser.error(f"--combine writes a new {out / 'results.json'}, and one is there already: pass another --out")
    combined: Dict = {}
    for folder in folders:
        part = load_previous(folder / "results.json", unstamped=folder.name, advice="leave that folder out")
        if not part:
            parser.error(f"--combine takes folders holding a results.json of this harness; {folder} holds none")
        combined = combined or {"config": None, "runs": {}, **{s: [] for s in SECTIONS}}
        # The header names the newest folder's machine; rows from another say theirs.
        combined["machine"] = part["machine"]
        combined["runs"].update(part["runs"])
        for section in SECTIONS:
            combined[section] = merge(combined[section], part.get(section) or [], section)
    # No run of its own: every table says where each of its rows was measured.
    combined["started"] = "combined"
    out.mkdir(parents=True, exist_ok=True)
    save(out, combined)
    print(
        f"{sum(len(combined[s]) for s in SECTIONS)} rows from {len(folders)} folders: {out}/results.json, results.md "
        "and results.png"
    )
    return 0
