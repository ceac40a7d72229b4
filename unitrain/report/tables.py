"""Tables as Markdown and as HTML, the one way every report writes them."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Dict, List


def markdown(rows: List[Dict[str, str]]) -> str:
    if not rows:
        return "(no runs)"
    cols = list(rows[0])
    return "\n".join(
        ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
        + ["| " + " | ".join(r[c] for c in cols) + " |" for r in rows]
    )


def html_table(rows: List[Dict[str, str]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(png: Path, alt: str) -> str:
    """An HTML figure with the PNG inlined as a data URI: the page needs no other file."""
    data = base64.b64encode(Path(png).read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'
