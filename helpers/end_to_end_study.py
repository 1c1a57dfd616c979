"""Chapter 03's own study (layer: chapter studies; taught in 03_end_to_end): one request taken
apart, built from the layers below.

The request is timed by ``generation.measure_generation`` and put on the roofline with
``generation.decode_bytes_per_step``; what is here is what only chapter 03 shows: how the prefill's
logits are computed, where one decode step's time goes (operators, launches, each weight matmul
timed alone, each path's step split by its own kernels), the prompt-length sweep, why graph mode
needs static shapes, and the guide's speed and first-token claims against the device bounds.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Callable, Optional

import torch

from . import backend, bench, plots, profiling, prose, roofline
from .backend import as_device, dtype_name
from .claims import claimed_range, load_claims
from .generation import decode_step, generate_tokens, measure_generation, run_sweep, sweep_table
from .prose import N_, message
from .model_files import tiny_llama
from .params import check_positive_int
from .profiling import count_ops
from .roofline import decode_ceiling_tok_s, load_specs
from .static_decode import GraphRecompileError, compile_model, restore_eager, static_generate_kwargs

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("decode_two_generates_ms"), N_("decode_two_generates_p10_ms"), N_("decode_two_generates_p90_ms"),
    N_("decode_two_generates_resolved"), N_("static_cache"), N_("repeats"), N_("weight_matmul_ms"),
    N_("attention_ms"), N_("other_kernel_ms"), N_("matmul_kernels"), N_("kernel_profile"), N_("calls"),
    N_("self_cpu_ms_per_step"), N_("graphs built"), N_("matmul"), N_("ms_per_step"), N_("ceiling_tok_s"),
    N_("guide's claim"), N_("claimed tok/s"), N_("spec status"), N_("bandwidth needed (GB/s)"),
    N_("device bandwidth (GB/s)"), N_("% of bandwidth the claim needs"), N_("ceiling tok/s"),
    N_("prefill floor (ms)"), N_("total_ms"), N_("decode_samples"), N_("step_ms"), N_("matmul_ms"),
    N_("rest_ms"), N_("matmul_share_pct"), N_("roofline_ms"), N_("roofline_pct"), N_("matmul_gbps"),
    N_("note"), N_("dynamic cache"), N_("static cache"), N_("impossible"), N_("plausible"),
    N_("tokens_per_s_per_user"), N_("tokens_per_s_aggregate"), N_("decode_steps_per_generate"),
    N_("memory_growth_bytes"), N_("kv_cache_bytes"), N_("weight_bytes"),
)


# --- the prefill's logits: the slice transformers takes against plain rows ------------------------

def logits_of_last_position(model, prompt_tokens: int, device=None, *, min_iters: int = 5,
                            min_seconds: float = 0.2) -> dict:
    """How the prefill's logits are computed (chapter 03): ``lm_head(hidden[:, -1:, :])``, the slice
    transformers takes of the prompt's hidden states, against the same rows as a plain 2-D matrix.

    The slice keeps the prompt's stride. Both give the same logits (checked); this returns each
    one's timing (``bench.measure``) and the operators it spent its time in, so a chapter
    can show whether this torch sends the slice down a slower path than the one GEMV it is.
    """
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


# --- where one decode step's time goes: operators, launches, each matmul alone, each path's split -

def top_ops(model, tokenizer, prompt: str, steps: int = 4, *, chat: bool = False,
            row_limit: int = 10, device=None):
    """Where decode time goes: torch.profiler over ``steps`` batch-1 decode steps (prefill excluded;
    each is ``generation.decode_step``, the same step at the same context).

    Returns a DataFrame of operators by self CPU time with their share of the profiled total.
    On CUDA the device time is profiled too; on NPU use ``torch_npu.profiler`` for kernel times.
    """
    import pandas as pd

    step = decode_step(model, tokenizer, prompt, chat=chat, device=device)
    device = as_device(device) if device is not None else next(model.parameters()).device
    step()  # one untimed step, as every measurement has

    def steps_in_a_row():
        for _ in range(steps):
            step()

    prof = profiling.profile_calls(steps_in_a_row, device)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = [{"op": e.key, "calls": e.count, "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
             "share_pct": 100.0 * e.self_cpu_time_total / total} for e in events]
    df = pd.DataFrame(rows).sort_values("self_cpu_ms_per_step", ascending=False)
    return df.head(row_limit).reset_index(drop=True)


def decode_step_launches(model, tokenizer, prompt: str, *, chat: bool = False, device=None) -> dict:
    """Operator launches of one eager batch-1 decode step (``decode_step``), counted from torch.profiler."""
    device = as_device(device) if device is not None else backend.model_device(model)
    return count_ops(decode_step(model, tokenizer, prompt, chat=chat, device=device), device, warmup=1)


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


# --- the prompt-length sweep ----------------------------------------------------------------------

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
    return prompt, len(tokenizer(prompt)["input_ids"])


def prompt_length_sweep(model, tokenizer, lengths, new_tokens: int, device=None, *, repeats: int = 3):
    """``measure_generation`` at each prompt length (chapter 03): TTFT and decode per point, the
    sample lists left out; a point that fails or runs out of memory is recorded and the sweep goes on."""
    def point(n_tokens):
        prompt, _ = prompt_of_length(tokenizer, n_tokens)
        r = measure_generation(model, tokenizer, [prompt], new_tokens, device, repeats=repeats)
        return {"requested_tokens": n_tokens, **r}

    return sweep_table(run_sweep(lengths, point, device, name=lambda n: message("{n} prompt tokens", n=n)))


# --- graph mode needs static shapes ---------------------------------------------------------------

def graph_count_demo(new_tokens: int = 12, recompile_limit: int = 4):
    """Chapter 03's demonstration on a tiny random Llama, with a backend that only counts graphs:
    ``dynamic=False`` with the dynamic cache builds a graph per KV length and hits the recompile
    limit (``GraphRecompileError``); with the static cache it builds two (prefill and decode).
    Returns one row per path and the error texts."""
    import pandas as pd

    model, tokenizer = tiny_llama(seed=0)
    inputs = tokenizer(["graph mode needs static shapes"], return_tensors="pt")
    rows, errors = [], []
    for path in ("dynamic cache", "static cache"):
        compiled = compile_model(model, "cpu", backend_override="eager", recompile_limit=recompile_limit)
        kwargs = static_generate_kwargs(model, inputs, new_tokens)[1] if path == "static cache" else {}
        try:
            with quiet_recompile_warnings():
                generate_tokens(model, tokenizer, inputs, new_tokens, **kwargs)
            outcome = "ok"
        except GraphRecompileError as exc:
            outcome = "GraphRecompileError"
            errors.append(str(exc))
        rows.append({"path": path, "new tokens": new_tokens, "graphs built": compiled.graphs, "outcome": outcome})
        restore_eager(model)
    return pd.DataFrame(rows), errors


def compiled_module_runs_generate_compiled() -> bool:
    """Does ``torch.compile(model).generate(...)`` run the compiled graph? Checked on a tiny module
    (chapter 03 records it): ``torch.compile`` returns an ``OptimizedModule`` whose attributes other
    than ``forward`` are the original module's, so its ``generate`` calls the eager ``forward``."""
    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x

        def generate(self):
            return self  # transformers' generate calls self(...) on this object

    compiled = torch.compile(Tiny())
    return compiled.generate() is compiled


# --- the guides' speed and first-token claims against the device bounds ---------------------------

def this_device(device, source) -> "prose.Message":
    """The ceilings table's row label for the device this run measured: ``this cpu (measured in
    chapter 00 of this run)``."""
    return message("this {device} ({source})", device=str(device), source=source)


def ceilings_table(weight_bytes: float, specs=None, extra: Optional[dict] = None):
    """Each device's batch-1 ceiling for ``weight_bytes``; ``extra`` adds measured rows {label: GB/s}."""
    import pandas as pd

    specs = load_specs() if specs is None else specs
    rows = [{"device": r.variant, "bandwidth_gbps": float(r.bandwidth_gbps), "status": r.status,
             "source": r.source} for r in specs.itertuples()]
    for label, gbps in (extra or {}).items():
        rows.append({"device": label, "bandwidth_gbps": float(gbps), "status": "measured",
                     "source": message("measured in this run")})
    df = pd.DataFrame(rows)
    df["ceiling_tok_s"] = [decode_ceiling_tok_s(b, weight_bytes) for b in df["bandwidth_gbps"]]
    return df


# (claim id in data/guide_claims.csv, the spec row it is about, the label shown); the claimed numbers
# are read from the claims table, where each is quoted once with its Chinese original.
DECODE_CLAIMS = (("C18", "910B1", message("batch 1, one 910B1")),
                 ("C18", "all 8 chips", message("the same on all 8 chips")),
                 ("C26", "910B1", "Llama-2-7B fp16, 910B"), ("C27", "A100 80GB SXM", "Llama-2-7B fp16, A100"))


def guide_decode_claims(specs, weight_bytes: float):
    """Each claimed batch-1 decode rate beside the bandwidth it needs and the device's ceiling.

    A rate range counts at its slowest end (the most lenient reading); ``verdict`` is
    ``claim_verdict`` (impossible above the ceiling, else plausible until measured there).
    """
    import pandas as pd

    table = load_claims().set_index("id")
    rows = []
    for claim_id, variant, label in DECODE_CLAIMS:
        device = specs[specs["variant"].str.contains(variant, regex=False)].iloc[0]
        low, _ = claimed_range(table.loc[claim_id, "claimed_value"])
        need = required_bandwidth_gbps(low, weight_bytes)
        bound = decode_ceiling_tok_s(float(device.bandwidth_gbps), weight_bytes)
        rows.append({"claim": claim_id,
                     "guide's claim": message("{claim} ({label})", claim=table.loc[claim_id, "text_zh"], label=label),
                     "claimed tok/s": low, "device": device.variant, "spec status": device.status,
                     "bandwidth needed (GB/s)": need, "device bandwidth (GB/s)": float(device.bandwidth_gbps),
                     "% of bandwidth the claim needs": 100 * need / float(device.bandwidth_gbps),
                     "ceiling tok/s": bound, "verdict": claim_verdict(low, bound)})
    return pd.DataFrame(rows)


def prefill_floor_table(prompt_lengths, parameters: int, tflops: float, budget_ms: float = 80.0):
    """The fastest prefill at 100 % of ``tflops`` per prompt length (2 FLOP per parameter per token),
    and the utilisation a ``budget_ms`` first token would need; plus the longest prompt that fits."""
    import pandas as pd

    needs = message("{budget:g} ms needs utilisation (%)", budget=budget_ms)
    rows = [{"prompt tokens": n, "prefill floor (ms)": prefill_floor_ms(n, parameters, tflops),
             needs: 100 * prefill_floor_ms(n, parameters, tflops) / budget_ms}
            for n in sorted(set(prompt_lengths))]
    longest = budget_ms / 1e3 * tflops * 1e12 / (2 * parameters)
    return pd.DataFrame(rows), longest


# --- chapter 03: the prompt-length sweep's chart --------------------------------------------------

def unresolved_decode_lengths(sweep) -> list[int]:
    """The prompt lengths of the sweep's finished points whose decode per token did not resolve
    (no positive median): the plot marks them and the sentence names them, neither draws them."""
    ok = sweep[sweep["status"] == "ok"].sort_values("prompt_tokens")
    if "decode_resolved" in ok:
        bad = [v != v or not bool(v) for v in ok["decode_resolved"]]  # NaN (a missing flag) counts as not
    else:
        bad = ~(ok["decode_ms_per_token"] > 0)
    return [int(n) for n in ok.loc[bad, "prompt_tokens"]]


def plot_prompt_sweep(sweep, title: str, figsize=(10, 3.8), lang: str = "en"):
    """TTFT (with its p10-p90) and decode per token against the prompt length, log-2 x axis. A
    length whose decode did not resolve gets no point (it has no value) but a mark on the axis and
    a note in the panel, so the line never skips it silently."""
    import matplotlib.pyplot as plt

    lang = plots.chart_language(lang)
    ok = sweep[sweep["status"] == "ok"].sort_values("prompt_tokens")
    missing = unresolved_decode_lengths(sweep)
    fig, ax = plt.subplots(1, 2, figsize=figsize)
    if len(ok):
        yerr = plots.error_bars(ok["ttft_ms"], ok["ttft_p10_ms"], ok["ttft_p90_ms"])
        ax[0].errorbar(ok["prompt_tokens"], ok["ttft_ms"], yerr=yerr, marker="o", capsize=3)
        dec = ok[~ok["prompt_tokens"].isin(missing)]
        yerr = plots.error_bars(dec["decode_ms_per_token"], dec["decode_p10_ms"], dec["decode_p90_ms"])
        ax[1].errorbar(dec["prompt_tokens"], dec["decode_ms_per_token"], yerr=yerr, marker="o", capsize=3,
                       color="tab:orange", label=prose.tell(lang, "median, p10-p90"))
    if missing:
        ax[1].plot(missing, [0.0] * len(missing), marker="x", ls="none", color="tab:red", clip_on=False,
                   transform=ax[1].get_xaxis_transform(), label=prose.tell(lang, "decode did not resolve"))
        ax[1].text(0.02, 0.96, prose.tell(lang, "decode did not resolve at {lengths} prompt tokens",
                                          lengths=[str(n) for n in missing]),
                   transform=ax[1].transAxes, va="top", fontsize=8, color="tab:red")
        ax[1].legend(fontsize=7, loc="lower right")
    for a, name in zip(ax, [prose.tell(lang, "TTFT (prefill)"), prose.tell(lang, "decode per token")]):
        a.set_xscale("log", base=2)
        a.set_xlabel(prose.tell(lang, "prompt tokens"))
        a.set_ylabel(prose.tell(lang, "ms (median, p10-p90)"))
        a.set_title(name)
    fig.suptitle(prose.tr(title, lang))
    return fig


# --- chapter 03: the busiest operators of a step --------------------------------------------------

def busiest_ops(fn: Callable[[], object], device="cpu", top: int = 3) -> list[str]:
    """The operators one call of ``fn`` spends its self time in, most first (children included:
    ``aten::bmm`` under ``aten::linear`` is named, where ``count_ops`` counts the caller)."""
    device = as_device(device)
    fn()
    prof = profiling.profile_calls(fn, device, device_kernels=False)
    ms = {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages() if e.self_cpu_time_total > 0}
    return sorted(ms, key=ms.get, reverse=True)[:top]


# --- chapter 03: the guide's bandwidth and prefill figures against the roofline -------------------

def required_bandwidth_gbps(tokens_per_s: float, weight_bytes: float) -> float:
    """Bandwidth (GB/s) a single stream needs to decode ``tokens_per_s`` with these weights."""
    return roofline.check_positive("tokens_per_s", tokens_per_s) * roofline.check_positive(
        "weight_bytes", weight_bytes) / 1e9


def prefill_floor_ms(prompt_tokens: int, parameters: int, tflops: float) -> float:
    """Lowest possible prefill time: 2 FLOP per parameter per prompt token at peak compute."""
    return 2.0 * roofline.check_positive("prompt_tokens", prompt_tokens) * roofline.check_positive(
        "parameters", parameters) / (roofline.check_positive("tflops", tflops) * 1e12) * 1e3


def claim_verdict(claimed_tok_s: float, ceiling_tok_s: float) -> str:
    """'impossible' above the roofline, else 'plausible' (only a measurement can reproduce it)."""
    return "impossible" if claimed_tok_s > ceiling_tok_s else "plausible"


# --- chapter 03: quiet recompile warnings in the graph-count demo ---------------------------------

@contextmanager
def quiet_recompile_warnings():
    """Mutes dynamo's recompile-limit warning (``GraphRecompileError`` already says what happened)."""
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# --- chapter 03's worked answers (solutions/03): the facts each answer's paragraph is said from ----
# The paragraphs are blocks of templates/03_end_to_end.answers.md.j2 (``prose.answer``), under the
# rules of the chapter's own page; here are only the figures they need, derived where a ratio or a
# share is needed. A figure that did not resolve is named (None, or listed), never divided by.

def _resolved(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def request_length_facts(runs: dict) -> dict:
    """Exercise 1: ``runs`` maps new tokens to ``measure_generation`` results (two lengths). The
    request's growth and TTFT's change; the longer request's decode step over the shorter's as a
    ratio with the spread of both p10-p90 and the stamped steps it stands on (``decode``, only when
    both resolved; else ``unresolved`` names the lengths); the two-generate cross-check per length."""
    (short, s), (long_, l) = sorted(runs.items())[0], sorted(runs.items())[-1]
    facts = {"short": short, "long": long_, "growth": l["total_ms"] / s["total_ms"],
             "ttft_change_pct": 100 * (l["ttft_ms"] / s["ttft_ms"] - 1), "more_positions": (long_ - short) // 2,
             "unresolved": [n for n, r in sorted(runs.items()) if not _resolved(r["decode_ms_per_token"])],
             "checks": [{"tokens": n, "stamped_ms": r["decode_ms_per_token"],
                         "two_ms": r.get("decode_two_generates_ms") if _resolved(r.get("decode_two_generates_ms"))
                         else None} for n, r in sorted(runs.items())]}
    if not facts["unresolved"]:
        facts["decode"] = {"change_pct": 100 * (l["decode_ms_per_token"] / s["decode_ms_per_token"] - 1),
                           "low": l["decode_p10_ms"] / s["decode_p90_ms"], "high": l["decode_p90_ms"] / s["decode_p10_ms"],
                           "n_samples": min(len(r.get("decode_samples_ms") or ()) for r in (s, l))}
    return facts


def dtype_ratio_facts(by_dtype: dict) -> dict:
    """Exercise 2: ``by_dtype`` maps two dtype names to ``{decode_ms_per_token, decode_p10_ms,
    decode_p90_ms, decode_samples, bytes_per_step}``. The bytes ratio, the time ratio with the spread
    of both p10-p90 and its sample count (the fewer of the two sides; a side without its count
    leaves the count unknown, so no direction is said), and each step's GB/s."""
    if len(by_dtype) != 2:
        return {"compared": False}
    small, large = sorted(by_dtype, key=lambda n: by_dtype[n]["bytes_per_step"])
    a, b = by_dtype[small], by_dtype[large]
    facts = {"compared": True, "small": small, "large": large,
             "bytes_ratio": b["bytes_per_step"] / a["bytes_per_step"],
             "unresolved": [n for n, r in ((small, a), (large, b)) if not _resolved(r.get("decode_ms_per_token"))]}
    if not facts["unresolved"]:
        counts = [r.get("decode_samples") for r in (a, b)]
        facts["time"] = {"ratio": b["decode_ms_per_token"] / a["decode_ms_per_token"],
                         "low": b["decode_p10_ms"] / a["decode_p90_ms"], "high": b["decode_p90_ms"] / a["decode_p10_ms"],
                         "n_samples": None if None in counts else min(counts)}
        facts.update(small_gbps=a["bytes_per_step"] / a["decode_ms_per_token"] / 1e6,
                     large_gbps=b["bytes_per_step"] / b["decode_ms_per_token"] / 1e6)
    return facts


def aggregate_users_facts(claim_tok_s: float, per_user_tok_s, weight_bytes: float, device_row,
                          dtype: str, model: str) -> dict:
    """Exercise 3: the bandwidth ``claim_tok_s`` needs with ``weight_bytes`` against ``device_row``
    (a row of the specs table), and the users at ``per_user_tok_s`` (this run's batch-1 decode; None
    or NaN when it did not resolve: ``users`` is then None) that the claim's aggregate needs."""
    need = required_bandwidth_gbps(claim_tok_s, weight_bytes)
    per_user = per_user_tok_s if _resolved(per_user_tok_s) else None
    return {"weight_gb": weight_bytes / 1e9, "claim_tok_s": claim_tok_s, "need_tbps": need / 1e3,
            "times": need / device_row.bandwidth_gbps, "variant": device_row.variant,
            "gbps": device_row.bandwidth_gbps, "status": device_row.status, "per_user": per_user,
            "users": claim_tok_s / per_user if per_user else None, "dtype": dtype, "model": model}
