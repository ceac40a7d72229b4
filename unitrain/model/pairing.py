"""Weights between the two halves of a user's model pair, matched parameter by parameter.

A pair written twice (by hand, or by a converter such as PaConvert or X2Paddle) keeps the same
structure but not always the same names. Each framework's state is first put in the canonical
layout (its backend's ``weights`` module renames what the framework names its own way, and
Linear weights become [out, in]; embeddings and convolutions are not transposed). Then:

1. a user's mapping file (``model.mapping``) names the pairs it knows;
2. the rest match by canonical name, when both sides hold the same names;
3. otherwise by order and shape: the n-th parameter of one with the n-th of the other, each
   pair with the same canonical shape.

A state may name one tensor twice: a framework's second name for it (Paddle's RNN layers name each
weight again per cell: ``lstm.0.cell.weight_ih`` is ``lstm.weight_ih_l0``), or weights a model ties
(an output layer sharing its embedding's weight). Such an alias is matched through the name it
aliases and given the same value, never matched on its own (:func:`tied`).

Anything else stops with one line naming the first parameter that cannot be matched: a silently
wrong conversion would make every later comparison meaningless.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from unitrain.errors import Refusal
from unitrain.interface.weights import weights_module
from unitrain.spec.initial_weights import generic_init

Arrays = Dict[str, np.ndarray]
#: Kept by torch's BatchNorm, with no counterpart elsewhere (unitrain.model.weights).
_COUNTERS = (".num_batches_tracked",)
_RUNNING_STATISTICS = ("running_mean", "running_var")


class PairingError(Refusal):
    """Two parameter lists that cannot be matched one to one: refused, nothing is left behind."""

    exit_code = 2


@dataclass(frozen=True, kw_only=True)
class Param:
    name: str  # the framework's own
    canonical: str  # after its backend's renaming
    shape: Tuple[int, ...]  # canonical layout
    transposed: bool  # stored [in, out]: transposed on the way to canonical and back
    #: The name of the state this one aliases (the same tensor), or None.
    alias_of: Optional[str] = None


#: A state's structure: its framework, and its names and shapes in order.
Structure = Tuple[str, Tuple[Tuple[str, Tuple[int, ...]], ...]]
#: What :func:`tied` found per structure, for the tables made from a state without its model (a
#: checkpoint's arrays, model.init=shared's draws): alias -> the name it aliases.
_TIED: Dict[Structure, Dict[str, str]] = {}


def _structure(framework: str, shapes: Mapping[str, Tuple[int, ...]]) -> Structure:
    return framework, tuple((name, tuple(shape)) for name, shape in shapes.items())


def tied(backend: Any, model: Any, *, known: bool = True) -> Dict[str, str]:
    """alias -> aliased name among ``model``'s state names (``backend``: its unitrain Backend):
    the names whose tensor is an earlier name's. Found without the framework's help: every name
    that could be one (the same shape and the same values as another) is written a value of its
    own, and the state read back: names that read back one value are one tensor. The state is
    then restored. ``known``: a structure already found is not probed again."""
    state = backend.state_arrays(model)
    key = _structure(backend.name, {k: v.shape for k, v in state.items()})
    if known and key in _TIED:
        return dict(_TIED[key])
    alike: Dict[Any, List[str]] = defaultdict(list)
    for name, array in state.items():
        if array.size and array.dtype.kind in "fi" and array.dtype.itemsize >= 4:
            digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).digest()
            alike[array.shape, array.dtype.str, digest].append(name)
    candidates = [name for names in alike.values() if len(names) > 1 for name in names]
    aliases: Dict[str, str] = {}
    if candidates:
        probe = dict(state)
        probe.update({name: np.full(state[name].shape, i + 1, state[name].dtype) for i, name in enumerate(candidates)})
        backend.load_state_arrays(model, probe)
        read = backend.state_arrays(model)
        backend.load_state_arrays(model, state)
        one_tensor: Dict[float, List[str]] = defaultdict(list)
        for name in candidates:  # in the state's order: the first of a group is the name kept
            one_tensor[float(read[name].flat[0])].append(name)
        for names in one_tensor.values():
            aliases.update({alias: names[0] for alias in names[1:]})
    _TIED[key] = aliases
    return dict(aliases)


def known_tied(framework: str, shapes: Mapping[str, Tuple[int, ...]]) -> Dict[str, str]:
    """What :func:`tied` found for a state of these names and shapes in this process, or {}."""
    return dict(_TIED.get(_structure(framework, shapes), {}))


def table(
    framework: str,
    shapes: Mapping[str, Tuple[int, ...]],
    linear: Sequence[str],
    aliases: Optional[Mapping[str, str]] = None,
) -> List[Param]:
    """``framework``'s state (names and shapes in its order) as canonical parameters; ``linear``:
    the names of its Linear weights; ``aliases``: alias -> aliased name (default: what
    :func:`tied` found for this structure)."""
    weights = weights_module(framework)
    linear_set = set(linear)
    aliases = known_tied(framework, shapes) if aliases is None else dict(aliases)
    out = []
    for name, shape in shapes.items():
        transposed = name in linear_set and weights.LINEAR_IN_OUT
        out.append(
            Param(
                name=name,
                canonical=weights.canonical_name(name),
                shape=tuple(reversed(shape)) if transposed else tuple(shape),
                transposed=transposed,
                alias_of=aliases.get(name) if aliases.get(name) in shapes else None,
            )
        )
    return [p for p in out if not p.canonical.endswith(_COUNTERS)]


def _own(params: List[Param]) -> List[Param]:
    """The parameters less the aliases: each tensor once."""
    return [p for p in params if p.alias_of is None]


def match(source: List[Param], target: List[Param], explicit: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Target name -> source name, for every target parameter (an alias: its aliased name's)."""
    explicit = dict(explicit or {})
    aliased = {p.name: p.alias_of for p in target if p.alias_of}
    source, target = _own(source), _own(target)
    by_name = {p.name: p for p in source}
    pairs: Dict[str, str] = {}
    target_names = {p.name for p in target}
    for a, b in explicit.items():  # either way round: {paddle name: torch name} or the reverse
        found = [
            (s_name, t_name) for s_name, t_name in ((a, b), (b, a)) if s_name in by_name and t_name in target_names
        ]
        if not found:
            raise PairingError(
                f"model.mapping pairs {a!r} with {b!r}, but the two models do not hold that pair of parameters; "
                "allowed: names as each framework's state names them (the first is e.g. "
                f"{next(iter(by_name), '?')!r})"
            )
        for s_name, t_name in found:
            pairs[t_name] = s_name
    rest_s = [p for p in source if p.name not in pairs.values()]
    rest_t = [p for p in target if p.name not in pairs]
    if {p.canonical for p in rest_s} == {p.canonical for p in rest_t}:
        canon = {p.canonical: p for p in rest_s}
        pairs.update({t.name: canon[t.canonical].name for t in rest_t})
    else:
        _by_order(rest_s, rest_t, pairs)
    _check_shapes(source, target, pairs)
    pairs.update({alias: pairs[name] for alias, name in aliased.items()})
    return pairs


def _by_order(source: List[Param], target: List[Param], pairs: Dict[str, str]) -> None:
    for i, t in enumerate(target):
        if i >= len(source):
            raise PairingError(
                f"{t.name} {t.shape} has no counterpart: the other model has {len(source)} parameters left to "
                f"match against {len(target)}; name it in model.mapping (a JSON file {{name: name}})"
            )
        if source[i].shape != t.shape:
            raise PairingError(
                f"{t.name} {t.shape} cannot be matched: names differ, and the parameter in the same place, "
                f"{source[i].name}, is {source[i].shape}; name its counterpart in model.mapping (a JSON file "
                "{name: name})"
            )
        pairs[t.name] = source[i].name
    if len(source) > len(target):
        extra = source[len(target)]
        raise PairingError(
            f"{extra.name} {extra.shape} has no counterpart in the other model ({len(source)} parameters against "
            f"{len(target)}); name it in model.mapping (a JSON file {{name: name}})"
        )


def _check_shapes(source: List[Param], target: List[Param], pairs: Dict[str, str]) -> None:
    by_name = {p.name: p for p in source}
    for t in target:
        s = by_name[pairs[t.name]]
        if s.shape != t.shape:
            raise PairingError(
                f"{t.name} {t.shape} cannot take {s.name} {s.shape}: the shapes differ in the canonical layout "
                "(Linear weights [out, in])"
            )


def convert_pair(
    arrays: Arrays,
    source: List[Param],
    target: List[Param],
    explicit: Optional[Mapping[str, str]] = None,
    counters: Sequence[str] = (),
) -> Arrays:
    """``arrays`` (the source's state) as the target's state; ``counters``: the target's
    BatchNorm counters, set to 0 (unitrain.model.weights says why that is exact)."""
    pairs = match(source, target, explicit)
    by_name = {p.name: p for p in source}
    out: Arrays = {}
    for t in _own(target):
        s = by_name[pairs[t.name]]
        canonical = arrays[s.name].T if s.transposed else arrays[s.name]
        out[t.name] = np.ascontiguousarray(canonical.T if t.transposed else canonical)
    # An alias is the same tensor as the name it aliases: the same value, in that name's layout.
    out.update({t.name: out[t.alias_of] for t in target if t.alias_of})
    out.update({name: np.array(0, dtype=np.int64) for name in counters})
    return out


def shared_initial_state(
    framework: str, state: Arrays, linear: Sequence[str], seed: int, buffers: Collection[str] = ()
) -> Arrays:
    """``model.init=shared`` for a user's model: :func:`generic_init`'s draws for its parameters,
    in the framework's own names and layouts; BatchNorm's running statistics 0 and 1, its
    counters 0. A buffer (``buffers``: an index, a mask) is never drawn: it keeps the value the
    model computed, and takes no place in the order, as running statistics take none (Paddle
    keeps them as parameters, torch as buffers). An alias (:func:`tied`) is drawn once, as the
    name it aliases, and takes no place either: a framework that names a tensor twice draws what
    the other draws."""
    params = table(framework, {k: tuple(v.shape) for k, v in state.items()}, linear)
    own = _own(params)
    stats = [p for p in own if p.canonical.endswith(_RUNNING_STATISTICS)]
    drawn = [p for p in own if p.name not in set(buffers) and p not in stats]
    canonical = generic_init({p.canonical: p.shape for p in drawn}, seed)
    canonical.update(generic_init({p.canonical: p.shape for p in stats}, seed))
    out = {
        p.name: np.ascontiguousarray(canonical[p.canonical].T if p.transposed else canonical[p.canonical])
        for p in [*drawn, *stats]
    }
    out.update({p.name: out[p.alias_of] for p in params if p.alias_of and p.alias_of in out})
    weights = weights_module(framework)
    for name, value in state.items():
        if name not in out:
            counter = weights.canonical_name(name).endswith(_COUNTERS)
            out[name] = np.array(0, dtype=np.int64) if counter else value
    return out
