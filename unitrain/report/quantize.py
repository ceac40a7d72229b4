"""The quantization table: one row per artifact and runtime, set against the fp32 artifact in
the same runtime, with an ``effective`` column read from the kernels each runtime reported
(never from the method); ``quantize.json`` files found again for sweeps and the comparison report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from unitrain.host.machine import describe_cpu
from unitrain.report import style
from unitrain.report.intervals import how_pairs_ran, ratio_text
from unitrain.report.runs import results_under
from unitrain.tasks.registry import task_of_inputs
from unitrain.tasks.task import Deployed

RESULT = "quantize.json"


def effective(kernels: Optional[Dict[str, int]]) -> str:
    """What ran, from the kernel counts a runtime observed: ``int8`` integer conv/linear kernels,
    ``float`` float ones, ``quantize`` activation (fake-)quantization ops, ``dequantize`` weight
    dequantization ops."""
    if not kernels:
        return "unknown (the runtime reports no kernels)"
    int8, flt = kernels.get("int8", 0), kernels.get("float", 0)
    if int8:
        return "int8 kernels" + (f" ({int8} of {int8 + flt} conv/linear)" if flt else "")
    if kernels.get("quantize", 0):
        return "simulated (fake-quant, fp32 kernels)"
    if kernels.get("dequantize", 0):
        return "int8 weights, fp32 compute"
    return "fp32"


def table(
    rows: List[Dict[str, Any]],
    sizes: Dict[str, int],
    methods: Dict[str, str],
    speedups: Dict[Tuple[str, str], Dict[str, Any]],
) -> List[Dict[str, Any]]:
    """One row per artifact and runtime, set against the fp32 artifact of the same format in
    the same runtime; ``methods`` names the quantized artifacts' methods (the rest are fp32),
    ``speedups`` their speed-ups as interleaved pairs (``deploy.speed_ratio``) by (file, runtime)."""
    out = [_row(r, sizes, methods) for r in rows]
    for row in out:
        _against_fp32(row, out, speedups)
    return out


def _row(r: Dict[str, Any], sizes: Dict[str, int], methods: Dict[str, str]) -> Dict[str, Any]:
    """What one runtime measured of one artifact."""
    return {
        "precision": methods.get(r["name"], "fp32"),
        "framework": r["framework"],
        "format": r["format"],
        "runtime": r["runtime"],
        "file": r["name"],
        "bytes": sizes.get(r["name"]),
        "top1": r.get("accuracy", {}).get("top1"),
        "loss": r.get("accuracy", {}).get("loss"),
        "latency": r.get("latency", {}),
        "effective": effective(r.get("observed", {}).get("kernels")) if "error" not in r else f"FAILED: {r['error']}",
        "kernels": r.get("observed", {}).get("kernels"),
        "baseline_runtime": r.get("baseline_runtime", r["runtime"]),
    }


def _against_fp32(
    row: Dict[str, Any], out: List[Dict[str, Any]], speedups: Dict[Tuple[str, str], Dict[str, Any]]
) -> None:
    """The row's size, top-1 and loss against its fp32 artifact's (same format, its baseline
    runtime), and its measured speed-up."""
    base = next(
        (
            b
            for b in out
            if b["precision"] == "fp32" and b["format"] == row["format"] and b["runtime"] == row["baseline_runtime"]
        ),
        None,
    )
    row["size_vs_fp32"] = row["bytes"] / base["bytes"] if base and row["bytes"] and base["bytes"] else None
    row["top1_delta_points"] = (
        100 * (row["top1"] - base["top1"]) if base and row["top1"] is not None and base["top1"] is not None else None
    )
    row["loss_delta"] = (
        row["loss"] - base["loss"] if base and row["loss"] is not None and base["loss"] is not None else None
    )
    measured = speedups.get((row["file"], row["runtime"]))
    row["speedup"] = (
        {str(measured["batch"]): measured}
        if measured and "batch" in measured
        else ({"error": measured["error"]} if measured else {})
    )


def results(dirs) -> List[Tuple[Path, Dict[str, Any]]]:
    """Every ``quantize.json`` in or under ``dirs`` (a run, a multirun), oldest path first."""
    found = []
    for f in sorted({f.resolve() for d in map(Path, dirs) for f in results_under(d, RESULT)}):
        try:
            report = json.loads(f.read_text())
            report["rows"], report["settings"], report["cpu"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"unitrain: warning: skipping {f}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            continue
        found.append((f, report))
    return found


def combined_rows(reports: List[Dict[str, Any]]) -> List[Dict[str, str]]:
    """The table rows of several quantize runs (a multirun over methods and backends); an fp32
    row that several runs measured is shown once, from the first."""
    rows, seen = [], set()
    for report in reports:
        for row in table_markdown_rows(report):
            key = (row["framework"], row["precision"], row["runtime"], row["file"])
            if key not in seen:
                seen.add(key)
                rows.append(row)
    return rows


def combined_markdown(reports: List[Dict[str, Any]]) -> str:
    runs = ", ".join(sorted({r["framework"] + " " + r["method"] for r in reports}))
    return markdown(reports[0], combined_rows(reports)) + f"\n\nRuns: {len(reports)} ({runs})."


def deployed(report: Dict[str, Any]) -> Deployed:
    """How the quantized model's task shows it, from the input kind the report records (token
    windows in: a language model)."""
    return task_of_inputs([(report.get("input") or {}).get("kind")]).deployed


def table_markdown_rows(report: Dict[str, Any]) -> List[Dict[str, str]]:
    small, large = str(min(report["batches"])), str(max(report["batches"]))
    shown = deployed(report)
    rows = []
    for r in report["rows"]:
        b1, bn = r["latency"].get(small), r["latency"].get(large)
        row = {
            "framework": r["framework"],
            "precision": r["precision"],
            "runtime": r["runtime"],
            "file": r["file"],
            "MB": f"{r['bytes'] / 1e6:.1f}" if r["bytes"] else "-",
            "size vs fp32": f"{r['size_vs_fp32']:.0%}" if r["size_vs_fp32"] else "-",
            shown.top1_label: f"{r['top1']:.4f}" if r["top1"] is not None else "-",
            "vs fp32 (points)": f"{r['top1_delta_points']:+.2f}" if r["top1_delta_points"] is not None else "-",
        }
        if shown.per_position:
            # A language model's accuracy is its loss per token (nats), set against fp32's.
            row["held-out loss"] = f"{r['loss']:.4f}" if r.get("loss") is not None else "-"
            row["loss vs fp32"] = f"{r['loss_delta']:+.4f}" if r.get("loss_delta") is not None else "-"
        row[f"p50 ms (batch {small})"] = f"{b1['p50_ms']:.2f}" if b1 else "-"
        row[f"{shown.rate_unit} (batch {large})"] = f"{bn[shown.rate_key]:.0f}" if bn and shown.rate_key in bn else "-"
        row[f"speed-up (batch {large}, 95% CI)"] = _speedup_cell(r["speedup"], large)
        row["effective"] = r["effective"]
        rows.append(row)
    return rows


def _speedup_cell(speedup: Dict[str, Any], batch: str) -> str:
    if "error" in speedup:
        return f"FAILED: {speedup['error']}"
    return ratio_text(speedup[batch]) if batch in speedup else "-"


def markdown(report: Dict[str, Any], rows: Optional[List[Dict[str, str]]] = None) -> str:
    from unitrain.report.tables import markdown as md_table

    rows = table_markdown_rows(report) if rows is None else rows
    s = report["settings"]
    shown = deployed(report)
    calibration = (
        f"{s['calib_batch_size'] * s['calib_batches']} training {shown.sample_noun}" if s["calib_batches"] else "none"
    )
    if report["method"] == "qat":
        q = s["qat"]
        held = f", fake-quant held-out top-1 {q['held_out']['val_top1']:.4f}" if q.get("held_out") else ""
        how = (
            f"fine-tuned {q['steps']} steps at lr {q['lr']:g} with fake quantization "
            f"(final loss {q['final_loss']:.4f}{held}; ONNX Runtime row: static PTQ)"
        )
    else:
        how = f"calibration: {calibration}"
    return (
        md_table(rows)
        + f"\n\n{report['method']} quantization in {report['framework']} of {report['source']['framework']} "
        f"{report['source']['model']} step {report['source']['step']}; {how}; "
        f"reduce_range (7-bit activations, where honoured): {s['reduce_range']}. Made by: "
        + "; ".join(f"{name}: {by}" for name, by in report.get("made_by", {}).items())
        + (
            f". Held-out next-token top-1 and loss (nats per token) over {report['held_out']} windows of "
            f"{report['input']['max_length']} tokens ({report.get('eval_data') or 'the held-out split'}); tokens/s = "
            f"samples/s x {report['input']['max_length']}; {report['threads']} thread(s) "
            if shown.per_position
            else f". Held-out top-1 over {report['held_out']} samples; {report['threads']} thread(s) "
        )
        + f"for every runtime. CPU: {describe_cpu(report['cpu'], {})} "
        f"(int8 is fast with VNNI or AMX). `effective` is read from the kernels each runtime ran, not from the method. "
        + _speedup_text(report, shown)
        + _deployment_notes(report)
    )


def _speedup_text(report: Dict[str, Any], shown: Deployed) -> str:
    if report.get("pairs") == 0:  # pairs=0: none was measured, and the column says "-"
        return "No speed-ups measured (pairs=0). "
    return (
        f"Speed-up: the median, with its 95% interval, of {report.get('pairs', '?')} interleaved pairs of runs of the "
        "int8 artifact and the same job's fp32 one in the same process and runtime; "
        f"{shown.rate_unit} times each artifact alone, so on a busy machine the two can disagree. " + how_pairs_ran()
    )


def _deployment_notes(report: Dict[str, Any]) -> str:
    """What a user deploying these artifacts trips on, where it applies."""
    notes = []
    if any(r["file"].endswith(".pt2") and r["precision"] != "fp32" for r in report["rows"]):
        notes.append(
            "a quantized .pt2 loads with plain torch.export.load only after `import torchao.quantization.pt2e."
            "quantize_pt2e` (it registers the quantized operators)"
        )
    if any(r["format"] == "onnx" and r["precision"] == "dynamic" for r in report["rows"]):
        notes.append(
            "ONNX Runtime's dynamic quantization computes activation scales per batch, so its accuracy depends on the "
            "batch size"
        )
    if report["method"] == "dynamic":
        notes.append(
            "dynamic int8 speeds up Linear-heavy models (transformers); on convolutional ones it only shrinks the file"
        )
    return "".join(f" Note: {n}." for n in notes)


def plot(rows: List[Dict[str, Any]], batches: List[int], path: Path) -> Path:
    """Held-out top-1 against throughput at the largest batch, one point per artifact and
    runtime; marker area by file size, filled where int8 kernels ran, hollow where not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    large = str(max(batches))
    colors = {"fp32": "#555555", "dynamic": "#1f77b4", "static": "#2ca02c", "qat": "#d62728"}
    unique = {
        (r["framework"], r["precision"], r["runtime"], r["file"]): r for r in reversed(rows)
    }  # a sweep measures fp32 in every job
    points = [r for r in unique.values() if r["top1"] is not None and large in r["latency"]]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    biggest = max([r["bytes"] or 1 for r in points] or [1])
    for r in points:
        int8 = r["effective"].startswith("int8 kernels")
        color = colors.get(r["precision"], "grey")
        ax.scatter(
            r["latency"][large]["throughput_ips"],
            r["top1"],
            s=30 + 400 * (r["bytes"] or 0) / biggest,
            facecolors=color if int8 else "none",
            edgecolors=color,
            marker=style.markers().get(r["framework"], "o"),
        )
        ax.annotate(
            f"{r['framework']} {r['runtime'].split(' (')[0]}",
            (r["latency"][large]["throughput_ips"], r["top1"]),
            fontsize=6,
            xytext=(4, 2),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.set_xlabel(f"throughput at batch {large} (images/s, log scale)")
    ax.set_ylabel("held-out top-1")
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, label=m) for m, c in colors.items()]
    ax.legend(handles=handles, title="method", fontsize=8)
    shapes = " / ".join(f"{'square' if m == 's' else 'circle'} {name}" for name, m in style.markers().items())
    ax.set_title(f"quantization: colour = method, {shapes}, area = file size, filled = int8 kernels ran", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
