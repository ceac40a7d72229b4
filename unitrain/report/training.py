"""Compare runs: ``python -m unitrain.compare <run-or-multirun-dirs...>``.

Reads each run's summary.json, metrics.jsonl and Hydra config, and writes into the output
directory (the first argument by default): comparison.md (also printed), curves.png,
throughput.png, step_time.png and a self-contained report.html. Runs that differ only by
trainer.seed (a seed sweep) or that are repeats of one job (trainer.repeats) are one row, with
the median and the spread over repeats. A ratio whose spread overlaps the baseline's is marked
as within noise rather than presented as a ranking.
"""

from __future__ import annotations

import hashlib
import html
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from unitrain.report import inference as inference_report
from unitrain.report import ps as ps_report
from unitrain.report import quantize as quantize_report
from unitrain.report.tables import figure, html_table, markdown
from unitrain.train.metrics import own_records

# What may differ between compared runs without making the comparison unfair: the axes of
# comparison themselves. Anything else (threads, data, image size, steps...) draws a warning,
# unless a multirun swept it on purpose.
COMPARED_KEYS = (
    "backend",
    "amp",
    "dist",
    "trainer.seed",
    "trainer.repeats",
    "profiler",
    "trainer.progress",
    "trainer.log_every",
)
# Settings that change how a job was run, not what it computed: a resumed run repeats the
# uninterrupted one step for step (tests/test_checkpoint.py), so where it resumed from is no
# reason to doubt the comparison.
SAME_JOB_KEYS = ("trainer.resume",)


@dataclass
class Run:
    dir: Path
    summary: Dict[str, Any]
    metrics: List[Dict[str, float]]
    config: Dict[str, Any]
    swept: List[str] = field(default_factory=list)
    evals: List[Dict[str, float]] = field(default_factory=list)  # held-out evaluations, in order

    @property
    def label(self) -> str:
        s = self.summary
        tuned = " tuned" if settings_of(self) == "tuned" else ""
        return f"{s['backend']}{tuned} {s['precision']['requested']}" + (
            f" x{s['world_size']}" if s["world_size"] > 1 else ""
        )

    @property
    def own_steps(self) -> List[Dict[str, float]]:
        """The steps this run's framework ran (a run resumed from the other framework's
        checkpoint keeps that framework's steps, marked, in its metrics)."""
        return own_records(self.metrics) or self.metrics

    @property
    def config_hash(self) -> str:
        """A hash of everything but the compared axes: equal hashes, equal jobs apart from those."""
        fair = {k: v for k, v in flatten(self.config).items() if not _compared(k, ())}
        return hashlib.sha256(json.dumps(fair, sort_keys=True, default=str).encode()).hexdigest()[:12]

    @property
    def repeat_key(self) -> str:
        """Runs with the same key are repeats of one job (they may differ only by the seed)."""
        config = {k: v for k, v in flatten(self.config).items() if k != "trainer.seed"}
        return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def _compared(key: str, swept) -> bool:
    return any(key == a or key.startswith(a + ".") for a in (*COMPARED_KEYS, *SAME_JOB_KEYS, *swept))


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _hydra_dir(run_dir: Path) -> Optional[Path]:
    for d in (run_dir, run_dir.parent):  # repeats live one level below the job directory
        if (d / ".hydra" / "config.yaml").exists():
            return d / ".hydra"
    return None


def _swept_keys(run_dir: Path) -> List[str]:
    """Keys a multirun swept on purpose (``key=a,b``), from the sweep's multirun.yaml."""
    for d in (run_dir.parent, run_dir.parent.parent):
        if (d / "multirun.yaml").exists():
            from hydra.core.override_parser.overrides_parser import OverridesParser

            task = yaml.safe_load((d / "multirun.yaml").read_text())["hydra"]["overrides"]["task"]
            parsed = OverridesParser.create().parse_overrides(task)
            return [o.key_or_group.lstrip("+~") for o in parsed if o.is_sweep_override()]
    return []


#: What a summary.json must hold to be compared (a run killed before its end has none of it).
REQUIRED = (
    "backend",
    "framework",
    "version",
    "device",
    "threads",
    "seed",
    "world_size",
    "global_batch_size",
    "precision",
    "profiler",
)
FOOTNOTE = (
    "samples/s: median over steps after warm-up (or over repeats); final loss/top-1: mean of the last 10 training "
    "steps "
    "(not the last step's value); held-out: the last evaluation on data the model did not train on."
)


class UnusableRun(ValueError):
    """A run directory whose results cannot be compared; the report goes on without it."""


def _read_run(summary_file: Path) -> Run:
    run_dir = summary_file.parent.resolve()
    try:
        summary = json.loads(summary_file.read_text())
    except ValueError as err:
        raise UnusableRun(f"not valid JSON ({err})") from None
    if not isinstance(summary, dict):
        raise UnusableRun("not a JSON object")
    missing = [k for k in REQUIRED if k not in summary]
    if missing:
        raise UnusableRun(f"incomplete: no {', '.join(missing)}")
    records = []
    metrics_file = run_dir / "metrics.jsonl"
    if metrics_file.exists():
        for number, line in enumerate(metrics_file.read_text().splitlines(), 1):
            try:
                records.append(json.loads(line))
            except ValueError:
                raise UnusableRun(f"{metrics_file.name} line {number} is not valid JSON") from None
    steps = [r for r in records if "loss" in r and "ips" in r]
    if not steps:
        raise UnusableRun("it recorded no training step")
    hydra = _hydra_dir(run_dir)
    return Run(
        dir=run_dir,
        summary=summary,
        metrics=steps,
        config=(yaml.safe_load((hydra / "config.yaml").read_text()) or {}) if hydra else {},
        swept=_swept_keys(run_dir),
        evals=[r for r in records if "val_top1" in r],
    )


def _is_ps(summary_file: Path) -> bool:
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("kind") == "ps"


def load_runs(dirs: Sequence[str | Path], warn=None) -> List[Run]:
    """Every run in the given run, multirun or repeat directories, each once. A run whose
    results are garbled or incomplete is skipped with a one-line warning naming its file."""
    warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))
    found: Dict[Path, Run] = {}
    for d in map(Path, dirs):
        files = [d / "summary.json"] if (d / "summary.json").exists() else sorted(d.rglob("summary.json"))
        unfinished = _unfinished(d)
        for run in unfinished:
            warn(f"unitrain.compare: warning: skipping {run}: it has no summary.json (the run did not finish)")
        if not files and not unfinished:
            raise FileNotFoundError(f"no summary.json in {d} or below it: not a unitrain run or multirun directory")
        for f in files:
            if _is_ps(f):
                continue  # parameter-server jobs have their own table (ps_report)
            try:
                found[f.parent.resolve()] = _read_run(f)
            except (UnusableRun, OSError, yaml.YAMLError) as err:
                warn(f"unitrain.compare: warning: skipping {f}: {err}")
    if not found:
        raise FileNotFoundError(f"no usable run in {', '.join(map(str, dirs))}: every run found was skipped")
    return list(found.values())


def _unfinished(folder: Path) -> List[Path]:
    """Run directories in or under ``folder`` that Hydra started (``.hydra/``) and that hold no
    summary.json, themselves or in a repeat below them: killed, or still running."""
    started = [p.parent.parent for p in sorted(folder.rglob(".hydra/config.yaml"))]
    return [run for run in started if not (run / "summary.json").exists() and not any(run.rglob("*/summary.json"))]


def group_repeats(runs: List[Run]) -> List[List[Run]]:
    """Runs of the same configuration (up to the seed) form one group, in first-seen order."""
    groups: Dict[str, List[Run]] = {}
    for run in runs:
        groups.setdefault(run.repeat_key, []).append(run)
    return list(groups.values())


def _step_ips(run: Run) -> List[float]:
    own = run.own_steps
    warmup = run.summary["profiler"].get("warmup_steps", 0) if run.summary.get("profiler") else 0
    return [r["ips"] for r in own[warmup:]] or [r["ips"] for r in own]


def throughput(group: List[Run]) -> Dict[str, float]:
    """Median samples/s and its spread: over repeats when there are several, else over steps (p10-p90)."""
    if len(group) > 1:
        medians = [statistics.median(_step_ips(r)) for r in group]
        return {
            "median": statistics.median(medians),
            "low": min(medians),
            "high": max(medians),
            "over": f"{len(group)} repeats",
        }
    values = sorted(_step_ips(group[0]))
    pick = lambda q: values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]  # noqa: E731
    return {"median": statistics.median(values), "low": pick(0.1), "high": pick(0.9), "over": f"{len(values)} steps"}


def time_to_loss(run: Run, target: float) -> Optional[float]:
    elapsed = 0.0
    for record in run.metrics:
        elapsed += record["batch_cost"]
        if record["loss"] <= target:
            return elapsed
    return None


def time_to_accuracy(run: Run, target: float) -> Optional[Dict[str, float]]:
    """Wall time (training and evaluation, as MLPerf counts it) and steps until the held-out
    top-1 first reached ``target``, or None."""
    for record in run.evals:
        if record["val_top1"] >= target:
            return {"seconds": record["elapsed_s"], "step": record["step"]}
    return None


def _time_to_accuracy_cell(group: List[Run], target: float) -> str:
    reached = [time_to_accuracy(r, target) for r in group]
    hits = [r for r in reached if r is not None]
    if not hits:
        return "not reached" if any(r.evals for r in group) else "n/a (no held-out set)"
    seconds, steps = [h["seconds"] for h in hits], [h["step"] for h in hits]
    if len(group) == 1:
        return f"{seconds[0]:.1f} s, step {steps[0]}"
    missed = f"; not reached in {len(group) - len(hits)}" if len(hits) < len(group) else ""
    spread = f"{min(seconds):.1f}-{max(seconds):.1f}"
    step = statistics.median(steps)
    return f"{statistics.median(seconds):.1f} s ({spread}), step {step:g} over {len(hits)} repeats{missed}"


def _held_out(group: List[Run], key: str, fmt: str) -> str:
    values = [(r.summary.get("eval") or {}).get(key) for r in group]
    values = [v for v in values if v is not None]
    return format(statistics.fmean(values), fmt) if values else "n/a"


def mixed_framework_warnings(runs: List[Run]) -> List[str]:
    """Runs resumed from the other framework's checkpoint: their steps up to it, the clock
    and the curves are the other framework's, which a time to target would silently count."""
    warnings = []
    for run in runs:
        others = {}
        for record in run.metrics:
            if "framework" in record:
                others.setdefault(record["framework"], []).append(record["step"])
        for framework, steps in others.items():
            warnings.append(
                f"{run.label} ({run.dir.name}) continued a {framework} run: steps {min(steps)}-{max(steps)}, their "
                "time and held-out "
                f"results are {framework}'s, so its time to target and curves mix two frameworks; its samples/s "
                "counts its own steps only"
            )
    return warnings


def fairness_warnings(runs: List[Run]) -> List[str]:
    """What differs between runs beyond the axes being compared, and runs that mix frameworks."""
    if len(runs) < 2:
        return mixed_framework_warnings(runs)
    swept = {k for r in runs for k in r.swept}
    allowed = lambda key: _compared(key, swept)  # noqa: E731
    flat = [flatten(r.config) for r in runs]
    warnings = []
    for key in sorted(set().union(*flat)):
        values = {json.dumps(f.get(key), sort_keys=True, default=str) for f in flat}
        if len(values) > 1 and not allowed(key):
            warnings.append(f"runs differ in {key} ({' vs '.join(sorted(values))}): the comparison would not be fair")
    # Resolved at run time, so the configs can agree (threads: null) while the runs did not.
    for fact, key in (("threads", "trainer.threads"), ("device", "backend.device"), ("image_size", "data.image_size")):
        values = {str(r.summary.get(fact)) for r in runs}
        if len(values) > 1 and not allowed(key) and not any(w.startswith(f"runs differ in {key} ") for w in warnings):
            warnings.append(f"runs differ in {fact} ({' vs '.join(sorted(values))}): the comparison would not be fair")
    # What a backend observed that slowed its own run (summary.json's speed_warnings).
    warnings += sorted({w for r in runs for w in r.summary.get("speed_warnings", [])})
    return warnings + mixed_framework_warnings(runs)


def table_rows(
    groups: List[List[Run]],
    baseline: int = 0,
    target_loss: Optional[float] = None,
    target_accuracy: Optional[float] = None,
) -> List[Dict[str, str]]:
    held_out = any(r.summary.get("eval") for g in groups for r in g)
    # A tuned row is never ranked against a same-settings row: each row's ratio refers to the
    # baseline when their settings agree, else to the first row with the row's own settings.
    settings = [settings_of(g[0]) for g in groups]
    rows = []
    for i, group in enumerate(groups):
        ref = baseline if settings[baseline] == settings[i] else settings.index(settings[i])
        row = _measured(
            group, groups[ref], i == ref, settings[i], "baseline" if ref == baseline else f"baseline ({settings[i]})"
        )
        if held_out:
            row.update(
                {
                    "held-out loss": _held_out(group, "val_loss", ".4f"),
                    "held-out top-1": _held_out(group, "val_top1", ".4f"),
                }
            )
        if target_loss is not None:
            reached = [time_to_loss(r, target_loss) for r in group]
            row["time to loss"] = ", ".join("not reached" if r is None else f"{r:.1f} s" for r in reached)
        if target_accuracy is not None:
            row[f"time to top-1 {target_accuracy:g}"] = _time_to_accuracy_cell(group, target_accuracy)
        rows.append(row)
    return rows


def _measured(
    group: List[Run], reference: List[Run], is_reference: bool, settings: str, reference_name: str
) -> Dict[str, str]:
    """A row's own cells: what ran, its throughput against its reference row's, memory, losses."""
    s, t, base = group[0].summary, throughput(group), throughput(reference)
    finals = [r.summary.get("final") or {} for r in group]
    ratio = t["median"] / base["median"] if base["median"] else float("nan")
    overlap = not is_reference and t["low"] <= base["high"] and base["low"] <= t["high"]
    memory = max((r.summary.get("memory") or {}).get("peak_host_rss_mb", [0]) for r in group)
    p = s["precision"]
    return {
        "backend": s["backend"],
        "model": str((group[0].config.get("model") or {}).get("name", "?")),
        "amp requested": p["requested"],
        "amp effective": p["effective"],
        "world": str(s["world_size"]),
        "global batch": str(s["global_batch_size"]),
        "settings": settings,
        "samples/s": f"{t['median']:.1f}",
        "spread": f"{t['low']:.1f}-{t['high']:.1f} ({t['over']})",
        "vs baseline": reference_name if is_reference else f"x{ratio:.2f}" + (" (within noise)" if overlap else ""),
        "reader ratio": f"{100 * (s.get('profiler') or {}).get('reader_ratio', 0):.1f}%",
        "peak RSS MB": f"{max(memory):.0f}" if memory else "n/a",
        "final loss": _mean_of(finals, "loss", ".4f"),
        "final top-1": _mean_of(finals, "top1", ".3f"),
    }


def settings_of(run: Run) -> str:
    """ "tuned" or "same settings", from what the run recorded (runs that recorded no reading: same)."""
    return (run.summary.get("tuning") or {}).get("settings", "same settings")


def _mean_of(finals: List[Dict[str, Any]], key: str, fmt: str) -> str:
    values = [f[key] for f in finals if key in f]
    return format(statistics.fmean(values), fmt) if values else "n/a"


def environment(runs: List[Run]) -> List[Dict[str, str]]:
    return [
        {
            "run": str(r.dir.name),
            "framework": f"{r.summary['framework']} {r.summary['version']}",
            "device": r.summary["device"],
            "threads": str(r.summary["threads"]),
            "BLAS kernels": r.summary.get("blas", "-"),
            "loader workers": str(r.config.get("data", {}).get("num_workers", "?")),
            "world": str(r.summary["world_size"]),
            "seed": str(r.summary["seed"]),
            "config hash": r.config_hash,
        }
        for r in runs
    ]


def plot(groups: List[List[Run]], out: Path) -> List[Path]:
    """curves.png, held_out.png (when there are evaluations), throughput.png, step_time.png."""
    import matplotlib

    matplotlib.use("Agg")
    files = [_save(_curves(groups), out / "curves.png")]
    if any(r.evals for g in groups for r in g):
        files.append(_save(_held_out_curves(groups), out / "held_out.png"))
    files.append(_save(_throughput_bars(groups), out / "throughput.png"))
    files.append(_save(_step_time_bars(groups), out / "step_time.png"))
    return files


def _curves(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for group in groups:
        for j, run in enumerate(group):
            steps = [r["step"] for r in run.metrics]
            label = run.label if j == 0 else None
            color = None if j == 0 else ax_loss.lines[-1].get_color()
            ax_loss.plot(
                steps, [r["loss"] for r in run.metrics], label=label, color=color, alpha=1.0 if j == 0 else 0.5
            )
            ax_acc.plot(steps, [r["top1"] for r in run.metrics], label=label, color=color, alpha=1.0 if j == 0 else 0.5)
    ax_loss.set(title="training loss", xlabel="step", ylabel="loss")
    ax_acc.set(title="top-1 accuracy (training batches)", xlabel="step", ylabel="top-1", ylim=(0, 1.02))
    ax_loss.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _held_out_curves(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    fig, (ax_step, ax_time) = plt.subplots(1, 2, figsize=(11, 4))
    for group in groups:
        for j, run in enumerate(group):
            if not run.evals:
                continue
            style = {
                "label": run.label if j == 0 else None,
                "alpha": 1.0 if j == 0 else 0.5,
                "marker": "o",
                "markersize": 3,
            }
            line = ax_step.plot([r["step"] for r in run.evals], [r["val_top1"] for r in run.evals], **style)[0]
            ax_time.plot(
                [r["elapsed_s"] for r in run.evals], [r["val_top1"] for r in run.evals], color=line.get_color(), **style
            )
    ax_step.set(title="held-out top-1 by step", xlabel="step", ylabel="held-out top-1")
    ax_time.set(title="held-out top-1 by wall time (training + evaluation)", xlabel="seconds", ylabel="held-out top-1")
    ax_step.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _throughput_bars(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    labels = [g[0].label for g in groups]
    t = [throughput(g) for g in groups]
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(groups)), 4))
    medians = [x["median"] for x in t]
    errors = [[m - x["low"] for m, x in zip(medians, t)], [x["high"] - m for m, x in zip(medians, t)]]
    ax.bar(labels, medians, yerr=errors, capsize=4, color="tab:blue")
    ax.set(title="throughput (median, spread)", ylabel="samples/s")
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return fig


def _step_time_bars(groups: List[List[Run]]):
    import matplotlib.pyplot as plt

    labels = [g[0].label for g in groups]
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(groups)), 4))
    reader = [statistics.median(r["reader_cost"] for r in g[0].own_steps) * 1e3 for g in groups]
    compute = [statistics.median(r["batch_cost"] - r["reader_cost"] for r in g[0].own_steps) * 1e3 for g in groups]
    ax.bar(labels, compute, label="compute", color="tab:orange")
    ax.bar(labels, reader, bottom=compute, label="waiting for data", color="tab:gray")
    ax.set(title="step time breakdown (median)", ylabel="ms per step")
    ax.tick_params(axis="x", rotation=20)
    ax.legend()
    fig.tight_layout()
    return fig


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def inference_results(dirs: Sequence[str | Path], warn=None) -> List[Tuple[Path, Dict[str, Any]]]:
    """Every ``inference.json`` (``python -m unitrain.infer``) in or under the given directories."""
    warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))
    found = []
    for f in sorted({f.resolve() for d in map(Path, dirs) for f in Path(d).rglob("inference.json")}):
        try:
            result = json.loads(f.read_text())
            result["rows"], result["batches"], result["cpu"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            warn(f"unitrain.compare: warning: skipping {f}: {type(err).__name__}: {err}")
            continue
        found.append((f, result))
    return found


def write_html(
    path: Path, rows, env, warnings, images: List[Path], note: str = FOOTNOTE, inference=(), quantized=(), ps_found=()
) -> None:
    """One file with everything inlined (images as data URIs): opens in a browser, no server."""
    imgs = "".join(figure(p, p.stem) for p in images)
    warn = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>unitrain comparison</title><style>"
        "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}"
        ".warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.5em 1em}img{max-width:100%}"
        "</style></head><body><h1>unitrain comparison</h1>"
        + (f"<div class='warn'><strong>Not a fair comparison:</strong><ul>{warn}</ul></div>" if warnings else "")
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


def _training_runs(dirs: Sequence[str | Path], ps_found) -> List[Run]:
    """The training runs; none is fine when the directories hold parameter-server jobs."""
    try:
        return load_runs(dirs)
    except FileNotFoundError:
        if ps_found:
            return []
        raise


def table(
    dirs: Sequence[str | Path],
    baseline: int = 0,
    target_loss: Optional[float] = None,
    target_accuracy: Optional[float] = None,
) -> str:
    """The comparison table alone (no plots): what a single run prints at its end."""
    ps_found = ps_report.results(dirs)
    runs = _training_runs(dirs, ps_found)
    parts = (
        [markdown(table_rows(group_repeats(runs), baseline, target_loss, target_accuracy)) + "\n\n" + FOOTNOTE]
        if runs
        else []
    )
    return "\n\n".join(parts + ([ps_report.markdown(ps_found)] if ps_found else []))


def write_report(
    dirs: Sequence[str | Path],
    out: str | Path | None = None,
    baseline: int = 0,
    target_loss: Optional[float] = None,
    target_accuracy: Optional[float] = None,
) -> str:
    """Write comparison.md, the plots and report.html into ``out``; return the Markdown."""
    ps_found = ps_report.results(dirs)
    runs = _training_runs(dirs, ps_found)
    out = Path(out or dirs[0])
    out.mkdir(parents=True, exist_ok=True)
    groups = group_repeats(runs)
    if runs and not 0 <= baseline < len(groups):
        raise ValueError(f"--baseline {baseline} is out of range: there are {len(groups)} rows (0..{len(groups) - 1})")
    rows = table_rows(groups, baseline, target_loss, target_accuracy) if runs else []
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
    (out / "comparison.md").write_text(text + "\n\n## Environment\n\n" + markdown(env) + "\n")
    write_html(
        out / "report.html", rows, env, warnings, images, inference=inference, quantized=quantized, ps_found=ps_found
    )
    return text
