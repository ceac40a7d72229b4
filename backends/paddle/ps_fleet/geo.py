"""Geo on Paddle: a trainer evaluates the servers' model, not its own copy (:class:`ServerView`),
and sends its last changes before the end."""

from __future__ import annotations

import time
from typing import Any, Dict

import numpy as np
import paddle

from unitrain.backends.paddle.ps_fleet.program import wide_deep
from unitrain.backends.paddle.ps_fleet.tables import sparse_tables

#: Seconds a geo trainer leaves its communicator's thread to send its last changes.
GEO_DRAIN_S = 0.5


class ServerView:
    """Geo: the job's model is the servers' (each trainer's copy holds its own changes whole and
    the others' divided by the trainers: GeoCommunicator sends (copy - last sent) / trainers).
    Evaluation reads it from them: embedding rows through distributed_lookup_table, the dense
    tower pulled into a scope of its own, so the trainer's copy is left as it is."""

    def __init__(self, cfg, executor: Any, initial: Dict[str, np.ndarray], runtime: Any, dense: Dict[int, list]):
        self.executor, self.runtime, self.dense = executor, runtime, dense
        self.scope = paddle.static.Scope()
        program, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(program, startup):
            _, self.prob, _ = wide_deep(cfg, "lookup")
        tables = sparse_tables(runtime)
        block = program.global_block()
        for index, op in list(enumerate(block.ops)):
            if op.type == "lookup_table_v2":
                self._to_server_lookup(block, index, op, tables)
        self.program = program._prune_with_input(["dense", "ids"], [self.prob])
        dim = cfg.model.embedding_dim
        # distributed_lookup_table reads only the width of its W.
        for name, width in (("deep_table", dim), ("wide_table", 1)):
            self.scope.var(name).get_tensor().set(np.zeros([1, width], "float32"), paddle.CPUPlace())
        for name, value in initial.items():
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
        (prob,) = self.executor.run(self.program, feed=feed, fetch_list=[self.prob], scope=self.scope)
        return np.asarray(prob).reshape(-1)
