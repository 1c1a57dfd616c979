"""Published device specs and the batch-1 decode roofline.

Layer: foundations; taught in 03_end_to_end.

Decoding one token at batch 1 reads every weight once, so no implementation can beat
``bandwidth / weight bytes`` tokens per second. The same arithmetic run backwards says how much
bandwidth a claimed speed would need, which is how chapter 03 tells a plausible claim from an
impossible one. Specs live in ``data/device_specs.csv`` with a source and an official/unofficial
mark per row; this machine's bandwidth is never a row there, it is measured in chapter 00.
"""
from __future__ import annotations

import numbers
from pathlib import Path
from typing import Optional

SPECS_PATH = Path(__file__).resolve().parent.parent / "data" / "device_specs.csv"
SPEC_COLUMNS = ("device", "variant", "memory_gb", "bandwidth_gbps", "fp16_dense_tflops",
                "status", "source", "note")
SPEC_NUMBERS = ("memory_gb", "bandwidth_gbps", "fp16_dense_tflops")  # the last may be empty
SPEC_STATUSES = ("official", "unofficial")

# The released Llama-2 shapes from their config.json files (meta-llama/Llama-2-{7b,13b,70b}-hf):
# untied embeddings; 7B and 13B use multi-head attention, 70B grouped-query attention (8 KV heads).
LLAMA2_7B_CONFIG = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                        tie_word_embeddings=False)
LLAMA2_CONFIGS = {
    "7b": LLAMA2_7B_CONFIG,
    "13b": dict(vocab_size=32000, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                num_attention_heads=40, num_key_value_heads=40, tie_word_embeddings=False),
    "70b": dict(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
}
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int4": 0.5}


def load_specs(path: "str | Path | None" = None):
    """The specs table as a DataFrame (the one reader of ``data/device_specs.csv``).

    Every row needs a device, variant, memory, bandwidth, source and an official/unofficial mark;
    a bad cell fails here with the file, the row and the column, so no bound is ever computed from
    a figure without its source. An empty ``fp16_dense_tflops`` is read as missing (NaN).
    """
    import pandas as pd

    path = Path(path) if path else SPECS_PATH
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable specs table ({exc})") from exc
    missing = [c for c in SPEC_COLUMNS if c not in df.columns]
    if missing or df.empty:
        raise ValueError(f"{path}: missing columns {missing}; expected {list(SPEC_COLUMNS)}" if missing
                         else f"{path}: no rows")
    problems = []
    for i, row in enumerate(df.to_dict(orient="records"), 1):
        where = f"row {i} ({row['variant'] or row['device'] or '?'}), column"
        problems += [f"{where} {c}: empty" for c in ("device", "variant", "source") if not row[c].strip()]
        if row["status"] not in SPEC_STATUSES:
            problems.append(f"{where} status: {row['status']!r}, not one of {', '.join(SPEC_STATUSES)}")
        for c in SPEC_NUMBERS:
            text = row[c].strip()
            if not text and c == "fp16_dense_tflops":
                continue
            try:
                check_positive(c, float(text))
            except ValueError:
                problems.append(f"{where} {c}: {text!r} is not a number > 0")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    for c in SPEC_NUMBERS:
        df[c] = pd.to_numeric(df[c].replace("", None))
    return df


def check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name}={value!r} is not valid; it must be a number > 0")
    return float(value)


def decode_ceiling_tok_s(bandwidth_gbps: float, weight_bytes: float) -> float:
    """Batch-1 decode upper bound: every step reads ``weight_bytes`` at ``bandwidth_gbps`` (1e9 B/s)."""
    return check_positive("bandwidth_gbps", bandwidth_gbps) * 1e9 / check_positive(
        "weight_bytes", weight_bytes)


def llama_parameter_count(vocab_size: int, hidden_size: int, intermediate_size: int,
                          num_hidden_layers: int, num_attention_heads: int,
                          num_key_value_heads: Optional[int] = None,
                          tie_word_embeddings: bool = False) -> int:
    """Parameters of a Llama decoder from its config (no biases; two norms per layer + final)."""
    kv_heads = num_key_value_heads or num_attention_heads
    head_dim = hidden_size // num_attention_heads
    attention = 2 * hidden_size * hidden_size + 2 * hidden_size * kv_heads * head_dim
    mlp = 3 * hidden_size * intermediate_size
    per_layer = attention + mlp + 2 * hidden_size
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    return num_hidden_layers * per_layer + embeddings + hidden_size


def llama2_weight_bytes(dtype: str = "float16", size: str = "7b") -> int:
    """Weight bytes of a released Llama-2 (7B: 6.74 B parameters) stored in ``dtype`` (scales of int
    formats ignored). A model loaded in this run is counted by ``helpers.models.weight_bytes``, and
    what one of its decode steps reads by ``helpers.generation.decode_bytes_per_step``."""
    if dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"dtype={dtype!r} is not valid; choose one of {', '.join(BYTES_PER_ELEMENT)}")
    if size not in LLAMA2_CONFIGS:
        raise ValueError(f"size={size!r} is not valid; choose one of {', '.join(LLAMA2_CONFIGS)}")
    return int(llama_parameter_count(**LLAMA2_CONFIGS[size]) * BYTES_PER_ELEMENT[dtype])


def _config_value(config, name: str):
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def kv_cache_bytes_per_token(config, dtype: str = "float16") -> int:
    """KV-cache bytes one token of one sequence keeps: 2 (K and V) x layers x kv_heads x head_dim x bytes.

    ``config`` is a transformers config or a dict with Llama's keys (``LLAMA2_7B_CONFIG``).
    Grouped-query attention (``num_key_value_heads`` < ``num_attention_heads``) shrinks it.
    """
    if dtype not in BYTES_PER_ELEMENT:
        raise ValueError(f"dtype={dtype!r} is not valid; choose one of {', '.join(BYTES_PER_ELEMENT)}")
    needed = ("num_hidden_layers", "num_attention_heads", "hidden_size")
    missing = [k for k in needed if not _config_value(config, k)]
    if missing:
        raise ValueError(f"config lacks {missing}; pass a Llama-style transformers config or a dict "
                         f"with {', '.join(needed)} (and optionally num_key_value_heads, head_dim)")
    heads = int(_config_value(config, "num_attention_heads"))
    kv_heads = int(_config_value(config, "num_key_value_heads") or heads)
    head_dim = int(_config_value(config, "head_dim") or int(_config_value(config, "hidden_size")) // heads)
    layers = int(_config_value(config, "num_hidden_layers"))
    return int(2 * layers * kv_heads * head_dim * BYTES_PER_ELEMENT[dtype])


def kv_cache_bytes(config, batch_size: int, context_len: int, dtype: str = "float16") -> int:
    """KV-cache bytes of a batch: ``batch_size`` sequences of ``context_len`` tokens each."""
    for name, value in (("batch_size", batch_size), ("context_len", context_len)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name}={value!r} is not valid; it must be an integer >= 0")
    return int(kv_cache_bytes_per_token(config, dtype) * batch_size * context_len)


