"""A torch parameter-server job's checkpoint files: each server's table (read back by id modulo the
servers, so a job resumes with another number of servers), and the dense tower with its optimizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from unitrain.spec.ps_table import SparseTable

TABLE_FILE, DENSE_FILE = "table.{}.npz", "dense.pt"


def save_dense(folder: Path, tower: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    torch.save({"tower": tower.state_dict(), "optimizer": optimizer.state_dict()}, folder / DENSE_FILE)


def load_dense(folder: Path, tower: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    state = torch.load(folder / DENSE_FILE, weights_only=True)
    tower.load_state_dict(state["tower"])
    optimizer.load_state_dict(state["optimizer"])


def load_tables(table: SparseTable, folder: Path, index: int, servers: int) -> None:
    """This server's ids (id modulo the servers) from every server's saved table."""
    for path in sorted(folder.glob(TABLE_FILE.format("*"))):
        with np.load(path) as saved:
            arrays = {k: saved[k] for k in saved.files}
        table.add(arrays, arrays["ids"] % servers == index)
