"""Which code path Paddle's bundled MKL runs, and its AVX2 path on CPUs that are not Intel's.

Paddle's CPU wheels carry MKL 2019.0.5 (``paddle/libs/libmklml_intel.so``); its CPU convolutions
(im2col, then MKL's sgemm) and matmuls run there. MKL of that age chooses its kernels by CPU
vendor as well as by instruction set: on a CPU that is not Intel's it runs its generic kernels,
whatever extensions the CPU has, at a fraction of the speed of its AVX2 kernels (the figures:
benchmarks/README.md, "Paddle's MKL on AMD CPUs"). MKL of that age reads ``MKL_DEBUG_CPU_TYPE``
once, when it first dispatches, and ``5`` selects its AVX2 kernels (MKL 2020 Update 1 and later
ignore the variable). torch's convolutions run in oneDNN, which chooses by instruction set alone.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any, Dict, Optional

import paddle

from unitrain.host import machine

AVX2 = 5
# What mkl_serv_cpu_detect() answers, as far as observed here: 0 with no variable on AMD, and
# the MKL_DEBUG_CPU_TYPE value it was given (5 for the AVX2 kernels). Others are shown as numbers.
_CODE_PATHS = {0: "generic", AVX2: "AVX2"}
_LIBRARY = Path(paddle.__file__).parent / "libs" / "libmklml_intel.so"


def _mkl() -> Optional[ctypes.CDLL]:
    # The library Paddle has already loaded: CDLL of the same file returns that same instance.
    return ctypes.CDLL(str(_LIBRARY)) if _LIBRARY.exists() else None


def code_path() -> Optional[Dict[str, Any]]:
    """The MKL version and the code path its BLAS runs in this process; None without MKL.

    Asking makes MKL choose, for the rest of the process, if it has not yet: call it after the
    work it describes, never before :func:`force_avx2` could still take effect."""
    mkl = _mkl()
    if mkl is None:
        return None
    version = ctypes.create_string_buffer(256)
    mkl.MKL_Get_Version_String(version, len(version))
    words = version.value.decode(errors="replace").split()
    number = next((w for w in words if w[:1].isdigit()), "?")
    detected = int(mkl.mkl_serv_cpu_detect())
    return {
        "library": f"MKL {number}",
        "code_path": _CODE_PATHS.get(detected, f"code path {detected}"),
        "detected": detected,
    }


def avx2_not_applicable() -> Optional[str]:
    """Why forcing MKL's AVX2 kernels does not apply on this machine, or None where it does."""
    cpu = machine.cpu()
    if not _LIBRARY.exists():
        return f"this Paddle carries no MKL ({_LIBRARY.name} is absent)"
    if cpu.get("vendor") == "GenuineIntel":
        return "an Intel CPU: MKL picks its best kernels itself"
    if not {"avx2", "fma"} <= set(cpu.get("extensions") or ()):
        return "the CPU lacks AVX2 or FMA, which MKL's AVX2 kernels need"
    return None


def force_avx2() -> None:
    """Ask MKL for its AVX2 kernels; it takes effect only if MKL has not dispatched yet."""
    os.environ["MKL_DEBUG_CPU_TYPE"] = str(AVX2)
