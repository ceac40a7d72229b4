"""Language modelling (data=text): a corpus as token windows for the one training loop, the next
token of every position predicted (cross-entropy, next-token top-1), and the held-out loss as
people compare language models: perplexity, and bits per character (char tokenizer) or per UTF-8
byte (BPE), which compare across tokenizers. Its loss is minimized, its rate is tokens/s (every
position of a sample is a prediction), and its tokenizer is saved in the run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from unitrain.data.text import (
    TextCorpus,
    TokenWindows,
    check_text_config,
    check_text_files,
    load_text,
    resolve_block_size,
    tokenizer_path,
)
from unitrain.errors import ConfigError
from unitrain.spec.hf import HF
from unitrain.spec.models import MODELS, GPTSpec, is_language_model
from unitrain.tasks import hf_text, language_export
from unitrain.tasks.task import ConversionProbe, Deployed, Measure, OwnKey, TaskData

#: Past it exp() overflows: a diverged model's perplexity is infinite, not an error.
_MAX_EXPONENT = 700.0
_UNSET = "unset with data={data} (data=text reads it)"
#: data.vocab_size's default: BPE's vocabulary, unread by the char tokenizer.
_BPE_VOCAB = 1024
#: The image data's keys, which a corpus's job would otherwise ignore without a word (the
#: unused values are the schema's defaults: tests/test_tasks.py checks that they agree).
_UNREAD = (
    OwnKey("val_path", None, "unset with data=text (its held-out set is the corpus's last data.val_fraction)"),
    OwnKey("num_classes", 10, "unset with data=text (its classes are the tokenizer's vocabulary)"),
    OwnKey("image_size", 32, "unset with data=text (a sample is data.block_size tokens)"),
    OwnKey("skip_bad_files", False, "false with data=text (a corpus's unreadable file is refused in one line)"),
)


def context_length(model_name: str) -> Optional[int]:
    """A built-in language model's context length (its position embeddings), None for a user's."""
    spec = MODELS.get(model_name) if model_name in MODELS else None
    return spec.block_size if isinstance(spec, GPTSpec) else None


def refuse_language_model(cfg: Any) -> None:
    """A language model trains on text: every other task refuses one."""
    if is_language_model(cfg.model.name):
        raise ConfigError("data", cfg.data.name, f"text with model={cfg.model.name} (a language model), e.g. data=text")


def text_corpus(cfg: Any, run_dir: Optional[Path], resumed_run: Optional[Path] = None) -> TextCorpus:
    """The job's corpus, its tokenizer saved in ``run_dir``: on resume the tokenizer of the run
    that wrote the checkpoint (refused if it was made from another corpus), so that the ids the
    weights learned keep their meaning. model=hf: the checkpoint's own tokenizer.json."""
    if cfg.model.name == HF:
        data, tokenizer, positions = hf_text.text_data(cfg)
        return load_text(data, run_dir=run_dir, max_block_size=positions, tokenizer_file=tokenizer)
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


class Language:
    name = "language"
    datasets: Tuple[str, ...] = ("text",)
    dist_mode = "collective"
    measure = Measure("val_loss", "held-out loss", "minimize")
    rate_unit = "tokens/s"
    val_samples_zero = "0: every held-out window; N: N windows spread over the held-out split"
    own_keys: Tuple[OwnKey, ...] = (
        OwnKey("tokenizer", "char", _UNSET),
        OwnKey("vocab_size", _BPE_VOCAB, _UNSET),
        OwnKey("block_size", None, _UNSET),
        OwnKey("val_fraction", 0.1, _UNSET),
    )

    def check(self, cfg: Any) -> None:
        """Text trains a language model (or a user's model, which the job asks for a text
        factory); its tokens per sample fit the model's context. model=hf: the checkpoint's rules
        (tasks/hf_text.check_job: its folder, tokenizer and positions; data.tokenizer and
        data.vocab_size unset)."""
        if cfg.model.name == HF:
            hf_text.check_job(cfg)
        spec = MODELS.get(cfg.model.name) if cfg.model.name in MODELS else None
        if spec is not None and not isinstance(spec, GPTSpec):
            language = ", ".join(n for n in MODELS.names() if is_language_model(n))
            raise ConfigError("model", cfg.model.name, f"a language model with data=text: {language} or custom")
        if cfg.data.augment != "none":
            raise ConfigError("data.augment", cfg.data.augment, "none with data=text (augmentation is for images)")
        for key in _UNREAD:
            key.check_unused(cfg.data)
        if str(cfg.data.tokenizer) == "char" and cfg.data.vocab_size != _BPE_VOCAB:
            raise ConfigError(
                "data.vocab_size",
                cfg.data.vocab_size,
                "unset with data.tokenizer=char (its vocabulary is the corpus's characters; only bpe reads it)",
            )
        block = cfg.data.block_size
        if isinstance(spec, GPTSpec) and block is not None and block > spec.block_size:
            raise ConfigError("data.block_size", block, f"at most {spec.block_size}, {cfg.model.name}'s context length")
        if spec is None and block is None:
            raise ConfigError(
                "data.block_size", None, "the tokens per sample (an integer > 0) with a model of your own"
            )
        check_text_config(cfg.data, context_length(cfg.model.name))

    def check_files(self, cfg: Any) -> None:
        check_text_files(cfg.data)  # read, not tokenized: the workers tokenize (once, cached)

    def has_held_out(self, data: Any) -> bool:
        return True  # the corpus's last data.val_fraction

    def data(self, cfg: Any, run_dir: Path, resumed_run: Optional[Path], default_size: int) -> TaskData:
        corpus = text_corpus(cfg, run_dir, resumed_run)
        return TaskData(
            train=corpus.train,
            held_out=held_out_windows(corpus, cfg.data.val_samples),
            predictions_per_sample=corpus.train.block_size,
            state=corpus,
        )

    def classes(self, data: Any) -> int:
        """The corpus's characters, or data.vocab_size for BPE."""
        return len(check_text_files(data).alphabet) if str(data.tokenizer) == "char" else int(data.vocab_size)

    def block_size(self, cfg: Any) -> Optional[int]:
        """data.block_size, else the built-in model's context length (a ``model=custom`` text job
        names data.block_size: validation asks for it)."""
        context = context_length(str(cfg.model.name))
        return resolve_block_size(cfg.data, context, context)

    def conversion_check(self, data: Any, num_classes: Optional[int]) -> ConversionProbe:
        classes = num_classes or self.classes(data)
        return ConversionProbe({"name": "text", "block_size": data.block_size, "num_classes": classes}, 2)

    def measures(self, data: TaskData, result: Mapping[str, float]) -> Dict[str, float]:
        return measures(data.held_out, result["val_loss"])

    def evaluation_line(self, result: Mapping[str, float]) -> str:
        unit = next(k for k in result if k.startswith("bits_per_"))
        return (
            f"loss {result['val_loss']:.4f} perplexity {result['perplexity']:.2f} {unit.replace('_', ' ')} "
            f"{result[unit]:.3f} ({int(result['val_samples'])} tokens, {result['eval_s']:.2f} s)"
        )

    def summary(self, data: TaskData, samples_per_s: Optional[float]) -> Dict[str, Any]:
        """The corpus, tokenizer and tokens/s (samples/s x block_size)."""
        corpus: TextCorpus = data.state
        block = data.predictions_per_sample
        return {"text": corpus.summary(), "tokens_per_s": samples_per_s * block if samples_per_s is not None else None}

    def summary_rate(self, summary: Mapping[str, Any]) -> int:
        return int((summary.get("text") or {}).get("block_size", 1))

    def held_out_columns(self, summary: Mapping[str, Any]) -> Dict[str, Tuple[str, str]]:
        unit = (summary.get("text") or {}).get("unit", "character")
        return {
            "held-out loss": ("val_loss", ".4f"),
            "perplexity": ("perplexity", ".2f"),
            f"bits/{unit}": (f"bits_per_{unit}", ".3f"),
        }

    # --- the report
    input_kind = "tokens"
    deployed = Deployed(
        "tokens_per_s", "tokens/s", "tokens/s", "held-out next-token top-1", "token windows", per_position=True
    )

    # --- export and inference
    export_files: Tuple[str, ...] = language_export.TOKENIZER_FILES

    def export_held_out(
        self, cfg: Any, samples: int, state: Optional[Path], vocab_size: Optional[int]
    ) -> Tuple[Any, str]:
        """The corpus's held-out windows re-read with the run's tokenizer (``state``), or seeded
        random ids in [0, ``vocab_size``) where they cannot be (:mod:`.language_export`)."""
        return language_export.held_out(cfg, self.block_size(cfg), samples, state, vocab_size)

    def export_classes(self, cfg: Any, meta: Mapping[str, Any], held_out: Any) -> int:
        """The vocabulary as the checkpoint records it: the check data may be random ids."""
        if meta.get("num_classes"):
            return int(meta["num_classes"])
        return int(getattr(held_out, "num_classes", cfg.data.num_classes))

    def export_example(self, cfg: Any, inputs: Any) -> Any:
        return language_export.token_ids(inputs, self.block_size(cfg))

    def input_entry(self, cfg: Any, example: Any, vocab_size: int, tokenizer: Optional[str]) -> Dict[str, Any]:
        return language_export.input_entry(self.input_kind, self.block_size(cfg), vocab_size, tokenizer)

    def calibration_set(self, cfg: Any, state: Optional[Path], default_size: int) -> Any:
        return language_export.training_windows(cfg, self.block_size(cfg), state)

    def input_positions(self, entry: Mapping[str, Any]) -> Optional[int]:
        return int(entry["max_length"])
