"""results.md: a header naming the machine and the settings, then one table per measured section."""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Tuple

Column = Tuple[str, Callable[[Dict], str]]


class Table(NamedTuple):
    section: str  # whose rows it shows: the start-up table shows the overhead section's
    text: List[str]  # its heading, and what to know before reading it
    columns: List[Column]


def image(r: Dict) -> str:
    return f"{r['model']} {r['image_size']}x{r['image_size']}"


def ci_text(key: str) -> Callable[[Dict], str]:
    """A median and its interval, as a row holds them in ``key`` and ``key_ci``."""
    return lambda r: f"{r[key]:.3f} [{r[key + '_ci'][0]:.3f}, {r[key + '_ci'][1]:.3f}]"


def spread_text(key: str, digits: int) -> Callable[[Dict], str]:
    """A median and its min-max over repeats, as a row holds them in ``key``, ``key_min``, ``key_max``."""
    return lambda r: f"{r[key]:.{digits}f} ({r[key + '_min']:.{digits}f}-{r[key + '_max']:.{digits}f})"


def text(key: str) -> Callable[[Dict], str]:
    return lambda r: r[key]


def count(key: str) -> Callable[[Dict], str]:
    return lambda r: str(r[key])


OVERHEAD = Table(
    "overhead",
    [
        "## Overhead: unitrain / native step time (target <= 1.01)\n",
        "Natives share only the dataset with unitrain (their own ResNets). Ratio: median over interleaved pairs "
        "of the runs' median step times, [bootstrap 95% confidence interval]; CPU: the same for the process's CPU "
        "time per step.\n",
    ],
    [
        ("model", image),
        ("backend", text("backend")),
        ("processes x threads", lambda r: f"{r['processes']} x {r['threads']}"),
        ("unitrain ms/step", lambda r: f"{r['unitrain_step_ms']:.1f}"),
        ("native ms/step", lambda r: f"{r['native_step_ms']:.1f}"),
        ("ratio", ci_text("ratio")),
        ("CPU ratio", ci_text("cpu_ratio")),
        ("pairs", count("pairs")),
    ],
)
LOOP = Table(
    "loop",
    [
        "\n## The loop alone: Trainer.train_step / a hand-written step, alternating in one process\n",
        "Same model, optimizer and batches; median over steps of the per-step ratio, [bootstrap 95% CI].\n",
    ],
    [
        ("model", image),
        ("backend", text("backend")),
        ("unitrain ms/step", lambda r: f"{r['unitrain_step_ms']:.1f}"),
        ("by hand ms/step", lambda r: f"{r['by_hand_step_ms']:.1f}"),
        ("ratio", ci_text("ratio")),
        ("CPU ratio", ci_text("cpu_ratio")),
        ("steps", count("steps")),
    ],
)
STARTUP = Table(
    "overhead",
    ["\n## Start-up: seconds from command to first step\n"],
    [
        ("model", text("model")),
        ("backend", text("backend")),
        ("processes", count("processes")),
        ("unitrain s", lambda r: f"{r['unitrain_startup_s']:.2f}"),
        ("native s", lambda r: f"{r['native_startup_s']:.2f}"),
    ],
)
DATA = Table(
    "data",
    ["\n## Data loading (target: reader ratio < 2% with workers)\n"],
    [
        ("backend", text("backend")),
        ("data", text("data")),
        ("workers", count("workers")),
        ("reader ratio", lambda r: f"{100 * r['reader_ratio']:.2f}%"),
        ("samples/s", lambda r: f"{r['ips']:.1f}"),
    ],
)
SCALING = Table(
    "scaling",
    [
        "\n## Data-parallel scaling on this machine (efficiency = ips(2x1) / (2 ips(1x1)))\n",
        "The frameworks' all-reduce levers, and the ceiling: two independent 1 x 1 jobs at once, with no all-reduce.\n",
    ],
    [
        ("backend", text("backend")),
        ("variant", lambda r: r.get("variant", "default")),
        ("1 proc x 1 thread", lambda r: f"{r['ips_1x1']:.1f}"),
        ("2 procs x 1 thread", lambda r: f"{r['ips_2x1']:.1f}"),
        ("efficiency", spread_text("efficiency", 2)),
        (
            "all-reduce buckets (MB)",
            lambda r: ", ".join(f"{b:g}" for b in r["buckets"]) if r.get("buckets") else "-",
        ),
    ],
)
COMPRESSION = Table(
    "compression",
    ["\n## What fp16 gradient compression costs (torch, 2 x 1, held-out top-1 over seeds)\n"],
    [
        ("data", lambda r: f"{r['data']}, {r['steps']} steps"),
        ("grad_compression", text("grad_compression")),
        ("held-out top-1", spread_text("val_top1", 4)),
        ("samples/s", lambda r: f"{r['ips']:.1f}"),
    ],
)
MAXBATCH = Table(
    "maxbatch",
    ["\n## Largest batch that fits (python -m unitrain.maxbatch)\n"],
    [
        ("backend", text("backend")),
        ("model", image),
        ("memory limit", lambda r: f"{r['memory_limit_mb']:.0f} MiB"),
        ("largest batch", lambda r: f"{r['max_batch_size']} (+-{r['resolution']})"),
        ("peak at it", lambda r: f"{r['peak_mb_at_max']:.0f} MiB" if r["peak_mb_at_max"] else "-"),
        ("trials", count("trials")),
    ],
)
TUNED = Table(
    "tuned",
    [
        "\n## Each framework at its best: backend.tuned=true against the same settings\n",
        "Speed-up: median over interleaved pairs of tuned / same-settings samples/s, [bootstrap 95% CI]; applied: "
        "what the framework reported it did.\n",
    ],
    [
        ("model", image),
        ("backend", text("backend")),
        ("tuned_settings", lambda r: r.get("variant", "default").replace(",", ", ")),
        ("same settings samples/s", lambda r: f"{r['same_ips']:.1f}"),
        ("tuned samples/s", lambda r: f"{r['tuned_ips']:.1f}"),
        ("speed-up", ci_text("speedup")),
        ("applied", lambda r: "; ".join(r["applied"]) or "nothing"),
        ("pairs", count("pairs")),
    ],
)
AMP = Table(
    "amp",
    ["\n## Mixed precision (bfloat16)\n"],
    [
        ("backend", text("backend")),
        ("amp", text("amp")),
        ("effective", text("effective")),
        ("samples/s", spread_text("ips", 1)),
        ("vs O0", lambda r: f"{r['vs_O0']:.2f}"),
    ],
)
#: In the order results.md shows them; a section without rows has no table.
TABLES = (OVERHEAD, LOOP, STARTUP, DATA, SCALING, COMPRESSION, MAXBATCH, TUNED, AMP)


def markdown(results: Dict) -> str:
    out = [header(results)]
    for table in TABLES:
        rows = results.get(table.section)
        if rows:
            out += [*table.text, draw(results, rows, table.columns)]
    return "\n".join(out) + "\n"


def header(results: Dict) -> str:
    m = results["machine"]
    where = (
        f"# unitrain benchmarks\n\n{m['cpu']}, {m['cores']} cores ({m.get('extensions', '?')}), Python "
        f"{m['python']}, torch {m['torch']}, paddle {m['paddle']}; "
    )
    c = results.get("config")
    if not c:  # --combine: rows of several runs, each saying which
        return where + "rows measured in separate runs of the harness, each named in its measured column.\n"
    return where + (
        f"{c['model']} at {c['image_size']}x{c['image_size']}, batch {c['batch_size']} per process, {c['steps']} "
        f"steps ({c['warmup']} left out as warm-up), {c['repeats']} repeat(s); medians, with min-max over repeats.\n"
    )


def draw(results: Dict, rows: List[Dict], cols: List[Column]) -> str:
    # Rows kept from an earlier run of the harness say when (and, if elsewhere, where) they ran.
    if any(r.get("measured_at") != results.get("started") for r in rows):
        cols = [*cols, ("measured", lambda r: provenance(results, r))]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt(r) for _, fmt in cols) + " |" for r in rows]
    return "\n".join(lines)


def provenance(results: Dict, row: Dict) -> str:
    """The run that measured a row, and its machine where that is not the header's."""
    when = row.get("measured_at", "?")
    machine_ = results.get("runs", {}).get(when, {}).get("machine")
    if machine_ and (machine_.get("cpu"), machine_.get("extensions")) != (
        results["machine"].get("cpu"),
        results["machine"].get("extensions"),
    ):
        return f"{when} on {machine_['cpu']} ({machine_.get('extensions', '?')})"
    return when
