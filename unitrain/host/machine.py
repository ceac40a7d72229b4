"""What this machine's CPU can do: recorded beside every timing, because machines differ.

Int8 and bf16 speed on a CPU depends on instruction-set extensions (VNNI and AMX for int8,
AVX512-BF16 and AMX-BF16 for bf16); one machine of this project had AVX2 only, another
AVX-512 with VNNI and bf16.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from typing import Dict, List

#: The extensions that decide vectorised fp32, int8 and bf16 speed, as /proc/cpuinfo names them.
FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


@functools.lru_cache(maxsize=None)
def cpu() -> Dict[str, object]:
    """Model name, vendor, logical CPUs and which of :data:`FLAGS` this CPU has (Linux; elsewhere
    unknown). The vendor matters too: some math libraries choose their kernels by it."""
    model, vendor, flags, count = platform.processor() or None, None, set(), 0
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "processor":
                    count += 1
                elif key == "model name" and model in (None, "", platform.processor()):
                    model = value.strip()
                elif key == "vendor_id" and vendor is None:
                    vendor = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        return {"model": model, "vendor": None, "logical_cpus": None, "extensions": None}
    extensions: List[str] = [f for f in FLAGS if f in flags]
    return {"model": model, "vendor": vendor, "logical_cpus": count, "extensions": extensions}


#: Variables that choose which kernels the math libraries run, and so the order of their sums:
#: results that agree only to rounding (parity) differ with them, as with the CPU's extensions.
KERNEL_ENV = (
    "MKL_DEBUG_CPU_TYPE",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
)


def kernel_env() -> Dict[str, str]:
    """Those of :data:`KERNEL_ENV` set in this process."""
    return {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}


def describe_cpu(c: Dict[str, object], env: Dict[str, str]) -> str:
    """One line from a recorded :func:`cpu` and :func:`kernel_env`: model, logical CPUs,
    extensions, and the kernel-choosing variables that were set."""
    extensions = ", ".join(c["extensions"] or ()) or "none of AVX2/AVX-512/VNNI/AMX/bf16"
    line = f"{c['model']}, {c['logical_cpus']} logical CPUs, extensions: {extensions}"
    return line + (f"; {', '.join(f'{k}={v}' for k, v in env.items())}" if env else "")


def unitrain_version() -> str:
    """The installed unitrain's version, as pip recorded it from pyproject.toml (its one source)."""
    try:
        return importlib.metadata.version("unitrain")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"
