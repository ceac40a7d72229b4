"""Tables as Markdown and as HTML, the one way every report writes them."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Dict, List

#: A cell of a row without that column (runs of different tasks: bits per character beside bits
#: per byte, tokens/s beside samples/s).
ABSENT = "-"


def columns(rows: List[Dict[str, str]]) -> List[str]:
    """Every row's columns once, each where its row has it: a column only later rows have goes
    after the one it follows there."""
    cols: List[str] = []
    for row in rows:
        after = -1
        for key in row:
            if key not in cols:
                cols.insert(after + 1, key)
            after = cols.index(key)
    return cols


def markdown(rows: List[Dict[str, str]]) -> str:
    if not rows:
        return "(no runs)"
    cols = columns(rows)
    return "\n".join(
        ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        + ["| " + " | ".join(r.get(c, ABSENT) for c in cols) + " |" for r in rows]
    )


def html_table(rows: List[Dict[str, str]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    cols = columns(rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    cells = ("".join(f"<td>{html.escape(r.get(c, ABSENT))}</td>" for c in cols) for r in rows)
    body = "".join(f"<tr>{row}</tr>" for row in cells)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(png: Path, alt: str) -> str:
    """An HTML figure with the PNG inlined as a data URI: the page needs no other file."""
    data = base64.b64encode(Path(png).read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'
