"""Chapter 04's own study (layer: chapter studies; taught in 04_batching): batching measured with
chapter 03's protocol, built from the layers below.

Every batch size is timed by ``generation.measure_generation`` and put on the roofline with
``generation.decode_bytes_per_step``; what is here is what only chapter 04 shows: the guide's
padding call, whether left padding changes greedy outputs (and whether float32 tells rounding from
a bug), the batch sweep and its ratios to batch 1, the KV cache beside the weights, and the guide's
memory growth read as Llama-2-7B's KV cache.
"""
from __future__ import annotations

import gc
import math
import numbers
from typing import Any, Callable, Iterable, Optional

from . import backend, bench, decide, generation, roofline
from .backend import as_device, dtype_name
from .generation import (achieved_bandwidth_gbps, decode_bytes_per_step, decode_timing, greedy_new_tokens,
                         measure_generation, run_sweep, ttft_timing)
from .model_files import byte_tokenizer
from .params import check_positive_int
from .prose import N_, message

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("runs"), N_("match"), N_("first_difference"), N_("alone"), N_("batched"), N_("point"),
    N_("throughput_ratio"), N_("throughput_low"), N_("throughput_high"), N_("latency_growth_pct"),
    N_("latency_growth_low_pct"), N_("latency_growth_high_pct"), N_("ttft_growth_pct"),
    N_("memory_growth_mib"), N_("kv_cache_mib"), N_("memory_growth_pct"), N_("guide_throughput"),
    N_("guide_memory_pct"), N_("guide_latency_pct"), N_("context_tokens"), N_("kv_cache_MiB"),
    N_("kv_share_of_weights_pct"), N_("bytes_per_step_MB"), N_("measured_growth_MiB"), N_("peak_memory_MiB"),
    N_("weights_gb"), N_("kv_per_token_kib"), N_("context_for_claim"), N_("kv_growth_pct_512"),
    N_("kv_growth_pct_2048"), N_("padding"), N_("prompt"), N_("aggregate_low"), N_("aggregate_high"),
    N_("pct_of_bandwidth"), N_("weights GB"), N_("KV per token KiB"), N_("KV batch 8 x 2048 GB"),
    N_("growth batch 8 vs 1 %"), N_("left"), N_("right"),
)


# --- padding: the guide's call and whether left padding changes greedy outputs --------------------

def guide_padding_call(texts=("Hello", "a longer prompt")) -> dict:
    """The guide's ``tokenizer(texts, return_tensors="pt", padding=True, truncation=True)`` with a
    tokenizer that, like Llama-2's (``<s>``, ``</s>``, ``<unk>``), defines no pad token.

    Chapter 04 records whether the call runs, and the error it raises when it does not.
    """
    tokenizer = byte_tokenizer()
    tokenizer.pad_token = None
    try:
        batch = tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True)
    except ValueError as exc:
        return {"runs": False, "error": f"ValueError: {str(exc).split('.')[0]}"}
    return {"runs": True, "error": "", "shape": list(batch["input_ids"].shape)}


# Prompts of different lengths on purpose, so that every batch of two or more is really padded.
BATCH_PROMPTS = (
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue, as you would to a curious child.",
    "List three prime numbers.",
    "What does a compiler do?",
    "Summarise the plot of a detective story in which the butler is innocent and the gardener is not.",
    "Translate 'good morning' into French.",
    "Name a mammal that can fly.",
)


def batch_prompts(batch_size: int) -> list[str]:
    """``batch_size`` prompts for one batch: ``BATCH_PROMPTS`` in turn, repeated past eight."""
    check_positive_int("batch_size", batch_size)
    return [BATCH_PROMPTS[i % len(BATCH_PROMPTS)] for i in range(batch_size)]


def padding_check(model, tokenizer, prompts, max_new_tokens: int, *, chat: bool = False,
                  device=None) -> dict:
    """Do batched (left-padded) greedy outputs equal each prompt generated alone?

    Returns ``match`` plus, per prompt, its token count and the first position where the two
    outputs differ (None when they agree).
    """
    batched = greedy_new_tokens(model, tokenizer, prompts, max_new_tokens, chat=chat, device=device)
    rows = []
    for prompt, together in zip(prompts, batched):
        alone = greedy_new_tokens(model, tokenizer, [prompt], max_new_tokens, chat=chat,
                                  device=device)[0]
        first = next((i for i, (a, b) in enumerate(zip(alone, together)) if a != b), None)
        if first is None and len(alone) != len(together):
            first = min(len(alone), len(together))
        prompt_tokens = len(generation.prompt_inputs(model, tokenizer, [prompt], device, chat)["input_ids"][0])
        rows.append({"prompt": prompt, "prompt_tokens": prompt_tokens, "first_difference": first,
                     "match": first is None, "alone": tokenizer.decode(alone),
                     "batched": tokenizer.decode(together)})
    return {"match": all(r["match"] for r in rows), "rows": rows,
            "batch_size": len(prompts), "new_tokens": max_new_tokens}


def padding_check_in_float32(model, tokenizer, prompts, max_new_tokens: int,
                             load_float32: Optional[Callable[[], Any]] = None, **kwargs) -> dict:
    """``padding_check`` in the model's own dtype and, where that one differs in a reduced-precision
    dtype, again in float32.

    A padded batch runs the matmuls with other shapes, so sums are accumulated in another order; in
    a 16-bit dtype that can move a logit enough to flip a near-tie between two tokens, and greedy
    decoding then follows the other token. float32 tells that rounding apart from a padding bug.
    ``load_float32()`` returns the same model in float32; it is called only when needed and the
    copy is dropped afterwards. Returns the working dtype's check (``match``, ``rows``, ``dtype``,
    ``differing``: prompts whose outputs differ, ``first_difference``: the earliest new token where
    one does), ``float32`` (the float32 check, or None when none was needed or possible) and
    ``padding_right``: the float32 verdict where there is one, else the working dtype's.
    """
    check = padding_check(model, tokenizer, prompts, max_new_tokens, **kwargs)
    differs = [r["first_difference"] for r in check["rows"] if r["first_difference"] is not None]
    check.update(dtype=dtype_name(next(model.parameters()).dtype), differing=len(differs),
                 first_difference=min(differs) if differs else None, float32=None)
    if not check["match"] and check["dtype"] != "float32" and load_float32 is not None:
        reference = load_float32()
        check["float32"] = padding_check(reference, tokenizer, prompts, max_new_tokens, **kwargs)
        del reference
        gc.collect()
    check["padding_right"] = (check["float32"] or check)["match"]
    return check


# --- the batch sweep and its ratios to batch 1 ----------------------------------------------------

def batch_sweep(model, tokenizer, batch_sizes: Iterable[int], max_new_tokens: int, device=None, *,
                repeats: int = 3, prompts: Callable[[int], list] = batch_prompts) -> list[dict]:
    """``measure_generation`` at each batch size (sorted, each once) through ``run_sweep``, so an
    out-of-memory or failed point is recorded and the sweep goes on.

    Eager, greedy, with the dynamic KV cache: chapter 03's batch-1 protocol, so the batch-1 point is
    that figure's protocol at this sweep's lengths. Each measured row adds ``bytes_per_step`` (every
    weight once plus the batch's KV cache halfway through the decode) and, where the decode time was
    resolved, ``achieved_gbps`` (those bytes per measured step).
    """
    device = as_device(device) if device is not None else backend.model_device(model)

    def point(batch: int) -> dict:
        r = measure_generation(model, tokenizer, prompts(batch), max_new_tokens, device, repeats=repeats)
        r["bytes_per_step"] = decode_bytes_per_step(model, batch, r["prompt_tokens"] + max_new_tokens // 2)
        if r["decode_resolved"]:
            r["achieved_gbps"] = achieved_bandwidth_gbps(r["bytes_per_step"], r["decode_ms_per_token"])
        return r

    return run_sweep(sorted(set(batch_sizes)), point, device, name=lambda b: message("batch {b}", b=b))


# The columns of a batch sweep a reader compares first (the recorded table keeps every column).
SWEEP_COLUMNS = ("point", "status", "prompt_tokens", "ttft_ms", "decode_ms_per_token", "decode_p10_ms",
                 "decode_p90_ms", "tokens_per_s_per_user", "tokens_per_s_aggregate", "memory_growth_bytes",
                 "kv_cache_bytes", "peak_memory_bytes", "achieved_gbps", "error")


def _resolved(rows: list[dict]) -> dict:
    """The sweep points whose every decode sample is positive: a sample at or below zero means the
    timing noise of that repeat exceeded the decode time, and a spread through it has no bound."""
    return {r["point"]: r for r in rows if r.get("status") == "ok" and r.get("decode_resolved")
            and min(r.get("decode_samples_ms") or [0.0]) > 0}


def batch_ratios(rows: list[dict], guide: Optional[dict] = None) -> list[dict]:
    """Every resolved batch size of a ``batch_sweep`` against batch 1 of the same sweep.

    Each ratio carries its spread (``bench.speedup`` of the decode and TTFT samples, p10-p90):
    ``throughput_ratio`` = batch x decode(1) / decode(B), aggregate tokens/s over batch 1's;
    ``latency_ratio`` = decode(B) / decode(1) per step, and ``latency_growth_pct`` the same as a
    change in %, ``ttft_ratio`` likewise for the first token. Memory, each figure named for what it
    is: ``memory_growth_mib`` (what the generates added over the memory in use before them),
    ``kv_cache_mib`` (the batch's KV cache from the config; ``kv_added_mib`` over batch 1's),
    ``peak_memory_mib`` (the request's peak: weights + growth on a CPU) and ``memory_growth_pct``, the peak over batch 1's (the guide's
    显存增长 includes the weights). ``memory_growth_change`` is ``decide.changed`` of the growth
    from batch 1 to B. ``guide`` maps a batch size to the guide's claims (``throughput``,
    ``memory_pct``, ``latency_pct``). Only points whose every decode sample is positive take part
    (``_resolved``); empty when batch 1 is not one of them.
    """
    by_batch, guide = _resolved(rows), guide or {}
    base = by_batch.get(1)
    if base is None:
        return []
    decode1, ttft1 = decode_timing(base, "decode batch 1"), ttft_timing(base, "ttft batch 1")
    out = []
    for b, r in sorted(by_batch.items()):
        s = bench.speedup(decode1, decode_timing(r))
        first = bench.speedup(ttft1, ttft_timing(r))
        claim = guide.get(b, {})
        out.append({
            "batch": b, "prompt_tokens": r["prompt_tokens"], "throughput_ratio": b * s.ratio,
            "throughput_low": b * s.low, "throughput_high": b * s.high,
            "latency_ratio": 1 / s.ratio, "latency_ratio_low": 1 / s.high,
            "latency_ratio_high": 1 / s.low, "latency_growth_pct": 100 * (1 / s.ratio - 1),
            "latency_growth_low_pct": 100 * (1 / s.high - 1),
            "latency_growth_high_pct": 100 * (1 / s.low - 1),
            "ttft_ratio": 1 / first.ratio, "ttft_ratio_low": 1 / first.high, "ttft_ratio_high": 1 / first.low,
            "ttft_growth_pct": 100 * (1 / first.ratio - 1),
            "memory_growth_mib": r["memory_growth_bytes"] / 2 ** 20,
            "kv_cache_mib": r["kv_cache_bytes"] / 2 ** 20,
            "kv_added_mib": (r["kv_cache_bytes"] - base["kv_cache_bytes"]) / 2 ** 20,
            "peak_memory_mib": r["peak_memory_bytes"] / 2 ** 20,
            "memory_growth_pct": 100 * (r["peak_memory_bytes"] / base["peak_memory_bytes"] - 1),
            "memory_growth_change": decide.changed([base["memory_growth_bytes"], r["memory_growth_bytes"]]),
            "memory_kind": r.get("memory_kind", ""), "guide_throughput": claim.get("throughput"),
            "guide_memory_pct": claim.get("memory_pct"), "guide_latency_pct": claim.get("latency_pct")})
    return out


# The columns of ``batch_ratios`` a reader compares with the guide's table first.
RATIO_COLUMNS = ("batch", "throughput_ratio", "throughput_low", "throughput_high", "latency_growth_pct",
                 "latency_growth_low_pct", "latency_growth_high_pct", "ttft_growth_pct", "memory_growth_mib",
                 "kv_cache_mib", "memory_growth_pct", "guide_throughput", "guide_memory_pct",
                 "guide_latency_pct")


# --- the KV cache beside the weights, measured and the guide's ------------------------------------

def kv_cache_table(rows: list[dict], weight_bytes: float) -> list[dict]:
    """Per measured batch size: the KV cache the config implies at the request's final length, beside
    the weights, the bytes a decode step reads, the achieved GB/s and the measured memory figures."""
    return [{"batch": r["point"], "context_tokens": int(r["prompt_tokens"] + r["new_tokens"]),
             "kv_cache_MiB": r["kv_cache_bytes"] / 2 ** 20,
             "kv_share_of_weights_pct": 100 * r["kv_cache_bytes"] / weight_bytes,
             "bytes_per_step_MB": r["bytes_per_step"] / 1e6, "decode_ms_per_token": r.get("decode_ms_per_token"),
             "achieved_gbps": r.get("achieved_gbps"), "measured_growth_MiB": r["memory_growth_bytes"] / 2 ** 20,
             "peak_memory_MiB": r["peak_memory_bytes"] / 2 ** 20} for r in rows if r.get("status") == "ok"]


def highest_bandwidth_point(rows: list[dict]) -> Optional[dict]:
    """The measured sweep row whose decode moved the most GB/s (None when no decode was resolved)."""
    found = [r for r in _resolved(rows).values() if math.isfinite(r.get("achieved_gbps", math.nan))]
    return max(found, key=lambda r: r["achieved_gbps"]) if found else None


def llama2_kv_growth(claims_pct: dict, contexts: Iterable[int] = (512, 2048), dtype: str = "float16") -> list:
    """The guide's memory growth per batch size read as Llama-2-7B's KV cache (computed, not measured).

    For each ``{batch: claimed %}``: the tokens per sequence at which the KV cache alone makes that
    batch need the claimed % more than batch 1 (``context_for_kv_growth``), and the growth
    the KV cache alone gives at each of ``contexts`` tokens, over the weights in ``dtype``.
    """
    config, weights = roofline.LLAMA2_7B_CONFIG, roofline.llama2_weight_bytes(dtype)
    return [{"batch": batch, "guide_memory_pct": claimed, "dtype": dtype, "weights_gb": weights / 1e9,
             "kv_per_token_kib": roofline.kv_cache_bytes_per_token(config, dtype) / 2 ** 10,
             "context_for_claim": context_for_kv_growth(config, batch, claimed, weights, dtype),
             **{f"kv_growth_pct_{n}": kv_memory_growth_pct(config, batch, n, weights, dtype) for n in contexts}}
            for batch, claimed in sorted(claims_pct.items())]


# --- chapter 04: how the KV cache grows with the context ------------------------------------------

def context_for_kv_growth(config, batch_size: int, growth_pct: float, weight_bytes: float,
                          dtype: str = "float16") -> float:
    """Tokens per sequence at which the KV cache alone makes batch ``batch_size`` use ``growth_pct`` % more
    memory than batch 1 (the inverse of ``kv_memory_growth_pct``); inf if it never can."""
    growth = roofline.check_positive("growth_pct", growth_pct) / 100.0
    weight_bytes = roofline.check_positive("weight_bytes", weight_bytes)
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 2:
        raise ValueError(f"batch_size={batch_size!r} is not valid; it must be an integer >= 2")
    per_token = roofline.kv_cache_bytes_per_token(config, dtype)
    # (W + B k c) = (1 + g)(W + k c)  ->  c = g W / (k (B - 1 - g))
    denominator = per_token * (batch_size - 1 - growth)
    return float("inf") if denominator <= 0 else growth * weight_bytes / denominator


def kv_memory_growth_pct(config, batch_size: int, context_len: int, weight_bytes: float,
                         dtype: str = "float16") -> float:
    """Memory growth over batch 1 (%) from the KV cache alone: weights + KV(B) against weights + KV(1).

    The analytic counterpart of a "batch B needs x % more memory" claim; activations and
    allocator slack come on top, so a measured growth can only be larger.
    """
    weight_bytes = roofline.check_positive("weight_bytes", weight_bytes)
    base = weight_bytes + roofline.kv_cache_bytes(config, 1, context_len, dtype)
    return 100.0 * (weight_bytes + roofline.kv_cache_bytes(config, batch_size, context_len, dtype)) / base - 100.0


# --- chapter 04's worked answers (solutions/04): the facts each answer's paragraph is said from ----
# The paragraphs are blocks of templates/04_batching.answers.md.j2 (``prose.answer``).

def padding_facts(rows) -> dict:
    """Exercise 1: which prompts' greedy outputs change in a right- and a left-padded batch (rows
    with padding, prompt_tokens, match); ``follows_length``: only prompts shorter than the longest
    changed, and the longest did not."""
    right = [r for r in rows if r["padding"] == "right"]
    left = [r for r in rows if r["padding"] == "left"]
    longest = max(r["prompt_tokens"] for r in rows)
    changed = sorted(int(r["prompt_tokens"]) for r in right if not r["match"])
    kept = sorted(int(r["prompt_tokens"]) for r in right if r["match"])
    return {"changed": changed, "kept": kept, "prompts": len(right), "longest": int(longest),
            "left_matches": sum(bool(r["match"]) for r in left), "left_prompts": len(left),
            "follows_length": bool(changed) and max(changed) < longest and longest in kept}


def aggregate_facts(rows, bandwidth: dict, bandwidth_source) -> dict:
    """Exercise 2: the batch sizes with a resolved decode (rows of the chapter's batch sweep, in batch
    order, with their aggregate tokens/s spread), and the first size whose aggregate does not grow
    beyond the noise over the size before (``decide.changed``, on the samples each row stands on):
    ``stop`` (its row and ``decision``), or ``too_few`` (the pair and its decision) when the samples
    cannot say, or neither when every size grew."""
    steps = []
    for r in rows:
        fastest = r["decode_p10_ms"] if r["decode_p10_ms"] > 0 else None  # a sample <= 0 has no bound
        steps.append({"batch": int(r["point"]), "tok_s": r["tokens_per_s_aggregate"],
                      "low": 1e3 * r["point"] / r["decode_p90_ms"],
                      "high": 1e3 * r["point"] / fastest if fastest else math.inf, "gbps": r["achieved_gbps"],
                      "pct": 100 * r["achieved_gbps"] / bandwidth["value"], "n_samples": decide.samples_of(r)})
    facts = {"steps": steps, "gbps": bandwidth["value"], "source": bandwidth_source}
    for before, after in zip(steps, steps[1:]):
        decision = decide.changed([before["tok_s"], after["tok_s"]],
                                  [(before["low"], before["high"]), (after["low"], after["high"])],
                                  samples=min(before["n_samples"] or 0, after["n_samples"] or 0) or None)
        if decide.is_too_few(decision):
            return {**facts, "too_few": {"from": before["batch"], "to": after["batch"], "decision": decision}}
        if decision != "grows":
            return {**facts, "stop": {**after, "decision": decision, "from": before["batch"]}}
    return facts


def gqa_facts(rows) -> dict:
    """Exercise 3: Llama-2-7B's and Llama-2-70B's KV cache per token and its growth at batch 8 x 2048
    tokens (rows with model, weights GB, KV per token KiB, growth batch 8 vs 1 %), as ratios."""
    r7, r70 = rows
    return {"kv7": r7["KV per token KiB"], "kv70": r70["KV per token KiB"],
            "kv_ratio": r70["KV per token KiB"] / r7["KV per token KiB"],
            "weights_ratio": r70["weights GB"] / r7["weights GB"],
            "growth7": r7["growth batch 8 vs 1 %"], "growth70": r70["growth batch 8 vs 1 %"]}
