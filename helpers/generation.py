"""Generation metrics: TTFT / decode split, bytes per step, sweeps (layer: model and kernels; taught
in 03_end_to_end and 04_batching).

``03_end_to_end.ipynb`` times one request with it (TTFT, decode, roofline) and ``04_batching.ipynb``
sweeps the batch size with the same protocol; each chapter's own tables are in its study module
(``end_to_end_study``, ``batching_study``). The prefill is timed as a generate of exactly one token
(TTFT); a full generate of ``N`` tokens is timed with ``min_new_tokens == N`` (so an early
end-of-sequence cannot shorten it), and inside it ``StepStamps`` stamps the clock after every new
token, with the device synchronised at each stamp, the way a streaming engine times each token of a
request (vLLM's inter-token latency). Decode per token is the median of those step intervals over
the timed generates (the warm-up generate excluded), with their p10-p90. The difference of two
generates, ``(t(N) - t(1)) / (N - 1)`` (optimum-benchmark's split), is kept beside it as a
cross-check: on a loaded machine the two totals carry the noise of whole requests and their
difference can come out at or below zero, where the step intervals still resolve.
Decoding is greedy, so runs are deterministic; both generates are timed with ``helpers.bench.measure``.
"""
from __future__ import annotations

import gc
import math
import time
from typing import Any, Callable, Iterable, Optional

import torch

from . import backend, bench, progress, static_decode, versions
from .backend import as_device, dtype_name
from .models import chat_inputs, weight_bytes
from .params import check_positive_int
from .prose import message
from .profiling import kernel_time_by_kind
from .roofline import kv_cache_bytes

from transformers import StoppingCriteria, StoppingCriteriaList


def prompt_inputs(model, tokenizer, prompts, device, chat: bool):
    """The tokenized batch of ``prompts`` on ``device`` (None: the model's), as every timing here uses."""
    prompts = [prompts] if isinstance(prompts, str) else prompts
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    return chat_inputs(tokenizer, list(prompts), device or backend.model_device(model), chat)


@torch.inference_mode()
def generate_tokens(model, tokenizer, inputs: dict, new_tokens: int, **generate_kwargs):
    """Greedy ``generate`` of exactly ``new_tokens`` tokens from tokenized ``inputs`` (all ids returned)."""
    return model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False, pad_token_id=tokenizer.pad_token_id, **generate_kwargs)


class StepStamps(StoppingCriteria):
    """A stopping criterion that never stops: it stamps the clock each time ``generate`` has added a
    token (after the prefill's first token, then after every decode step), with ``device``
    synchronised first so that a stamp comes after the step's kernels and not after their launch.
    ``start()`` stamps the moment before the call; ``decode_intervals(n)`` are the ``n - 1``
    decode steps of an ``n``-token generate, in seconds."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, device):
        self.device = device
        self.stamps: list[float] = []

    def start(self) -> None:
        backend.synchronize(self.device)
        self.stamps = [self.clock()]

    def __call__(self, input_ids, scores=None, **kwargs):
        backend.synchronize(self.device)
        self.stamps.append(self.clock())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def decode_intervals(self, new_tokens: int) -> list[float]:
        """Seconds between the stamps of token 1 and 2, 2 and 3, ... ``new_tokens - 1`` and
        ``new_tokens`` (stamps past ``new_tokens``, from a generate that ran a step ahead, are left out)."""
        after_tokens = self.stamps[1:new_tokens + 1]
        return [b - a for a, b in zip(after_tokens, after_tokens[1:])]


def greedy_new_tokens(model, tokenizer, prompts, max_new_tokens: int, *, chat: bool = False,
                      device=None) -> list[list[int]]:
    """The new token ids of one batched greedy generate (left padding), one list per prompt."""
    inputs = prompt_inputs(model, tokenizer, prompts, device, chat)
    out = generate_tokens(model, tokenizer, inputs, max_new_tokens)
    return out[:, inputs["input_ids"].shape[1]:].tolist()


# New tokens of the profiled generates behind ``kernel_profile``: the profiler's events, not the steps,
# cost the time (a 32-token generate of the embedded model gives about 200,000 events and 10 s of
# parsing; the split took 43 s at 32 tokens, 14 s at 8, with the same shares within its noise).
KERNEL_PROFILE_TOKENS = 8


def measure_generation(model, tokenizer, prompts, max_new_tokens: int, device=None, *,
                       repeats: int = 3, chat: bool = False, seed: int = 0,
                       code_path: Optional[str] = None, generate_kwargs: Optional[dict] = None,
                       static_cache: bool = False, kernel_profile: bool = False, warm: bool = False) -> dict:
    """TTFT, decode latency per token, tokens/s per user and aggregate, and peak memory.

    ``prompts`` is the batch (one string per user). ``repeats`` timed runs of each generate follow
    one untimed warm-up. TTFT is the generate of one token, its percentiles over the repeats. Decode
    per token is the median, p10 and p90 of every decode step of the ``repeats`` timed full
    generates (``StepStamps``: ``repeats x (N - 1)`` samples, in ``decode_samples_ms``); the
    difference of two generates, the i-th full run minus the i-th one-token run over ``N - 1``, is
    the cross-check ``decode_two_generates_ms`` (NaN, with ``decode_two_generates_resolved`` false,
    when the noise of the totals exceeds the decode time). Memory (``request_memory``) is what the
    full generates add on top of what was in use before them, measured with ``backend.MemoryRegion``.

    ``static_cache=True`` is the static-shape path of ``helpers.static_decode``: one static KV
    cache sized for the request, reset before every generate. When ``model.forward`` is a
    ``static_decode.CompiledForward``, an extra untimed generate first pays the compilation, and the
    result adds ``compiled_graphs`` (graphs built during that warm-up and the timed runs) and
    ``compile_s`` (wall time of the calls that built a graph).

    ``kernel_profile=True`` adds where one decode step's time goes in this very configuration
    (``profiling.kernel_time_by_kind``: the weight-matmul kernels this path ran, attention, other
    kernels), from profiled generates of 1 and of at most ``KERNEL_PROFILE_TOKENS`` new tokens after
    the timed ones.

    ``warm=True`` says the model has just run this request (a later round of an interleaved
    measurement): the full generates then get no untimed warm-up of their own, and a compiled forward
    no compiling generate; the 1-token generate keeps its untimed one, so the timed runs still follow a
    run of this model.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 2:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is not valid; it must be an integer >= 2 "
                         "(decode is timed between the new tokens of one generate)")
    check_positive_int("repeats", repeats)
    device = as_device(device) if device is not None else backend.model_device(model)
    inputs = prompt_inputs(model, tokenizer, prompts, device, chat)
    batch, prompt_len = inputs["input_ids"].shape
    extra = dict(generate_kwargs or {})
    torch.manual_seed(seed)
    compiled = static_decode.compiled_forward_of(model)
    cache, static_kwargs = (static_decode.static_generate_kwargs(model, inputs, max_new_tokens) if static_cache
                            else (None, {}))
    extra.update(static_kwargs)

    def generate(n_tokens: int, stamps: Optional[StepStamps] = None):
        if cache is not None:
            cache.reset()
        kwargs = dict(extra)
        if stamps is not None:  # after any criteria of the caller's, so it stamps once they have run
            kwargs["stopping_criteria"] = StoppingCriteriaList([*kwargs.get("stopping_criteria", []), stamps])
        return generate_tokens(model, tokenizer, inputs, n_tokens, **kwargs)

    lengths: list[int] = []
    steps: list[list[float]] = []  # the decode step intervals of each full generate, in call order

    def full_generate():
        stamps = StepStamps(device)
        stamps.start()
        lengths.append(generate(max_new_tokens, stamps).shape[1])
        steps.append(stamps.decode_intervals(max_new_tokens))

    graphs_before = (compiled.graphs, compiled.compile_s) if compiled is not None else (0, 0.0)
    if compiled is not None and not warm:
        generate(max_new_tokens)  # pays the compilation of the prefill and decode graphs, untimed
    # The first call of each measurement is its untimed warm-up.
    timing = dict(warmup=1, min_iters=repeats, max_iters=repeats, min_seconds=0.0,
                  min_sample_seconds=0.0)
    prefill = bench.measure(lambda: generate(1), device, name="generate 1 token", **timing)
    with backend.MemoryRegion(device) as memory:
        if warm:  # every call timed: the model has just run, and the 1-token generate warmed it again
            full = bench.Timing(f"generate {max_new_tokens} tokens",
                                [bench.timed_calls(full_generate, device)[1] for _ in range(repeats)],
                                device=str(device))
        else:
            full = bench.measure(full_generate, device, name=f"generate {max_new_tokens} tokens", **timing)
    wrong = {n - prompt_len for n in lengths if n - prompt_len != max_new_tokens}
    if wrong:
        raise RuntimeError(f"generate produced {sorted(wrong)} new tokens instead of {max_new_tokens}")

    kernels = (kernel_time_by_kind(generate, min(max_new_tokens, KERNEL_PROFILE_TOKENS), device) if kernel_profile
               else {})
    # The timed samples are the last calls bench.measure made; the calls before them were warm-up.
    decode_samples = [x for run in steps[max(len(steps) - len(full.samples), 0):] for x in run]
    two_generates = [(f - p) / (max_new_tokens - 1) for f, p in zip(full.samples, prefill.samples)]
    attn = getattr(model.config, "_attn_implementation", None) or "default"
    path = message("transformers generate, greedy, decode stamped per token (device synchronised), "
                   "min_new_tokens=max_new_tokens, {attention} attention, left padding, {cache}{compiled}",
                   attention=attn, cache=message("static KV cache sized for the request") if static_cache
                   else message("dynamic KV cache"),
                   compiled=message(", forward compiled ({how})", how=compiled.describe()) if compiled is not None
                   else ", eager")
    return {
        "batch_size": int(batch),
        "prompt_tokens": int(prompt_len),
        "new_tokens": int(max_new_tokens),
        **timing_figures(prefill.samples, decode_samples, int(batch), str(device), two_generates),
        "decode_steps_per_generate": int(max_new_tokens - 1),
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


def pool_runs(parts: list, rounds: int) -> dict:
    """One figure from the ``measure_generation`` results of several interleaved rounds: every round's
    TTFT and decode samples together, the largest memory growth, the code path naming the rounds."""
    out = dict(max(parts, key=lambda p: p["memory_growth_bytes"]))
    out.update(timing_figures([x / 1e3 for p in parts for x in p["ttft_samples_ms"]],
                              [x / 1e3 for p in parts for x in p["decode_samples_ms"]],
                              out["batch_size"], out["device"],
                              [x / 1e3 for p in parts for x in p.get("decode_two_generates_samples_ms", [])]),
               rounds=rounds, code_path=message("{path}, {rounds} interleaved rounds pooled", path=out["code_path"],
                                                rounds=rounds))
    out["repeats"] = len(out["ttft_samples_ms"])  # generates of each kind; decode has a sample per step
    return out


def timing_figures(ttft_samples: list, decode_samples: list, batch_size: int, device: str,
                   two_generates: Optional[list] = None) -> dict:
    """The one definition of the recorded TTFT and decode figures, from samples in seconds (TTFT:
    one per generate; decode: one per step): medians, p10 / p90, tokens/s per user and for the
    batch, noise flags and the samples in ms. ``two_generates`` (one ``(t(N) - t(1)) / (N - 1)`` per
    pair of generates) adds the cross-check ``decode_two_generates_ms`` with its p10 / p90."""
    ttft = bench.Timing("ttft", list(ttft_samples), device=device)
    decode = bench.Timing("decode per token", list(decode_samples), device=device)
    # A non-positive median means timing noise exceeded the decode time: report no figure.
    resolved = bool(decode.samples) and decode.median > 0
    per_user = 1.0 / decode.median if resolved else math.nan
    return {**_cross_check(two_generates),"ttft_ms": ttft.median * 1e3, "ttft_p10_ms": ttft.p10 * 1e3, "ttft_p90_ms": ttft.p90 * 1e3,
            "decode_ms_per_token": decode.median * 1e3 if resolved else math.nan,
            "decode_p10_ms": decode.p10 * 1e3 if resolved else math.nan,
            "decode_p90_ms": decode.p90 * 1e3 if resolved else math.nan,
            "tokens_per_s_per_user": per_user, "tokens_per_s_aggregate": per_user * batch_size,
            "ttft_noisy": ttft.noisy, "decode_noisy": decode.noisy or not resolved,
            "decode_resolved": resolved, "ttft_samples_ms": [x * 1e3 for x in ttft.samples],
            "decode_samples_ms": [x * 1e3 for x in decode.samples]}


def _cross_check(two_generates: Optional[list]) -> dict:
    """The difference of two generates as a figure beside the per-step one (NaN when unresolved)."""
    if not two_generates:
        return {}
    diff = bench.Timing("decode, two generates", list(two_generates))
    ok = diff.median > 0
    return {"decode_two_generates_ms": diff.median * 1e3 if ok else math.nan,
            "decode_two_generates_p10_ms": diff.p10 * 1e3 if ok else math.nan,
            "decode_two_generates_p90_ms": diff.p90 * 1e3 if ok else math.nan,
            "decode_two_generates_resolved": ok,
            "decode_two_generates_samples_ms": [x * 1e3 for x in diff.samples]}


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

    The one count behind every roofline of a loaded model (chapters 03, 04 and 06). The weights are
    ``models.weight_bytes`` (packed int8 / int4 weights and their scales included, so a quantized
    rung reads its own bytes), with one exception: an untied input embedding is a lookup, so it
    counts as one row per sequence, not the whole table. A tied embedding / lm_head matrix is counted
    once (the lm_head reads all of it). The KV cache is ``roofline.kv_cache_bytes`` of the batch at
    ``context_len`` tokens.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("context_len", context_len, minimum=0)
    embedding = model.get_input_embeddings().weight
    output = getattr(model.get_output_embeddings(), "weight", None)  # an int8 lm_head has no .weight
    tied = type(output) in (torch.Tensor, torch.nn.Parameter) and output.data_ptr() == embedding.data_ptr()
    weights = weight_bytes(model)
    if not tied:  # the table is in weight_bytes; a step reads one row of it per sequence
        weights += (batch_size - embedding.shape[0]) * embedding.shape[1] * embedding.element_size()
    return int(weights + kv_cache_bytes(model.config, batch_size, context_len, dtype_name(embedding.dtype)))


def achieved_bandwidth_gbps(bytes_per_step: float, decode_ms_per_token: float) -> float:
    """Bytes per decode step times steps per second, in GB/s (1e9 bytes)."""
    if decode_ms_per_token <= 0:
        raise ValueError(f"decode_ms_per_token={decode_ms_per_token!r} must be > 0")
    return bytes_per_step / (decode_ms_per_token / 1e3) / 1e9


def run_sweep(points: Iterable, fn: Callable[[Any], dict], device,
              name: Callable[[Any], str] = str) -> list[dict]:
    """Call ``fn(point)`` for each point; a point that fails is recorded and the sweep goes on.
    A progress line names the point running (``name(point)``, ``progress.steps``).

    Each row has ``point``, ``status`` (ok / oom / failed), ``error`` and the dict ``fn`` returned.
    Memory is freed after an out-of-memory error so the next (often smaller) point can run.
    """
    rows = []
    for point in progress.steps(list(points), name):
        row: dict = {"point": point, "status": "ok", "error": ""}
        t0 = time.perf_counter()
        try:
            row.update(fn(point) or {})
        except Exception as exc:  # noqa: BLE001  a sweep reports every failure and goes on
            row["status"] = "oom" if backend.is_out_of_memory(exc) else "failed"
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            del exc
            backend.free_memory(device)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
    gc.collect()
    return rows


def decode_step(model, tokenizer, prompt: str, *, chat: bool = False, device=None) -> Callable[[], Any]:
    """One eager batch-1 decode step after ``prompt``, as a callable that repeats the same step.

    The prefill runs once; each call is one forward of one token through the dynamic cache, which is
    cropped back afterwards, so every call (warm-up, timed, profiled) is the same step at the same
    context. The probes of one step use it: ``end_to_end_study.decode_step_launches``,
    ``end_to_end_study.top_ops``, and chapter 01's share of a step. Timing whole requests is
    ``measure_generation``'s job.
    """
    device = as_device(device) if device is not None else backend.model_device(model)
    inputs = prompt_inputs(model, tokenizer, [prompt], device, chat)
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


def sweep_table(rows: list[dict]):
    """A sweep's rows as a DataFrame without the per-sample lists (``*_samples_ms``)."""
    import pandas as pd

    return pd.DataFrame([{k: v for k, v in r.items() if not k.endswith("samples_ms")} for r in rows])
