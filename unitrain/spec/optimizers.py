"""Every optimizer unitrain knows, in one table: its name (``optim.name``), whether it is adaptive
(reads optim.beta1, optim.beta2 and optim.eps), which jobs build it (collective jobs and
unitrain.parity through each backend's ``build_optimizer``; parameter servers through
spec/ps_table.py's rules and the backends' engines), and what a server's table keeps beside each
row for it. Framework-free, so that everything that needs it reads it: the config's Choice
(config/schema.py), validation and the kinds of job, spec/ps_table.py, and both backends, whose
rule tables are checked against it (:func:`implemented`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Tuple, TypeVar

Rule = TypeVar("Rule")


@dataclass(frozen=True, kw_only=True)
class Optimizer:
    name: str
    #: Reads optim.beta1, optim.beta2 and optim.eps (and no optim.momentum, no Nesterov).
    adaptive: bool = False
    #: Every backend's build_optimizer builds it: collective jobs and unitrain.parity.
    collective: bool = False
    #: Parameter servers apply it: spec/ps_table.py's rule on the sparse tables (Paddle's servers'),
    #: the framework's optimizer of the same name on the dense tower.
    ps: bool = False
    #: A server's state for it beside each value of a row (Paddle's rules keep the same).
    row_state: Tuple[str, ...] = ()
    #: ... and beside each row, one number each.
    row_scalars: Tuple[str, ...] = ()


#: In the order the config lists them (Hydra's message for a wrong optim.name names them so).
TABLE: Tuple[Optimizer, ...] = (
    Optimizer(name="momentum", collective=True),
    Optimizer(name="sgd", collective=True, ps=True),
    # Parameter servers only: Paddle's StdAdaGradSGDRule (spec/ps_table.py).
    Optimizer(name="adagrad", ps=True, row_state=("g2sum",)),
    # Adam with L2 weight decay (added to the gradient) in collective jobs; on the servers each row
    # counts its own steps (Paddle's SparseAdamSGDRule).
    Optimizer(
        name="adam",
        adaptive=True,
        collective=True,
        ps=True,
        row_state=("m", "v"),
        row_scalars=("beta1_pow", "beta2_pow"),
    ),
    # AdamW: decoupled weight decay (Loshchilov & Hutter), one update rule on both frameworks.
    Optimizer(name="adamw", adaptive=True, collective=True),
)

BY_NAME: Mapping[str, Optimizer] = {o.name: o for o in TABLE}
NAMES: Tuple[str, ...] = tuple(BY_NAME)
#: What every backend's build_optimizer builds.
COLLECTIVE: Tuple[str, ...] = tuple(o.name for o in TABLE if o.collective)
#: The rules of a parameter-server job's servers.
PS: Tuple[str, ...] = tuple(o.name for o in TABLE if o.ps)
#: The ones that read optim.beta1, optim.beta2 and optim.eps.
ADAPTIVE: Tuple[str, ...] = tuple(o.name for o in TABLE if o.adaptive)


def state_values(name: str, width: int) -> int:
    """Numbers a server keeps for a row of ``width`` values beside the values themselves."""
    optimizer = BY_NAME[str(name)]
    return len(optimizer.row_state) * width + len(optimizer.row_scalars)


def implemented(names: Tuple[str, ...], rules: Mapping[str, Rule]) -> Mapping[str, Rule]:
    """``rules`` (a backend's builders, or spec/ps_table.py's updates, by optimizer name) when
    they are exactly ``names``; a table that lacks one or adds one fails where it is written."""
    if set(rules) != set(names):
        raise RuntimeError(f"rules for {sorted(rules)}, not for {sorted(names)} (unitrain/spec/optimizers.py)")
    return rules
