"""A Hugging Face folder's weights, framework-free: its safetensors file or shards found (a
pickle never read), their headers checked against the names and shapes its config.json implies
(unitrain/spec/hf.py) before anything is written, and the tensors read as float32 NumPy (BF16 by
its bits: NumPy has no bfloat16)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from unitrain.spec.hf import (
    FLOAT_DTYPES,
    INDEX_FILE,
    WEIGHTS_FILE,
    HfSpec,
    expected_shapes,
    read_config,
    refusal,
)


def weight_files(folder: Path) -> List[Path]:
    """model.safetensors, or the shards model.safetensors.index.json names; one line for a
    folder with pickled weights only (pytorch_model.bin: never unpickled) or none."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise refusal(folder, f"a readable {INDEX_FILE} with a weight_map ({err})") from None
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise refusal(folder, f"every shard {INDEX_FILE} names; {missing[0]} is missing")
        return [folder / s for s in shards]
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    pickled = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
    if pickled:
        raise refusal(
            folder,
            f"weights in safetensors (model.safetensors or {INDEX_FILE}); it has {pickled[0]}, a pickle, which "
            "unitrain does not read (pickles run code): convert it once with transformers' save_pretrained",
        )
    raise refusal(folder, f"a Hugging Face model folder with its weights ({WEIGHTS_FILE} or {INDEX_FILE}); it has none")


def _header(file: Path) -> Tuple[Dict[str, Any], int]:
    """A safetensors file's header (name -> dtype, shape, data_offsets) and where its data starts."""
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100_000_000:
                raise ValueError("header too large")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as err:
        raise refusal(file.parent, f"safetensors files that read; {file.name} does not ({err})") from None
    header.pop("__metadata__", None)
    return header, 8 + size


def _headers(spec: HfSpec) -> Dict[str, Tuple[Path, Dict[str, Any], int]]:
    found: Dict[str, Tuple[Path, Dict[str, Any], int]] = {}
    for file in weight_files(spec.folder):
        header, start = _header(file)
        for name, entry in header.items():
            found[name] = (file, entry, start)
    return found


def _checked_headers(spec: HfSpec) -> Dict[str, Tuple[Path, Dict[str, Any], int]]:
    """The weight files' entries, checked against the names and shapes ``spec`` implies."""
    found = _headers(spec)
    expected = expected_shapes(spec)
    if spec.tied:
        # A tied head is often saved too (transformers drops it, others keep it): it must equal the embedding's shape.
        found.pop("lm_head.weight", None)
    missing = [n for n in expected if n not in found]
    if missing:
        raise refusal(
            spec.path,
            f"weights matching its config.json: {missing[0]} is missing ({len(missing)} missing in all)",
        )
    extra = [n for n in found if n not in expected and not _ignorable(n)]
    if extra:
        raise refusal(
            spec.path, f"weights matching its config.json: {extra[0]} is not a parameter of {spec.model_type}"
        )
    for name, shape in expected.items():
        file, entry, _ = found[name]
        if tuple(entry.get("shape", ())) != shape:
            raise refusal(
                spec.path, f"weights matching its config.json: {name} is {tuple(entry.get('shape', ()))}, not {shape}"
            )
        if entry.get("dtype") not in FLOAT_DTYPES:
            raise refusal(spec.path, f"float weights (F32, F16, BF16); {name} is {entry.get('dtype')}")
    return {n: found[n] for n in expected}


def _ignorable(name: str) -> bool:
    # Buffers some writers saved: rotary tables, GPT-2's causal masks.
    return name.endswith((".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"))


def check_folder(path: Any) -> HfSpec:
    """What validation checks (config.json and the weight files' headers; no weights read)."""
    spec = read_config(path)
    _checked_headers(spec)
    return spec


def read_weights(spec: HfSpec) -> Dict[str, np.ndarray]:
    """The checkpoint's parameters as float32 arrays by its names (``expected_shapes``), through
    ``safetensors``' NumPy reader (no torch): F32 as is, F16 and F64 converted. NumPy has no
    bfloat16, so a BF16 tensor is read as its raw bytes at the offsets the file's header gives and
    widened by its bits (bfloat16 is float32's upper half: the 16 bits shifted left, exact)."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise refusal(
            spec.path, "readable once the safetensors package is installed (pip install 'unitrain[hf]')"
        ) from None
    entries = _checked_headers(spec)
    arrays: Dict[str, np.ndarray] = {}
    by_file: Dict[Path, List[str]] = {}
    for name, (file, _entry, _) in entries.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(str(file), framework="numpy") as f:
            for name in names:
                _, entry, start = entries[name]
                if entry["dtype"] == "BF16":
                    begin, end = entry["data_offsets"]
                    bits = np.fromfile(file, dtype="<u2", count=(end - begin) // 2, offset=start + begin)
                    array = (bits.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])
                else:
                    array = f.get_tensor(name)
                arrays[name] = np.ascontiguousarray(array, dtype=np.float32)
    return arrays
