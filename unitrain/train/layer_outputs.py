"""Two runs' layer outputs, compared layer by layer in execution order (parity, the conversion
check, and where a model draws random numbers)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Tuple

import numpy as np

Outputs = List[Tuple[str, np.ndarray]]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))


def _numbered(outputs: Outputs) -> Iterator[Tuple[str, np.ndarray]]:
    # A layer object can run several times per forward (a block's one ReLU runs twice): pair its
    # n-th call on one framework with its n-th call on the other.
    seen: Dict[str, int] = {}
    for name, out in outputs:
        seen[name] = seen.get(name, 0) + 1
        yield (f"{name}#{seen[name]}" if seen[name] > 1 else name), out


def first_divergence(
    outputs: Outputs, reference: Outputs, tolerance: float, in_both: Callable[[str], bool] = lambda name: False
) -> Dict[str, Any]:
    """Compare layer outputs in execution order; the first beyond ``tolerance``, the worst, and
    how many outputs found no counterpart: a layer one half has and the other computes as a
    function (``F.gelu`` against ``nn.GELU``), which the comparison must not pass over in
    silence. A layer ``in_both`` halves that only one of them calls as a layer (torch's
    MultiheadAttention reads its out_proj's weights without calling it) is not such a case."""
    expected = dict(_numbered(reference))
    compared, first, worst = 0, None, {"layer": None, "rel_diff": 0.0}
    numbered = list(_numbered(outputs))
    if expected.keys() != {name for name, _ in numbered} and len(numbered) == len(expected):
        # A user's pair names its layers its own way on each side: pair them in execution order.
        expected = {name: out for (name, _), (_, out) in zip(numbered, reference)}
    unpaired = []
    for name, out in numbered:
        if name not in expected or expected[name].shape != out.shape:
            unpaired.append(name)
            continue
        rel = _rel(out, expected[name])
        compared += 1
        if rel > worst["rel_diff"]:
            worst = {"layer": name, "rel_diff": rel}
        if first is None and rel > tolerance:
            first = {"layer": name, "rel_diff": rel}
    paired = {name for name, _ in numbered} - set(unpaired)
    unpaired += [name for name in expected if name not in paired]
    unpaired = [name for name in unpaired if not in_both(name.split("#")[0])]
    return {
        "layers_compared": compared,
        "layers_unpaired": len(unpaired),
        "first_unpaired": unpaired[0] if unpaired else None,
        "first_beyond_tolerance": first,
        "largest": worst,
    }


def activations_pass(activations: Dict[str, Any]) -> bool:
    """Every layer output paired and compared: a comparison of none passes nothing."""
    return activations["layers_compared"] > 0 and not activations["layers_unpaired"]
