"""``model.<backend>=convert``: that half of a user's model translated from the other half's code.

"translate" is this: code of one framework rewritten as another's. Weights are "converted"
(:mod:`unitrain.model.weights`, :mod:`unitrain.model.conversion`); the config value ``convert``
and the ``converted/`` folders keep the name users already type and read.

The user names one factory (``model=custom model.torch=my_pkg.nets:build model.paddle=convert``).
The factory's top-level package (or its single module) is the user's own code: every Python file
of it is translated by the backend's translate module (PaConvert for Paddle), its imports of itself
point at the translated copy, and the copy is imported under a name of its own, so both halves
live in one process. The translated tree is cached by a hash of the sources, the converter's
version, unitrain's and its substitutions' code (``UNITRAIN_CACHE``, else ``$XDG_CACHE_HOME/unitrain``, else
``~/.cache/unitrain``), and each run keeps a copy (``converted/`` in its run directory).

Nothing is translated silently in part: a call the converter left, a module of the user's outside the
package, a name the installed framework lacks, each stops the job in one line before it starts.

The user's files are found in :mod:`unitrain.model.translation.source`, the cache's entries kept
whole in :mod:`unitrain.model.translation.cache`; this module converts, caches and refuses.
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from unitrain.errors import ConfigError, Refusal
from unitrain.host import processes
from unitrain.host.cache import cache_dir
from unitrain.interface.translate import FileTranslation, Unconverted, translate_module
from unitrain.model.translation.cache import CONTENTS, clean_leftovers, contents, damaged, digest, discard
from unitrain.model.translation.source import (  # noqa: F401 - find_source: the callers' entry, imported from here
    Source,
    check_syntax,
    did_you_mean,
    factory_parts,
    find_source,
)
from unitrain.model.user_code import factory_in

#: The factory value that asks for a translated half.
CONVERT = "convert"
REPORT = "translation.json"
UNCONVERTED = "unconverted.txt"
#: A run's own copy of its translated tree, in its run directory: what its checkpoints were
#: trained with, so an export or a quantization months later builds that model, not today's code.
RUN_COPY = "converted"

log = logging.getLogger("unitrain")


class ConversionRefused(Refusal):
    """Code the converter could not turn into working code of the other framework."""


@dataclass(frozen=True, kw_only=True)
class Translation:
    """A translated tree in the cache, and what the conversion did."""

    directory: Path  # on sys.path: it holds the package ``alias``
    alias: str
    source: Source
    converted: int
    unconverted: List[Unconverted]
    substituted: Dict[str, int]
    missing: List[List[str]]  # [name, file]: names the translated code uses that the framework lacks

    def factory(self) -> Callable[..., Any]:
        if str(self.directory) not in sys.path:
            sys.path.insert(0, str(self.directory))
        processes.user_code_loaded()
        module = importlib.import_module(f"{self.alias}.{self.source.module}")
        # The converted module's names are the user's: refused as the user's own module would be.
        path = f"{self.source.module}:{self.source.function}"
        return factory_in(self.source.key, path, module, self.source.module, self.source.function)


def _translation(directory: Path, alias: str, source: Source) -> Translation:
    report = json.loads((directory / REPORT).read_text())
    return Translation(
        directory=directory,
        alias=alias,
        source=source,
        converted=report["converted"],
        unconverted=[Unconverted(**u) for u in report["unconverted"]],
        substituted=report["substituted"],
        missing=report["missing"],
    )


def run_copy(run_dir: Path, key: str, path: str) -> Optional[Translation]:
    """The translated tree a run kept (:data:`RUN_COPY`) of the factory ``path`` (``key``:
    model.<backend> of it), or None where the run has none (deleted, or written before runs
    kept one)."""
    directory = Path(run_dir) / RUN_COPY
    aliases = sorted(p.name for p in directory.glob("unitrain_converted_*") if p.is_dir())
    if not (directory / REPORT).is_file() or len(aliases) != 1:
        return None
    report = json.loads((directory / REPORT).read_text())
    module, function = factory_parts(path)
    origin = Path(report["source"])
    source = Source(
        key=key,
        root=origin.parent,
        top=origin.name.removesuffix(".py"),
        files=[Path(f) for f in report["files"]],
        module=module,
        function=function,
    )
    return _translation(directory, aliases[0], source)


def translate(source: Source, backend: str, *, refuse: bool = True) -> Translation:
    """``source`` converted for ``backend``: from the cache, or converted now and cached whole
    (a tree half-written by a killed process is never read). ``refuse``: a conversion left
    incomplete stops here in one line (:func:`refuse_what_did_not_convert`)."""
    module = translate_module(backend)
    converter = module.converter_version()
    key = digest(source, converter, module)
    alias = f"unitrain_converted_{key}"
    directory = cache_dir("converted") / key
    if directory.exists():
        damaged_because = damaged(directory)
        if damaged_because:
            log.warning("the cached conversion %s %s: converting %s again", directory, damaged_because, source.module)
            discard(directory)
    if not (directory / REPORT).exists():
        check_syntax(source)
        _convert_into(directory, alias, source, module, f"model.{backend}")
    translation = _translation(directory, alias, source)
    if refuse:
        refuse_what_did_not_convert(translation, backend)
    return translation


def _convert_into(directory: Path, alias: str, source: Source, module: Any, key: str) -> None:
    clean_leftovers(directory.parent)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=directory.parent))
    try:
        (tmp / alias).mkdir()
        (tmp / alias / "__init__.py").write_text("")
        files: List[FileTranslation] = []
        for rel in source.files:
            out = tmp / alias / rel
            files.append(module.translate_file(source.root / rel, out))
            if not files[-1].unconverted:  # the converter marks what it left: no longer Python
                _point_imports_at(out, source.top, alias, key)
        unconverted = [
            asdict(u) | {"file": str(Path(u.file).relative_to(source.root))} for f in files for u in f.unconverted
        ]
        substituted: Dict[str, int] = {}
        for f in files:
            for name, count in f.substituted.items():
                substituted[name] = substituted.get(name, 0) + count
        report = {
            "source": str(source.root / source.top),
            "files": [str(f) for f in source.files],
            "converted": sum(f.converted for f in files),
            "per_file": {
                str(rel): {"converted": f.converted, "unconverted": len(f.unconverted)}
                for rel, f in zip(source.files, files)
            },
            "unconverted": unconverted,
            "substituted": substituted,
            "missing": _missing(tmp / alias, source, module),
        }
        (tmp / UNCONVERTED).write_text("".join(f"{u['file']}:{u['line']}: {u['api']}\n" for u in unconverted))
        (tmp / REPORT).write_text(json.dumps(report, indent=2))
        (tmp / CONTENTS).write_text(json.dumps(contents(tmp), indent=1))  # last: the entry is whole
        try:
            tmp.rename(directory)
        except OSError:  # another process cached the same tree meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _point_imports_at(path: Path, top: str, alias: str, key: str) -> None:
    """The translated code's imports of the user's own package, pointed at the translated copy."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    changed = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == top or node.module.startswith(top + "."):
                node.module, changed = f"{alias}.{node.module}", True
        elif isinstance(node, ast.Import):
            for name in node.names:
                if name.name == top or name.name.startswith(top + "."):
                    # ``import pkg.sub`` binds ``pkg``: bind the translated package under that name.
                    name.asname = name.asname or (top if name.name == top else None)
                    if name.asname is None:
                        raise ConfigError(
                            key,
                            CONVERT,
                            f"code that imports its own modules as 'from {top} import ...' or 'import {name.name} as "
                            f"...' ({path.name} has 'import {name.name}')",
                        )
                    name.name, changed = f"{alias}.{name.name}", True
    if changed:
        path.write_text(ast.unparse(tree) + "\n", encoding="utf-8")


def _missing(package: Path, source: Source, module: Any) -> List[Tuple[str, str]]:
    """(name, file) for every name the translated code uses that the framework lacks."""
    found = []
    for rel in source.files:
        if ">>>>>>" in (package / rel).read_text(encoding="utf-8"):
            continue  # refused for what did not convert
        code = (package / rel).read_text(encoding="utf-8")
        found += [(name, str(rel)) for name in module.missing_names(code)]
    return found


def refuse_what_did_not_convert(translation: Translation, backend: str) -> None:
    if translation.unconverted:
        first, rest = translation.unconverted[0], len(translation.unconverted) - 1
        raise ConversionRefused(
            f"model.{backend}=convert: {first.api} at {first.file}:{first.line} did not convert"
            + (f", nor {rest} other call(s)" if rest else "")
            + f" (all listed in {translation.directory / UNCONVERTED}); allowed: code whose every call the converter "
            f"maps, or a {backend} half of your own (model.{backend}=pkg.module:function)"
        )
    if translation.missing:
        (name, file), rest = translation.missing[0], len(translation.missing) - 1
        raise ConversionRefused(
            f"model.{backend}=convert: the converted {file} uses {name}, which the installed {backend} does not have"
            + (f" ({rest} other such name(s))" if rest else "")
            + f"; allowed: code that converts to names {backend} has, or a {backend} half of your own "
            f"(model.{backend}=pkg.module:function)"
        )


def per_file(translation: Translation) -> Dict[str, Dict[str, int]]:
    """{file: {"converted": calls, "unconverted": calls}} of the user's files, as converted."""
    return json.loads((translation.directory / REPORT).read_text())["per_file"]


def copy_to(translation: Translation, target: Path) -> None:
    """The translated tree, with its report, where the user reads it."""
    if not target.exists():
        shutil.copytree(translation.directory, target, ignore=shutil.ignore_patterns("__pycache__"))


def keep(translation: Translation, run_dir: Path) -> None:
    """The run's own copy of the translated code, for the user to read."""
    copy_to(translation, Path(run_dir) / RUN_COPY)
