"""A user's code, called: the function an import path names (``pkg.module:function``, as
``model.<backend>=`` names a factory and ``python -m unitrain.convert`` a model to convert), what a
factory returns checked to be the framework's model, the logits picked from what the model
returns (a tuple ``(logits, ...)``, an object's ``.logits``), and where the user's (or the
converted) code failed and what it said, for one line."""

from __future__ import annotations

import importlib
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from unitrain.errors import ConfigError
from unitrain.host import processes
from unitrain.interface.models import models_module
from unitrain.model.translation.source import did_you_mean, factory_parts

#: Where code is not the user's: Python's own library, installed packages, unitrain and its backends.
_LIBRARIES: Tuple[str, ...] = tuple(
    str(Path(p).resolve()) + os.sep
    for p in [
        *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
        Path(__file__).resolve().parents[1],
        Path(__file__).resolve().parents[2] / "backends",
    ]
)


def failed_at(err: BaseException) -> str:
    """Where the user's (or the converted) code failed and what it said, for one line."""
    return f"{where_it_failed(err)}: {what_it_said(err)}"


def what_it_said(err: BaseException) -> str:
    """The failure's type and the first line of its message."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def where_it_failed(err: BaseException) -> str:
    """The last line of the user's (converted) code a failure passed through: the converted
    copy's, else the user's own (not Python's, an installed package's such as the framework's,
    nor unitrain's: ``nn.Conv2d(3, width, 3)`` with a string width fails inside torch, at the
    user's line), else the last."""
    frames = traceback.extract_tb(err.__traceback__)
    converted = [f for f in frames if "unitrain_converted_" in f.filename]
    own = [f for f in frames if not _library(f.filename)]
    last = (converted or own or frames)[-1]
    if converted:
        # The translated copy is reformatted: the user's line from the map the translation wrote
        # beside it, else the copy's own path and line.
        source = _source_line(last.filename, last.lineno)
        if source:
            return source
        return f"{_shown(last.filename)}:{last.lineno} of the converted copy ({(last.line or '').strip()})"
    return f"{Path(last.filename).name}:{last.lineno} ({(last.line or '').strip()})"


#: Beside each translated module, its line map (the Paddle translation's, backends/paddle/translation/lines.py).
_LINE_MAP = ".lines.json"


def _source_line(copy: str, line: int) -> Optional[str]:
    """``file.py:N (its text)``: the user's line the translated copy's ``line`` came from, where
    the translation mapped it."""
    import json
    import linecache

    try:
        found = json.loads(Path(copy + _LINE_MAP).read_text(encoding="utf-8"))
        number = int(found["lines"][str(line)])
        source = str(found["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    text = linecache.getline(source, number).strip()
    return f"{Path(source).name}:{number} ({text})" if text else f"{Path(source).name}:{number}"


def _shown(path: str) -> str:
    """A path as short as it is unambiguous: relative to the working directory where it is below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def _library(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    path = str(Path(filename).resolve())
    return "site-packages" in path or "dist-packages" in path or path.startswith(_LIBRARIES)


def given(kwargs: Mapping[str, Any]) -> str:
    """`` with model.kwargs width='abc', depth=3``: what a factory was given of the user's own, for
    a failure's line; empty without."""
    return f" with model.kwargs {', '.join(f'{k}={v!r}' for k, v in kwargs.items())}" if kwargs else ""


def logits_of(output: Any) -> Any:
    """A model's logits in what it returns: the output itself (a tensor), the first of a tuple or
    list ``(logits, ...)`` (a model returning its auxiliary loss or state beside them, a Hugging
    Face model's ``return_dict=False``), or an object's ``.logits`` (Hugging Face's
    ``ModelOutput``). Anything else is returned as it is, for the check to refuse."""
    if isinstance(output, (tuple, list)):
        return output[0] if output else output
    logits = _logits_attribute(output)
    return output if logits is None else logits


def _logits_attribute(output: Any) -> Any:
    try:
        return getattr(output, "logits", None)
    except Exception:  # noqa: BLE001 - a mapping whose __getattr__ raises KeyError
        return None


def pick_logits(backend: Any, model: Any) -> None:
    """``model``'s calls return :func:`logits_of` what its forward returns, everywhere it is called
    (the loop, evaluation, the checks, parity, export): a hook on the model itself, which leaves
    its state and its layers' names as they were. A tensor passes untouched (the hook returns
    None, which both frameworks read as "unchanged")."""
    backend._on_output(model, _picked)  # noqa: SLF001 - a forward hook; its return replaces the output


def _picked(output: Any) -> Optional[Any]:
    picked = logits_of(output)
    return None if picked is output else picked


def describe_output(output: Any, shape_of: Any) -> str:
    """What a model returned, for a refusal: a tensor's shape, a tuple's items' shapes (or types),
    an object's ``.logits``. ``shape_of(x)``: a tensor's shape as a list, None for anything else."""

    def one(item: Any) -> str:
        shape = shape_of(item)
        return str(shape) if shape is not None else _article(type(item).__name__)

    if isinstance(output, (tuple, list)):
        return f"{_article(type(output).__name__)} ({', '.join(one(x) for x in output)})"
    logits = _logits_attribute(output)
    if logits is not None and shape_of(output) is None:
        return f"{_article(type(output).__name__)} whose .logits is {one(logits)}"
    return one(output)


def check_model(backend: str, path: str, model: Any) -> None:
    """What a factory returns is the framework's model, or the job stops in one line."""
    if not models_module(backend).is_model(model):
        raise ConfigError(
            f"model.{backend}",
            path,
            f"a factory that returns a {backend} model (it returned {type(model).__module__}.{type(model).__name__})",
        )


def resolve_factory(key: str, path: str) -> Any:
    """The function an import path names, imported; a wrong path is one line."""
    # The launchers start workers by script path, which puts the script's folder first on
    # sys.path, not the folder the user ran the command from, where their package lives.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    module_name, function = factory_parts(path)
    allowed = "an importable function (pkg.module:function)"
    if not module_name or not function:
        raise ConfigError(key, path, allowed)
    processes.user_code_loaded()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise ConfigError(key, path, f"{allowed}; no module {err.name!r} on the path") from None
    except Exception as err:  # noqa: BLE001 - the user's module failing on import: one line that says where
        raise ConfigError(
            key, path, f"{allowed}; importing {module_name} failed at {where_it_failed(err)}: {err}"
        ) from None
    return factory_in(key, path, module, module_name, function)


def factory_in(key: str, path: str, module: Any, module_name: str, function: str) -> Any:
    """``module``'s ``function``, the factory ``key=path`` names, or one line: a name bound to
    something else (``is an int, not a function``), a name not there (``did you mean``). The
    user's module and its converted copy (``model.paddle=convert``) alike."""
    allowed = "an importable function (pkg.module:function)"
    factory = getattr(module, function, None)
    if factory is not None and not callable(factory):
        raise ConfigError(
            key, path, f"{allowed}; {module_name}.{function} is {_article(type(factory).__name__)}, not a function"
        )
    if not callable(factory):
        raise ConfigError(key, path, f"{allowed}; {module_name}{did_you_mean(function, dir(module))}")
    return factory


def _article(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
