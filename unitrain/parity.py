"""``python -m unitrain.parity model=resnet18 steps=20``: do both frameworks compute the same thing?

Both backends run in this one process, in fp32, from the same initial weights on the same
batches, with the same threads; per step it reports each loss, their differences, the largest
parameter difference and that of BatchNorm's running statistics, and on the first batch the
first layer whose output differs. Writes parity.json and parity.png into the run directory and
exits 1 when a difference exceeds ``tolerance``; the work is :mod:`unitrain.train.parity`'s, the
plot :mod:`unitrain.report.parity`'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from unitrain.config.schema import register_configs
from unitrain.errors import Refusal, UnitrainError
from unitrain.launch.hydra import discard_refused, hydra_entry
from unitrain.report.parity import format_table, plot
from unitrain.train.parity import run_parity, validate

register_configs()


@hydra.main(version_base=None, config_path="pkg://unitrain.conf", config_name="parity")
def _main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        report = run_parity(cfg, out_dir)
        plot(report["per_step"], report["frameworks"], cfg.tolerance, out_dir / "parity.png")
    except UnitrainError as err:
        print(f"unitrain.parity: error: {err}", file=sys.stderr, flush=True)
        if isinstance(err, Refusal):
            discard_refused(out_dir)
        sys.exit(2)
    print(format_table(report) + f"\n\nwritten: {out_dir / 'parity.json'}, {out_dir / 'parity.png'}", flush=True)
    if not report["passed"]:
        sys.exit(1)


def main() -> None:
    hydra_entry("unitrain.parity", _main, config_name="parity", validate=validate)


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
