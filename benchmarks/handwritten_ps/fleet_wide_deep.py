"""Wide&deep on Paddle Fleet's parameter server, written as a Paddle user writes it from Paddle's
parameter-server quick start and FleetX's wide&deep example: static graph, one input per
categorical slot, ``sparse_embedding`` tables on the servers, ``a_sync`` strategy, and a
trainer loop that steps with ``Executor.run``. It shares nothing with unitrain but the data files.

    FLAGS_enable_pir_api=0 OMP_NUM_THREADS=1 .venv-ps/bin/python -m paddle.distributed.launch \\
        --server_num=1 --trainer_num=2 benchmarks/handwritten_ps/fleet_wide_deep.py --data DIR/train

DIR/train holds Criteo TSV part files (label, I1..I13, C1..C26); trainer i of T reads the files
i, i+T, ... Each trainer prints (and appends to --out) one JSON line: examples, the seconds of
its training loop, examples/s over the loop, and the median examples/s of its steps.

Paddle 3.0.0 (the last wheel with the engine) needs three additions a user finds on the way:
the dense parameters are pulled after each async step, trainer 0 retries its first push of them,
and trainer 0 stops the servers at the end (marked "3.0.0:" below).
"""

from __future__ import annotations

import os

# 3.0.0: the parameter-server passes work on the legacy program only (set before paddle loads).
os.environ.setdefault("FLAGS_enable_pir_api", "0")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, List, Tuple  # noqa: E402

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from criteo_rows import DENSE, SLOTS, Batch, batches, dense_stats  # noqa: E402 - beside this script
from paddle.distributed import fleet  # noqa: E402
from trainer_result import report, trainer_result  # noqa: E402

FIRST_PUSH_TRIES = 30


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder of Criteo TSV part files")
    p.add_argument("--batch", type=int, default=512, help="rows per step per trainer")
    p.add_argument("--lr", type=float, default=0.001, help="Adam's, dense and sparse")
    p.add_argument("--buckets", type=int, default=100_000, help="hash buckets of the categorical ids")
    p.add_argument("--dim", type=int, default=8, help="embedding width")
    p.add_argument("--hidden", default="400,400,400", help="the deep tower's layers")
    p.add_argument("--out", help="a file each trainer appends its JSON line to")
    return p.parse_args()


# --- model ---------------------------------------------------------------------------------
def wide_deep(buckets: int, dim: int, hidden: List[int]) -> Tuple[Any, List[str]]:
    """The loss of the wide&deep program and its feed names: the deep tower over the dense
    features and the 26 slots' embeddings, plus a linear term on the dense features and the
    sum of the slots' width-1 "wide" embeddings."""
    dense = paddle.static.data("dense", [-1, DENSE], "float32")
    slots = [paddle.static.data(f"C{s + 1}", [-1, 1], "int64") for s in range(SLOTS)]
    label = paddle.static.data("label", [-1, 1], "float32")

    def embed(ids: Any, table: str, width: int) -> Any:
        # One table per name on the servers, shared by the slots; rows start uniform in +-0.01.
        attr = paddle.ParamAttr(name=table, initializer=paddle.nn.initializer.Uniform(-0.01, 0.01))
        return paddle.static.nn.sparse_embedding(ids, size=[buckets, width], param_attr=attr)

    deep = paddle.reshape(paddle.concat([embed(s, "deep_emb", dim) for s in slots], axis=1), [-1, SLOTS * dim])
    wide = paddle.sum(paddle.concat([embed(s, "wide_emb", 1) for s in slots], axis=1), axis=1, keepdim=True)
    x = paddle.concat([dense, deep], axis=1)
    for width in hidden:
        x = paddle.static.nn.fc(x, width, activation="relu")
    logit = paddle.static.nn.fc(x, 1) + paddle.static.nn.fc(dense, 1) + wide
    loss = paddle.mean(F.binary_cross_entropy_with_logits(logit, label))
    return loss, ["dense", *(f"C{s + 1}" for s in range(SLOTS)), "label"]


def feed(names: List[str], batch: Batch) -> dict:
    dense, ids, label = batch
    return dict(zip(names, [dense, *(ids[:, s : s + 1] for s in range(SLOTS)), label[:, None]]))


# --- 3.0.0 additions -----------------------------------------------------------------------
def retry_first_push(runtime: Any) -> None:
    """3.0.0: trainer 0's init_worker pushes the initial dense parameters once, and a server that
    is not ready yet answers "push dense param failed" (now and then on a busy machine): retry."""
    push = runtime._init_all_params

    def retried(*args: Any) -> Any:
        for attempt in range(FIRST_PUSH_TRIES):
            try:
                return push(*args)
            except ValueError as err:
                if "push dense param failed" not in str(err) or attempt == FIRST_PUSH_TRIES - 1:
                    raise
                time.sleep(1.0)

    runtime._init_all_params = retried


def dense_puller(runtime: Any) -> Callable[[], None]:
    """3.0.0: in async mode a trainer pushes its dense gradients but nothing pulls the servers'
    dense parameters back (train_from_dataset's PullDenseWorker does): pull after each step."""
    from paddle.distributed.ps.utils.public import get_the_one_recv_context

    recv = get_the_one_recv_context(runtime.context, split_dense_table=runtime.is_heter_ps_mode)
    return lambda: runtime._pull_all_dense(runtime.scopes, runtime._send_ctx, recv)


# --- roles ---------------------------------------------------------------------------------
def train(args: argparse.Namespace, loss: Any, names: List[str]) -> dict:
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    runtime = fleet.fleet._runtime_handle
    retry_first_push(runtime)
    fleet.init_worker()
    pull_dense = dense_puller(runtime)
    index, count = fleet.worker_index(), fleet.worker_num()
    files = sorted(str(p) for p in Path(args.data).iterdir() if p.is_file())
    mean, std = dense_stats(files, args.buckets)
    main = paddle.static.default_main_program()
    costs, losses, examples = [], [], 0
    started = time.perf_counter()
    for batch in batches(files[index::count], args.batch, args.buckets, mean, std):
        tick = time.perf_counter()
        (value,) = exe.run(main, feed=feed(names, batch), fetch_list=[loss])
        pull_dense()
        losses.append(float(np.asarray(value)))
        costs.append(time.perf_counter() - tick)
        examples += len(batch[2])
    seconds = time.perf_counter() - started
    fleet.stop_worker()
    # 3.0.0: stop_worker leaves the servers running and launch would wait for them for ever;
    # once every trainer is done, trainer 0 stops them.
    fleet.barrier_worker()
    if index == 0:
        runtime._worker.stop_server()
    return trainer_result(
        framework=f"paddle {paddle.__version__}",
        trainer=index,
        batch=args.batch,
        costs=costs,
        losses=losses,
        examples=examples,
        seconds=seconds,
    )


def main() -> None:
    args = parse_args()
    paddle.enable_static()
    fleet.init(is_collective=False)  # the role comes from paddle.distributed.launch
    loss, names = wide_deep(args.buckets, args.dim, [int(h) for h in args.hidden.split(",")])
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    optimizer = fleet.distributed_optimizer(paddle.optimizer.Adam(learning_rate=args.lr), strategy)
    optimizer.minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()  # returns when trainer 0 stops the servers
        return
    report(train(args, loss, names), args.out)


if __name__ == "__main__":
    main()
