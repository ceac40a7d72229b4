"""Every fixed set of values a config key takes, as a Choice enum (one line each): Hydra refuses a
value outside it at start. config/schema.py's dataclasses are typed with them."""

from __future__ import annotations

from enum import Enum
from typing import Tuple

from unitrain.data.text.tokenizer import KINDS as TOKENIZER_KINDS
from unitrain.spec import optimizers


class Choice(str, Enum):
    """A value from a fixed set. Hydra matches an override against the member names (equal to
    their values here); the member is a ``str``, so it compares, hashes, prints, formats and
    serialises as its value, in configs, summaries and messages alike."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __repr__(self) -> str:
        return repr(str(self.value))

    @classmethod
    def values(cls) -> Tuple[str, ...]:
        return tuple(m.value for m in cls)


def choice(name: str, *values: str) -> type:
    """A Choice of ``values``, each member named as its value (``async`` and ``global`` too,
    which a class body cannot name: PsSync["async"])."""
    return Choice(name, [(v, v) for v in values], module=__name__, qualname=name)  # type: ignore[return-value]


Device = choice("Device", "auto", "cpu", "gpu")
AmpLevel = choice("AmpLevel", "O0", "O1", "O2", "O3")
AmpDtype = choice("AmpDtype", "float16", "bfloat16")
AmpImpl = choice("AmpImpl", "native", "apex")
ModelInit = choice("ModelInit", "framework", "shared")
Remainder = choice("Remainder", "pad", "drop")
Order = choice("Order", "global", "shard")
# Every optimizer, in spec.optimizers' table (which jobs build each, which are adaptive).
OptimName = choice("OptimName", *optimizers.NAMES)
# Every data.tokenizer kind, one per tokenizer in data/text/tokenizer.py (char: the corpus's characters,
# one token each, nanoGPT's shakespeare_char; bpe: byte-level BPE trained on the training split).
Tokenizer = choice("Tokenizer", *TOKENIZER_KINDS)
Schedule = choice("Schedule", "constant", "step", "cosine")
LrScaling = choice("LrScaling", "linear", "keep_global")
NonFinite = choice("NonFinite", "stop", "warn")
Cardinality = choice("Cardinality", "small", "criteo")
ObjectiveMetric = choice("ObjectiveMetric", "heldout", "time_to_target")
Malloc = choice("Malloc", "fixed", "dynamic")
Logger = choice("Logger", "tensorboard", "visualdl", "mlflow")
DistMode = choice("DistMode", "collective", "ps")
PsSync = choice("PsSync", "sync", "async", "geo")
PsFeed = choice("PsFeed", "steps", "engine")
CommBackend = choice("CommBackend", "auto", "gloo", "nccl")
GradCompression = choice("GradCompression", "none", "fp16", "bf16")
ProfilerMode = choice("ProfilerMode", "off", "timer", "trace")
QuantMethod = choice("QuantMethod", "dynamic", "static", "qat")
