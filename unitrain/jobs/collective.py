"""Collective jobs (``dist.mode=collective``): the image models on image data, in one process or
data parallel through the framework's launcher, every process running the one training loop."""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
from pathlib import Path
from typing import Any, Dict

from unitrain.config.schema import DATASET_NAMES, PS_DATASETS, PS_MODELS, ModelInit, PsConfig, UnitrainConfig
from unitrain.config.validation import changed_from_schema, check_image_model, one_of
from unitrain.errors import ConfigError
from unitrain.host.memory import check_fits
from unitrain.interface.launch import launch_module
from unitrain.interface.validation import validation_module
from unitrain.jobs.kind import Processes, Summary
from unitrain.launch.shared_dir import seen_by_every_node
from unitrain.launch.supervise import (
    Launch,
    WorkersReported,
    check_before_launch,
    finished,
    launcher_command,
    network_env,
    run_isolated,
    supervise,
    write_worker_config,
)
from unitrain.launch.workers import LogFollower
from unitrain.model.custom import check_factories, custom_model
from unitrain.model.translate import CONVERT, keep
from unitrain.spec.hf import HF
from unitrain.spec.models import CUSTOM, MODELS
from unitrain.spec.optimizers import COLLECTIVE
from unitrain.tasks import task_of
from unitrain.train import restarts
from unitrain.train.parity import check_converted
from unitrain.train.trainer import train

log = logging.getLogger("unitrain")


def _check_ps_unread(ps: Any) -> None:
    """dist.ps.* as the schema has it: a data-parallel job reads none of it."""
    changed = changed_from_schema(ps, PsConfig)
    if changed:
        key, value = changed
        raise ConfigError(
            f"dist.ps.{key}",
            value,
            "unset with dist.mode=collective (only parameter-server jobs, dist=ps, read dist.ps.*)",
        )


class CollectiveJob:
    nodes_from_slurm = True

    def check(self, cfg: UnitrainConfig) -> None:
        one_of("model.name", cfg.model.name, MODELS.names() + [CUSTOM, HF] + list(PS_MODELS))
        check_image_model(cfg.model.name, cfg.data.image_size, cfg.model.freeze_bn)
        check_factories(cfg.model)
        if cfg.model.name == CUSTOM and cfg.model.mapping and cfg.model.init == ModelInit.shared:
            raise ConfigError(
                "model.init",
                "shared",
                "framework with model.mapping (shared draws follow each half's own parameter order, which a mapping "
                "says differs: start one half from the other's checkpoint with trainer.resume, or compare with "
                "unitrain.parity, which copies the weights through the mapping)",
            )
        if cfg.dist.interface is not None and cfg.dist.nproc_per_node * cfg.dist.nnodes == 1:
            raise ConfigError(
                "dist.interface", cfg.dist.interface, "unset with one process (no other process to talk to)"
            )
        if cfg.model.name in PS_MODELS:
            raise ConfigError(
                "model",
                cfg.model.name,
                f"one of {', '.join(MODELS.names())} with dist.mode=collective ({cfg.model.name} trains with "
                "dist.mode=ps)",
            )
        one_of("data.name", cfg.data.name, DATASET_NAMES + PS_DATASETS)
        if cfg.data.name in PS_DATASETS:
            raise ConfigError(
                "data",
                cfg.data.name,
                f"one of {', '.join(DATASET_NAMES)} with dist.mode=collective ({cfg.data.name} is for dist.mode=ps)",
            )
        one_of("optim.name", cfg.optim.name, COLLECTIVE)
        _check_ps_unread(cfg.dist.ps)
        if cfg.trainer.eval_every and not task_of(cfg).has_held_out(cfg.data):
            raise ConfigError(
                "trainer.eval_every",
                cfg.trainer.eval_every,
                f"0 with data={cfg.data.name} without held-out data (set data.val_samples, or data.val_path for "
                "imagefolder)",
            )

    def check_machine(self, cfg: UnitrainConfig) -> None:
        task_of(cfg).check_files(cfg)
        spec = MODELS.get(cfg.model.name) if cfg.model.name in MODELS else None
        features = spec.feature_dim if spec is not None else None
        check_fits(cfg.data.image_size, cfg.trainer.batch_size, cfg.data.num_classes, features)
        if cfg.model.name == CUSTOM:
            _check_custom(cfg)

    def check_backend(self, cfg: UnitrainConfig) -> None:
        validation_module(cfg.backend.name).check_collective(cfg)

    def processes(self, cfg: UnitrainConfig) -> Processes:
        count = cfg.dist.nproc_per_node
        return Processes(count=count, keys="dist.nproc_per_node", key="dist.nproc_per_node", value=count)

    def run(self, cfg: UnitrainConfig, run_dir: Path, fresh_process: bool) -> Summary:
        if cfg.model.name == CUSTOM and getattr(cfg.model, cfg.backend.name, None) == CONVERT:
            _keep_converted(cfg, run_dir)
        if cfg.dist.nproc_per_node * cfg.dist.nnodes > 1:
            return launch(cfg, run_dir)
        if fresh_process:
            return run_isolated(cfg, run_dir)
        return train(cfg, run_dir)

    def summary_node(self, cfg: UnitrainConfig) -> int:
        return 0

    def summary_holder(self, cfg: UnitrainConfig) -> str:
        return "node 0"


def launch(cfg: UnitrainConfig, run_dir: Path) -> Summary:
    """Run ``cfg`` data-parallel; returns rank 0's summary (None on nodes other than node 0)."""
    run_dir = Path(run_dir).resolve()
    launcher = launch_module(cfg.backend.name).LAUNCHER
    dist = cfg.dist
    check_before_launch(cfg, dist.nproc_per_node, "dist.nproc_per_node")
    config_file = write_worker_config(cfg, run_dir, dist.nproc_per_node)
    # The shared directory's marks inside: node 0 stops what is beside its launcher (Paddle's
    # etcd master) only once the other nodes have left it.
    with launcher.beside(dist, run_dir) as beside, seen_by_every_node(dist):
        command = launcher_command(launcher, launcher.options(dist, run_dir), [], config_file, run_dir, beside)
        log.info("launching %d worker(s) on this node: %s", dist.nproc_per_node, shlex.join(command))
        launch = Launch(
            launcher=launcher,
            command=command,
            # This node's first worker: rank 0 of the job on node 0.
            follower=LogFollower(run_dir / "workerlog.0", f"[rank {dist.node_rank * dist.nproc_per_node}] "),
            workers=dist.nproc_per_node,
            env={**network_env(dist, launcher), **beside.env},
            nodes=WorkersReported(run_dir),
        )
        supervise(cfg, run_dir, launch)
    if dist.max_restarts:
        restarts.add_to_summary(run_dir)
    return finished(run_dir)


#: Converted trees whose forward check passed in this process -> the comparison.
_FORWARD_CHECKED: Dict[Path, Dict[str, Any]] = {}


def _keep_converted(cfg: UnitrainConfig, run_dir: Path) -> None:
    """The run's copy of its converted model, and what the conversion and its check found."""
    translation = custom_model(cfg.model, cfg.data.image_size).translation(cfg.backend.name)
    keep(translation, run_dir)
    found = _FORWARD_CHECKED.get(translation.directory)
    log.info(
        "model.%s=convert: %s converted (%d calls, substituted: %s; the code: %s)%s",
        cfg.backend.name,
        translation.source.top,
        translation.converted,
        ", ".join(f"{k} x{v}" for k, v in translation.substituted.items()) or "none",
        Path(run_dir) / "converted",
        f"; from the same weights, {found['layers_compared']} layer outputs within {found['largest']['rel_diff']:.2e} "
        "of the other half's"
        if found
        else "",
    )


def _check_custom(cfg: UnitrainConfig) -> None:
    """model=custom, before anything is written: model.kwargs is a mapping, the mapping file
    reads as {name: name} pairs (a resume from the other framework's checkpoint reads it), the
    backend's factory names a module that exists (or converts, with convert), and the model it
    builds gives logits of the shape the data needs on one batch: [batch, classes], or
    [batch, time, vocab] with data=text. This imports the framework. A translated half is then
    compared with its source layer by layer."""
    key = f"model.{cfg.backend.name}"
    path = getattr(cfg.model, cfg.backend.name, None)
    pair = custom_model(cfg.model, cfg.data.image_size, task_of(cfg).block_size(cfg))
    if cfg.model.mapping:
        if not os.path.isfile(cfg.model.mapping):
            raise ConfigError("model.mapping", cfg.model.mapping, "an existing JSON file of {name: name} pairs")
        pair.explicit_mapping()
    if path != CONVERT:
        allowed = f"an import path pkg.module:function that builds the {cfg.backend.name} model (model=custom)"
        if not path:
            raise ConfigError(key, path, allowed)
        module = path.split(":")[0] if ":" in path else path.rpartition(".")[0]
        try:
            found = bool(module) and importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(key, path, f"{allowed}; no module {module!r} on the path")
    translation = pair.translation(cfg.backend.name) if path == CONVERT else None
    classes = pair.check_output(cfg.backend.name, cfg.data)
    if translation is not None and translation.directory not in _FORWARD_CHECKED:
        _FORWARD_CHECKED[translation.directory] = check_converted(cfg, cfg.backend.name, classes)
