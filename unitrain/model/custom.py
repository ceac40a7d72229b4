"""A user's own model pair: one factory per framework, named by import path.

``model=custom model.torch=my_pkg.nets:build_torch model.paddle=my_pkg.nets:build_paddle
model.kwargs={width: 64}`` builds the backend's model with
``factory(num_classes=..., image_size=..., **kwargs)``: the data's class count and image size, and
the user's own arguments; with ``data=text``, ``factory(vocab_size=..., block_size=..., **kwargs)``:
the corpus's vocabulary and data.block_size, for a model from [batch, time] token ids to
[batch, time, vocab] logits. The path is Hydra's ``_target_`` (``pkg.module.function``) or the
entry-point form ``pkg.module:function``; both resolve with ``hydra.utils.get_method``.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from unitrain.errors import ConfigError, UnitrainError
from unitrain.interface.backend import get_backend
from unitrain.interface.data import data_module
from unitrain.interface.modules import available_backends
from unitrain.interface.translate import translate_module
from unitrain.model.pairing import tied
from unitrain.model.translate import CONVERT, RUN_COPY, ConversionRefused, Translation, find_source, run_copy, translate
from unitrain.model.user_code import (
    check_model,
    describe_output,
    failed_at,
    given,
    logits_of,
    pick_logits,
    resolve_factory,
    what_it_said,
    where_it_failed,
)
from unitrain.spec.hf import HF, read_config
from unitrain.spec.models import CUSTOM, MODELS, ViTSpec
from unitrain.tasks import task_for_data, task_of

log = logging.getLogger("unitrain")


@dataclass(frozen=True, kw_only=True)
class CustomModel:
    #: backend name -> import path of its factory.
    factories: Mapping[str, str]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: A JSON file {name in one framework's state: name in the other's} for what cannot be derived.
    mapping: Optional[str] = None
    image_size: int = 32
    #: data=text: the tokens of a sample. Set, the factories are text factories, called with
    #: vocab_size= and block_size=; None, image factories (num_classes=, image_size=).
    block_size: Optional[int] = None
    #: A checkpoint's run: its translated half is built from the copy the run kept, the code it
    #: trained with, not from the source as it reads now.
    run_dir: Optional[Path] = None

    @property
    def text(self) -> bool:
        return self.block_size is not None

    def arguments(self, num_classes: int) -> Dict[str, Any]:
        """A factory's keyword arguments for data of ``num_classes`` classes (a vocabulary, for text)."""
        data = (
            {"vocab_size": num_classes, "block_size": self.block_size}
            if self.text
            else {"num_classes": num_classes, "image_size": self.image_size}
        )
        return {**data, **dict(self.kwargs)}

    def expects(self) -> str:
        return "vocab_size=, block_size=" if self.text else "num_classes=, image_size="

    def factory_path(self, backend: str) -> str:
        path = self.factories.get(backend)
        if not path:
            raise ConfigError(
                f"model.{backend}", path, f"an import path pkg.module:function that builds the {backend} model"
            )
        return path

    def build(self, backend: str, num_classes: int) -> Any:
        """The user's ``backend`` model for this data."""
        path = self.factory_path(backend)
        factory = self.translation(backend).factory() if path == CONVERT else resolve_factory(f"model.{backend}", path)
        arguments = self.arguments(num_classes)
        try:
            inspect.signature(factory).bind(**arguments)
        except TypeError as err:
            raise ConfigError(
                f"model.{backend}",
                path,
                f"a factory taking {self.expects()} and model.kwargs ({', '.join(self.kwargs) or 'none'})"
                f"{' (data=text)' if self.text else ''}; it says: {err}",
            ) from None
        except ValueError:  # no signature to read (a builtin): let the call say
            pass
        try:
            model = factory(**arguments)
        except (UnitrainError, MemoryError):
            raise
        except Exception as err:  # noqa: BLE001 - the user's code failing: one line that says where
            if path == CONVERT:
                self._converted_failed(backend, arguments, err)
            raise ConfigError(
                f"model.{backend}",
                path,
                f"a factory that builds the model{given(self.kwargs)}; it failed at {failed_at(err)}",
            ) from None
        check_model(backend, path, model)
        # What its calls return is its logits, also where it returns (logits, ...) or .logits.
        pick_logits(get_backend(backend), model)
        # The names its state gives one tensor twice, for the pairing and model.init=shared of
        # the model just built (unitrain.model.pairing).
        tied(get_backend(backend), model, known=False)
        return model

    def _converted_failed(self, backend: str, arguments: Dict[str, Any], err: Exception) -> None:
        """The translated factory failed: whose failure it is. The user's own factory, run with the
        same arguments, failing too is the user's code (its file and line, not the converted
        copy's); otherwise the conversion's."""
        source = translate_module(backend).SOURCE
        path = self.factories[source]
        try:
            resolve_factory(f"model.{source}", path)(**arguments)
        except (UnitrainError, MemoryError):
            raise
        except Exception as own:  # noqa: BLE001 - the user's code failing: one line that says where
            raise ConfigError(
                f"model.{source}",
                path,
                f"a factory that builds the model{given(self.kwargs)}; it failed at {failed_at(own)}",
            ) from None
        raise ConversionRefused(
            f"model.{backend}=convert: building the converted model failed at {where_it_failed(err)} (your {source} "
            f"factory builds): {what_it_said(err)}; allowed: code that converts to calls {backend} takes, or a "
            f"{backend} half of your own"
        ) from None

    def check_output(self, backend: str, data: Any) -> int:
        """The model ``backend``'s factory builds (converted or not) for the data a DataConfig
        ``data`` describes gives logits of the shape training needs, on one batch, in evaluation
        mode and in training mode (what only training returns, an auxiliary output, a tuple):
        [batch, classes] for images, [batch, time, vocab] for token ids, itself or picked from
        ``(logits, ...)`` or ``.logits`` (:func:`~unitrain.model.user_code.logits_of`); else one
        line naming the factory the user wrote, what the model returned and what is wanted. A
        converted model that fails where the user's own runs is the conversion's
        (:class:`ConversionRefused`). Returns the class count (the vocabulary) it was built for
        (:func:`classes_of`)."""
        num_classes = classes_of(data)
        samples = ProbeSamples(self, num_classes, count=2)
        # The factory the user wrote: with model.<backend>=convert, the one converted from.
        written = self.written_half(backend)
        problem = self._probe(backend, samples, "it" if written == backend else "the converted half")
        if problem is None:
            return num_classes
        if written != backend:
            own = self._probe(written, samples, "it")
            if own is None:  # the user's model runs: the conversion's
                raise ConversionRefused(
                    f"model.{backend}=convert: {problem[1]}, where your {written} model gives logits "
                    f"{samples.wanted()}; allowed: code that converts to calls {backend} takes (see docs/models.md), "
                    f"or a {backend} half of your own"
                )
            problem = own
        raise ConfigError(f"model.{written}", self.factory_path(written), "; ".join(problem))

    def _probe(self, backend: str, samples: "ProbeSamples", subject: str) -> Optional[Tuple[str, str]]:
        """What is wrong with the ``backend`` model's output on ``samples``, in evaluation mode,
        then in training mode: (what is allowed, what ``subject``, the model, did), or None."""
        model = self.build(backend, samples.num_classes)
        inputs, _ = next(iter(data_module(backend).make_loader(samples, [list(range(samples.count))])))
        for training in (False, True):
            (model.train if training else model.eval)()
            mode = "in training mode (random layers on) " if training else ""
            try:
                output = model(inputs)
            except (UnitrainError, MemoryError):
                raise
            except Exception as err:  # noqa: BLE001 - the user's model failing: one line that says where
                return f"a model that takes {samples.describe()}", f"{mode}{subject} failed at {failed_at(err)}"
            shape = _shape(backend, output)
            if shape == list(samples.wanted_shape()):
                continue
            # What the model's own forward returns: a call of forward runs no hook of the model
            # itself, so not pick_logits'.
            raw = model.forward(inputs)
            if shape is not None and logits_of(raw) is raw:  # one tensor, of another shape
                return (
                    f"a model giving logits {samples.wanted()} for {samples.describe()}",
                    f"{mode}{subject} gave {shape}",
                )
            returned = describe_output(raw, lambda x: _shape(backend, x))
            allowed = (
                f"a model whose output is logits {samples.wanted()}: one tensor, the first of a tuple "
                "(logits, ...) or an output's .logits"
            )
            return allowed, f"{mode}{subject} returned {returned}"
        return None

    def written_half(self, backend: str) -> str:
        """The backend whose factory the user wrote for ``backend``'s model: itself, or where
        ``model.<backend>=convert`` the one converted from."""
        return translate_module(backend).SOURCE if self.factories.get(backend) == CONVERT else backend

    def translation(self, backend: str) -> Translation:
        """``model.<backend>=convert``: the other half's code, converted (cached)."""
        source = translate_module(backend).SOURCE
        path = self.factories.get(source) if source else None
        if not path or path == CONVERT:
            raise ConfigError(f"model.{backend}", CONVERT, _convert_allowed(backend, source))
        if self.run_dir is not None:
            kept = run_copy(self.run_dir, f"model.{source}", path)
            if kept is not None:
                return kept
            log.warning(
                "model.%s=convert: %s holds no %s/ copy of its converted model; converting %s as it reads now",
                backend,
                self.run_dir,
                RUN_COPY,
                path,
            )
        return translate(find_source(f"model.{source}", path), backend)

    def explicit_mapping(self) -> Dict[str, str]:
        """The user's mapping file, or {}."""
        if not self.mapping:
            return {}
        try:
            pairs = json.loads(Path(self.mapping).read_text())
        except (OSError, ValueError) as err:
            raise ConfigError("model.mapping", self.mapping, f"a JSON file of {{name: name}} pairs; {err}") from None
        if not isinstance(pairs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in pairs.items()):
            raise ConfigError("model.mapping", self.mapping, "a JSON object whose keys and values are parameter names")
        return pairs

    def record(self) -> Dict[str, Any]:
        """What a checkpoint or an export keeps to build the pair again."""
        return {
            "factories": dict(self.factories),
            "kwargs": dict(self.kwargs),
            "mapping": self.mapping,
            "image_size": self.image_size,
            "block_size": self.block_size,
        }


def _shape(backend: str, output: Any) -> Optional[list]:
    """A tensor's shape, or None for anything else (a tuple, a dict of outputs)."""
    try:
        return list(get_backend(backend).to_numpy(output).shape)
    except Exception:  # noqa: BLE001 - not a tensor of this framework
        return None


class ProbeSamples:
    """A few samples of what a pair's models take, to check them on: random images
    [3, image_size, image_size], or token ids [block_size] in [0, vocab), with labels."""

    def __init__(self, pair: CustomModel, num_classes: int, count: int = 2, seed: int = 0):
        self.pair, self.num_classes, self.count = pair, num_classes, count
        rng = np.random.default_rng(seed)
        if pair.text:
            shape = (count, pair.block_size)
            self.inputs = rng.integers(0, num_classes, shape).astype(np.int64)
            self.labels = rng.integers(0, num_classes, shape).astype(np.int64)
        else:
            self.inputs = rng.standard_normal((count, 3, pair.image_size, pair.image_size)).astype(np.float32)
            self.labels = rng.integers(0, num_classes, count).astype(np.int64)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Tuple[np.ndarray, np.ndarray]:
        return self.inputs[index], self.labels[index]

    def wanted_shape(self) -> Tuple[int, ...]:
        if self.pair.text:
            return (self.count, self.pair.block_size, self.num_classes)
        return (self.count, self.num_classes)

    def wanted(self) -> str:
        if self.pair.text:
            return f"[batch, time, vocab] = {list(self.wanted_shape())} (at every position, one per token)"
        return f"[batch, classes] = {list(self.wanted_shape())} (one per class)"

    def describe(self) -> str:
        if self.pair.text:
            return f"{self.count} rows of {self.pair.block_size} int64 token ids"
        size = self.pair.image_size
        return f"{self.count} images [3, {size}, {size}]"


def _convert_allowed(backend: str, source: Optional[str]) -> str:
    if source is None:
        return f"an import path pkg.module:function of your {backend} model (no converter writes {backend} code)"
    return f"convert with model.{source}=pkg.module:function naming the {source} model to convert"


def check_factories(model_cfg: Any) -> None:
    """A factory (model.<backend>) only with model=custom, where it builds the model; with a
    built-in model it would be read by nothing. ``convert`` only where the backend converts the
    other half's code, and that half is named."""
    for name in available_backends():
        path = getattr(model_cfg, name, None)
        if path is not None and not str(path).strip():
            raise ConfigError(f"model.{name}", path, "unset (null) or an import path pkg.module:function")
    if model_cfg.name == CUSTOM:
        for name in available_backends():
            if getattr(model_cfg, name, None) == CONVERT:
                source = translate_module(name).SOURCE
                if not source or getattr(model_cfg, source, None) in (None, CONVERT):
                    raise ConfigError(f"model.{name}", CONVERT, _convert_allowed(name, source))
        return
    for name in available_backends():
        path = getattr(model_cfg, name, None)
        if path:
            raise ConfigError(
                f"model.{name}", path, f"unset with model={model_cfg.name} (a factory builds the model of model=custom)"
            )


def custom_model(model_cfg: Any, image_size: int, block_size: Optional[int] = None) -> CustomModel:
    """The pair a ``model`` config group names; ``block_size``: data=text's, for text factories."""
    factories = {name: getattr(model_cfg, name, None) for name in available_backends()}
    return CustomModel(
        factories={k: v for k, v in factories.items() if v},
        kwargs=factory_kwargs(model_cfg.kwargs),
        mapping=model_cfg.mapping,
        image_size=image_size,
        block_size=block_size,
    )


def classes_of(data: Any) -> int:
    """The class count a job's factory is built for, as its task reads it in the main process
    without loading the data (the vocabulary for data=text: the corpus's characters, or
    data.vocab_size for BPE; an image folder's class sub-directories)."""
    return task_for_data(data.name).classes(data)


def factory_kwargs(kwargs: Any) -> Dict[str, Any]:
    """model.kwargs: a mapping of argument names to values (or unset), else one line."""
    if kwargs is None:
        return {}
    if isinstance(kwargs, Mapping) or (hasattr(kwargs, "keys") and hasattr(kwargs, "items")):
        if all(isinstance(k, str) for k in kwargs.keys()):
            return dict(kwargs.items())
    raise ConfigError(
        "model.kwargs",
        kwargs,
        "a mapping of the factory's own arguments, e.g. 'model.kwargs={width: 32}' (or unset)",
    )


def sized(name: str, image_size: int) -> "str | ViTSpec":
    """A built-in model's name, or its spec where it depends on the image size (a ViT's position
    embeddings)."""
    spec = MODELS.get(name) if name in MODELS else None
    return replace(spec, image_size=image_size) if isinstance(spec, ViTSpec) else name


def model_ref(cfg: Any) -> "str | ViTSpec | CustomModel":
    """What :func:`unitrain.model.build.build_model` takes for a job's config: a built-in model, or the pair."""
    if cfg.model.name == CUSTOM:
        # Tokens per sample (text factories) where the task has them, else image factories.
        return custom_model(cfg.model, cfg.data.image_size, task_of(cfg).block_size(cfg))
    if cfg.model.name == HF:
        return read_config(cfg.model.path)
    return sized(cfg.model.name, cfg.data.image_size)


def from_record(record: Mapping[str, Any], run_dir: Optional[Path] = None) -> CustomModel:
    """The pair a checkpoint's record names; ``run_dir``: the run that wrote it, whose converted
    copy builds a translated half."""
    return CustomModel(
        run_dir=run_dir,
        factories=dict(record["factories"]),
        kwargs=dict(record.get("kwargs") or {}),
        mapping=record.get("mapping"),
        image_size=int(record.get("image_size", 32)),
        block_size=record.get("block_size"),
    )
