"""Fleet's tables as unitrain sets them: the sparse tables' rule set to spec/ps_table.py's (for each
of spec.optimizers.PS), the dense tower's optimizer (Paddle's own of the same name), the shards
of each sparse table and a checkpoint's checked against them, and the servers' id of each table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, Mapping

import paddle

from unitrain.backends.paddle.serving import TABLES
from unitrain.data.criteo import SPARSE_SLOTS
from unitrain.errors import Refusal
from unitrain.spec.optimizers import PS, implemented
from unitrain.spec.ps_model import EMBED_INIT
from unitrain.spec.ps_table import BETA1, BETA2, EPSILON, INITIAL_G2SUM

#: The program's two sparse tables (the deep part's embeddings and the wide part's weights).
SPARSE = ("deep_table", "wide_table")
#: Shards of each sparse table, over all servers (Fleet's default is 1000). A checkpoint saves
#: every shard as a gzip file through a shell command of its own: 1000 shards made each save of a
#: small table thousands of processes. A server works its shards in parallel, so a few each.
SPARSE_SHARDS = 16

#: The dense tower's optimizer for each of the servers' rules.
_DENSE: Mapping[str, Callable[[float], paddle.optimizer.Optimizer]] = implemented(
    PS,
    {
        "sgd": lambda lr: paddle.optimizer.SGD(learning_rate=lr),
        "adagrad": lambda lr: paddle.optimizer.Adagrad(learning_rate=lr),
        # lazy_mode: only the batch's rows move, as on the servers (whose rows count their own steps).
        "adam": lambda lr: paddle.optimizer.Adam(
            learning_rate=lr, beta1=BETA1, beta2=BETA2, epsilon=EPSILON, lazy_mode=True
        ),
    },
)


def dense_optimizer(name: Any, lr: float) -> paddle.optimizer.Optimizer:
    return _DENSE[str(name)](lr)


def _naive(cfg, sync: str, common: Dict[str, Any]) -> Dict[str, Any]:
    trainers = cfg.dist.ps.trainers if sync == "sync" else 1
    naive = {**common, "learning_rate": cfg.optim.lr / (cfg.trainer.batch_size * SPARSE_SLOTS * trainers)}
    return {"name": "SparseNaiveSGDRule", **{f"naive.{k}": v for k, v in naive.items()}}


def _adagrad(cfg, sync: str, common: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "name": "StdAdaGradSGDRule",
        **{f"adagrad.{k}": v for k, v in common.items()},
        "adagrad.initial_g2sum": INITIAL_G2SUM,
    }


def _adam(cfg, sync: str, common: Dict[str, Any]) -> Dict[str, Any]:
    adam = {**common, "beta1_decay_rate": BETA1, "beta2_decay_rate": BETA2}
    return {"name": "SparseAdamSGDRule", **{f"adam.{k}": v for k, v in adam.items()}}


_SPARSE_RULES = implemented(PS, {"sgd": _naive, "adagrad": _adagrad, "adam": _adam})


def sparse_rule(cfg, sync: str) -> Dict[str, Any]:
    """The servers' rule for the sparse tables, set to unitrain's (unitrain/spec/ps_table.py).

    Fleet's CPU default is its Adam rule whatever the dense optimizer (the_one_ps.py sets
    SparseNaiveSGDRule for SGD, then overwrites it), so the rule is always named here. A pushed
    row gradient is multiplied by the rows of the id tensor, here batch x 26
    (FleetWrapper::PushSparseFromTensorAsync): SGD's rate is divided by them, Adagrad divides
    by the row's count itself, and Adam is blind to the scale but for its epsilon, which Fleet
    sets to 1e-8 whatever it is given (the_one_ps.py's Accessor._set): on gradients that large
    it is 1e-8 / (batch x 26) of torch's table's, a difference only rows with gradients below
    1e-8 would feel. Fleet's sync mode applies each trainer's sparse push when it arrives (only the
    dense tables wait at the barrier), so the rows would move by the sum of the trainers'
    gradients: SGD's rate is divided by the trainers, which makes it their mean. Adam and
    Adagrad keep state, and two updates are not one of the mean: observed() says so."""
    common = {"initial_range": EMBED_INIT, "learning_rate": cfg.optim.lr}
    return _SPARSE_RULES[str(cfg.optim.name)](cfg, sync, common)


def sparse_shards(servers: int) -> int:
    return max(SPARSE_SHARDS, servers)


def sparse_table_configs(cfg, sync: str, servers: int) -> Dict[str, Dict[str, Any]]:
    """strategy.sparse_table_configs: each sparse table's shards, and its rule for both parts of
    a row (the embed value and the embedx ones)."""
    rule = sparse_rule(cfg, sync)
    return {
        table: {
            f"table_parameters.{table}.shard_num": sparse_shards(servers),
            **{
                f"table_parameters.{table}.accessor.{part}_sgd_param.{key}": value
                for part in ("embed", "embedx")
                for key, value in rule.items()
            },
        }
        for table in SPARSE
    }


def check_shards(folder: Path, servers: int) -> None:
    """A checkpoint's sparse tables in other shards (Fleet's default 1000: written before unitrain
    set its own) load only in part, without a word from Fleet: refused in one line."""
    for table, number in json.loads((folder / TABLES).read_text()).items():
        saved = len(list((folder / f"{number:03d}").glob("part-*")))
        if saved != sparse_shards(servers):
            raise Refusal(
                f"trainer.resume: {folder} holds {table} in {saved} shards, and this job's servers hold it in "
                f"{sparse_shards(servers)}: Fleet would load it only in part; allowed: a checkpoint written by "
                "this version of unitrain"
            )


def sparse_tables(runtime: Any) -> Dict[str, int]:
    """The servers' id of each sparse table, by the program's parameter name."""
    return {
        name: c.table_id()
        for c in runtime._send_ctx.values()
        if c.is_sparse()
        for name in SPARSE
        if name in c.origin_varnames()[0]
    }
