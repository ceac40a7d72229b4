"""The translated half's training, checked before a job: what evaluation mode never runs.

``model.<backend>=convert`` is checked layer by layer in evaluation mode (:mod:`unitrain.train.parity`);
code that only training runs (stochastic depth, drop path, an in-place dropout) would pass that
and fail at the job's first step. Here, from the same weights: the translated half's training
forward and backward runs once with its random layers on (a failure: one line, where), then
both halves take one plain step with their random layers off, and the changes of every weight
(the gradients, through the step) are compared. The halves are parity's ``_Side`` objects.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unitrain.errors import ConfigError, UnitrainError
from unitrain.interface.data import data_module
from unitrain.model.translate import ConversionRefused
from unitrain.model.user_code import failed_at
from unitrain.train.layer_outputs import first_divergence

#: Relative difference of the losses that passes (as the forward check's).
TOLERANCE = 1e-4
#: Of a weight's change over one step (its gradient): sums over a batch and a map in another order
#: move a BatchNorm scale's gradient by up to 2e-3 here (EfficientNet, MobileNetV3, Swin) while
#: the losses agree to 1e-7; a conversion that computes otherwise moves weights by whole parts.
GRADIENT_TOLERANCE = 1e-2
#: Random layers turned off one by one, at most.
_MAX_RANDOM = 32


def first_random_layer(side: Any, dataset: Any, batch_size: int, seed: int) -> Optional[str]:
    """The first layer whose training-mode output differs between two forwards of one batch from
    the same weights, seeded apart: where the model draws random numbers (dropout, stochastic
    depth; a random function inside a layer shows at the next layer); None if it draws none.
    Its state (BatchNorm's running statistics) is put back."""
    inputs, _ = _batch(side, dataset, batch_size)
    state = side.backend.state_arrays(side.model)
    runs = []
    for offset in (1, 2):
        side.backend.seed(seed + offset)
        with side.backend.capture_outputs(side.model) as outputs:
            side.model(inputs)
        runs.append(outputs)
    side.backend.load_state_arrays(side.model, state)
    found = first_divergence(runs[0], runs[1], 0.0)["first_beyond_tolerance"]
    return found["layer"].split("#")[0] if found else None


def _batch(side: Any, dataset: Any, batch_size: int) -> Any:
    batch = list(range(min(batch_size, len(dataset))))
    return next(iter(data_module(side.name).make_loader(dataset, [batch])))


def _random_layers_off(sides: List[Any], dataset: Any, batch_size: int, seed: int) -> Dict[str, Any]:
    """Each random layer the reference half (``sides[-1]``) shows, in evaluation mode on both
    halves (no draw); ``off`` lists them. ``drawn_outside`` names one that evaluation mode does
    not stop (a random function called by a layer's parent): the step is then not compared."""
    off: List[str] = []
    for _ in range(_MAX_RANDOM):
        layer = first_random_layer(sides[-1], dataset, batch_size, seed)
        if layer is None:
            return {"off": off, "drawn_outside": None}
        if layer in off:
            break
        off.append(layer)
        for side in sides:
            found = layer_named(side.model, layer)
            if found is not None:
                turn_off(found)
    return {"off": off, "drawn_outside": off[-1]}


def layer_named(model: Any, name: str) -> Any:
    """The layer of ``model`` at a dotted name (``lstm``, ``blocks.1.drop``), leaf or not, or None.
    A layer one framework holds whole may be a parent in the other: torch's ``nn.LSTM`` is one
    layer, Paddle's ``paddle.nn.LSTM`` a list of cells (``lstm.0.cell``) whose own forward draws
    the dropout between them. Both frameworks reach a sub-layer as an attribute of its parent (a
    list's items by index)."""
    layer = model
    for part in name.split("."):
        layer = getattr(layer, part, None)
        if layer is None:
            return None
    return layer if callable(getattr(layer, "eval", None)) else None


def turn_off(layer: Any) -> None:
    """``layer`` draws no random numbers from now on, alike in both frameworks. A recurrent layer
    (``nn.LSTM(..., dropout=0.1)``, ``paddle.nn.LSTM``, GRU, RNN: a number ``dropout``) keeps
    training mode with its dropout between layers 0: Paddle's fused rnn operator has no backward
    in evaluation mode ("Tensor holds no memory"), nor has cuDNN's. Anything else (dropout,
    stochastic depth, drop path) is put in evaluation mode, it and its sub-layers."""
    rate = getattr(layer, "dropout", None)
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        layer.dropout = 0.0
    else:
        layer.eval()


def _train_once(side: Any, dataset: Any, batch_size: int) -> None:
    """A training forward and backward (random layers on); the gradients then dropped."""
    inputs, labels = _batch(side, dataset, batch_size)
    side.backend.loss(side.model(inputs), labels).backward()
    side.optimizer.zero_grad()


def check_training(
    converted: Any,
    source: Any,
    dataset: Any,
    batch_size: int,
    seed: int,
    where: str,
    written: Optional[Tuple[str, str]] = None,
) -> Dict:
    """See the module's docstring. ``where`` starts each refusal (``model.paddle=convert: ...``);
    ``written``: (model.<source>, its factory path), named where the source half's own training
    fails too. Returns what was compared: the random layers turned off, the loss's and the
    weights' changes' largest relative differences (the weight named)."""
    for side in (converted, source):
        side.model.train()
    state = converted.backend.state_arrays(converted.model)
    try:
        _train_once(converted, dataset, batch_size)
    except (UnitrainError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - the translated code failing in training: one line, where
        _source_trains(source, dataset, batch_size, written)
        raise ConversionRefused(
            f"{where} in training mode (random layers on) the converted half failed at {failed_at(err)}; allowed: "
            f"code that converts to calls the framework takes (see docs/models.md), or a half of your own"
        ) from None
    converted.backend.load_state_arrays(converted.model, state)  # its BatchNorm statistics as they were
    random = _random_layers_off([converted, source], dataset, batch_size, seed)
    if random["drawn_outside"]:
        return {"compared": False, "random_layers_off": random["off"], "drawn_outside": random["drawn_outside"]}
    result = _compare_step(converted, source)
    if result["loss_rel_diff"] > TOLERANCE or result["largest_change"]["rel_diff"] > GRADIENT_TOLERANCE:
        worst, off = result["largest_change"], ", ".join(random["off"]) or "none"
        raise ConversionRefused(
            f"{where} one training step from the same weights (random layers off: {off}) moves the converted "
            f"half's {worst['weight']} by {worst['rel_diff']:.2e} (relative) from the source half's, the losses "
            f"{result['loss_rel_diff']:.2e} apart (at most {GRADIENT_TOLERANCE:g} and {TOLERANCE:g} pass); allowed: "
            "a model whose conversion computes the same gradients (see docs/models.md), or a half of your own"
        )
    return {"compared": True, "random_layers_off": random["off"], **result}


def _source_trains(source: Any, dataset: Any, batch_size: int, written: Optional[Tuple[str, str]]) -> None:
    """The source half's own training forward and backward, where the converted half's failed:
    failing too, it is the user's model (its file and line), not the conversion."""
    if written is None:
        return
    state = source.backend.state_arrays(source.model)
    try:
        _train_once(source, dataset, batch_size)
    except (UnitrainError, MemoryError):
        raise
    except Exception as own:  # noqa: BLE001 - the user's code failing in training: one line, where
        raise ConfigError(
            *written, f"a model that trains (forward and backward in training mode); it failed at {failed_at(own)}"
        ) from None
    source.backend.load_state_arrays(source.model, state)


def _compare_step(converted: Any, source: Any) -> Dict[str, Any]:
    """One plain step of each half: the losses' and each weight's change's relative differences.
    A change is set against its own size, with a floor of a thousandth of the largest change: a
    weight that barely moves (behind a zero-initialised scale) is not all rounding."""
    before = source.canonical(source.backend.state_arrays(source.model))
    (loss_c, after_c), (loss_s, after_s) = converted.step(False, 0.0), source.step(False, 0.0)
    changes = {
        k: (after_c[k] - value, after_s[k] - value)
        for k, value in before.items()
        if np.issubdtype(value.dtype, np.floating) and value.size
    }
    floor = 1e-3 * max((float(np.max(np.abs(s))) for _, s in changes.values()), default=0.0) + 1e-12
    rel = {k: float(np.max(np.abs(c - s))) / max(float(np.max(np.abs(s))), floor) for k, (c, s) in changes.items()}
    weight = max(rel, key=rel.get, default=None)
    return {
        "loss_rel_diff": abs(loss_c - loss_s) / max(abs(loss_s), 1e-12),
        "largest_change": {"weight": weight, "rel_diff": rel.get(weight, 0.0)},
    }
