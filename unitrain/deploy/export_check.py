"""An exported artifact read back and judged: its logits computed by its own deployment runtime
alone (the first one unitrain.infer lists for it) and compared with the checkpoint's model's,
within a tolerance relative to the largest logit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from unitrain.deploy import artifacts
from unitrain.deploy.runtimes import runtimes_for
from unitrain.errors import UnitrainError

#: Held-out images (or token windows) the check runs on (dynamic-batch artifacts also at batch 1).
CHECK_SAMPLES = 8
#: Largest allowed |logit difference|, relative to the largest |logit| (at least 1): fp32
#: rounding only, with room for other CPUs' kernels (docs/export-and-inference.md).
TOLERANCE = 1e-5


class ExportCheckError(UnitrainError):
    """An artifact whose outputs differ from the checkpoint's beyond the tolerance (not kept);
    ``fmt``: its format."""

    fmt: Optional[str] = None


def run_artifact(framework: str, fmt: str, path: Path, inputs: List[np.ndarray]) -> List[np.ndarray]:
    """The artifact's logits for each of ``inputs``, computed by its deployment runtime alone (no
    unitrain model code), loaded once: the first runtime ``unitrain.infer`` lists for it
    (torch.export.load, the Paddle Inference predictor, ONNX Runtime), so the check and the
    benchmark load an artifact the same way."""
    artifact = artifacts.Artifact(path.parent, path.name, framework, fmt, (path.name,), None)
    runtime = runtimes_for(artifact, threads=len(os.sched_getaffinity(0)))[0]
    runtime.load()
    return [np.asarray(runtime.run(runtime.prepare(x))) for x in inputs]


def compare_logits(ref: np.ndarray, got: np.ndarray) -> Dict[str, float]:
    """Largest |difference| and the share of arg maxes that agree: per image, or per position of
    a language model's ``[batch, time, vocab]``."""
    if ref.shape != got.shape:
        raise ExportCheckError(
            f"the artifact gives logits of shape {list(got.shape)}, the checkpoint {list(ref.shape)}"
        )
    return {
        "max_abs_diff": float(np.abs(ref - got).max()),
        "max_abs_logit": float(np.abs(ref).max()),
        "top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
    }


def tile(images: np.ndarray, size: int) -> np.ndarray:
    """``size`` images, repeating the check batch when it is smaller."""
    return np.ascontiguousarray(np.resize(images, (size, *images.shape[1:])) if size > len(images) else images[:size])
