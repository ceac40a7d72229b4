"""Paddle Fleet's parameter server, as FleetX's wide&deep example uses it (static graph).

Every process builds the same program; ``fleet.distributed_optimizer(...).minimize`` rewrites
it for its role: a server's ``init_server``/``run_server`` hold the tables, a trainer's program
pulls embedding rows (``distributed_lookup_table``) and pushes gradients. Sync, async and geo
are Fleet's own modes (``strategy.a_sync`` and ``a_sync_configs["k_steps"]``).

Paddle's engine needs the legacy program (``FLAGS_enable_pir_api=0`` before paddle loads: the
launcher sets it) and a wheel that has all of it: paddlepaddle 3.0.0 (`make ps-env`). Later
wheels lack the trainer's ops (3.1.x) or the whole engine (3.2 on).

What Fleet's runtime does only inside ``Executor.train_from_dataset`` is done here, since a
trainer steps with ``Executor.run`` (batch by batch, timed and evaluated like torch's):

* async: a trainer pushes its dense gradients, but nothing pulls the servers' dense parameters
  back (train_from_dataset runs a PullDenseWorker thread); the trainer pulls them after each step.
* the end: ``stop_worker`` does not stop the servers; once every trainer stopped, trainer 0 tells
  them to (otherwise paddle.distributed.launch waits forever).
* sync: the program's send_barrier needs a Communicator that 3.0.0 creates only for geo, and the
  servers apply the collected dense gradients only at their barrier table; both are provided
  here (``_sync_step``), which is what train_from_dataset would not do either.

The pieces are in ``ps_fleet/``: the trainer's client (``client.py``), the tables and their rules
(``tables.py``), the wide&deep program (``program.py``), passes Fleet runs (``passes.py``), geo's
evaluation (``geo.py``) and what Fleet reports it ran (``report.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np
import paddle

from unitrain.backends.paddle.ps_fleet import client, passes, report, tables
from unitrain.backends.paddle.ps_fleet.geo import ServerView
from unitrain.backends.paddle.ps_fleet.program import feed, wide_deep
from unitrain.backends.paddle.serving import TABLES
from unitrain.data.criteo import CtrData
from unitrain.data.criteo_files import FileRows
from unitrain.interface.ps import PassResult, PsProgram, Role

__all__ = ["build", "engine_problem"]

LOCAL_STATE = "model"  # paddle.static.save's prefix in a one-process job's checkpoint


def engine_problem() -> Optional[str]:
    """Why this wheel cannot run a parameter-server job, or None: 3.2 on lack the engine, 3.1.x
    keep its server side (DistFleetWrapper) but not the trainer's ops."""
    from paddle.base import core
    from paddle.base.framework import OpProtoHolder

    missing = [] if hasattr(core, "DistFleetWrapper") else ["DistFleetWrapper"]
    for op in ("distributed_lookup_table", "distributed_push_sparse", "send"):
        try:
            OpProtoHolder.instance().get_op_proto(op)
        except ValueError:
            missing.append(f"the {op} op")
    if not missing:
        return None
    return (
        f"backend=paddle with dist.mode=ps is not allowed with paddlepaddle {paddle.__version__}: its wheel lacks "
        "Paddle's "
        f"parameter-server engine ({', '.join(missing[:2])}{'...' if len(missing) > 2 else ''}; removed after 3.1.0 "
        "by PR #73999, "
        "the trainer's ops already in 3.1.x); run the job in the environment with paddlepaddle 3.0.0 that `make "
        "ps-env` "
        "builds: .venv-ps/bin/python -m unitrain ..."
    )


class PaddlePs(PsProgram):
    def __init__(self, cfg, role: Role, resume: Optional[Path]):
        paddle.enable_static()
        self.cfg, self.role, self.use_ps = cfg, role, role.servers > 0
        self.sync = cfg.dist.ps.sync if self.use_ps else "local"
        self.fleet = None
        self.fed: Optional[Dict[str, Any]] = None  # what ran the passes of dist.ps.feed=engine
        if self.use_ps:
            from paddle.distributed import fleet

            client.gloo_on_interface(os.environ.get("GLOO_SOCKET_IFNAME"))
            fleet.init(is_collective=False)  # the role comes from the launcher's variables
            self.fleet = fleet
        # Built into the default programs: in parameter-server mode minimize() swaps in rewritten
        # ones, which a program_guard would undo on exit.
        on = "trainer" if not self.use_ps or self.sync == "geo" else "servers"
        self.loss, self.prob, self.initial = wide_deep(cfg, on)
        self._optimizer(cfg).minimize(self.loss)
        self.main = self.loss.block.program
        if not (self.use_ps and self.fleet.is_server()):
            self._start_trainer()
            if resume is not None:
                self._load(resume)

    def _optimizer(self, cfg):
        optimizer = tables.dense_optimizer(cfg.optim.name, cfg.optim.lr)
        if not self.use_ps:
            return optimizer
        strategy = self.fleet.DistributedStrategy()
        strategy.a_sync = self.sync != "sync"
        if self.sync == "geo":
            strategy.a_sync_configs = {"k_steps": cfg.dist.ps.geo_k_steps}
        strategy.sparse_table_configs = tables.sparse_table_configs(cfg, self.sync, self.role.servers)
        return self.fleet.distributed_optimizer(optimizer, strategy)

    def _start_trainer(self) -> None:
        self.executor = paddle.static.Executor(paddle.CPUPlace())
        # Prediction: the trainer's program cut down to the click probability, which keeps the
        # pulls of embedding rows and drops the pushes.
        test = self.main.clone(for_test=True)
        self.test = test._prune_with_input(["dense", "ids"], [test.global_block().var(self.prob.name)])
        self.executor.run(paddle.static.default_startup_program())
        scope = paddle.static.global_scope()
        for name, value in self.initial.items():
            scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())
        # pull_dense: the servers' dense parameters into this trainer's scope; after_step: what a
        # trainer does after each step (async: pull; sync: flush, barrier, pull; geo: nothing).
        self.pull_dense = self.after_step = self.server_view = None
        if not self.use_ps:
            return
        fleet = self.fleet
        client.wait_for_servers(fleet.server_endpoints())
        client.retry_first_push(fleet.fleet._runtime_handle)
        if self.sync == "async":
            fleet.fleet._runtime_handle.ps_desc_builder.ps_desc.init_gflags = client.client_flags(
                self.cfg.dist.ps.merge_pushes
            )
        fleet.init_worker()
        from paddle.distributed.ps.utils.public import get_the_one_recv_context

        runtime = fleet.fleet._runtime_handle
        dense = get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)
        if self.sync == "geo":
            self.server_view = ServerView(self.cfg, self.executor, self.initial, runtime, dense)
        else:
            self.pull_dense = lambda: runtime._pull_all_dense(runtime.scopes, runtime._send_ctx, dense)
            self.after_step = self._sync_step(runtime, dense) if self.sync == "sync" else self.pull_dense

    def _sync_step(self, runtime, dense):
        """Fleet's sync mode, completed (client.sync_communicator): after each step the trainer
        flushes its queued pushes, meets the others at the barrier table, and pulls the updated
        dense parameters."""
        self._communicator = client.sync_communicator(runtime, dense)

        def step_done() -> None:
            runtime._worker.client_flush()
            runtime._worker.barrier(0)
            self.pull_dense()

        return step_done

    def run_server(self) -> None:
        self.fleet.init_server()
        self.fleet.run_server()

    def train_pass(
        self, share: FileRows, batch_size: int, threads: int, progress: Callable[[float], None]
    ) -> PassResult:
        """Fleet's dataset API, as PaddleRec trains (passes.train_pass)."""
        result, self.fed = passes.train_pass(
            self.executor, self.main, self.loss, share, batch_size, threads, progress, self.pull_dense
        )
        return result

    def train_batch(self, batch: CtrData) -> float:
        (loss,) = self.executor.run(self.main, feed=feed(batch), fetch_list=[self.loss])
        if self.after_step:
            self.after_step()
        return float(np.asarray(loss))

    def predict(self, batch: CtrData) -> np.ndarray:
        if self.server_view:
            return self.server_view.predict(feed(batch, with_label=False))
        (prob,) = self.executor.run(self.test, feed=feed(batch, with_label=False), fetch_list=[self.prob])
        return np.asarray(prob).reshape(-1)

    def barrier(self) -> None:
        if self.use_ps:
            self.fleet.fleet._runtime_handle._worker.client_flush()
            self.fleet.barrier_worker()

    def save_state(self, folder: Path) -> None:
        if not self.use_ps:
            # Every persistable of the program: parameters and the optimizer's accumulators.
            paddle.static.save(self.main, str(folder / LOCAL_STATE))
            return
        # Each server writes its shards of every table (rows with their rule's state, and the
        # dense tables) under folder, on its own file system (mode 0: everything). Beside them,
        # for serving: which table is which, and the dense tower as this trainer pulled it.
        runtime = self.fleet.fleet._runtime_handle
        runtime._worker.save_all_model(str(folder), 0)
        (folder / TABLES).write_text(json.dumps(tables.sparse_tables(runtime)))
        if self.pull_dense:
            self.pull_dense()
        scope = paddle.static.global_scope()
        np.savez(folder / "dense.npz", **{n: np.asarray(scope.find_var(n).get_tensor()) for n in self.initial})

    def _load(self, folder: Path) -> None:
        if not self.use_ps:
            paddle.static.load(self.main, str(folder / LOCAL_STATE), self.executor)
            return
        runtime = self.fleet.fleet._runtime_handle
        if self.role.index == 0:
            runtime._worker.load_model(str(folder), 0)
        self.fleet.barrier_worker()
        if self.pull_dense:
            self.pull_dense()

    def end_training(self) -> None:
        if self.server_view:
            self.server_view.send_the_rest()
        if self.use_ps:
            self.barrier()
            if self.pull_dense:
                self.pull_dense()

    def observed(self) -> Dict[str, Any]:
        if not self.use_ps:
            # One process holds whole [buckets, dim] tables (and the optimizer's state beside them).
            buckets, dim = self.cfg.model.sparse_buckets, self.cfg.model.embedding_dim
            held = {"rows": buckets, "bytes": buckets * (dim + 1) * 4, "preallocated": True}
            return {"engine": "none (one process)", "sync": "local", "tables": held, "fed": self.fed}
        runtime = self.fleet.fleet._runtime_handle
        ran = report.mode(runtime)
        # Read back from the runtime's context and the rewritten program, not the request.
        return {
            **report.engine(runtime, self.main, ran),
            # Fleet's geo tables cannot be saved (MemorySparseGeoTable::Save writes nothing), so
            # their rows cannot be counted. Trainer 0 asks the servers.
            "tables": report.table_rows(runtime) if ran != "geo" and self.role.index == 0 else None,
            "evaluates": "the servers' model" if self.server_view else "this trainer's pulled parameters",
            "fed": self.fed,
            # How far the dense tower moved from its initial values, in this trainer's copy after
            # the last pull: in sync mode only the servers' barrier applies dense gradients.
            "dense_moved": self._dense_moved(),
            "traffic": report.server_counters(self.fleet.server_endpoints()),
        }

    def _dense_moved(self) -> float:
        scope = paddle.static.global_scope()
        return max(
            float(np.abs(np.asarray(scope.find_var(name).get_tensor()) - value).max())
            for name, value in self.initial.items()
        )

    def close(self) -> None:
        if not (self.use_ps and self.fleet.is_worker()):
            return
        self.fleet.stop_worker()  # flushes geo's communicator
        self.fleet.barrier_worker()
        if self.role.index == 0:
            self.fleet.fleet._runtime_handle._worker.stop_server()


def build(cfg, role: Role, resume: Optional[Path]) -> PaddlePs:
    if resume is not None and role.servers > 0:
        tables.check_shards(resume, role.servers)
    return PaddlePs(cfg, role, resume)
