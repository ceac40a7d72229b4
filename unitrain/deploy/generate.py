"""Text sampled from a language model's checkpoint, on either framework.

The model runs in the framework chosen (the checkpoint's weights converted exactly where it is
the other one); the next token is chosen in NumPy from the last position's logits, so that both
frameworks choose alike: at temperature 0 the most likely token, else a draw from the softmax of
the logits over the temperature (the ``top_k`` most likely only), from one seeded generator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

import numpy as np

from unitrain.data.text import Tokenizer, UnknownCharacter
from unitrain.data.text.job_tokenizer import model_tokenizer
from unitrain.deploy.artifacts import job_config
from unitrain.errors import UnitrainError
from unitrain.interface.backend import get_backend
from unitrain.interface.evaluation import evaluation_module
from unitrain.model.build import build_model
from unitrain.model.conversion import checkpoint_model, weights_for
from unitrain.tasks import task_of_summary
from unitrain.train.checkpoint import checkpoint_run_dir, find_checkpoint, read_meta, read_model_arrays

#: How many tokens one call may ask for: past it a CPU takes minutes for a tiny model.
MAX_TOKENS = 100_000


@dataclass(frozen=True, kw_only=True)
class Sampling:
    tokens: int = 200
    temperature: float = 0.8
    top_k: Optional[int] = None
    seed: int = 0

    def check(self) -> None:
        if not 1 <= self.tokens <= MAX_TOKENS:
            raise UnitrainError(f"--tokens={self.tokens} is not allowed: an integer from 1 to {MAX_TOKENS}")
        if not (np.isfinite(self.temperature) and 0 <= self.temperature <= 100):
            raise UnitrainError(
                f"--temperature={self.temperature} is not allowed: a number from 0 (the most likely token) to 100"
            )
        if self.top_k is not None and self.top_k < 1:
            raise UnitrainError(f"--top-k={self.top_k} is not allowed: an integer >= 1 (leave it out for all tokens)")
        if not 0 <= self.seed < 2**32:
            raise UnitrainError(f"--seed={self.seed} is not allowed: an integer in [0, 2**32)")


@dataclass(kw_only=True)
class Generator:
    """A checkpoint's language model on one framework, with its tokenizer."""

    framework: str
    checkpoint: Path
    model: Any
    tokenizer: Tokenizer
    block_size: int

    def next_logits(self, ids: List[int]) -> np.ndarray:
        window = np.asarray([ids[-self.block_size :]], dtype=np.int64)
        logits = evaluation_module(self.framework).predict(self.model, window)
        return np.asarray(logits[0, -1], dtype=np.float64)


def load_generator(source: str, framework: Optional[str], roots: List[Path]) -> Generator:
    """The language model of ``source`` (a run directory, a checkpoint, or latest) on
    ``framework`` (default: the checkpoint's own)."""
    folder = Path(source)
    if folder.is_dir() and not (folder / "meta.json").exists() and not (folder / "checkpoints" / "latest").exists():
        raise UnitrainError(
            f"{source} holds no checkpoint (a run writes them with trainer.checkpoint_every); allowed: a run "
            "directory with checkpoints/, a checkpoint directory, or latest"
        )
    path = find_checkpoint(source, roots, key="checkpoint")
    meta = read_meta(path)
    config = meta.get("config", {})
    # Tokens per sample: only a language model's task has them (the others' is None).
    block = task_of_summary(config).block_size(job_config(config))
    if block is None:
        data = (config.get("data") or {}).get("name")
        raise UnitrainError(
            f"checkpoint {path} holds model={meta.get('model')} trained on data={data}; allowed: a language model's "
            "checkpoint (data=text)"
        )
    run_dir = checkpoint_run_dir(path)
    # The run that wrote the checkpoint saved it: refused where it is not the model's (another
    # corpus's), before a framework loads, rather than text of another corpus's tokens.
    tokenizer = model_tokenizer(
        run_dir, int(meta["num_classes"]), config.get("data") or {}, _corpus_sha256(run_dir), f"checkpoint {path}"
    )
    framework = framework or meta["framework"]
    backend = get_backend(framework)
    model = build_model(backend, checkpoint_model(meta, run_dir), int(meta["num_classes"]))
    backend.load_state_arrays(model, weights_for(read_model_arrays(path), meta, backend, model))
    return Generator(framework=framework, checkpoint=path, model=model, tokenizer=tokenizer, block_size=int(block))


def _corpus_sha256(run_dir: Path) -> Optional[str]:
    """The corpus a run trained on, as its summary.json says (None before the run ended)."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())["text"]["corpus_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """The next token: the most likely at temperature 0, else a draw (top-k first)."""
    logits = np.asarray(logits, dtype=np.float64)
    if not np.isfinite(logits).all():
        raise UnitrainError(
            f"the model gave non-finite logits ({int((~np.isfinite(logits)).sum())} of {len(logits)}); allowed: "
            "a checkpoint of a run whose loss stayed finite"
        )
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    # The largest logit taken away before the division: every scaled logit is then at most 0, so no
    # temperature overflows exp (1e-320 turned logits / T into inf, then inf - inf into NaN) and the
    # most likely token keeps exp(0) = 1; a tiny temperature is the most likely token, as it should.
    with np.errstate(over="ignore"):  # a logit far below the largest: -inf, a probability of 0
        scaled = (logits - logits.max()) / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < len(scaled):
        cut = np.partition(scaled, -sampling.top_k)[-sampling.top_k]
        scaled = np.where(scaled < cut, -np.inf, scaled)
    probs = np.exp(scaled)
    return int(rng.choice(len(probs), p=probs / probs.sum()))


def prompt_ids(generator: Generator, prompt: str) -> List[int]:
    """The prompt's tokens (no prompt: the newline's, where a document would start)."""
    tokenizer = generator.tokenizer
    try:
        return tokenizer.encode(prompt) if prompt else [tokenizer.start_token()]
    except UnknownCharacter as err:
        raise UnitrainError(
            f"--prompt holds {err.char!r}, which the corpus never had; allowed: text of the corpus's "
            f"{tokenizer.vocab_size} characters"
        ) from None


def generate(generator: Generator, prompt: str, sampling: Sampling, emit: Callable[[str], None]) -> str:
    """``prompt`` followed by ``sampling.tokens`` new tokens; ``emit`` gets the text as it is
    decoded (a byte-level token may end mid-character: held back until the character is whole)."""
    tokenizer = generator.tokenizer
    ids = prompt_ids(generator, prompt)
    first = len(ids)
    rng = np.random.default_rng(sampling.seed)
    shown = 0
    for _ in range(sampling.tokens):
        ids.append(choose(generator.next_logits(ids), sampling, rng))
        text = tokenizer.decode(ids[first:])
        if not text.endswith("\ufffd"):
            emit(text[shown:])
            shown = len(text)
    text = tokenizer.decode(ids[first:])
    emit(text[shown:])
    return prompt + text
