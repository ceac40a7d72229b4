"""``python -m unitrain.quantize <run dir | checkpoint | latest> method=dynamic|static|qat [backend=torch|paddle]``

Post-training (dynamic, static) or quantization-aware training, in the framework's own toolkit
and in ONNX Runtime, then every int8 artifact set against the fp32 export of the same
checkpoint in the same runtime; the work is :mod:`unitrain.deploy.quantize`'s.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from unitrain.config.schema import register_configs
from unitrain.deploy.quantize import quantize, validate
from unitrain.errors import Refusal, UnitrainError
from unitrain.launch.hydra import discard_refused, hydra_entry
from unitrain.report.quantize import RESULT, markdown

register_configs()


@hydra.main(version_base=None, config_path="pkg://unitrain.conf", config_name="quantize")
def _main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    os.environ.setdefault("GLOG_minloglevel", "2")
    try:
        report = quantize(cfg, out_dir)
    except UnitrainError as err:
        print(f"unitrain.quantize: error: {err}", file=sys.stderr, flush=True)
        if isinstance(err, Refusal):
            # What this run made before the refusal (the fp32 export it set the int8 against) goes too.
            for made in ("fp32", "int8", "qat"):
                shutil.rmtree(out_dir / made, ignore_errors=True)
            discard_refused(out_dir)
        sys.exit(2)
    print("\n" + markdown(report) + f"\n\n{RESULT}: {out_dir / RESULT}", flush=True)
    if any(r["effective"].startswith("FAILED") for r in report["rows"]):
        sys.exit(1)


def main() -> None:
    # ``python -m unitrain.quantize <run dir> method=static``: the first bare argument is the source.
    args = sys.argv[1:]
    bare = [i for i, a in enumerate(args) if "=" not in a and not a.startswith("-")]
    if bare:
        args[bare[0]] = f"source={args[bare[0]]}"
    sys.argv[1:] = args
    hydra_entry("unitrain.quantize", _main, config_name="quantize", validate=validate)


if __name__ == "__main__":
    from unitrain.host.processes import run_command

    run_command(main)
