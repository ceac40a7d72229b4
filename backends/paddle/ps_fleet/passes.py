"""dist.ps.feed=engine on Paddle: a pass over a trainer's files that Fleet runs by itself, as
PaddleRec trains (a QueueDataset streams the files through the MultiSlot pipe command, and
Executor.train_from_dataset steps the program in Hogwild threads), its loss read while it runs."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import paddle
from paddle.base.executor import FetchHandler

from unitrain.data import multislot
from unitrain.data.criteo_files import FileRows
from unitrain.errors import Refusal
from unitrain.interface.ps import PassResult

#: Seconds between the loss reports of a pass that Fleet runs (dist.ps.feed=engine).
PROGRESS_S = 10
LOSS_READ_S = 0.2


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


def train_pass(
    executor: Any,
    main: Any,
    loss: Any,
    share: FileRows,
    batch_size: int,
    threads: int,
    progress: Callable[[float], None],
    after: Optional[Callable[[], None]],
) -> Tuple[PassResult, Dict[str, Any]]:
    """One pass of ``main`` over the share's whole files in ``threads`` reader and trainer
    threads, ``progress(loss)`` called now and then; ``after`` (the servers' dense parameters
    pulled) once the engine is done. The pass's result, and what ran it, read back."""
    with tempfile.TemporaryDirectory(prefix="unitrain-feed-") as errors:
        result = _run_pass(executor, main, loss, share, batch_size, threads, progress, Path(errors))
        if after:
            after()
        refused = multislot.first_error(Path(errors))
    if refused:
        # Fleet's reader went on past the file it could not read: the pass is not the data.
        raise Refusal(f"{refused} (dist.ps.feed=engine: the pass skipped the rest of that file)")
    return result


def _run_pass(
    executor, main, loss, share: FileRows, batch_size: int, threads: int, progress, errors: Path
) -> Tuple[PassResult, Dict[str, Any]]:
    dataset = paddle.distributed.QueueDataset()
    block = main.global_block()
    dataset.init(
        batch_size=batch_size,
        thread_num=threads,
        use_var=[block.var(name) for name in ("dense", "ids", "label")],
        pipe_command=multislot.command(sys.executable, share.buckets, share.standardize, errors),
    )
    dataset.set_filelist(share.whole_files())
    handler = _LossHandler(loss, progress)
    tick = time.perf_counter()
    executor.train_from_dataset(
        program=main, dataset=dataset, thread=threads, fetch_handler=handler, print_period=10**9
    )
    seconds = time.perf_counter() - tick
    # Read back: the dataset takes at most a thread per file.
    fed = {
        "by": "Fleet QueueDataset (MultiSlotDataFeed) + Executor.train_from_dataset",
        "threads": dataset.thread_num,
        "files": len(dataset.filelist),
    }
    return PassResult(rows=share.rows, seconds=seconds, loss=handler.last), fed
