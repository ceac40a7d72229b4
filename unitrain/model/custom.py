"""A user's own model pair: one factory per framework, named by import path.

``model=custom model.torch=my_pkg.nets:build_torch model.paddle=my_pkg.nets:build_paddle
model.kwargs={width: 64}`` builds the backend's model with
``factory(num_classes=..., image_size=..., **kwargs)``: the data's class count and image size, and
the user's own arguments. The path is Hydra's ``_target_`` (``pkg.module.function``) or the
entry-point form ``pkg.module:function``; both resolve with ``hydra.utils.get_method``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from hydra.utils import get_method

from unitrain.errors import ConfigError
from unitrain.interface.modules import available_backends
from unitrain.spec.models import CUSTOM, MODELS, ViTSpec


@dataclass(frozen=True, kw_only=True)
class CustomModel:
    #: backend name -> import path of its factory.
    factories: Mapping[str, str]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: A JSON file {name in one framework's state: name in the other's} for what cannot be derived.
    mapping: Optional[str] = None
    image_size: int = 32

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
        factory = _resolve(f"model.{backend}", path)
        try:
            return factory(num_classes=num_classes, image_size=self.image_size, **dict(self.kwargs))
        except TypeError as err:
            raise ConfigError(
                f"model.{backend}",
                path,
                f"a factory taking num_classes=, image_size= and model.kwargs ({', '.join(self.kwargs) or 'none'}); "
                f"it says: {err}",
            ) from None

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
        }


def _resolve(key: str, path: str) -> Any:
    # The launchers start workers by script path, which puts the script's folder first on
    # sys.path, not the folder the user ran the command from, where their package lives.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return get_method(path.replace(":", "."))
    except Exception as err:  # noqa: BLE001 - Hydra wraps every import failure in its own kinds
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(key, path, f"an importable function (pkg.module:function); {why}") from None


def check_factories(model_cfg: Any) -> None:
    """A factory (model.<backend>) only with model=custom, where it builds the model; with a
    built-in model it would be read by nothing."""
    for name in available_backends():
        path = getattr(model_cfg, name, None)
        if path is not None and not str(path).strip():
            raise ConfigError(f"model.{name}", path, "unset (null) or an import path pkg.module:function")
    if model_cfg.name == CUSTOM:
        return
    for name in available_backends():
        path = getattr(model_cfg, name, None)
        if path:
            raise ConfigError(
                f"model.{name}", path, f"unset with model={model_cfg.name} (a factory builds the model of model=custom)"
            )


def custom_model(model_cfg: Any, image_size: int) -> CustomModel:
    """The pair a ``model`` config group names."""
    factories = {name: getattr(model_cfg, name, None) for name in available_backends()}
    return CustomModel(
        factories={k: v for k, v in factories.items() if v},
        kwargs=dict(model_cfg.kwargs or {}),
        mapping=model_cfg.mapping,
        image_size=image_size,
    )


def sized(name: str, image_size: int) -> "str | ViTSpec":
    """A built-in model's name, or its spec where it depends on the image size (a ViT's position
    embeddings)."""
    spec = MODELS.get(name) if name in MODELS else None
    return replace(spec, image_size=image_size) if isinstance(spec, ViTSpec) else name


def model_ref(cfg: Any) -> "str | ViTSpec | CustomModel":
    """What :func:`unitrain.model.build.build_model` takes for a job's config: a built-in model, or the pair."""
    if cfg.model.name == CUSTOM:
        return custom_model(cfg.model, cfg.data.image_size)
    return sized(cfg.model.name, cfg.data.image_size)


def from_record(record: Mapping[str, Any]) -> CustomModel:
    return CustomModel(
        factories=dict(record["factories"]),
        kwargs=dict(record.get("kwargs") or {}),
        mapping=record.get("mapping"),
        image_size=int(record.get("image_size", 32)),
    )
