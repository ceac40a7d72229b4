"""What a results table's header says of the machine that measured it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Dict

from unitrain.host.machine import FLAGS
from unitrain.host.machine import cpu as cpu_info


def framework_version(module: str) -> str:
    # A child interpreter: a framework missing or failing to import gives "?", not the harness's end.
    try:
        return (
            subprocess.run(
                [sys.executable, "-c", f"import {module}; print({module}.__version__)"],
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
    except IndexError:
        return "?"


def machine() -> Dict[str, str]:
    info = cpu_info()
    versions = {module: framework_version(module) for module in ("torch", "paddle")}
    extensions = " ".join(info["extensions"] or []) or "none of " + " ".join(FLAGS)
    # The vendor too: Paddle's MKL chooses its kernels by it (backends/paddle/blas.py).
    return {
        "cpu": f"{info['model'] or platform.processor()} ({info.get('vendor') or 'vendor unknown'})",
        "cores": str(os.cpu_count()),
        "extensions": extensions,
        "python": platform.python_version(),
        **versions,
    }
