"""A language model's job (data=text): the corpus as token windows for the one training loop,
and its held-out loss as people compare language models: perplexity, and bits per character
(char tokenizer) or per UTF-8 byte (BPE), which compare across tokenizers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional

from unitrain.data.text import TextCorpus, TokenWindows, load_text, tokenizer_path
from unitrain.spec.models import MODELS, GPTSpec

#: Past it exp() overflows: a diverged model's perplexity is infinite, not an error.
_MAX_EXPONENT = 700.0


def context_length(model_name: str) -> Optional[int]:
    """A built-in language model's context length (its position embeddings), None for a user's."""
    spec = MODELS.get(model_name) if model_name in MODELS else None
    return spec.block_size if isinstance(spec, GPTSpec) else None


def text_corpus(cfg: Any, run_dir: Path, resumed_run: Optional[Path] = None) -> TextCorpus:
    """The job's corpus, its tokenizer saved in ``run_dir``: on resume the tokenizer of the run
    that wrote the checkpoint (refused if it was made from another corpus), so that the ids the
    weights learned keep their meaning."""
    context = context_length(cfg.model.name)
    saved = tokenizer_path(resumed_run) if resumed_run is not None else None
    return load_text(
        cfg.data,
        block_size=context,
        run_dir=run_dir,
        max_block_size=context,
        tokenizer_file=saved if saved is not None and saved.is_file() else None,
    )


def held_out_windows(corpus: TextCorpus, count: int = 0) -> TokenWindows:
    """Disjoint windows of the held-out split: every held-out token predicted once (a window at
    every token would cost block_size times as much for nearly the same mean), or ``count``
    windows spread evenly over it (data.val_samples: a large corpus's estimate)."""
    held_out = corpus.held_out
    return held_out.spread(count) if count else held_out.with_stride(held_out.block_size)


def measures(held_out: TokenWindows, val_loss: float) -> Dict[str, float]:
    """Perplexity and bits per character or byte of a mean held-out loss per token (nats)."""
    return {
        "perplexity": math.exp(val_loss) if val_loss < _MAX_EXPONENT else math.inf,
        f"bits_per_{held_out.unit}": held_out.bits(val_loss),
    }
