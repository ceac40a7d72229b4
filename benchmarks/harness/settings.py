"""What the harness measures, as the command line can narrow it: backends, sections, sizes, layouts."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

#: benchmarks/: the native scripts, loop_overhead.py and the default --out are found from it.
BENCHMARKS = Path(__file__).resolve().parents[1]
BACKENDS = ("paddle", "torch")
SECTIONS = ("overhead", "loop", "data", "scaling", "compression", "tuned", "maxbatch", "amp")


class Size(NamedTuple):
    model: str
    image: int
    steps: int
    warmup: int


#: The overhead section's networks: the natives build their own, so no "tiny" there. ResNet50 at
#: 64x64 is the product's model; 12 steps as in the issue that measured the gap (0.2 s a step).
#: vit_small is the transformer family's benchmark size.
OVERHEAD_SIZES = {
    True: [Size("resnet18", 16, 3, 1)],
    False: [Size("resnet18", 32, 30, 5), Size("resnet50", 64, 12, 2), Size("vit_small", 32, 30, 5)],
}
#: (processes, threads) on 2 cores, as --layouts spells them.
LAYOUTS = ((1, 2), (2, 1))
