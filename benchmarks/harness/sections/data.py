"""The reader's share of a step and samples/s against loader workers, synthetic and image-folder data."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List

import numpy as np

from .base import Section

# --quick checks that a section runs and writes its rows, so it measures fewer variants: both
# kinds of data (the image folder is written here), one worker count.
DATA_WORKERS = {True: (0,), False: (0, 1, 2)}


class Data(Section):
    def measure(self) -> List[Dict]:
        folder = self.bench.work / "imagefolder"
        if not folder.exists():
            write_images(folder, self.bench.size.steps * self.bench.batch // 2 + self.bench.batch)
        return [
            self.row(backend, data, workers, [f"data.path={folder}"] if data == "imagefolder" else [])
            for backend in self.bench.backends
            for data in ("synthetic", "imagefolder")
            for workers in DATA_WORKERS[self.quick]
        ]

    def row(self, backend: str, data: str, workers: int, extra: List[str]) -> Dict:
        runs = [
            self.bench.unitrain(backend, f"data={data}", f"data.num_workers={workers}", *extra)
            for _ in range(self.bench.repeats)
        ]
        ratios = [r["reader_ratio"] for r in runs]
        return {
            "backend": backend,
            "data": data,
            "workers": workers,
            "reader_ratio": statistics.median(ratios),
            "reader_ratio_max": max(ratios),
            "ips": statistics.median(r["ips"] for r in runs),
        }


def write_images(folder: Path, per_class: int) -> None:
    """Two classes of random 64x64 PNGs, enough images for every step of a run."""
    from PIL import Image  # only this section reads image files

    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(folder / cls / f"{i}.png")
