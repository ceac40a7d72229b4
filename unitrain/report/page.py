"""report.html: one self-contained page (style inline, images as data URIs, no server needed) with,
in this order, the fairness warnings, the training table and its footnote, the parameter-server
table, the plots, each inference benchmark, the quantization runs and the environment table.
write_html assembles it; each kind of job other than training has its own section here.
"""

from __future__ import annotations

import html
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from unitrain.report import inference as inference_report
from unitrain.report import ps as ps_report
from unitrain.report import quantize as quantize_report
from unitrain.report.stats import FOOTNOTE
from unitrain.report.tables import figure, html_table

_HEAD = (
    "<!doctype html><html><head><meta charset='utf-8'><title>unitrain comparison</title><style>"
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}"
    ".warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.5em 1em}img{max-width:100%}"
    "</style></head><body><h1>unitrain comparison</h1>"
)


def write_html(
    path: Path,
    rows,
    env,
    warnings,
    images: List[Path],
    note: str = FOOTNOTE,
    inference=(),
    quantized=(),
    ps_found=(),
    best=(),
) -> None:
    """One file with everything inlined (images as data URIs): opens in a browser, no server."""
    imgs = "".join(figure(p, p.stem) for p in images)
    warn = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    path.write_text(
        _HEAD
        + (f"<div class='warn'><strong>Not a fair comparison:</strong><ul>{warn}</ul></div>" if warnings else "")
        + ("<h2>Best against best</h2>" + html_table(list(best)) if best else "")
        + ("<h2>Results</h2>" + html_table(rows) + f"<p><small>{html.escape(note)}</small></p>" if rows else "")
        + _ps_html(ps_found)
        + "<h2>Plots</h2>"
        + imgs
        + "".join(_inference_html(f, result) for f, result in inference)
        + _quantize_html(quantized)
        + "<h2>Environment</h2>"
        + html_table(env)
        + "</body></html>",
        encoding="utf-8",
    )


def _ps_html(ps_found) -> str:
    if not ps_found:
        return ""
    return (
        "<h2>Parameter server</h2>"
        + html_table(ps_report.rows(ps_found))
        + f"<p><small>{html.escape(ps_report.NOTE)}</small></p>"
    )


def _inference_html(file: Path, result: Dict[str, Any]) -> str:
    png = file.parent / "inference.png"
    img = figure(png, "inference") if png.exists() else ""
    note = inference_report.markdown(result).rsplit("\n\n", 1)[-1]
    return (
        f"<h2>Inference ({html.escape(str(file))})</h2>"
        + html_table(inference_report.table_rows(result))
        + f"<p><small>{html.escape(note)}</small></p>"
        + img
    )


def _quantize_html(quantized) -> str:
    if not quantized:
        return ""
    reports = [report for _, report in quantized]
    rows = quantize_report.combined_rows(reports)
    with tempfile.TemporaryDirectory() as tmp:
        png = quantize_report.plot(
            [row for r in reports for row in r["rows"]], reports[0]["batches"], Path(tmp) / "quantize.png"
        )
        img = figure(png, "quantization")
    note = quantize_report.combined_markdown(reports).split("\n\n", 1)[-1]
    return "<h2>Quantization</h2>" + html_table(rows) + f"<p><small>{html.escape(note)}</small></p>" + img
