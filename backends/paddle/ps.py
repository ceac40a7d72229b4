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
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np
import paddle
from paddle.base.executor import FetchHandler

from unitrain.backends.paddle.serving import TABLES
from unitrain.data import multislot
from unitrain.data.criteo import DENSE_FEATURES, SPARSE_SLOTS, CtrData
from unitrain.data.criteo_files import FileRows
from unitrain.errors import Refusal, UnitrainError
from unitrain.host.console import captured_stdout
from unitrain.interface.ps import PassResult, PsProgram, Role
from unitrain.spec.ps_model import EMBED_INIT, tower_init
from unitrain.spec.ps_table import BETA1, BETA2, EPSILON, INITIAL_G2SUM

__all__ = ["build", "engine_problem"]

log = logging.getLogger("unitrain")

LOCAL_STATE = "model"  # paddle.static.save's prefix in a one-process job's checkpoint
#: Shards of each sparse table, over all servers (Fleet's default is 1000). A checkpoint saves
#: every shard as a gzip file through a shell command of its own: 1000 shards made each save of a
#: small table thousands of processes. A server works its shards in parallel, so a few each.
SPARSE_SHARDS = 16
# Seconds a trainer waits for the servers to listen before it gives up.
SERVER_WAIT_S = 120.0


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


def _wait_for_servers(endpoints) -> None:
    """init_worker pushes the initial dense parameters to the servers before it waits for them
    (and Paddle's own wait_server_ready returns at once): a server still building its program
    fails that push. Wait until every server listens."""
    deadline = time.monotonic() + SERVER_WAIT_S
    for endpoint in endpoints:
        host, port = endpoint.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise UnitrainError(
                        f"parameter server {endpoint} did not start listening within {SERVER_WAIT_S:g}s; see "
                        "serverlog.*"
                    ) from None
                time.sleep(0.2)


#: Seconds between the loss reports of a pass that Fleet runs (dist.ps.feed=engine).
PROGRESS_S = 10
LOSS_READ_S = 0.2

#: Seconds a geo trainer leaves its communicator's thread to send its last changes.
GEO_DRAIN_S = 0.5

#: Tries of trainer 0's first push of the dense parameters, a second apart.
FIRST_PUSH_TRIES = 30


def _gloo_on_interface(interface: Optional[str]) -> None:
    """Fleet's role maker gives its gloo an empty interface, so gloo binds to what the host name
    resolves to: 127.0.x.x on many hosts (Debian's /etc/hosts), where the trainers of another
    node cannot reach it ("connect [127.0.0.1]: Connection refused"). Over several nodes
    (GLOO_SOCKET_IFNAME, set by unitrain's launch) its gloo takes that interface instead."""
    if not interface:
        return
    from paddle.base import core

    class Gloo(core.Gloo):  # type: ignore[name-defined, misc]
        def set_iface(self, iface: str) -> None:
            super().set_iface(iface or interface)

    core.Gloo = Gloo


def _retry_first_push(runtime: Any) -> None:
    """Trainer 0's init_worker pushes the initial dense parameters once; a server that listens
    but has not yet set up its tables answers "push dense param failed, status[-1]" and the job
    dies (about one Paddle job in sixteen on 2 cores). The push only sets the tables' initial
    values, so it is safe to repeat: retry it for a while before giving up."""
    push = runtime._init_all_params

    def retried(*args: Any) -> Any:
        for attempt in range(FIRST_PUSH_TRIES):
            try:
                return push(*args)
            except ValueError as err:
                if "push dense param failed" not in str(err) or attempt == FIRST_PUSH_TRIES - 1:
                    raise
                time.sleep(1.0)
        return None

    runtime._init_all_params = retried


#: What Fleet's client is given when its proto names no flags (FleetWrapper::InitGFlag): naming
#: any replaces these, so they are named again.
FLEET_CLIENT_FLAGS = (
    "-max_body_size=314217728",
    "-bthread_concurrency=40",
    "-socket_max_unwritten_bytes=2048000000",
    "-max_connection_pool_size=1950",
)
MERGE_FLAG = {"sparse": "pserver_push_sparse_merge_limit", "dense": "pserver_push_dense_merge_limit"}
#: Fleet's own limits (brpc_ps_client.cc): the steps whose pushes make one update.
FLEET_MERGES = {"sparse": "about 12", "dense": 13}


def _client_flags(merge: Optional[int]) -> str:
    """An async trainer's brpc client sums its queued pushes before it sends them, and each
    send is one update on the servers: PushDenseTaskConsume sends 13 steps' dense gradients at
    once (one Adam step for 13 batches), PushSparseTaskConsume about 12 steps' rows. Its limits
    are flags that are not exported (FLAGS_ variables do not reach them), only the proto's
    init_gflags. None keeps Fleet's own."""
    if merge is None:
        return ""
    # A sparse limit of 1 still waits for a second push before sending; 0 sends each.
    limits = {"sparse": 0 if merge == 1 else merge, "dense": merge - 1}
    return " ".join([*FLEET_CLIENT_FLAGS, *(f"-{MERGE_FLAG[kind]}={limit}" for kind, limit in limits.items())])


def _merged_pushes(flags: str) -> Dict[str, Any]:
    """The steps per update that the flags given to Fleet's client make, read back from them."""
    given = dict(flag.lstrip("-").split("=", 1) for flag in flags.split())
    if MERGE_FLAG["dense"] not in given:
        return dict(FLEET_MERGES)
    return {"sparse": max(1, int(given[MERGE_FLAG["sparse"]])), "dense": int(given[MERGE_FLAG["dense"]]) + 1}


def _sparse_rule(cfg, sync: str) -> Dict[str, Any]:
    """The servers' rule for the sparse tables, set to unitrain's (unitrain/ps/table.py).

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
    pushed, lr = cfg.trainer.batch_size * SPARSE_SLOTS, cfg.optim.lr
    common = {"initial_range": EMBED_INIT, "learning_rate": lr}
    if cfg.optim.name == "adagrad":
        return {
            "name": "StdAdaGradSGDRule",
            **{f"adagrad.{k}": v for k, v in common.items()},
            "adagrad.initial_g2sum": INITIAL_G2SUM,
        }
    if cfg.optim.name == "adam":
        adam = {**common, "beta1_decay_rate": BETA1, "beta2_decay_rate": BETA2}
        return {"name": "SparseAdamSGDRule", **{f"adam.{k}": v for k, v in adam.items()}}
    trainers = cfg.dist.ps.trainers if sync == "sync" else 1
    naive = {**common, "learning_rate": lr / (pushed * trainers)}
    return {"name": "SparseNaiveSGDRule", **{f"naive.{k}": v for k, v in naive.items()}}


class PaddlePs(PsProgram):
    def __init__(self, cfg, role: Role, resume: Optional[Path]):
        paddle.enable_static()
        self.cfg, self.role, self.use_ps = cfg, role, role.servers > 0
        self.sync = cfg.dist.ps.sync if self.use_ps else "local"
        self.fleet = None
        self.fed: Optional[Dict[str, Any]] = None  # what ran the passes of dist.ps.feed=engine
        if self.use_ps:
            from paddle.distributed import fleet

            _gloo_on_interface(os.environ.get("GLOO_SOCKET_IFNAME"))
            fleet.init(is_collective=False)  # the role comes from the launcher's variables
            self.fleet = fleet
        # Built into the default programs: in parameter-server mode minimize() swaps in rewritten
        # ones, which a program_guard would undo on exit.
        self.loss, self.prob = self._build(cfg)
        self._optimizer(cfg).minimize(self.loss)
        self.main = self.loss.block.program
        if not (self.use_ps and self.fleet.is_server()):
            self._start_trainer()
            if resume is not None:
                self._load(resume)

    def _optimizer(self, cfg):
        lr, name = cfg.optim.lr, cfg.optim.name
        if name == "adam":
            # lazy_mode: only the batch's rows move, as on the servers (whose rows count their own steps).
            optimizer = paddle.optimizer.Adam(
                learning_rate=lr, beta1=BETA1, beta2=BETA2, epsilon=EPSILON, lazy_mode=True
            )
        elif name == "adagrad":
            optimizer = paddle.optimizer.Adagrad(learning_rate=lr)
        else:
            optimizer = paddle.optimizer.SGD(learning_rate=lr)
        if not self.use_ps:
            return optimizer
        strategy = self.fleet.DistributedStrategy()
        strategy.a_sync = self.sync != "sync"
        if self.sync == "geo":
            strategy.a_sync_configs = {"k_steps": cfg.dist.ps.geo_k_steps}
        rule = _sparse_rule(cfg, self.sync)
        strategy.sparse_table_configs = {
            table: {
                f"table_parameters.{table}.shard_num": _sparse_shards(self.role.servers),
                **{
                    f"table_parameters.{table}.accessor.{part}_sgd_param.{key}": value
                    for part in ("embed", "embedx")
                    for key, value in rule.items()
                },
            }
            for table in ("deep_table", "wide_table")
        }
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
        _wait_for_servers(fleet.server_endpoints())
        _retry_first_push(fleet.fleet._runtime_handle)
        if self.sync == "async":
            fleet.fleet._runtime_handle.ps_desc_builder.ps_desc.init_gflags = _client_flags(
                self.cfg.dist.ps.merge_pushes
            )
        fleet.init_worker()
        from paddle.distributed.ps.utils.public import get_the_one_recv_context

        runtime = fleet.fleet._runtime_handle
        dense = get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)
        if self.sync == "geo":
            self.server_view = _ServerView(self, runtime, dense)
        else:
            self.pull_dense = lambda: runtime._pull_all_dense(runtime.scopes, runtime._send_ctx, dense)
            self.after_step = self._sync_step(runtime, dense) if self.sync == "sync" else self.pull_dense

    def _sync_step(self, runtime, dense):
        """Fleet's sync mode, completed. Its trainer program pushes dense gradients (which the
        servers hold back: with ``common.sync`` a dense table only collects them) and ends with
        send_barrier, which calls the process's Communicator; 3.0.0's the_one_ps creates one only
        for geo, and only its barrier table's Barrier applies the collected gradients (their
        mean, then the optimizer) once every trainer has arrived. So a SYNC Communicator is
        created here, as the_one_ps does for geo, and left stopped (a stopped one releases
        send_barrier at once; a started one waits for sends that 3.0.0 no longer routes through
        it). After each step the trainer flushes its queued pushes, meets the others at the
        barrier table, and pulls the updated dense parameters."""
        from google.protobuf import text_format
        from paddle.distributed.communicator import Communicator
        from paddle.distributed.ps.utils.public import DistributedMode

        roles = runtime.role_maker
        kwargs = {
            "need_global_step": "0",
            "trainer_id": roles._role_id(),
            "trainers": roles._worker_num(),
            "barrier_table_id": runtime.ps_desc_builder.barrier_table_id,
            "pserver_endpoints": roles._get_pserver_endpoints(),
        }
        self._communicator = Communicator(
            DistributedMode.SYNC, kwargs, runtime.context["trainer"].get_communicator_flags()
        )
        self._communicator.init_with_ctx(
            runtime._send_ctx,
            dense,
            text_format.MessageToString(runtime.ps_desc_builder.ps_desc),
            runtime.string_hosts,
            paddle.static.global_scope(),
        )

        def step_done() -> None:
            runtime._worker.client_flush()
            runtime._worker.barrier(0)
            self.pull_dense()

        return step_done

    def _build(self, cfg, server_lookup: bool = False):
        """The wide&deep program; ``server_lookup``: an inference program whose embeddings are
        read from the servers' tables (geo's evaluation), built with plain lookups that
        _ServerView turns into the servers' ones."""
        static = paddle.static
        dense = static.data("dense", [-1, DENSE_FEATURES], "float32")
        # The batch's 26 ids per row, row after row; a sequence (lod_level 1) where Fleet's dataset
        # reader fills it, which gives each row's 26 ids as one slot.
        engine_fed = cfg.dist.ps.feed == "engine" and not server_lookup
        ids = static.data("ids", [-1, 1], "int64", lod_level=1 if engine_fed else 0)
        label = static.data("label", [-1, 1], "float32")
        deep, wide = self._embeddings(cfg, ids, server_lookup)
        logit = self._towers(cfg, dense, deep, wide)
        loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, label))
        return loss, paddle.nn.functional.sigmoid(logit)

    def _embeddings(self, cfg, ids, server_lookup: bool):
        """The deep part's embeddings of a row's ids, side by side, and the wide part's sum of them."""
        static, dim = paddle.static, cfg.model.embedding_dim

        def table(name: str, width: int):
            attr = paddle.ParamAttr(name=name, initializer=paddle.nn.initializer.Uniform(-EMBED_INIT, EMBED_INIT))
            # Geo trains a local copy of the table, which sparse_embedding's server-only table
            # cannot give (init_worker fails on it): geo takes embedding(is_sparse=True).
            if server_lookup:
                return static.nn.embedding(ids, size=[cfg.model.sparse_buckets, width], param_attr=attr)
            if self.use_ps and self.sync != "geo":
                return static.nn.sparse_embedding(ids, size=[cfg.model.sparse_buckets, width], param_attr=attr)
            return static.nn.embedding(ids, size=[cfg.model.sparse_buckets, width], is_sparse=True, param_attr=attr)

        deep = paddle.reshape(table("deep_table", dim), [-1, SPARSE_SLOTS * dim])
        wide = paddle.sum(paddle.reshape(table("wide_table", 1), [-1, SPARSE_SLOTS]), axis=1, keepdim=True)
        return deep, wide

    def _towers(self, cfg, dense, deep, wide):
        """The logit: the deep tower over dense features and embeddings, plus the wide part."""
        static = paddle.static
        *layers, wide_dense = tower_init(cfg)
        self.initial = {}  # parameter name -> its shared NumPy value, set after the startup program

        def attr(name: str, value: np.ndarray) -> paddle.ParamAttr:
            # A plain initializer in the program: the servers' dense tables build their own from
            # it and crash on Assign's. The shared values replace it before init_worker pushes them.
            self.initial[name] = value
            return paddle.ParamAttr(name=name, initializer=paddle.nn.initializer.Constant(0.0))

        x = paddle.concat([dense, deep], axis=1)
        for i, (weight, bias) in enumerate(layers):
            last = i == len(layers) - 1
            x = static.nn.fc(
                x,
                weight.shape[1],
                weight_attr=attr(f"deep_{i}.w", weight),
                bias_attr=attr(f"deep_{i}.b", bias),
                activation=None if last else "relu",
            )
        return (
            x
            + static.nn.fc(
                dense, 1, weight_attr=attr("wide_dense.w", wide_dense[0]), bias_attr=attr("wide_dense.b", wide_dense[1])
            )
            + wide
        )

    @staticmethod
    def _feed(batch: CtrData, with_label: bool = True) -> Dict[str, np.ndarray]:
        feed = {"dense": batch.dense, "ids": batch.sparse.reshape(-1, 1)}
        if with_label:
            feed["label"] = batch.label.reshape(-1, 1)
        return feed

    def run_server(self) -> None:
        self.fleet.init_server()
        self.fleet.run_server()

    def train_pass(
        self, share: FileRows, batch_size: int, threads: int, progress: Callable[[float], None]
    ) -> PassResult:
        """Fleet's dataset API, as PaddleRec trains: a QueueDataset streams the share's files
        through the pipe command (unitrain's parsing, as MultiSlot text) in ``threads`` reader
        threads, and train_from_dataset steps the program in as many Hogwild threads."""
        with tempfile.TemporaryDirectory(prefix="unitrain-feed-") as errors:
            result = self._run_pass(share, batch_size, threads, progress, Path(errors))
            refused = multislot.first_error(Path(errors))
        if refused:
            # Fleet's reader went on past the file it could not read: the pass is not the data.
            raise Refusal(f"{refused} (dist.ps.feed=engine: the pass skipped the rest of that file)")
        return result

    def _run_pass(self, share, batch_size: int, threads: int, progress, errors: Path) -> PassResult:
        dataset = paddle.distributed.QueueDataset()
        block = self.main.global_block()
        dataset.init(
            batch_size=batch_size,
            thread_num=threads,
            use_var=[block.var(name) for name in ("dense", "ids", "label")],
            pipe_command=multislot.command(sys.executable, share.buckets, share.standardize, errors),
        )
        dataset.set_filelist(share.whole_files())
        handler = _LossHandler(self.loss, progress)
        tick = time.perf_counter()
        self.executor.train_from_dataset(
            program=self.main, dataset=dataset, thread=threads, fetch_handler=handler, print_period=10**9
        )
        seconds = time.perf_counter() - tick
        # Read back: the dataset takes at most a thread per file.
        self.fed = {
            "by": "Fleet QueueDataset (MultiSlotDataFeed) + Executor.train_from_dataset",
            "threads": dataset.thread_num,
            "files": len(dataset.filelist),
        }
        if self.pull_dense:
            self.pull_dense()
        return PassResult(rows=share.rows, seconds=seconds, loss=handler.last)

    def train_batch(self, batch: CtrData) -> float:
        (loss,) = self.executor.run(self.main, feed=self._feed(batch), fetch_list=[self.loss])
        if self.after_step:
            self.after_step()
        return float(np.asarray(loss))

    def predict(self, batch: CtrData) -> np.ndarray:
        if self.server_view:
            return self.server_view.predict(self._feed(batch, with_label=False))
        (prob,) = self.executor.run(self.test, feed=self._feed(batch, with_label=False), fetch_list=[self.prob])
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
        (folder / TABLES).write_text(json.dumps(_sparse_tables(runtime)))
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
            tables = {"rows": buckets, "bytes": buckets * (dim + 1) * 4, "preallocated": True}
            return {"engine": "none (one process)", "sync": "local", "tables": tables, "fed": self.fed}
        context = self.fleet.fleet._runtime_handle.context
        ops = {op.type for op in self.main.global_block().ops}
        # Read back from the runtime's context and the rewritten program, not the request.
        from paddle.distributed.ps.utils.public import DistributedMode

        modes = {getattr(DistributedMode, name): name.lower() for name in ("SYNC", "ASYNC", "HALF_ASYNC", "GEO")}
        mode = modes.get(context["ps_mode"], str(context["ps_mode"]))
        return {
            "engine": f"Paddle Fleet parameter server (brpc), paddle {paddle.__version__}",
            "sync": mode,
            "geo_k_steps": context["user_defined_strategy"].a_sync_configs["k_steps"] if mode == "geo" else None,
            "steps_per_update": _merged_pushes(self.fleet.fleet._runtime_handle.ps_desc_builder.ps_desc.init_gflags)
            if mode == "async"
            else None,
            "pulls_sparse": "distributed_lookup_table" in ops,
            "program_ops": sorted(
                ops
                & {
                    "distributed_lookup_table",
                    "distributed_push_sparse",
                    "send",
                    "recv",
                    "send_barrier",
                    "fetch_barrier",
                }
            ),
            "dense": "each trainer's copy, merged on the servers" if mode == "geo" else "on the servers",
            # Fleet's geo tables cannot be saved (MemorySparseGeoTable::Save writes nothing), so
            # their rows cannot be counted.
            "tables": None if mode == "geo" else self._table_rows(),
            "evaluates": "the servers' model" if self.server_view else "this trainer's pulled parameters",
            "fed": self.fed,
            # How far the dense tower moved from its initial values, in this trainer's copy after
            # the last pull: in sync mode only the servers' barrier applies dense gradients.
            "dense_moved": self._dense_moved(),
            "traffic": _server_counters(self.fleet.server_endpoints()),
        }

    def _table_rows(self) -> Optional[Dict[str, Any]]:
        """Rows of the sparse tables as the servers hold them (trainer 0). Fleet's client has no
        call that returns them: its print_table_stat asks every server and prints the sum on
        this process's standard output, where it is read. (Saving the table and counting the
        saved rows cost a third of a small job's CPU: a gzip file for each of its 1000 shards.)"""
        if self.role.index != 0:
            return None
        runtime = self.fleet.fleet._runtime_handle
        table = _sparse_tables(runtime)["deep_table"]
        with captured_stdout(pass_on=True) as printed:
            runtime._worker.print_table_stat(table, 0, 0)
            deadline = time.monotonic() + PRINT_WAIT_S
            while not TABLE_STAT.search(printed()) and time.monotonic() < deadline:
                time.sleep(0.01)
        found = TABLE_STAT.search(printed())
        if found is None:
            log.warning("Fleet's client printed no table statistics: the table rows are not reported")
            return None
        return {"rows": int(found.group(1)), "bytes": None}

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


# The servers' brpc counters (its built-in /vars page on each server's port): requests served.
# console=1: plain text (brpc answers a browser-like client with HTML).
COUNTERS = re.compile(r"^cost_profiler_pserver_server_(pull|push)_(sparse|dense)_count : (\d+)$", re.M)


#: What Fleet's client prints for print_table_stat, summed over the servers.
TABLE_STAT = re.compile(r"table id: \d+, feasign size: (\d+),")
#: Seconds the client may take to print after its call returned (it prints after it answers).
PRINT_WAIT_S = 5.0


def _sparse_tables(runtime: Any) -> Dict[str, int]:
    """The servers' id of each sparse table, by the program's parameter name."""
    return {
        name: c.table_id()
        for c in runtime._send_ctx.values()
        if c.is_sparse()
        for name in ("deep_table", "wide_table")
        if name in c.origin_varnames()[0]
    }


class _LossHandler(FetchHandler):
    """The loss of thread 0's latest batch, read every LOSS_READ_S of a pass (Fleet's fetch
    monitor reads thread 0's scope, which the pass destroys when it ends; a persistable loss
    shared by the threads crashes them) and reported every PROGRESS_S."""

    def __init__(self, loss, progress: Callable[[float], None]):
        super().__init__(var_dict={"loss": loss}, period_secs=LOSS_READ_S)
        self.progress, self.last, self.reported = progress, float("nan"), time.monotonic()

    def handler(self, res_dict) -> None:
        value = res_dict.get("loss")
        if isinstance(value, np.ndarray) and value.size:
            self.last = float(value.reshape(-1)[0])
            if time.monotonic() - self.reported >= PROGRESS_S:
                self.reported = time.monotonic()
                self.progress(self.last)


class _ServerView:
    """Geo: the job's model is the servers' (each trainer's copy holds its own changes whole and
    the others' divided by the trainers: GeoCommunicator sends (copy - last sent) / trainers).
    Evaluation reads it from them: embedding rows through distributed_lookup_table, the dense
    tower pulled into a scope of its own, so the trainer's copy is left as it is."""

    def __init__(self, ps: "PaddlePs", runtime: Any, dense: Dict[int, list]):
        self.ps, self.runtime, self.dense = ps, runtime, dense
        self.scope = paddle.static.Scope()
        program, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(program, startup):
            # Rebuilding fills ps.initial again with the same values (tower_init is seeded).
            _, self.prob = ps._build(ps.cfg, server_lookup=True)
        tables = _sparse_tables(runtime)
        block = program.global_block()
        for index, op in list(enumerate(block.ops)):
            if op.type == "lookup_table_v2":
                self._to_server_lookup(block, index, op, tables)
        self.program = program._prune_with_input(["dense", "ids"], [self.prob])
        dim = ps.cfg.model.embedding_dim
        # distributed_lookup_table reads only the width of its W.
        for name, width in (("deep_table", dim), ("wide_table", 1)):
            self.scope.var(name).get_tensor().set(np.zeros([1, width], "float32"), paddle.CPUPlace())
        for name, value in ps.initial.items():
            self.scope.var(name).get_tensor().set(value, paddle.CPUPlace())

    @staticmethod
    def _to_server_lookup(block, index: int, op, tables: Dict[str, int]) -> None:
        weight = op.input("W")[0]
        inputs, outputs = op.input("Ids"), op.output("Out")
        block._remove_op(index)
        block._insert_op(
            index,
            type="distributed_lookup_table",
            inputs={"Ids": [block.var(n) for n in inputs], "W": [block.var(weight)]},
            outputs={"Outputs": [block.var(n) for n in outputs]},
            attrs={
                "is_distributed": True,
                "padding_idx": -1,
                "table_id": tables[weight],
                "lookup_table_version": "lookup_table_v2",
            },
        )

    def send_the_rest(self) -> None:
        """Stop the communicator once its thread has sent this trainer's last changes: it merges
        queued ids for about 50 ms (send_wait_times x 10 ms) and then sends, and stopping it
        while it sends drops what was queued meanwhile (stop_worker's own stop does)."""
        time.sleep(GEO_DRAIN_S)
        self.runtime._communicator.stop()

    def predict(self, feed: Dict[str, np.ndarray]) -> np.ndarray:
        for table_id, names in self.dense.items():
            self.runtime._worker.pull_dense_params(self.scope, table_id, names)
        (prob,) = self.ps.executor.run(self.program, feed=feed, fetch_list=[self.prob], scope=self.scope)
        return np.asarray(prob).reshape(-1)


def _server_counters(endpoints) -> Optional[Dict[str, int]]:
    totals: Dict[str, int] = {}
    for endpoint in endpoints:
        try:
            # Straight to the server: a proxy set in the environment must not see loopback requests.
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://{endpoint}/vars?console=1", timeout=5
            ) as page:
                text = page.read().decode("utf-8", "replace").replace("\r", "")
        except OSError:
            return None
        for way, kind, count in COUNTERS.findall(text):
            key = f"{way}_{kind}_requests"
            totals[key] = totals.get(key, 0) + int(count)
    return totals or None


def _sparse_shards(servers: int) -> int:
    return max(SPARSE_SHARDS, servers)


def _check_shards(folder: Path, servers: int) -> None:
    """A checkpoint's sparse tables in other shards (Fleet's default 1000: written before unitrain
    set its own) load only in part, without a word from Fleet: refused in one line."""
    for table, number in json.loads((folder / TABLES).read_text()).items():
        saved = len(list((folder / f"{number:03d}").glob("part-*")))
        if saved != _sparse_shards(servers):
            raise Refusal(
                f"trainer.resume: {folder} holds {table} in {saved} shards, and this job's servers hold it in "
                f"{_sparse_shards(servers)}: Fleet would load it only in part; allowed: a checkpoint written by "
                "this version of unitrain"
            )


def build(cfg, role: Role, resume: Optional[Path]) -> PaddlePs:
    if resume is not None and role.servers > 0:
        _check_shards(resume, role.servers)
    return PaddlePs(cfg, role, resume)
