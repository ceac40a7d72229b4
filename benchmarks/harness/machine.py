"""What a results table's header says of the machine that measured it."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Dict

from unitrain.host.machine import FLAGS
from unitrain.host.machine import cpu as cpu_info


def framework_versions(modules=("torch", "paddle")) -> Dict[str, str]:
    """Each module's installed version, read from its distribution's metadata (paddle's is
    paddlepaddle, or paddlepaddle-gpu): importing torch and paddle costs seconds of CPU a run;
    "?" for one that is not installed."""
    found = metadata.packages_distributions()
    versions = {}
    for module in modules:
        try:
            versions[module] = metadata.version(found[module][0])
        except (KeyError, IndexError, metadata.PackageNotFoundError):
            versions[module] = "?"
    return versions


def machine() -> Dict[str, str]:
    info = cpu_info()
    versions = framework_versions()
    extensions = " ".join(info["extensions"] or []) or "none of " + " ".join(FLAGS)
    # The vendor too: Paddle's MKL chooses its kernels by it (backends/paddle/blas.py).
    return {
        "cpu": f"{info['model'] or platform.processor()} ({info.get('vendor') or 'vendor unknown'})",
        "cores": str(os.cpu_count()),
        "extensions": extensions,
        "python": platform.python_version(),
        **versions,
    }
