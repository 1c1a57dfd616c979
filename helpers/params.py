"""Checks for notebook parameters: fail before heavy work, naming the parameter and valid values.

Layer: foundations. Every chapter's parameters cell is checked here, first in
``00_environment_check`` (``chapter.open_chapter``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence


def check_choice(name: str, value, choices: Iterable) -> object:
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, choices))}")
    return value


def _is_int_at_least(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    if not _is_int_at_least(value, minimum):
        raise ValueError(f"{name}={value!r} is not valid; it must be an integer >= {minimum}")
    return value


def check_positive_ints(name: str, values: Sequence, minimum: int = 1) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"{name}={values!r} is not valid; give a non-empty list of integers >= {minimum}")
    for v in values:
        if not _is_int_at_least(v, minimum):
            raise ValueError(f"{name}={values!r} is not valid: {v!r} is not an integer >= {minimum}")
    return list(values)


def check_prompts(name: str, prompts) -> list[str]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"{name} is empty; give at least one non-empty prompt string")
    for p in prompts:
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"{name} contains {p!r}; every prompt must be a non-empty string")
    return list(prompts)


def check_positive_float(name: str, value, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} is not valid; it must be a number {bound}")
    return float(value)


# --- every parameter of every chapter, checked by its name -------------------------------------
# A rule is a function (name, value) -> value that raises ValueError naming the parameter and the
# valid values. The same name means the same rule in every chapter; ``open_chapter(checks=...)``
# overrides one where a chapter needs a stricter bound.

def at_least(minimum: int = 1):
    return lambda name, value: check_positive_int(name, value, minimum)


def ints_at_least(minimum: int = 1, allow_empty: bool = False, length: Optional[int] = None,
                  including: Optional[int] = None):
    """A non-empty list of integers >= ``minimum`` (``[]`` too with ``allow_empty``), of ``length``
    integers when given, holding ``including`` when given (chapter 04's ``batch_sizes`` must include
    1, the baseline of every ratio)."""
    def rule(name, values):
        if allow_empty and isinstance(values, (list, tuple)) and len(values) == 0:
            return []
        values = check_positive_ints(name, values, minimum)
        if length is not None and len(values) != length:
            raise ValueError(f"{name}={values!r} is not valid; give {length} integers >= {minimum}")
        if including is not None and including not in values:
            raise ValueError(f"{name}={values!r} is not valid; it must include {including}, "
                             "the baseline of the ratios")
        return values
    return rule


def ints_including(required: int, minimum: int = 1):
    return ints_at_least(minimum, including=required)


def one_of(*choices):
    return lambda name, value: check_choice(name, value, choices)


def number(allow_zero: bool = False):
    return lambda name, value: check_positive_float(name, value, allow_zero)


def numbers(allow_empty: bool = True):
    """A list of numbers > 0 (``[]`` too with ``allow_empty``): chapter 07's request rates."""
    def rule(name, values):
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or (
                not values and not allow_empty):
            raise ValueError(f"{name}={values!r} is not valid; give a list of numbers > 0")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{name}={values!r} is not valid: {v!r} is not a number > 0")
        return [float(v) for v in values]
    return rule


def text(allow_empty: bool = True):
    def rule(name, value):
        if not isinstance(value, str) or (not allow_empty and not value.strip()):
            raise ValueError(f"{name}={value!r} is not valid; give a {'' if allow_empty else 'non-empty '}string")
        return value
    return rule


def names(name, values):
    if isinstance(values, str) or not isinstance(values, (list, tuple)) or not values or not all(
            isinstance(v, str) and v for v in values):
        raise ValueError(f"{name}={values!r} is not valid; give a non-empty list of names")
    return list(values)


def file_or_empty(name, value):
    """A path to an existing file, or empty (the shipped table)."""
    if not isinstance(value, str) or (value and not Path(value).is_file()):
        raise ValueError(f"{name}={value!r} is not a file; leave it empty for the shipped table")
    return value


def run_folders(name, value):
    """Comma-separated run folders (``reports/<run-id>``), or empty."""
    folders = [p.strip() for p in str(value).split(",") if p.strip()]
    for folder in folders:
        if not Path(folder).is_dir():
            raise ValueError(f"{name}: {folder!r} is not a run folder; give folders like reports/<run-id>, "
                             "comma-separated, or leave it empty")
    return value


def prompt(name, value):
    return check_prompts(name, [value])[0]


FLAG = one_of(True, False)
CHECKS = {
    "device": one_of("auto", "npu", "cuda", "cpu"), "model": text(allow_empty=False),
    "dtype": one_of("auto", "float32", "fp32", "float16", "fp16", "half", "bfloat16", "bf16"),
    "run_dir": text(), "profile": text(), "lang": one_of("auto", "en", "zh"),
    "max_new_tokens": at_least(1), "new_tokens": at_least(2), "repeats": at_least(1), "rounds": at_least(1),
    "bandwidth_mib": at_least(1), "rms_shape": ints_at_least(length=3),
    "prefill_tokens": at_least(1),
    "compile_ops": FLAG, "llama7b_edge_ops": FLAG, "min_iters": at_least(1), "min_seconds": number(allow_zero=True),
    "ffn_hidden": at_least(1), "ffn_intermediate": at_least(1), "guide_prompt": prompt, "prompt": prompt,
    "guide_new_tokens": at_least(2), "prompt_lengths": ints_at_least(1), "sweep_new_tokens": at_least(2),
    "profile_steps": at_least(1), "graph_mode": FLAG, "npu_graph_mode": text(allow_empty=False),
    "matmul_min_seconds": number(), "batch_sizes": ints_at_least(1), "padding_new_tokens": at_least(1),
    "reference": text(allow_empty=False), "variants": names,
    "eval_tokens": at_least(16), "calibration_counts": ints_at_least(1, allow_empty=True),
    "calibration_tokens": at_least(4), "int8": FLAG, "batch_size": at_least(1), "endpoint": text(),
    # chapter 06's references and INT4 rung (its profile_steps may be 0: open it with checks= to say so)
    "int4": FLAG, "llamacpp": FLAG, "float32_reference": FLAG,
    "mindspeed_script": text(), "claims_file": file_or_empty, "specs_file": file_or_empty,
    "other_runs": run_folders,
    "write_html": FLAG,
    # chapter 07, serving
    "port": at_least(1), "max_model_len": at_least(16), "kv_cache_gib": number(allow_zero=True),
    "tensor_parallel_size": at_least(1), "start_timeout_s": at_least(1), "request_timeout_s": number(),
    "input_len": at_least(1), "output_len": at_least(2), "concurrency": ints_at_least(1), "bench_serve": FLAG,
    "enforce_eager": FLAG,
    "bench_concurrency": at_least(1), "bench_timeout_s": at_least(1), "ttft_target_ms": number(),
    "tpot_target_ms": number(), "min_requests": at_least(1), "users_limit": at_least(1),
    "request_rates": numbers(), "prompt_seed": at_least(0),
}


def check_all(values: dict, overrides: "dict | None" = None) -> dict:
    """Check every parameter by its name; a name without a rule is an error (so none goes unchecked)."""
    rules = {**CHECKS, **(overrides or {})}
    unknown = [name for name in values if name not in rules]
    if unknown:
        raise ValueError(f"no check for parameter(s) {unknown}: add them to helpers.params.CHECKS or pass "
                         "checks= to open_chapter")
    return {name: rules[name](name, value) for name, value in values.items()}

