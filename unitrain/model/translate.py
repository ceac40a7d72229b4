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
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from unitrain.errors import ConfigError, Refusal
from unitrain.host.cache import cache_dir
from unitrain.host.machine import unitrain_version
from unitrain.interface.translate import FileTranslation, Unconverted, translate_module

#: The factory value that asks for a translated half.
CONVERT = "convert"
REPORT = "translation.json"
UNCONVERTED = "unconverted.txt"
#: A run's own copy of its translated tree, in its run directory: what its checkpoints were
#: trained with, so an export or a quantization months later builds that model, not today's code.
RUN_COPY = "converted"
#: {file: sha256} of a cached tree, written last: an entry is used only as it was written.
CONTENTS = "contents.json"

log = logging.getLogger("unitrain")


class ConversionRefused(Refusal):
    """Code the converter could not turn into working code of the other framework."""


@dataclass(frozen=True, kw_only=True)
class Source:
    """The user's code a factory path names."""

    key: str  # model.<backend> of the factory
    root: Path  # the folder holding the top-level package or module
    top: str  # the top-level package's or module's name
    files: List[Path]  # relative to root
    module: str  # the factory's module
    function: str


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
        module = importlib.import_module(f"{self.alias}.{self.source.module}")
        if not callable(getattr(module, self.source.function, None)):
            raise ConfigError(
                self.source.key,
                f"{self.source.module}:{self.source.function}",
                f"a function of {self.source.module}{did_you_mean(self.source.function, dir(module))}",
            )
        return getattr(module, self.source.function)


def did_you_mean(name: str, names: List[str]) -> str:
    """`` (no 'x' there; did you mean 'y'?)``: for a misspelt function name."""
    close = difflib.get_close_matches(name, [n for n in names if not n.startswith("_")], n=1)
    return f" (no {name!r} there; did you mean {close[0]!r}?)" if close else f" (no {name!r} there)"


def factory_parts(path: str) -> Tuple[str, str]:
    """(module, function) of a factory path: ``pkg.module:function`` or Hydra's ``pkg.module.function``."""
    module, _, function = path.partition(":") if ":" in path else path.rpartition(".")
    return module, function


def find_source(key: str, path: str) -> Source:
    """The files of the package (or module) a factory path names, found without importing it."""
    module, function = factory_parts(path)
    allowed = "an import path pkg.module:function of your model's factory, found from the folder you run in"
    if not module or not function:
        raise ConfigError(key, path, allowed)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    is_package = spec is not None and bool(spec.submodule_search_locations)
    if spec is None or not (is_package or (spec.origin or "").endswith(".py")):
        raise ConfigError(key, path, f"{allowed}; no Python package or module {top!r} on the path")
    if is_package:
        root = Path(list(spec.submodule_search_locations)[0]).parent
    else:
        root = Path(spec.origin).parent
    start = _module_file(root, module)
    if start is None:
        raise ConfigError(key, path, f"{allowed}; no module {module!r} in {root / top}")
    names = _top_level_names(root / start)
    if names is not None and function not in names:
        raise ConfigError(key, path, f"a function of {module}{did_you_mean(function, sorted(names))}")
    files = sorted(_imported_closure(root, top, start)) if is_package else [start]
    return Source(key=key, root=root, top=top, files=files, module=module, function=function)


def _top_level_names(path: Path) -> Optional[Set[str]]:
    """The names a module defines at its top level, read without running it; None where they
    cannot all be read (a star import, a module ``__getattr__``, code that does not parse)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return None
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return None if "__getattr__" in names else names


def _module_file(root: Path, module: str) -> Optional[Path]:
    """The file of ``module`` under ``root``, relative to it."""
    for rel in (Path(*module.split(".")).with_suffix(".py"), Path(*module.split("."), "__init__.py")):
        if (root / rel).is_file():
            return rel
    return None


def _imported_closure(root: Path, top: str, start: Path) -> Set[Path]:
    """``start`` and the package's own modules it imports, directly or not, with the package
    ``__init__`` files on their way (importing ``pkg.a.b`` runs ``pkg/__init__.py`` and
    ``pkg/a/__init__.py``): the user's code the factory runs, and none of the rest."""
    found: Set[Path] = set()
    todo = [start]
    while todo:
        rel = todo.pop()
        if rel in found:
            continue
        found.add(rel)
        parts = rel.with_suffix("").parts
        package = parts[:-1] if rel.name != "__init__.py" else parts[:-1]
        todo += [p for i in range(1, len(package) + 1) if (p := root.joinpath(*package[:i], "__init__.py")).is_file()]
        todo = [p.relative_to(root) if p.is_absolute() else p for p in todo]
        for name in _imports(root / rel, package):
            if name.split(".")[0] == top:
                for candidate in (name, name.rpartition(".")[0]):  # a module, or a name from a module
                    module_file = _module_file(root, candidate) if candidate else None
                    if module_file:
                        todo.append(module_file)
                        break
    return found


def _imports(path: Path, package: Tuple[str, ...]) -> List[str]:
    """The absolute names ``path`` imports (``from .x import y``: ``pkg.x.y`` and ``pkg.x``)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return []
    names: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names += [f"{base}.{alias.name}" for alias in node.names] + [base]
    return names


def _digest(source: Source, converter: str, module: Any) -> str:
    """The cache key: the sources, the converter, and unitrain's substitutions (the code of the
    translate module's backend: a bridge added since a tree was cached changes what it runs)."""
    digest = hashlib.sha256(f"{converter}\n{unitrain_version()}\n".encode())
    for own in sorted(Path(module.__file__).parent.glob("*.py")):
        digest.update(own.read_bytes())
    for rel in source.files:
        digest.update(f"{rel}\n".encode())
        digest.update((source.root / rel).read_bytes())
    return digest.hexdigest()[:16]


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
    key = _digest(source, converter, module)
    alias = f"unitrain_converted_{key}"
    directory = cache_dir("converted") / key
    if directory.exists():
        damaged = _damaged(directory)
        if damaged:
            log.warning("the cached conversion %s %s: converting %s again", directory, damaged, source.module)
            _discard(directory)
    if not (directory / REPORT).exists():
        check_syntax(source)
        _convert_into(directory, alias, source, module, f"model.{backend}")
    translation = _translation(directory, alias, source)
    if refuse:
        refuse_what_did_not_convert(translation, backend)
    return translation


def check_syntax(source: Source) -> None:
    """The user's files compile, or one line naming the file and line (a converter given code
    that is not Python fails with a traceback of its own)."""
    for rel in source.files:
        path = source.root / rel
        try:
            compile(path.read_bytes(), str(path), "exec")
        except SyntaxError as err:
            raise ConfigError(
                source.key,
                f"{source.module}:{source.function}",
                f"Python that compiles; {rel}:{err.lineno}: SyntaxError: {err.msg}",
            ) from None


def _contents(directory: Path) -> Dict[str, str]:
    """{file: sha256} of a translated tree, what Python writes when it imports it left out."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != CONTENTS and "__pycache__" not in p.parts
    }


def _damaged(directory: Path) -> Optional[str]:
    """None where a cached tree holds what was written, else what is not so (a file edited,
    truncated or deleted since: it would be imported as the conversion)."""
    try:
        written = json.loads((directory / CONTENTS).read_text())
    except (OSError, ValueError):
        return f"has no readable {CONTENTS} (unfinished, or written before entries were verified)"
    found = _contents(directory)
    for name, digest in written.items():
        if name not in found:
            return f"lost {name}"
        if found[name] != digest:
            return f"holds {name} changed since it was written"
    return None


def _discard(directory: Path) -> None:
    """A damaged entry out of the way (renamed first: another process may be reading the name)."""
    stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=directory.parent))
    try:
        directory.rename(stale / directory.name)
    except OSError:  # another process moved it first
        pass
    shutil.rmtree(stale, ignore_errors=True)


def _clean_leftovers(root: Path, older_than_s: float = 86400) -> None:
    """What killed conversions left (``.converting-*``, ``.stale-*``), once nothing can still be
    writing it: older than a day."""
    now = time.time()
    for path in [*root.glob(".converting-*"), *root.glob(".stale-*")]:
        try:
            if now - path.stat().st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def _convert_into(directory: Path, alias: str, source: Source, module: Any, key: str) -> None:
    _clean_leftovers(directory.parent)
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
        (tmp / CONTENTS).write_text(json.dumps(_contents(tmp), indent=1))  # last: the entry is whole
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
