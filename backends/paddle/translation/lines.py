"""The user's line of each line of the translated copy. PaConvert rewrites a file whole (its
output's line numbers are not the source's): before it runs, each simple statement of the source
gets a marker after it on its own line (``; "__unitrain_line_12"``, no line added, so PaConvert's
own report keeps the source's numbers); after the rewriting the markers are read off the syntax
tree, removed, and each statement of the final code mapped to the source line it came from,
written beside the copy (:func:`map_path`) for :func:`unitrain.model.user_code.where_it_failed`.
No paddle import."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

_MARK = "__unitrain_line_"
_MARK_LINE = re.compile(rf"^\s*(['\"]){_MARK}\d+\1\s*$")
#: The file beside a translated module that holds its line map: ``<module>.py.lines.json``.
SUFFIX = ".lines.json"


def map_path(copy: Path) -> Path:
    return copy.with_name(copy.name + SUFFIX)


def marked(source: str) -> Optional[str]:
    """``source`` with a marker after each simple statement, on the statement's last line; None
    where it does not parse (the converter reports that itself)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    lines = source.splitlines(keepends=True)
    ends = sorted(
        {
            (node.end_lineno, node.end_col_offset, node.lineno)
            for node in ast.walk(tree)
            if isinstance(node, ast.stmt) and not _compound(node) and node.end_lineno is not None
        },
        reverse=True,
    )
    encoded = [line.encode("utf-8") for line in lines]
    for end_line, end_col, line in ends:  # from the last: earlier offsets stay valid
        row = encoded[end_line - 1]
        encoded[end_line - 1] = row[:end_col] + f'; "{_MARK}{line}"'.encode() + row[end_col:]
    text = b"".join(encoded).decode("utf-8")
    try:
        ast.parse(text)
    except SyntaxError:
        return None
    return text


def _compound(node: ast.stmt) -> bool:
    return any(isinstance(getattr(node, field, None), list) for field in ("body", "cases"))


def unmarked(code: str, source: str) -> Tuple[str, Dict[str, object]]:
    """The translated ``code`` without its markers, and its line map: ``{"source": the user's
    file, "lines": {copy line: source line}}`` (empty lines where the markers cannot be read)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:  # what the converter left unconverted: no longer Python; markers dropped
        kept = [line for line in code.splitlines(keepends=True) if not _MARK_LINE.match(line)]
        return "".join(kept), {"source": source, "lines": {}}
    origins: Dict[int, int] = {}  # id(statement) -> source line
    for body in _bodies(tree):
        _take_markers(body, origins)
    final = ast.unparse(tree) + "\n"
    lines: Dict[str, int] = {}
    for before, after in zip(_statements(tree), _statements(ast.parse(final))):
        line = origins.get(id(before))
        if line is not None and type(before) is type(after):
            for copy_line in range(after.lineno, (after.end_lineno or after.lineno) + 1):
                lines[str(copy_line)] = line
    return final, {"source": source, "lines": lines}


def _bodies(tree: ast.AST) -> Iterator[List[ast.stmt]]:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value
        for handler in getattr(node, "handlers", []) or []:
            yield handler.body
        for case in getattr(node, "cases", []) or []:
            yield case.body


def _line_of(node: ast.stmt) -> Optional[int]:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        text = node.value.value
        if text.startswith(_MARK) and text[len(_MARK) :].isdigit():
            return int(text[len(_MARK) :])
    return None


def _take_markers(body: List[ast.stmt], origins: Dict[int, int]) -> None:
    """The markers of one body removed; each marks the statements since the previous marker (what
    PaConvert wrote for one source statement, one or several)."""
    pending: List[ast.stmt] = []
    kept: List[ast.stmt] = []
    for node in body:
        line = _line_of(node)
        if line is None:
            kept.append(node)
            if not _compound(node):  # a compound statement is never marked: its own statements are
                pending.append(node)
            continue
        for statement in pending:
            origins.setdefault(id(statement), line)
        pending = []
    if not kept:  # a body of markers alone (never: a marker follows a statement)
        kept = [ast.Pass()]
    body[:] = kept


def _statements(tree: ast.AST) -> List[ast.stmt]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.stmt)]


def write_map(copy: Path, line_map: Dict[str, object]) -> None:
    map_path(copy).write_text(json.dumps(line_map, indent=0) + "\n", encoding="utf-8")
