"""Generation metrics: TTFT / decode split, batching, bytes per step, sweeps.

Taught in ``03_end_to_end.ipynb`` (TTFT, decode, roofline) and ``04_batching.ipynb`` (batch sweep,
padding correctness). The split follows optimum-benchmark: the prefill is timed as a generate of
exactly one token, a full generate of ``N`` tokens is timed with ``min_new_tokens == N`` (so an
early end-of-sequence cannot shorten it), and decode per token is ``(t(N) - t(1)) / (N - 1)``.
Decoding is greedy, so runs are deterministic; both timings use ``helpers.bench.measure``.
"""
from __future__ import annotations

import gc
import math
import os
import time
from typing import Any, Callable, Iterable, Optional

import torch

from . import backend, bench, static_decode, versions
from .backend import as_device, dtype_name
from .models import chat_inputs
from .params import check_positive_int


def _inputs(model, tokenizer, prompts, device, chat: bool):
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    return chat_inputs(tokenizer, list(prompts), device or backend.model_device(model), chat)


@torch.inference_mode()
def generate_tokens(model, tokenizer, inputs: dict, new_tokens: int, **generate_kwargs):
    """Greedy ``generate`` of exactly ``new_tokens`` tokens from tokenized ``inputs`` (all ids returned)."""
    return model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False, pad_token_id=tokenizer.pad_token_id, **generate_kwargs)


def greedy_new_tokens(model, tokenizer, prompts, max_new_tokens: int, *, chat: bool = False,
                      device=None) -> list[list[int]]:
    """The new token ids of one batched greedy generate (left padding), one list per prompt."""
    inputs = _inputs(model, tokenizer, prompts, device, chat)
    out = generate_tokens(model, tokenizer, inputs, max_new_tokens)
    return out[:, inputs["input_ids"].shape[1]:].tolist()


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
        prompt_tokens = len(_inputs(model, tokenizer, [prompt], device, chat)["input_ids"][0])
        rows.append({"prompt": prompt, "prompt_tokens": prompt_tokens, "first_difference": first,
                     "match": first is None, "alone": tokenizer.decode(alone),
                     "batched": tokenizer.decode(together)})
    return {"match": all(r["match"] for r in rows), "rows": rows,
            "batch_size": len(prompts), "new_tokens": max_new_tokens}


def measure_generation(model, tokenizer, prompts, max_new_tokens: int, device=None, *,
                       repeats: int = 3, chat: bool = False, seed: int = 0,
                       code_path: Optional[str] = None, generate_kwargs: Optional[dict] = None,
                       static_cache: bool = False, kernel_profile: bool = False) -> dict:
    """TTFT, decode latency per token, tokens/s per user and aggregate, and peak memory.

    ``prompts`` is the batch (one string per user). ``repeats`` timed runs follow one untimed
    warm-up, and percentiles are taken over the repeats; decode samples pair the i-th full run
    with the i-th prefill run. Memory (``request_memory``) is what the full generates add on top of
    what was in use before them, measured with ``backend.MemoryRegion``.

    ``static_cache=True`` is the static-shape path of ``helpers.static_decode``: one static KV
    cache sized for the request, reset before every generate. When ``model.forward`` is a
    ``static_decode.CompiledForward``, an extra untimed generate first pays the compilation, and the
    result adds ``compiled_graphs`` (graphs built during that warm-up and the timed runs) and
    ``compile_s`` (wall time of the calls that built a graph).

    ``kernel_profile=True`` adds where one decode step's time goes in this very configuration
    (``profiling.kernel_time_by_kind``: the weight-matmul kernels this path ran, attention, other
    kernels), from two profiled generates after the timed ones.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 2:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not valid; it must be an integer >= 2 "
                         "(the decode time is the difference between N tokens and 1 token)")
    check_positive_int("repeats", repeats)
    device = as_device(device) if device is not None else backend.model_device(model)
    inputs = _inputs(model, tokenizer, prompts, device, chat)
    batch, prompt_len = inputs["input_ids"].shape
    extra = dict(generate_kwargs or {})
    torch.manual_seed(seed)
    compiled = static_decode.compiled_forward_of(model)
    cache = None
    if static_cache:
        cache, static_kwargs = static_decode.static_generate_kwargs(model, inputs, max_new_tokens)
        extra.update(static_kwargs)

    def generate(n_tokens: int):
        if cache is not None:
            cache.reset()
        return generate_tokens(model, tokenizer, inputs, n_tokens, **extra)

    lengths: list[int] = []

    def full_generate():
        lengths.append(generate(max_new_tokens).shape[1])

    graphs_before = (compiled.graphs, compiled.compile_s) if compiled is not None else (0, 0.0)
    if compiled is not None:
        generate(max_new_tokens)  # pays the compilation of the prefill and decode graphs, untimed
    # The first call of each measurement is its untimed warm-up.
    timing = dict(warmup=1, min_iters=repeats, max_iters=repeats, min_seconds=0.0,
                  min_sample_seconds=0.0)
    prefill = bench.measure(lambda: generate(1), device, name="generate 1 token", **timing)
    with backend.MemoryRegion(device) as memory:
        full = bench.measure(full_generate, device, name=f"generate {max_new_tokens} tokens", **timing)
    wrong = {n - prompt_len for n in lengths if n - prompt_len != max_new_tokens}
    if wrong:
        raise RuntimeError(f"generate produced {sorted(wrong)} new tokens instead of {max_new_tokens}")

    kernels = {}
    if kernel_profile:
        from .profiling import kernel_time_by_kind

        kernels = kernel_time_by_kind(generate, max_new_tokens, device)
    decode_samples = [(f - p) / (max_new_tokens - 1) for f, p in zip(full.samples, prefill.samples)]
    attn = getattr(model.config, "_attn_implementation", None) or "default"
    path = (f"transformers generate, greedy, min_new_tokens=max_new_tokens, {attn} attention, left padding, "
            + ("static KV cache sized for the request" if static_cache else "dynamic KV cache")
            + (f", forward compiled ({compiled.describe()})" if compiled is not None else ", eager"))
    return {
        "batch_size": int(batch),
        "prompt_tokens": int(prompt_len),
        "new_tokens": int(max_new_tokens),
        **timing_figures(prefill.samples, decode_samples, int(batch), str(device)),
        "total_ms": full.median * 1e3,
        **request_memory(model, memory, batch, prompt_len + max_new_tokens),
        "dtype": dtype_name(next(model.parameters()).dtype),
        "device": str(device),
        "code_path": code_path or path,
        "static_cache": bool(static_cache),
        "repeats": repeats,
        **static_decode.graph_fields(compiled, graphs_before),
        **kernels,
    }


def measure_interleaved(models_by_name: dict, tokenizer, prompts, max_new_tokens: int, device=None, *,
                        rounds: int = 3, repeats: int = 2, **kwargs) -> dict:
    """``measure_generation`` of several models in turn, ``rounds`` times, samples pooled per model.

    On a shared machine the load drifts over minutes; measuring A, B, A, B, ... makes the drift hit
    every model alike, so a ratio of their medians compares the models, not the moments. Each
    round is the same protocol as a single ``measure_generation``; the pooled result has its keys,
    with medians and p10/p90 over every round's samples and the largest memory growth of the rounds.
    """
    check_positive_int("rounds", rounds)
    runs: dict = {name: [] for name in models_by_name}
    for _ in range(rounds):
        for name, model in models_by_name.items():
            runs[name].append(measure_generation(model, tokenizer, prompts, max_new_tokens, device,
                                                 repeats=repeats, **kwargs))
    return {name: _pooled(parts, rounds) for name, parts in runs.items()}


def _pooled(parts: list, rounds: int) -> dict:
    out = dict(max(parts, key=lambda p: p["memory_growth_bytes"]))
    out.update(timing_figures([x / 1e3 for p in parts for x in p["ttft_samples_ms"]],
                              [x / 1e3 for p in parts for x in p["decode_samples_ms"]],
                              out["batch_size"], out["device"]),
               rounds=rounds, code_path=out["code_path"] + f", {rounds} interleaved rounds pooled")
    out["repeats"] = len(out["decode_samples_ms"])
    return out


def timing_figures(ttft_samples: list, decode_samples: list, batch_size: int, device: str) -> dict:
    """The one definition of the recorded TTFT and decode figures, from per-run samples in seconds:
    medians, p10 / p90, tokens/s per user and for the batch, noise flags and the samples in ms."""
    ttft = bench.Timing("ttft", list(ttft_samples), device=device)
    decode = bench.Timing("decode per token", list(decode_samples), device=device)
    # A non-positive median means timing noise exceeded the decode time: report no figure.
    resolved = decode.median > 0
    per_user = 1.0 / decode.median if resolved else math.nan
    return {"ttft_ms": ttft.median * 1e3, "ttft_p10_ms": ttft.p10 * 1e3, "ttft_p90_ms": ttft.p90 * 1e3,
            "decode_ms_per_token": decode.median * 1e3 if resolved else math.nan,
            "decode_p10_ms": decode.p10 * 1e3 if resolved else math.nan,
            "decode_p90_ms": decode.p90 * 1e3 if resolved else math.nan,
            "tokens_per_s_per_user": per_user, "tokens_per_s_aggregate": per_user * batch_size,
            "ttft_noisy": ttft.noisy, "decode_noisy": decode.noisy or not resolved,
            "decode_resolved": resolved, "ttft_samples_ms": [x * 1e3 for x in ttft.samples],
            "decode_samples_ms": [x * 1e3 for x in decode.samples]}


def ttft_timing(result: dict, name: str = "") -> bench.Timing:
    """The TTFT samples of a ``measure_generation`` result as a ``bench.Timing``."""
    return _samples(result, "ttft", name)


def decode_timing(result: dict, name: str = "") -> bench.Timing:
    """The decode-per-token samples of a ``measure_generation`` result as a ``bench.Timing``,
    so that two configurations compare with ``bench.speedup``."""
    return _samples(result, "decode", name)


def _samples(result: dict, phase: str, name: str) -> bench.Timing:
    return bench.Timing(name or f"{phase} batch {result['batch_size']}",
                        [x / 1e3 for x in result[f"{phase}_samples_ms"]], device=result["device"])


def request_memory(model, memory: "backend.MemoryRegion", batch_size: int, context_len: int) -> dict:
    """The memory figures of a measured request, each named for what it is.

    ``memory_growth_bytes``: the peak the request added over what was in use before it (KV cache,
    activations, logits, temporaries). ``peak_memory_bytes``: the request's peak memory, i.e.
    ``max_memory_allocated`` (reset before it) on NPU / CUDA, and the model's weight bytes plus the
    growth on a CPU, where the process RSS also holds the Python runtime and libraries.
    ``kv_cache_bytes``: the KV cache of the batch at its final length, from the model config, shown
    beside the growth that holds it.
    """
    from .models import weight_bytes
    from .roofline import kv_cache_bytes

    growth = memory.growth_bytes
    on_device = memory.module is not None
    dtype = dtype_name(next(model.parameters()).dtype)
    return {
        "memory_growth_bytes": int(growth),
        "peak_memory_bytes": int(memory.peak_bytes if on_device else weight_bytes(model) + growth),
        "kv_cache_bytes": int(kv_cache_bytes(model.config, int(batch_size), int(context_len), dtype)),
        "memory_kind": memory.kind if on_device else f"model weight bytes + growth; growth from the {memory.kind}",
    }


def decode_bytes_per_step(model, batch_size: int, context_len: int) -> int:
    """Bytes one decode step reads: every weight once, plus the KV cache of the whole batch.

    A tied embedding / lm_head matrix is counted once (the lm_head reads all of it); an untied
    input embedding is a lookup, so it counts as one row per sequence, not the whole table.
    The KV cache is ``roofline.kv_cache_bytes`` of the batch at ``context_len`` tokens.
    """
    from .roofline import kv_cache_bytes

    check_positive_int("batch_size", batch_size)
    check_positive_int("context_len", context_len, minimum=0)
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight.data_ptr() == embedding.data_ptr()
    seen, weights = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if p.data_ptr() == embedding.data_ptr() and not tied:
            weights += batch_size * p.shape[1] * p.element_size()
        else:
            weights += p.numel() * p.element_size()
    return int(weights + kv_cache_bytes(model.config, batch_size, context_len, dtype_name(embedding.dtype)))


def achieved_bandwidth_gbps(bytes_per_step: float, decode_ms_per_token: float) -> float:
    """Bytes per decode step times steps per second, in GB/s (1e9 bytes)."""
    if decode_ms_per_token <= 0:
        raise ValueError(f"decode_ms_per_token={decode_ms_per_token!r} must be > 0")
    return bytes_per_step / (decode_ms_per_token / 1e3) / 1e9


def run_sweep(points: Iterable, fn: Callable[[Any], dict], device) -> list[dict]:
    """Call ``fn(point)`` for each point; a point that fails is recorded and the sweep goes on.

    Each row has ``point``, ``status`` (ok / oom / failed), ``error`` and the dict ``fn`` returned.
    Memory is freed after an out-of-memory error so the next (often smaller) point can run.
    """
    rows = []
    for point in points:
        row: dict = {"point": point, "status": "ok", "error": ""}
        t0 = time.perf_counter()
        try:
            result = fn(point)
            if result:
                row.update(result)
        except Exception as exc:  # noqa: BLE001  a sweep reports every failure and goes on
            oom = backend.is_out_of_memory(exc)
            row["status"] = "oom" if oom else "failed"
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            del exc
            backend.free_memory(device)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
    gc.collect()
    return rows


def prompt_of_length(tokenizer, n_tokens: int, text: Optional[str] = None) -> tuple[str, int]:
    """A plain-text prompt of about ``n_tokens`` tokens (and its exact count) for length sweeps."""
    check_positive_int("n_tokens", n_tokens)
    base = text or ("Large language models generate text one token at a time. Each step reads "
                    "every weight of the model from memory, so the speed of decoding is set by "
                    "memory bandwidth, while the prompt is processed in parallel. ")
    ids: list[int] = []
    while len(ids) < n_tokens + 8:
        ids += tokenizer(base, add_special_tokens=False)["input_ids"]
    prompt = tokenizer.decode(ids[:n_tokens], skip_special_tokens=True)
    count = len(tokenizer(prompt)["input_ids"])
    return prompt, count


# --- the decode gap: each path's step split by its own kernels (chapter 03) ---------------------

def eager_matmul_times(model, batch_size: int = 1, device=None, *, min_iters: int = 5,
                       min_seconds: float = 0.2):
    """The weight matmuls of one decode step at the model's own shapes, each kind timed alone with
    ATen's eager kernels: what each kind of GEMV reaches on this device (not a floor: a compiled
    path may run other, faster kernels; ``decode_gap`` uses each path's own kernel times).

    Every ``nn.Linear`` of the model is grouped by its name (q_proj, k_proj, v_proj, o_proj,
    gate_proj, up_proj, down_proj, lm_head, ...); one ``bench.measure`` sample runs ``F.linear`` of a
    ``(batch_size, in_features)`` activation with every layer's own weight of that kind, so the time
    is the kind's share of one step summed over layers, and the weights stream from memory as they do
    in a real step instead of staying in cache. Returns a DataFrame with one row per kind: shape,
    layers, ``ms_per_step``, ``weight_bytes`` and the achieved ``gbps``.
    """
    import pandas as pd
    import torch.nn.functional as F
    from torch import nn

    check_positive_int("batch_size", batch_size)
    device = as_device(device) if device is not None else backend.model_device(model)
    groups: dict = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            groups.setdefault(name.rsplit(".", 1)[-1], []).append(module.weight.detach())
    if not groups:
        raise ValueError("model has no nn.Linear modules; pass an unquantized Llama-style model")
    rows = []
    with torch.inference_mode():
        for kind, weights in groups.items():
            out_f, in_f = weights[0].shape
            x = torch.randn(batch_size, in_f, device=weights[0].device, dtype=weights[0].dtype)

            def run(x=x, weights=weights):
                for w in weights:
                    F.linear(x, w)

            timing = bench.measure(run, device, name=kind, warmup=2, min_iters=min_iters,
                                   min_seconds=min_seconds)
            nbytes = sum(w.numel() * w.element_size() for w in weights)
            rows.append({"matmul": kind, "shape": f"({batch_size}, {in_f}) x ({in_f}, {out_f})",
                         "layers": len(weights), "ms_per_step": timing.median * 1e3,
                         "p10_ms": timing.p10 * 1e3, "p90_ms": timing.p90 * 1e3, "weight_bytes": int(nbytes),
                         "gbps": nbytes / timing.median / 1e9, "dtype": dtype_name(weights[0].dtype)})
    return pd.DataFrame(rows)


def decode_gap(paths: dict, bytes_per_step: float, weight_bytes: float, bandwidth_gbps: float):
    """One row per path: its measured decode step split into the weight-matmul kernels it ran and
    the rest, beside the roofline.

    ``paths`` maps a name (eager, graph, ...) to a ``measure_generation(..., kernel_profile=True)``
    result. ``matmul_ms`` is that path's own weight-matmul kernel time per step (so a compiled path's
    faster kernels are its own, and nothing is "beaten"); ``rest_ms`` = step - matmul_ms:
    attention, norms, elementwise kernels, launches, Python. ``roofline_ms`` = bytes per step /
    bandwidth, the time reading the weights and KV cache once would take. ``matmul_gbps`` is the
    weights the matmuls read over their kernel time. A profiled kernel time above the timed step
    (profiling and timing disagree) is kept as measured and flagged in ``note``.
    """
    import pandas as pd

    if bandwidth_gbps <= 0 or bytes_per_step <= 0:
        raise ValueError("bandwidth_gbps and bytes_per_step must be > 0")
    roofline_ms = bytes_per_step / (bandwidth_gbps * 1e9) * 1e3
    rows = []
    for name, result in paths.items():
        step = float(result["decode_ms_per_token"])
        matmul = result.get("weight_matmul_ms")
        matmul = float(matmul) if matmul is not None else math.nan
        rows.append({"path": name, "step_ms": step, "matmul_ms": matmul, "rest_ms": step - matmul,
                     "matmul_share_pct": 100.0 * matmul / step, "roofline_ms": roofline_ms,
                     "roofline_pct": 100.0 * roofline_ms / step,
                     "matmul_gbps": weight_bytes / (matmul / 1e3) / 1e9 if matmul > 0 else math.nan,
                     "attention_ms": result.get("attention_ms"), "matmul_kernels": result.get("matmul_kernels", ""),
                     "note": "profiled matmul time exceeds the timed step" if matmul > step else ""})
    return pd.DataFrame(rows)


def decode_step(model, tokenizer, prompt: str, *, chat: bool = False, device=None) -> Callable[[], Any]:
    """One eager batch-1 decode step after ``prompt``, as a callable that repeats the same step.

    The prefill runs once; each call is one forward of one token through the dynamic cache, which is
    cropped back afterwards, so every call (warm-up, timed, profiled) is the same step at the same
    context. The probes of one step use it: ``decode_step_launches``, ``profiling.top_ops``, and
    chapter 01's share of a step. Timing whole requests is ``measure_generation``'s job.
    """
    device = as_device(device) if device is not None else backend.model_device(model)
    inputs = _inputs(model, tokenizer, [prompt], device, chat)
    forward = static_decode.eager_forward(model)
    with torch.inference_mode():
        out = forward(**inputs, use_cache=True)
    past = versions.cache_of(out)
    token = out.logits[:, -1:].argmax(-1)
    mask = torch.cat([inputs["attention_mask"], inputs["attention_mask"].new_ones(1, 1)], dim=1)
    cache_kw = versions.cache_argument(model)

    @torch.inference_mode()
    def step():
        logits = forward(input_ids=token, attention_mask=mask, use_cache=True, **{cache_kw: past}).logits
        past.crop(-1)  # drop this step's entry: every call is the same step
        return logits

    return step


def decode_step_launches(model, tokenizer, prompt: str, *, chat: bool = False, device=None) -> dict:
    """Operator launches of one eager batch-1 decode step (``decode_step``), counted from torch.profiler."""
    from .profiling import count_ops

    device = as_device(device) if device is not None else backend.model_device(model)
    return count_ops(decode_step(model, tokenizer, prompt, chat=chat, device=device), device, warmup=1)


def prompt_length_sweep(model, tokenizer, lengths, new_tokens: int, device=None, *, repeats: int = 3):
    """``measure_generation`` at each prompt length (chapter 03): TTFT and decode per point, the
    sample lists left out; a point that fails or runs out of memory is recorded and the sweep goes on."""
    def point(n_tokens):
        prompt, _ = prompt_of_length(tokenizer, n_tokens)
        r = measure_generation(model, tokenizer, [prompt], new_tokens, device, repeats=repeats)
        return {"requested_tokens": n_tokens, **r}

    return sweep_table(run_sweep(lengths, point, device))


# --- batching: the padding check and the batch sweep (chapter 04) --------------------------------

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

    return run_sweep(sorted(set(batch_sizes)), point, device)


# The columns of a batch sweep a reader compares first (the recorded table keeps every column).
SWEEP_COLUMNS = ("point", "status", "prompt_tokens", "ttft_ms", "decode_ms_per_token", "decode_p10_ms",
                 "decode_p90_ms", "tokens_per_s_per_user", "tokens_per_s_aggregate", "memory_growth_bytes",
                 "kv_cache_bytes", "peak_memory_bytes", "achieved_gbps", "error")


def sweep_table(rows: list[dict]):
    """A sweep's rows as a DataFrame without the per-sample lists (``*_samples_ms``)."""
    import pandas as pd

    return pd.DataFrame([{k: v for k, v in r.items() if not k.endswith("samples_ms")} for r in rows])


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
    from . import decide

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


def kv_cache_table(rows: list[dict], weight_bytes: float) -> list[dict]:
    """Per measured batch size: the KV cache the config implies at the request's final length, beside
    the weights, the bytes a decode step reads, the achieved GB/s and the measured memory figures."""
    out = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        kv = r["kv_cache_bytes"]
        out.append({"batch": r["point"], "context_tokens": int(r["prompt_tokens"] + r["new_tokens"]),
                    "kv_cache_MiB": kv / 2 ** 20, "kv_share_of_weights_pct": 100 * kv / weight_bytes,
                    "bytes_per_step_MB": r["bytes_per_step"] / 1e6,
                    "decode_ms_per_token": r.get("decode_ms_per_token"),
                    "achieved_gbps": r.get("achieved_gbps"),
                    "measured_growth_MiB": r["memory_growth_bytes"] / 2 ** 20,
                    "peak_memory_MiB": r["peak_memory_bytes"] / 2 ** 20})
    return out


def highest_bandwidth_point(rows: list[dict]) -> Optional[dict]:
    """The measured sweep row whose decode moved the most GB/s (None when no decode was resolved)."""
    found = [r for r in _resolved(rows).values() if math.isfinite(r.get("achieved_gbps", math.nan))]
    return max(found, key=lambda r: r["achieved_gbps"]) if found else None


def llama2_kv_growth(claims_pct: dict, contexts: Iterable[int] = (512, 2048), dtype: str = "float16") -> list:
    """The guide's memory growth per batch size read as Llama-2-7B's KV cache (computed, not measured).

    For each ``{batch: claimed %}``: the tokens per sequence at which the KV cache alone makes that
    batch need the claimed % more than batch 1 (``roofline.context_for_kv_growth``), and the growth
    the KV cache alone gives at each of ``contexts`` tokens, over the weights in ``dtype``.
    """
    from . import roofline

    config, weights = roofline.LLAMA2_7B_CONFIG, roofline.llama2_weight_bytes(dtype)
    out = []
    for batch, claimed in sorted(claims_pct.items()):
        row = {"batch": batch, "guide_memory_pct": claimed, "dtype": dtype, "weights_gb": weights / 1e9,
               "kv_per_token_kib": roofline.kv_cache_bytes_per_token(config, dtype) / 2 ** 10,
               "context_for_claim": roofline.context_for_kv_growth(config, batch, claimed, weights, dtype)}
        for n in contexts:
            row[f"kv_growth_pct_{n}"] = roofline.kv_memory_growth_pct(config, batch, n, weights, dtype)
        out.append(row)
    return out


def logits_of_last_position(model, prompt_tokens: int, device=None, *, min_iters: int = 5,
                            min_seconds: float = 0.2) -> dict:
    """How the prefill's logits are computed (chapter 03): ``lm_head(hidden[:, -1:, :])``, the slice
    transformers takes of the prompt's hidden states, against the same rows as a plain 2-D matrix.

    The slice keeps the prompt's stride. Both give the same logits (checked); this returns each
    one's timing (``bench.measure``) and the operators it spent its time in, so a chapter
    can show whether this torch sends the slice down a slower path than the one GEMV it is.
    """
    from .profiling import busiest_ops

    device = as_device(device) if device is not None else backend.model_device(model)
    head = model.get_output_embeddings()
    hidden = torch.randn(1, int(prompt_tokens), head.in_features, device=device, dtype=head.weight.dtype)
    sliced, flat = hidden[:, -1:, :], hidden[:, -1, :]
    with torch.inference_mode():
        exact = torch.nn.functional.linear(flat.float(), head.weight.float())  # float32 reference
        for got in (head(sliced)[:, 0], head(flat)):
            bench.assert_within(got, exact, "matmul", what="lm_head logits")
        out = {}
        for name, x in (("slice", sliced), ("2-D rows", flat)):
            timing = bench.measure(lambda x=x: head(x), device, name=f"lm_head, {name}", min_iters=min_iters,
                                   min_seconds=min_seconds)
            out[name] = {"median_ms": timing.median_ms, "p10_ms": timing.p10 * 1e3, "p90_ms": timing.p90 * 1e3,
                         "ops": ", ".join(busiest_ops(lambda x=x: head(x), device)), "stride": list(x.stride()),
                         "timing": timing}
    return out
