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
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Optional

import torch

from . import backend, bench, compat, static_decode
from .backend import as_device, dtype_name
from .models import chat_inputs


def _inputs(model, tokenizer, prompts, device, chat: bool):
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    return chat_inputs(tokenizer, list(prompts), device or backend.model_device(model), chat)


@torch.inference_mode()
def _generate(model, tokenizer, inputs, new_tokens: int, **kwargs):
    return model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False, pad_token_id=tokenizer.pad_token_id, **kwargs)


def generate_tokens(model, tokenizer, inputs: dict, new_tokens: int, **generate_kwargs):
    """Greedy ``generate`` of exactly ``new_tokens`` tokens from tokenized ``inputs`` (all ids returned)."""
    return _generate(model, tokenizer, inputs, new_tokens, **generate_kwargs)


def greedy_new_tokens(model, tokenizer, prompts, max_new_tokens: int, *, chat: bool = False,
                      device=None) -> list[list[int]]:
    """The new token ids of one batched greedy generate (left padding), one list per prompt."""
    inputs = _inputs(model, tokenizer, prompts, device, chat)
    out = _generate(model, tokenizer, inputs, max_new_tokens)
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
                       static_cache: bool = False) -> dict:
    """TTFT, decode latency per token, tokens/s per user and aggregate, and peak memory.

    ``prompts`` is the batch (one string per user). ``repeats`` timed runs follow one untimed
    warm-up, and percentiles are taken over the repeats; decode samples pair the i-th full run
    with the i-th prefill run. ``peak_memory_bytes`` is the peak over the full generates.

    ``static_cache=True`` is the static-shape path of ``helpers.static_decode``: one static KV
    cache sized for the request, reset before every generate. When ``model.forward`` is a
    ``static_decode.CompiledForward``, an extra untimed generate first pays the compilation, and the
    result adds ``compiled_graphs`` (graphs built during that warm-up and the timed runs) and
    ``compile_s`` (wall time of the calls that built a graph).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 2:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not valid; it must be an integer >= 2 "
                         "(the decode time is the difference between N tokens and 1 token)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is not valid; it must be an integer >= 1")
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
        return _generate(model, tokenizer, inputs, n_tokens, **extra)

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
    backend.reset_peak_memory(device)
    full = bench.measure(full_generate, device, name=f"generate {max_new_tokens} tokens", **timing)
    peak = backend.peak_memory_bytes(device)
    wrong = {n - prompt_len for n in lengths if n - prompt_len != max_new_tokens}
    if wrong:
        raise RuntimeError(f"generate produced {sorted(wrong)} new tokens instead of {max_new_tokens}")

    decode_samples = [(f - p) / (max_new_tokens - 1) for f, p in zip(full.samples, prefill.samples)]
    decode = bench.Timing("decode per token", decode_samples, device=str(device))
    decode_s = decode.median
    # A non-positive difference means timing noise exceeded the decode time: report no figure.
    resolved = decode_s > 0
    if not resolved:
        decode_s = math.nan
    per_user = 1.0 / decode_s if resolved else math.nan
    attn = getattr(model.config, "_attn_implementation", None) or "default"
    path = (f"transformers generate, greedy, min_new_tokens=max_new_tokens, {attn} attention, left padding, "
            + ("static KV cache sized for the request" if static_cache else "dynamic KV cache")
            + (f", forward compiled ({compiled.describe()})" if compiled is not None else ", eager"))
    return {
        "batch_size": int(batch),
        "prompt_tokens": int(prompt_len),
        "new_tokens": int(max_new_tokens),
        "ttft_ms": prefill.median * 1e3,
        "ttft_p10_ms": prefill.p10 * 1e3,
        "ttft_p90_ms": prefill.p90 * 1e3,
        "decode_ms_per_token": decode_s * 1e3,
        "decode_p10_ms": decode.p10 * 1e3 if resolved else math.nan,
        "decode_p90_ms": decode.p90 * 1e3 if resolved else math.nan,
        "tokens_per_s_per_user": per_user,
        "tokens_per_s_aggregate": per_user * int(batch),
        "total_ms": full.median * 1e3,
        "peak_memory_bytes": int(peak),
        "memory_kind": backend.peak_memory_kind(device),
        "dtype": dtype_name(next(model.parameters()).dtype),
        "device": str(device),
        "code_path": code_path or path,
        "static_cache": bool(static_cache),
        "repeats": repeats,
        "ttft_noisy": prefill.noisy,
        "decode_noisy": decode.noisy or not resolved,
        "decode_resolved": resolved,
        "ttft_samples_ms": [x * 1e3 for x in prefill.samples],
        "decode_samples_ms": [x * 1e3 for x in decode_samples],
        **static_decode.graph_fields(compiled, graphs_before),
    }


def decode_timing(result: dict, name: str = "") -> bench.Timing:
    """The decode-per-token samples of a ``measure_generation`` result as a ``bench.Timing``,
    so that two configurations compare with ``bench.speedup``."""
    return bench.Timing(name or f"decode batch {result['batch_size']}",
                        [x / 1e3 for x in result["decode_samples_ms"]], device=result["device"])


def decode_bytes_per_step(model, batch_size: int, context_len: int) -> int:
    """Bytes one decode step reads: every weight once, plus the KV cache of the whole batch.

    A tied embedding / lm_head matrix is counted once (the lm_head reads all of it); an untied
    input embedding is a lookup, so it counts as one row per sequence, not the whole table.
    The KV cache is 2 (K and V) x layers x kv_heads x head_dim x context_len x batch_size.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid; it must be an integer >= 1")
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 0:
        raise ValueError(f"context_len={context_len!r} is not valid; it must be an integer >= 0")
    cfg = model.config
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
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv = 2 * cfg.num_hidden_layers * kv_heads * head_dim * context_len * batch_size * embedding.element_size()
    return int(weights + kv)


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
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens={n_tokens!r} is not valid; it must be an integer >= 1")
    base = text or ("Large language models generate text one token at a time. Each step reads "
                    "every weight of the model from memory, so the speed of decoding is set by "
                    "memory bandwidth, while the prompt is processed in parallel. ")
    ids: list[int] = []
    while len(ids) < n_tokens + 8:
        ids += tokenizer(base, add_special_tokens=False)["input_ids"]
    prompt = tokenizer.decode(ids[:n_tokens], skip_special_tokens=True)
    count = len(tokenizer(prompt)["input_ids"])
    return prompt, count


@contextmanager
def _native_stderr_silenced():
    """Kineto (torch.profiler's backend) logs start/stop lines from C++ straight to fd 2, which
    end up in executed notebooks; they carry no information, so fd 2 is muted while profiling."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def top_ops(model, tokenizer, prompt: str, steps: int = 4, *, chat: bool = False,
            row_limit: int = 10, device=None):
    """Where decode time goes: torch.profiler over ``steps`` batch-1 decode steps (prefill excluded).

    Returns a DataFrame of operators by self CPU time with their share of the profiled total.
    On CUDA the device time is profiled too; on NPU use ``torch_npu.profiler`` for kernel times.
    """
    import pandas as pd
    from torch.profiler import ProfilerActivity, profile

    device = as_device(device) if device is not None else backend.model_device(model)
    inputs = _inputs(model, tokenizer, [prompt], device, chat)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.inference_mode():
        out = model(**inputs, use_cache=True)
        past, mask = compat.cache_of(out), inputs["attention_mask"]
        token = out.logits[:, -1:].argmax(-1)
        backend.synchronize(device)
        with _native_stderr_silenced(), profile(activities=activities) as prof:
            for _ in range(steps):
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                out = model(input_ids=token, attention_mask=mask, use_cache=True,
                            **{compat.cache_argument(model): past})
                past, token = compat.cache_of(out), out.logits[:, -1:].argmax(-1)
            backend.synchronize(device)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = [{"op": e.key, "calls": e.count, "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
             "share_pct": 100.0 * e.self_cpu_time_total / total} for e in events]
    df = pd.DataFrame(rows).sort_values("self_cpu_ms_per_step", ascending=False)
    return df.head(row_limit).reset_index(drop=True)


def compile_forward(model, device, **options) -> str:
    """Graph mode for generate: ``static_decode.compile_model`` (``dynamic=False``, graphs counted,
    the recompile limit an error); returns the backend used. Measure it with ``static_cache=True``."""
    return static_decode.compile_model(model, device, **options).backend


def cpu_contention(device) -> Optional[str]:
    """A warning when CPU timings are unreliable because the cores are oversubscribed, else None.

    With more runnable processes than cores, torch's OpenMP threads wait for each other at every
    barrier and a decode step can be tens of times slower; one thread per free core avoids that.
    """
    if as_device(device).type != "cpu" or not hasattr(os, "getloadavg"):
        return None
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    if load <= cores:
        return None
    return (f"CPU load average {load:.1f} on {cores} cores with {torch.get_num_threads()} torch threads: "
            "timings are inflated by other processes; run alone or set OMP_NUM_THREADS to the free cores")


# --- the decode gap: roofline, matmul kernel floor, measured step (chapter 03) ---------------------

def decode_matmul_floor(model, batch_size: int = 1, device=None, *, min_iters: int = 5,
                        min_seconds: float = 0.2):
    """The matmuls of one decode step at the model's own shapes, each kind timed alone.

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

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not valid; it must be an integer >= 1")
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


def decode_gap(step_ms: dict, floor_ms: float, bytes_per_step: float, bandwidth_gbps: float):
    """One row per variant: roofline, kernel floor and measured step of a decode step, in ms.

    ``step_ms`` maps a variant name (eager, graph, ...) to its measured ms per decode step.
    ``roofline_ms`` = bytes per step / bandwidth; ``kernel_excess_ms`` = kernel floor - roofline
    (the matmul kernels alone below the bandwidth); ``overhead_ms`` = step - kernel floor
    (everything that is not a weight matmul: attention, norms, elementwise ops, launches, Python).
    The three add up to the step; a negative part is kept as measured (e.g. a compiled step faster
    than the eager matmuls timed alone) and the plot shows it as zero.
    """
    import pandas as pd

    if bandwidth_gbps <= 0 or bytes_per_step <= 0:
        raise ValueError("bandwidth_gbps and bytes_per_step must be > 0")
    roofline_ms = bytes_per_step / (bandwidth_gbps * 1e9) * 1e3
    rows = []
    for name, step in step_ms.items():
        rows.append({"variant": name, "step_ms": step, "roofline_ms": roofline_ms, "kernel_floor_ms": floor_ms,
                     "kernel_excess_ms": floor_ms - roofline_ms, "overhead_ms": step - floor_ms,
                     "overhead_share_pct": 100.0 * (step - floor_ms) / step,
                     "roofline_pct": 100.0 * roofline_ms / step})
    return pd.DataFrame(rows)


def plot_decode_gap(gap, title: str = "", figsize=(7, 4.5), floor_gbps: Optional[float] = None):
    """Stacked bars per variant: roofline time, matmul kernels below bandwidth, overhead; each bar is
    labelled with its step time and overhead share, the legend with the kernel floor's GB/s."""
    import matplotlib.pyplot as plt

    parts = [("roofline_ms", "roofline: bytes / bandwidth", "#4c72b0"),
             ("kernel_excess_ms", "matmul kernels below bandwidth"
              + (f" (floor at {floor_gbps:.1f} GB/s)" if floor_gbps else ""), "#dd8452"),
             ("overhead_ms", "overhead: non-matmul ops, launches, Python", "#c44e52")]
    fig, ax = plt.subplots(figsize=figsize)
    bottom = [0.0] * len(gap)
    for col, label, color in parts:
        heights = [max(float(v), 0.0) for v in gap[col]]
        ax.bar(gap["variant"], heights, bottom=bottom, label=label, color=color)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, (step, share) in enumerate(zip(gap["step_ms"], gap["overhead_share_pct"])):
        ax.text(i, max(bottom[i], float(step)), f"{float(step):.1f} ms\noverhead {float(share):.0f} %",
                ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("ms per decode step (batch 1)")
    ax.set_title(title or "Where one decode step goes")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    ax.set_ylim(0, max(bottom + [float(s) for s in gap["step_ms"]]) * 1.25)
    fig.tight_layout()
    return fig


def decode_step_launches(model, tokenizer, prompt: str, *, chat: bool = False, device=None) -> dict:
    """Operator launches of one eager batch-1 decode step, counted from torch.profiler.

    The prefill runs first; the step is one forward of one token through the dynamic cache, which is
    cropped back after each call so the warm-up and the profiled call are the same step.
    """
    from .profiling import count_ops

    device = as_device(device) if device is not None else backend.model_device(model)
    inputs = _inputs(model, tokenizer, [prompt], device, chat)
    forward = static_decode.eager_forward(model)
    with torch.inference_mode():
        out = forward(**inputs, use_cache=True)
        past = compat.cache_of(out)
        token = out.logits[:, -1:].argmax(-1)
        mask = torch.cat([inputs["attention_mask"], inputs["attention_mask"].new_ones(1, 1)], dim=1)

        def step():
            forward(input_ids=token, attention_mask=mask, use_cache=True,
                    **{compat.cache_argument(model): past})
            past.crop(-1)  # drop this step's entry: every call is the same step

        return count_ops(step, device, warmup=1)
