"""Checks for notebook parameters: fail before heavy work, naming the parameter and valid values."""
from __future__ import annotations

from typing import Iterable, Sequence


def check_choice(name: str, value, choices: Iterable) -> object:
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(map(repr, choices))}")
    return value


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is not valid; it must be an integer >= {minimum}")
    return value


def check_positive_ints(name: str, values: Sequence, minimum: int = 1) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"{name}={values!r} is not valid; give a non-empty list of integers >= {minimum}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
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
