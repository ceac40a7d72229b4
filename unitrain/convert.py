"""``python -m unitrain.convert``: a checkpoint's weights converted into a framework's native file, or a
model's code translated into the other framework's (the command keeps the name users know for both).

``python -m unitrain.convert <checkpoint> --to torch|paddle``: the output loads with plain
framework code, no unitrain needed: ``model.load_state_dict(torch.load(path))`` or
``layer.set_state_dict(paddle.load(path))``.

``python -m unitrain.convert --model my_pkg.nets:build``: the PyTorch factory's code translated
(what ``model.paddle=convert`` trains, docs/models.md), written into a folder to read, and both
halves run from the same weights on one batch (images; a language model's token ids with
``--vocab-size N --block-size T``, its factory called as data=text calls it), layer by layer,
without training. Exit status 1
when a call did not translate or a layer computes otherwise: the folder and the report say which.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Sequence

import yaml
from omegaconf import OmegaConf

from unitrain.config.schema import TrainerConfig
from unitrain.errors import UnitrainError
from unitrain.host.atomic import cannot_create_in, cannot_write_beside
from unitrain.interface.backend import get_backend
from unitrain.interface.modules import available_backends
from unitrain.interface.translate import translate_module
from unitrain.interface.weights import weights_module
from unitrain.launch.arguments import OneLineParser
from unitrain.model.conversion import converted
from unitrain.model.translate import (
    CONVERT,
    REPORT,
    UNCONVERTED,
    ConversionRefused,
    Translation,
    copy_to,
    find_source,
    per_file,
    refuse_what_did_not_convert,
    translate,
)
from unitrain.model.user_code import resolve_factory
from unitrain.train.checkpoint import checkpoint_run_dir, find_checkpoint, read_image_meta, read_model_arrays
from unitrain.train.parity import CONVERTED_TOLERANCE, check_converted

PROG = "python -m unitrain.convert"
#: What the forward check writes beside the translated code.
CHECK = "check.json"


def _parser() -> OneLineParser:
    parser = OneLineParser(
        prog=PROG,
        description="Convert a unitrain checkpoint's weights into a framework's native weights file, or translate a "
        "PyTorch model's code into Paddle's (--model), checked layer by layer without training.",
    )
    parser.add_argument(
        "checkpoint",
        nargs="?",
        help=(
            "a checkpoint directory, a run directory (its latest checkpoint), or latest (the newest under ./runs and "
            "./multirun)"
        ),
    )
    parser.add_argument("--to", choices=available_backends(), help="the framework whose format (or code) to write")
    parser.add_argument(
        "--model", help="instead of a checkpoint: a model factory pkg.module:function whose code to translate"
    )
    parser.add_argument(
        "--out",
        help="output file (default: <checkpoint>/model.<framework>.pt|pdparams); with --model, a folder that does "
        "not exist yet (default: ./converted/<package>-<hash of its code>)",
    )
    parser.add_argument("--image-size", type=int, help="--model: the check's image size (default 32)")
    parser.add_argument("--num-classes", type=int, help="--model: the check's class count (default 10)")
    parser.add_argument(
        "--vocab-size",
        type=int,
        help="--model: a language model's vocabulary: the factory is called factory(vocab_size=..., block_size=..., "
        "**kwargs), as model=custom's text factories (data=text) are, and checked on token ids",
    )
    parser.add_argument(
        "--block-size", type=int, help="--model: a language model's tokens per sample (with --vocab-size)"
    )
    parser.add_argument(
        "--kwarg", action="append", default=[], metavar="NAME=VALUE", help="--model: a factory argument (repeatable)"
    )
    parser.add_argument("--no-check", action="store_true", help="--model: translate and report, without the check")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.model is None):
        parser.error("give a checkpoint or --model=pkg.module:function, one of the two")
    try:
        if args.model is None:
            return _checkpoint(args)
        return _model(args)
    except UnitrainError as err:
        print(f"unitrain.convert: error: {err}", file=sys.stderr)
        return 2


def _checkpoint(args: argparse.Namespace) -> int:
    if args.to is None:
        raise UnitrainError("--to is missing; allowed: --to " + "|".join(available_backends()) + " with a checkpoint")
    target = weights_module(args.to)
    path = find_checkpoint(args.checkpoint, [Path.cwd() / "runs", Path.cwd() / "multirun"], key="checkpoint")
    meta = read_image_meta(path, "unitrain.convert")
    out = Path(args.out) if args.out else path / f"model.{args.to}{target.NATIVE_SUFFIX}"
    if out.is_dir() or not out.parent.is_dir():
        why = "is a directory" if out.is_dir() else f"its directory {out.parent} does not exist"
        raise UnitrainError(f"--out={str(out)!r} is not allowed: {why}; allowed: a file path in an existing directory")
    # get_backend imports the framework the way unitrain does (and fails clearly if it is missing).
    arrays = converted(read_model_arrays(path), meta, get_backend(args.to), checkpoint_run_dir(path))
    try:
        target.save_native(arrays, out)
    except OSError as err:
        raise UnitrainError(
            f"--out={str(out)!r} is not allowed: {err.strerror or err}; allowed: a file path this user can write"
        ) from None
    print(f"{meta['framework']} checkpoint {path} (model={meta['model']}, step {meta['step']}) -> {args.to}: {out}")
    return 0


def _converting_backend(to: str | None) -> str:
    converting = [b for b in available_backends() if translate_module(b).SOURCE]
    if to is None and len(converting) == 1:
        return converting[0]
    if to not in converting:
        allowed = ", ".join(f"--to {b} (from {translate_module(b).SOURCE} code)" for b in converting) or "none"
        raise UnitrainError(
            f"--to={to!r} is not allowed with --model: no converter writes that code; allowed: {allowed}"
        )
    return to


def _kwargs(pairs: Sequence[str]) -> Dict[str, Any]:
    kwargs: Dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.isidentifier():
            raise UnitrainError(f"--kwarg={pair!r} is not allowed; allowed: NAME=VALUE, NAME a Python identifier")
        try:
            kwargs[name] = yaml.safe_load(value)
        except yaml.YAMLError:
            kwargs[name] = value
    return kwargs


def _model(args: argparse.Namespace) -> int:
    backend = _converting_backend(args.to)
    text = _text_arguments(args)
    for flag, value in (("--image-size", args.image_size), ("--num-classes", args.num_classes)):
        if value is not None and not 2 <= value <= 4096:
            raise UnitrainError(f"{flag}={value} is not allowed; allowed: 2 to 4096")
    kwargs = _kwargs(args.kwarg)
    _check_out(args.out)
    source_name = translate_module(backend).SOURCE
    translation = translate(find_source("--model", args.model), backend, refuse=False)
    if not args.no_check:
        _check_arguments(args.model, kwargs, text)
    out = _out_folder(args.out, translation, args.model)
    # The outermost folder this writes that was not there (the default's converted/ too).
    created = next((p for p in [*reversed(out.parents), out] if not p.exists()), None)
    copy_to(translation, out)
    print(_conversion_lines(translation, backend, out))
    try:
        refuse_what_did_not_convert(translation, backend)
        if args.no_check:
            return 0
        cfg = {"model": {"name": "custom", source_name: args.model, backend: CONVERT, "kwargs": kwargs}}
        if text:  # token ids [2, block_size] in [0, vocab_size), as a data=text job's check has
            cfg |= {"data": {"name": "text", "block_size": args.block_size}}
        else:
            cfg |= {"data": {"image_size": args.image_size, "num_classes": args.num_classes}}
        cfg |= {"trainer": {"seed": TrainerConfig.seed, "threads": TrainerConfig.threads}}
        found = check_converted(OmegaConf.create(cfg), backend, args.vocab_size if text else None)
    except ConversionRefused as err:
        print(f"unitrain.convert: {err}", file=sys.stderr)
        return 1
    except UnitrainError:
        if created:
            shutil.rmtree(created, ignore_errors=True)  # bad input leaves nothing behind
        raise
    (out / CHECK).write_text(json.dumps({"factory": args.model, **found}, indent=2) + "\n")
    print(_check_line(found, source_name, _batch(args, text)))
    return 0


def _text_arguments(args: argparse.Namespace) -> bool:
    """Whether --model is a language model's factory (--vocab-size and --block-size, both, and no
    image argument); the image arguments' defaults filled in where it is not."""
    if args.vocab_size is None and args.block_size is None:
        args.image_size = 32 if args.image_size is None else args.image_size
        args.num_classes = 10 if args.num_classes is None else args.num_classes
        return False
    if args.vocab_size is None or args.block_size is None:
        missing = "--block-size" if args.block_size is None else "--vocab-size"
        raise UnitrainError(
            f"{missing} is missing; allowed: --vocab-size N --block-size T together (a language model's factory, "
            "called factory(vocab_size=N, block_size=T, **kwargs)), or neither (an image model's)"
        )
    for flag, value in (("--image-size", args.image_size), ("--num-classes", args.num_classes)):
        if value is not None:
            raise UnitrainError(
                f"{flag}={value} is not allowed with --vocab-size and --block-size: a language model is checked on "
                "token ids; allowed: the image arguments or the text ones, not both"
            )
    for flag, value, low in (("--vocab-size", args.vocab_size, 2), ("--block-size", args.block_size, 1)):
        if not low <= value <= 1_000_000:
            raise UnitrainError(f"{flag}={value} is not allowed; allowed: {low} to 1000000")
    return True


def _batch(args: argparse.Namespace, text: bool) -> str:
    if text:
        return f"2 rows of {args.block_size} token ids in [0, {args.vocab_size})"
    return f"{args.image_size}x{args.image_size} images"


def _check_arguments(path: str, kwargs: Dict[str, Any], text: bool = False) -> None:
    """The factory takes the check's arguments and the --kwarg ones (it is imported to see)."""
    factory = resolve_factory("--model", path)
    check = {"vocab_size": 2, "block_size": 2} if text else {"num_classes": 2, "image_size": 2}
    try:
        inspect.signature(factory).bind(**check, **kwargs)
    except TypeError as err:
        given = " ".join(f"--kwarg {k}=..." for k in kwargs) or "no --kwarg"
        if text:
            allowed = "a language model's factory taking vocab_size=, block_size= and the --kwarg arguments"
        else:
            allowed = (
                "a factory taking num_classes=, image_size= and the --kwarg arguments (a language model's: "
                "--vocab-size N --block-size T, for factory(vocab_size=, block_size=))"
            )
        raise UnitrainError(f"--model={path!r} is not allowed with {given}: {err}; allowed: {allowed}") from None
    except ValueError:  # no signature to read: the check's call says
        pass


def _out_folder(out: str | None, translation: Translation, factory: str) -> Path:
    """--out, which must not hold anything yet; by default a folder named by the factory and the
    code's hash, which holds the same conversion and check when it exists (two factories of one
    module: two folders, each its own check.json)."""
    if out is None:
        name = re.sub(r"[^\w.-]", ".", factory)
        return Path("converted") / f"{name}-{translation.directory.name}"
    path = Path(out)
    if path.exists():
        path.rmdir()  # empty (:func:`_check_out`): copied whole below
    return path


def _check_out(out: str | None) -> None:
    """--out can be written, before any work: a new or empty folder in a folder this process can
    write (the default's: the working directory)."""
    if out is None:
        why = cannot_create_in(Path.cwd())
        if why:
            raise UnitrainError(
                f"the default --out (converted/ here) is not allowed: {Path.cwd()}: {why}; allowed: --out in a "
                "folder you can write"
            )
        return
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UnitrainError(
            f"--out={out!r} is not allowed: it exists and is not an empty folder; allowed: a new folder"
        )
    why = cannot_write_beside(path)
    if why:
        raise UnitrainError(f"--out={out!r} is not allowed: {why}; allowed: a new folder in a folder you can write")


def _conversion_lines(translation: Translation, backend: str, out: Path) -> str:
    files = per_file(translation)
    left = sum(f["unconverted"] for f in files.values())
    lines = [f"{translation.source.top} -> {backend}: {translation.converted} calls converted, {left} left ({out})"]
    lines += [
        f"  {name}: {f['converted']} converted" + (f", {f['unconverted']} left" if f["unconverted"] else "")
        for name, f in files.items()
    ]
    substituted = ", ".join(f"{name} x{count}" for name, count in translation.substituted.items())
    lines.append(f"  substituted by unitrain (docs/models.md): {substituted or 'nothing'}")
    if left:
        lines.append(f"  what did not convert: {out / UNCONVERTED}")
    lines.append(f"  the code: {out / translation.alias}; the report: {out / REPORT}")
    return "\n".join(lines)


def _check_line(found: Dict[str, Any], source_name: str, batch: str) -> str:
    largest = found["largest"]
    return (
        f"forward check (the same weights, one batch of {batch}, evaluation mode): "
        f"{found['layers_compared']} layer outputs within {largest['rel_diff']:.2e} of the {source_name} half's "
        f"(largest at {largest['layer']}; at most {CONVERTED_TOLERANCE:g} passes), losses within "
        f"{found['loss_rel_diff']:.2e}"
    )


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
