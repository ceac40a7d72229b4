"""The user's code a factory path names (``model.torch=my_pkg.nets:build``), found without
importing it: the top-level package (or single module) that holds the factory, and of it the
files the factory's module imports, directly or not; checked to compile before it is translated
(:mod:`unitrain.model.translate`)."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Set, Tuple

from unitrain.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Source:
    """The user's code a factory path names."""

    key: str  # model.<backend> of the factory
    root: Path  # the folder holding the top-level package or module
    top: str  # the top-level package's or module's name
    files: List[Path]  # relative to root
    module: str  # the factory's module
    function: str


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
