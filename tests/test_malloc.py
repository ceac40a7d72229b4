"""trainer.malloc: freed buffers are reused rather than faulted in from the kernel again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# 64 MiB: above the 32 MiB that glibc's dynamic mmap threshold never exceeds on 64-bit, so with
# glibc's defaults such a buffer is mmapped and unmapped every time, as a step's activations can be.
FAULTS_OF_A_REUSED_BUFFER = """
import json, resource, sys
import numpy as np
from unitrain.host import malloc
info = malloc.apply(sys.argv[1])
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = np.empty(64 << 20, dtype=np.uint8)
    buffer.fill(1)
    del buffer
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(json.dumps({"info": info, "faults": [faults() for _ in range(3)]}))
"""
# Faulting 64 MiB in takes at least one fault per 2 MiB, even with transparent huge pages.
LEAST_FAULTS = (64 << 20) // (2 << 20)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_fixed_thresholds_reuse_a_freed_buffer_and_dynamic_ones_fault_it_in_again():
    runs = {}
    for mode in ("fixed", "dynamic"):
        out = subprocess.run(
            [sys.executable, "-c", FAULTS_OF_A_REUSED_BUFFER, mode], capture_output=True, text=True, check=True
        ).stdout
        runs[mode] = json.loads(out)
    assert runs["fixed"]["info"]["applied"] is True and runs["dynamic"]["info"] == {"mode": "dynamic", "applied": False}
    assert max(runs["fixed"]["faults"]) < LEAST_FAULTS <= min(runs["dynamic"]["faults"]), runs
