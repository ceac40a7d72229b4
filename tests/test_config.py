"""The Hydra config: every group composes, typed schemas reject wrong keys and types, values are checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from unitrain.config.schema import register_configs
from unitrain.errors import ConfigError
from unitrain.jobs.select import validate
from unitrain.launch import preflight
from unitrain.launch.hydra import check_group_choices, group_options

register_configs()


def make(*overrides: str):
    with initialize_config_module(version_base=None, config_module="unitrain.conf"):
        return compose(config_name="config", overrides=list(overrides))


def test_required_groups_and_options_exist():
    options = group_options()
    assert options["backend"] == ["paddle", "torch"]
    assert options["amp"] == ["O0", "O1", "O2", "O3"]
    assert set(options["model"]) >= {"resnet50", "resnet18", "resnet18_cifar", "resnet18_stride2", "tiny"}
    assert set(options["data"]) >= {"synthetic", "learnable", "imagefolder"}
    for group in ("optim", "trainer", "dist", "profiler", "experiment"):
        assert options[group], group


def _hf_folder(folder: Path) -> Path:
    """A tiny LLaMA folder written without transformers: its config.json, zero weights of the
    shapes it implies, and a byte-level BPE tokenizer.json."""
    import tokenizers
    from safetensors.numpy import save_file

    from unitrain.spec.hf import expected_shapes, read_config

    folder.mkdir()
    config = {"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64}
    config |= {"num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu"}
    (folder / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 64}))
    weights = {n: np.zeros(s, np.float32) for n, s in expected_shapes(read_config(folder)).items()}
    save_file(weights, str(folder / "model.safetensors"))
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=280, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(["a short corpus of plain prose"] * 5, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return folder


PS_ONLY = {"wide_deep", "criteo", "criteo_synthetic", "sgd", "adagrad", "adam", "ps", "wide_deep_ps"}


@pytest.mark.parametrize(
    "group,option",
    [(g, o) for g, opts in group_options().items() for o in opts],
)
def test_every_option_composes_and_validates(group, option, tmp_path):
    extra = [f"data.path={tmp_path}"] if option == "imagefolder" else []
    if option in PS_ONLY:
        # The parameter-server job's options: valid within that job.
        extra.append("experiment=wide_deep_ps")
    if option == "custom":
        # Validation builds the user's model once, to check its logits' shape on one batch.
        extra.append("model.torch=examples.gallery.convmixer:build")
    if option == "hf":
        # A Hugging Face folder: validation reads its config.json, weight headers and tokenizer.
        extra += [f"model.path={_hf_folder(tmp_path / 'hf')}", "data.block_size=8"]
    if option.startswith("gpt_") or option in ("text", "hf"):
        # A language model and its corpus go together.
        (tmp_path / "corpus.txt").write_text("A short corpus of plain prose, long enough for a block or two. " * 20)
        extra += ["data=text" if group == "model" else "model=gpt_nano", f"data.path={tmp_path / 'corpus.txt'}"]
    if option == "criteo":
        (tmp_path / "train.txt").write_text("0" + "\t" * 39 + "\n")
        extra.append(f"data.path={tmp_path / 'train.txt'}")
    cfg = make(f"{group}={option}", *extra)
    validate(cfg)
    if group in ("backend", "model", "data"):
        assert cfg[group].name == option
    if group == "amp":
        assert cfg.amp.level == option


def test_defaults_are_the_documented_job():
    cfg = make()
    assert (cfg.backend.name, cfg.model.name, cfg.data.name, cfg.amp.level) == ("torch", "resnet50", "learnable", "O0")
    assert cfg.dist.nproc_per_node == 1 and cfg.trainer.threads is None
    # The seed's optimizer in the optim group, at the small default job's lr.
    assert (cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay) == (0.02, 0.9, 1e-4)
    assert make("experiment=seed_resnet50").optim.lr == 0.1
    # A choice of optimizer brings its own lr, whatever the experiment: none sets one for all.
    for name, lr in (("sgd", 0.1), ("adagrad", 0.01), ("adam", 0.001)):
        assert make("experiment=wide_deep_ps", f"optim={name}").optim.lr == lr
    from unitrain.config.schema import OptimConfig

    assert (OptimConfig.lr, OptimConfig.momentum, OptimConfig.weight_decay) == (0.1, 0.9, 1e-4)


def test_seed_experiment_is_one_choice_away():
    cfg = make("experiment=seed_resnet50")
    assert cfg.model.name == "resnet50" and cfg.data.name == "synthetic"
    assert (cfg.data.image_size, cfg.data.num_classes, cfg.trainer.batch_size, cfg.trainer.steps) == (224, 102, 32, 100)


def test_fashion_mnist_recipe_is_the_one_readme_measured_and_the_first_is_three_overrides_away():
    cfg = make("experiment=fashion_mnist_resnet18")
    assert (cfg.model.name, cfg.data.name, cfg.data.image_size, cfg.data.augment, cfg.model.init) == (
        "resnet18_stride2",
        "fashion_mnist",
        28,
        "flip",
        "shared",
    )
    assert (cfg.trainer.epochs, cfg.trainer.batch_size, cfg.trainer.steps) == (10, 128, None)
    first = make("experiment=fashion_mnist_resnet18", "model=resnet18", "data.image_size=32", "data.augment=standard")
    assert (first.model.name, first.data.image_size, first.data.augment, first.model.init) == (
        "resnet18",
        32,
        "standard",
        "shared",
    )
    validate(cfg)
    validate(first)


def test_unknown_key_fails_at_compose():
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        make("trainer.stepz=3")


def test_wrong_type_fails_at_compose():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        make("trainer.steps=many")


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.lr=0", "optim.lr"),
        ("optim.lr=-0.1", "optim.lr"),
        ("trainer.batch_size=0", "trainer.batch_size"),
        ("model.name=vgg", "model.name"),
        ("data.num_workers=-1", "data.num_workers"),
    ],
)
def test_validate_names_the_key_and_what_is_allowed(override, key):
    with pytest.raises(ConfigError) as err:
        validate(make(override))
    message = str(err.value)
    assert message.startswith(key + "=") and "allowed" in message and "\n" not in message


@pytest.mark.parametrize(
    "override,message",
    [
        ("amp.dtype=float8", "amp.dtype='float8' is not allowed: one of float16, bfloat16"),
        ("profiler.mode=verbose", "profiler.mode='verbose' is not allowed: one of off, timer, trace"),
        ("dist.ps.sync=eventually", "dist.ps.sync='eventually' is not allowed: one of sync, async, geo"),
        ("trainer.loggers=[wandb]", "trainer.loggers='wandb' is not allowed: one of tensorboard, visualdl, mlflow"),
    ],
)
def test_a_choice_outside_its_set_is_refused_at_compose_in_one_line(override, message):
    with pytest.raises(preflight.PreflightError) as err:
        preflight.check([override], "unitrain.conf", "config")
    assert str(err.value) == message


def test_choices_read_and_write_as_their_strings():
    cfg = make("amp=O2", "dist.ps.sync=async", "data.order=global")
    assert cfg.amp.level == "O2" and f"{cfg.amp.level}" == "O2" and str(cfg.dist.ps.sync) == "async"
    assert repr(cfg.data.order) == "'global'" and {"global": 1}[cfg.data.order] == 1


def test_group_choice_check_lists_options():
    assert check_group_choices(["backend=torch", "model=tiny", "trainer.steps=3"]) is None
    assert check_group_choices(["-m", "backend=paddle,torch"]) is None
    problem = check_group_choices(["-m", "backend=paddle,mxnet"])
    assert problem == "backend='mxnet' is not allowed: one of paddle, torch"


def test_unset_threads_are_a_share_of_the_node_and_the_log_says_layouts_differ(tmp_path, caplog):
    """Two hosts x 1 process and one host x 2 processes give their processes different thread
    counts by default; the run's log says so, and that pinning trainer.threads matches them."""
    import logging

    from omegaconf import OmegaConf

    from unitrain.host.threads import available_cores
    from unitrain.launch.supervise import write_worker_config

    with caplog.at_level(logging.INFO, logger="unitrain"):
        written = write_worker_config(make("model=tiny"), tmp_path, processes=2)
    assert OmegaConf.load(written).trainer.threads == max(1, available_cores() // 2)
    assert "matches this one bit for bit only with trainer.threads set" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="unitrain"):
        write_worker_config(make("model=tiny", "trainer.threads=1"), tmp_path, processes=2)
    assert "trainer.threads unset" not in caplog.text
