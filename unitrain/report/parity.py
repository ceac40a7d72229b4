"""The parity table and plot: both frameworks' losses and differences, step by step."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from unitrain.host import machine


def plot(records: List[Dict[str, float]], frameworks: List[str], tolerance: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (ax_loss, ax_diff) = plt.subplots(1, 2, figsize=(11, 4))
    for name, style in zip(frameworks, ("-", "--")):
        ax_loss.plot(steps, [r[f"loss_{name}"] for r in records], style, label=name)
    ax_loss.set(title="loss, same weights and batches", xlabel="step", ylabel="loss")
    ax_loss.legend()
    floor = 1e-12  # a log axis cannot show an exact zero
    ax_diff.semilogy(steps, [max(r["rel_diff"], floor) for r in records], label="relative loss difference")
    ax_diff.semilogy(steps, [max(r["max_param_diff"], floor) for r in records], label="max parameter difference")
    ax_diff.semilogy(
        steps,
        [max(r["running_stat_rel_diff"], floor) for r in records],
        label="BatchNorm running statistics (relative)",
    )
    ax_diff.axhline(tolerance, color="red", linestyle=":", label=f"tolerance {tolerance:g}")
    ax_diff.set(title="divergence between frameworks", xlabel="step")
    ax_diff.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(report: Dict[str, Any]) -> str:
    a, b = report["frameworks"]
    lines = [
        f"| step | loss {a} | loss {b} | abs diff | rel diff | max param diff | BN stats rel diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["per_step"]:
        lines.append(
            f"| {r['step']} | {r[f'loss_{a}']:.6f} | {r[f'loss_{b}']:.6f} | {r['abs_diff']:.2e} | {r['rel_diff']:.2e} "
            f"| {r['max_param_diff']:.2e} | {r['running_stat_rel_diff']:.2e} |"
        )
    a = report["first_batch_activations"]
    first = a["first_beyond_tolerance"]
    lines.append(
        f"\nfirst batch, {a['layers_compared']} layer outputs compared: "
        + (
            f"first beyond {a['tolerance']:g} is {first['layer']} ({first['rel_diff']:.2e})"
            if first
            else f"all within {a['tolerance']:g}"
        )
        + f"; largest {a['largest']['layer']} ({a['largest']['rel_diff']:.2e})"
    )
    if report.get("random_layer"):
        lines.append(
            f"RANDOM: the model draws random numbers in training, first at {report['random_layer']} (dropout, "
            "stochastic depth): the frameworks' generators differ, so no two steps can agree; turn them off (their "
            "rate 0, e.g. through model.kwargs) and run parity again"
        )
    if a.get("layers_unpaired") or not a["layers_compared"]:
        lines.append(
            f"NOT COMPARED: {a.get('layers_unpaired', 0)} layer output(s) without a counterpart in the other half "
            f"(first: {a.get('first_unpaired')}); the halves differ in which layers they have (a module on one side, "
            "a function call on the other): make them match, or the comparison passes nothing"
        )
    lines.append(f"CPU: {machine.describe_cpu(report['cpu'], report['kernel_env'])}")
    within = max(report["max_rel_loss_diff"], report["max_running_stat_rel_diff"]) <= report["tolerance"]
    verdict = "within" if within else "BEYOND"
    lines.append(
        f"max relative loss difference {report['max_rel_loss_diff']:.2e}, BatchNorm running statistics "
        f"{report['max_running_stat_rel_diff']:.2e}: {verdict} tolerance {report['tolerance']:g}"
    )
    return "\n".join(lines)
