"""Compare runs: ``python -m unitrain.compare <run-or-multirun-dirs...>``.

Reads each run's summary.json, metrics.jsonl and Hydra config, and writes into the output
directory (the first argument by default): comparison.md (also printed), curves.png,
throughput.png, step_time.png and a self-contained report.html. Runs that differ only by
trainer.seed (a seed sweep) or that are repeats of one job (trainer.repeats) are one row, with
the median and the spread over repeats. A ratio whose spread overlaps the baseline's is marked
as within noise rather than presented as a ranking. This module holds the two entry points,
table and write_report, and wires the parts: runs.py reads the runs, stats.py computes the
table, fairness.py the warnings, plots.py draws, page.py writes report.html, and ps.py,
inference.py and quantize.py add the other kinds of job found in the same directories.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from unitrain.report import hyperparameter_search as search_report
from unitrain.report import inference as inference_report
from unitrain.report import ps as ps_report
from unitrain.report import quantize as quantize_report
from unitrain.report.fairness import fairness_warnings
from unitrain.report.page import write_html
from unitrain.report.plots import plot
from unitrain.report.runs import Run, group_repeats, inference_results, load_runs
from unitrain.report.stats import FOOTNOTE, environment, table_rows
from unitrain.report.tables import markdown


def _training_runs(dirs: Sequence[str | Path], ps_found) -> List[Run]:
    """The training runs; none is fine when the directories hold parameter-server jobs."""
    try:
        return load_runs(dirs)
    except FileNotFoundError:
        if ps_found:
            return []
        raise


@dataclass(frozen=True)
class _Found:
    """What the directories hold: parameter-server results, training runs, the table's rows."""

    ps: list
    runs: List[Run]
    groups: List[List[Run]]
    rows: List[Dict[str, str]]


def _find(
    dirs: Sequence[str | Path], baseline: int, target_loss: Optional[float], target_accuracy: Optional[float]
) -> _Found:
    """The runs in ``dirs`` and the training table's rows (``baseline``: the row ratios refer to)."""
    ps_found = ps_report.results(dirs)
    runs = _training_runs(dirs, ps_found)
    groups = group_repeats(runs)
    if runs and not 0 <= baseline < len(groups):
        raise ValueError(f"--baseline {baseline} is out of range: there are {len(groups)} rows (0..{len(groups) - 1})")
    rows = table_rows(groups, baseline, target_loss, target_accuracy) if runs else []
    return _Found(ps=ps_found, runs=runs, groups=groups, rows=rows)


def table(
    dirs: Sequence[str | Path],
    baseline: int = 0,
    target_loss: Optional[float] = None,
    target_accuracy: Optional[float] = None,
) -> str:
    """The comparison table alone (no plots): what a single run prints at its end."""
    found = _find(dirs, baseline, target_loss, target_accuracy)
    parts = [markdown(found.rows) + "\n\n" + FOOTNOTE] if found.runs else []
    return "\n\n".join(parts + ([ps_report.markdown(found.ps)] if found.ps else []))


def write_report(
    dirs: Sequence[str | Path],
    out: str | Path | None = None,
    baseline: int = 0,
    target_loss: Optional[float] = None,
    target_accuracy: Optional[float] = None,
) -> str:
    """Write comparison.md, the plots and report.html into ``out``; return the Markdown."""
    out = Path(out or dirs[0])
    training = _find(dirs, baseline, target_loss, target_accuracy)
    ps_found, runs, groups, rows = training.ps, training.runs, training.groups, training.rows
    out.mkdir(parents=True, exist_ok=True)
    env, warnings = environment(runs), fairness_warnings(runs)
    images = plot(groups, out) if runs else []
    text = markdown(rows) + "\n\n" + FOOTNOTE if runs else ""
    if ps_found:
        text = (text + "\n\n## Parameter server\n\n" if text else "") + ps_report.markdown(ps_found)
        images.append(ps_report.plot(ps_found, out / "ps.png"))
    if warnings:
        text += "\n\nWARNING: " + "\nWARNING: ".join(warnings)
    inference = inference_results(dirs)
    if inference:
        text += "".join(f"\n\n## Inference ({f})\n\n" + inference_report.markdown(result) for f, result in inference)
    quantized = quantize_report.results(dirs)
    if quantized:
        text += "\n\n## Quantization\n\n" + quantize_report.combined_markdown([report for _, report in quantized])
    found = search_report.searches(dirs, target_accuracy)
    if found:
        text, warnings = _best_against_best(found, text, warnings, images, out)
    (out / "comparison.md").write_text(text + "\n\n## Environment\n\n" + markdown(env) + "\n")
    write_html(
        out / "report.html",
        rows,
        env,
        warnings,
        images,
        inference=inference,
        quantized=quantized,
        ps_found=ps_found,
        best=search_report.rows(found) if found else (),
    )
    return text


def _best_against_best(found, text: str, warnings: List[str], images: List[Path], out: Path):
    """Searches first: one row each, their fairness, search.png; then every trial's table."""
    best = markdown(search_report.rows(found))
    said = "\n".join(f"WARNING: {w}" for w in search_report.fairness(found))
    images.insert(0, search_report.plot(found, out))
    searched = {key for search in found for key in search.space}
    # Trials differ in what was searched by design; the searches' own fairness says the rest.
    kept = [w for w in warnings if not any(w.startswith(f"runs differ in {k} ") for k in searched)]
    return f"## Best against best\n\n{best}\n\n{said}\n\n## Every trial\n\n{text}", kept + search_report.fairness(found)
