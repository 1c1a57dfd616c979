"""Chapter 05's measurements (layer: chapter studies; taught in 05_int8_quantization).

Every INT8 variant measured the same way, the headline pair timed alternately, the calibration
sweep, the guide's ratios (its ladder from ``helpers.claims``) and the plot, so that the chapter's
cells stay short. The kernels are ``helpers.quant``'s; the timing is chapter 03's batch-1 protocol
(``generation.measure_generation``: the request ``prompt`` with ``new_tokens`` new tokens, greedy,
warm-up excluded, decode = (t(N) - t(1)) / (N - 1)), at batch 1 and at the other batch sizes of the
chapter, with the same prompt repeated.
"""
from __future__ import annotations

import gc
import inspect
import math
import re
from typing import Iterable, Optional

import torch
from torch import nn

from . import backend, bench, claims, decide, generation, models, plots, progress, prose, quality, quant
from .models import load_model, weight_bytes
from .prose import N_, message
from .params import check_positive_int

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("takes"), N_("missing"), N_("params"), N_("activations"), N_("weight_MB"), N_("perplexity"),
    N_("top1_agreement_pct"), N_("max_abs_logit_diff"), N_("ttft_ms_b1"), N_("decode_tok_s_b1"),
    N_("peak_MB_b1"), N_("growth_MB_b1"), N_("weight_mb"), N_("chosen"), N_("guide_claim_ratio"),
    N_("guide_baseline"), N_("guide_compared"), N_("measured_compared"), N_("measured_here_ratio"),
    N_("measured_low"), N_("measured_high"), N_("dense dtype"), N_("top1_agreement"), N_("speedup_vs_dense"),
    N_("activation scales"), N_("calibration_samples"), N_("per layer"), N_("per channel"), N_("per token"),
    N_("dynamic per-token"), N_("scheme"), N_("bytes_before"), N_("bytes_after"), N_("kept_dense"),
    N_("layer"), N_("What is the capital of France? Answer in one sentence."),
    N_("Give two reasons why lighthouses flash in patterns."),
    N_("Write one sentence about the sea at night."),
)


# Greedy answers shown side by side; the timed request is the chapter's ``prompt`` parameter.
ANSWER_PROMPTS = ["What is the capital of France? Answer in one sentence.",
                  "Give two reasons why lighthouses flash in patterns.",
                  "Write one sentence about the sea at night."]
# Library paths: when one of these overflows here (quality.NonFiniteQuality), the variant is listed
# as skipped with that reason; the workbook's own kernels must stay finite, so theirs raises.
LIBRARY_VARIANTS = ("torchao", "quantize_dynamic")
QUALITY_KEYS = ("perplexity", "tokens", "top1_agreement", "max_abs_logit_diff", "mean_abs_logit_diff")


def heldout_split(tokenizer, text: str, eval_tokens: int):
    """``(eval_ids, pool)``: the first ``eval_tokens`` tokens of ``text`` are evaluated; the
    sentences after them (six words or more, the first partial one dropped) are the calibration
    pool, so calibration never sees the evaluated text."""
    eval_ids = quality.encode(tokenizer, text, eval_tokens)
    eval_chars = len(tokenizer.decode(eval_ids[0], skip_special_tokens=True))
    pool = [s for s in re.split(r"(?<=[.!?])\s+", text[eval_chars:]) if len(s.split()) >= 6][1:]
    return eval_ids, pool


def measure_variants(names: Iterable[str], model_name: str, device, dtype, eval_ids, ref_logits, *,
                     prompt: str, new_tokens: int, batch_sizes: Iterable[int],
                     repeats: int) -> tuple[dict, list]:
    """Each variant loaded and quantized, one model in memory at a time: its quality on the held-out
    text, its timings per batch size (none for an emulated kernel, whose speed means nothing) and
    its greedy answers. A variant that cannot run here (``quant.VariantUnavailable``), or a library
    variant whose logits are not finite here, is returned in ``skipped`` with its reason:
    ``(rows, skipped)``."""
    rows, skipped = {}, []
    for name in progress.steps(list(names)):
        try:
            lm, tok, info = build_variant(name, model_name, device, dtype)
        except quant.VariantUnavailable as exc:
            skipped.append({"variant": name, "reason": str(exc)})
            continue
        try:
            quality_figures = quality.evaluate(lm, eval_ids, ref_logits,
                                               label=f"variant {name} ({info['dtype']}, {info['impl']})")
        except quality.NonFiniteQuality as exc:
            if name not in LIBRARY_VARIANTS:
                raise
            skipped.append({"variant": name, "reason": str(exc)})
        else:
            row = rows[name] = {**info, **quality_figures, "timings": {}}
            for b in batch_sizes if info["speed_is_meaningful"] else []:
                row["timings"][b] = generation.measure_generation(lm, tok, [prompt] * b, new_tokens,
                                                                  device, repeats=repeats)
            row["answers"] = [models.generate_text(lm, tok, p, new_tokens) for p in ANSWER_PROMPTS]
        del lm
        gc.collect()
    return rows, skipped


def variant_row(name: str, r: dict) -> dict:
    """One row of the variants table: quality, bytes and, per batch size, TTFT, decode and memory."""
    out = {"variant": name, "dtype": r["dtype"], "kernel": r["impl"], "activations": r["activations"],
           "weight_MB": r["bytes_after"] / 1e6, "perplexity": r["perplexity"],
           "top1_agreement_pct": 100 * r["top1_agreement"], "max_abs_logit_diff": r["max_abs_logit_diff"]}
    for b, t in r["timings"].items():
        out[f"ttft_ms_b{b}"] = t["ttft_ms"]
        out[f"decode_tok_s_b{b}"] = t["tokens_per_s_aggregate"]
        out[f"peak_MB_b{b}"] = t["peak_memory_bytes"] / 1e6
        out[f"growth_MB_b{b}"] = t["memory_growth_bytes"] / 1e6
    return out


def kept_dense_rows(rows: dict) -> list[dict]:
    """The linears each variant left dense because its kernel cannot take their shape, with the reason
    (``quant.quantize_model_int8``'s ``kept_dense``; on an NPU ``lm_head`` of a vocabulary above 65,535)."""
    return [{"variant": name, "layer": layer, "reason": why}
            for name, r in rows.items() for layer, why in r.get("kept_dense") or ()]


KERNEL_COLUMNS = ("kernel", "activations", "decode_ms", "decode_p10_ms", "decode_p90_ms", "weight_mb",
                  "gbps", "chosen", "problem")


def kernel_rows(row: Optional[dict]) -> list[dict]:
    """The W8A16 kernel timings ``quant`` made to pick the kernel (CPU only; empty elsewhere), each
    row marked ``chosen`` or not."""
    if not row or not row.get("kernel_timings"):
        return []
    pick = row["kernel_choice"]["kernel"]
    return [{**{k: r.get(k) for k in KERNEL_COLUMNS if k != "chosen"}, "chosen": r["kernel"] == pick}
            for r in row["kernel_timings"]]


def time_pair(model_name: str, device, dtype, tokenizer, *, prompt: str, new_tokens: int,
              batch_sizes: Iterable[int], rounds: int, repeats: int) -> dict:
    """``dense`` and ``w8a16`` loaded together and timed alternately (``rounds`` times, samples
    pooled) at each batch size: ``{batch: {"dense": result, "w8a16": result}}``. On a shared machine
    the load drifts over minutes; alternating makes it hit both models alike."""
    pair = {n: build_variant(n, model_name, device, dtype)[0] for n in ("dense", "w8a16")}
    out = {b: measure_interleaved(pair, tokenizer, [prompt] * b, new_tokens, device,
                                  rounds=rounds, repeats=repeats) for b in batch_sizes}
    del pair
    gc.collect()
    return out


def perplexity_change_pct(perplexity: float, baseline: float) -> float:
    """The perplexity change from ``baseline`` in percent: the one formula behind the summary's
    ``int8_ppl_delta_pct`` and the speed-vs-quality plot's legend, so both print the same figure."""
    return 100 * (perplexity - baseline) / baseline


def signed_pct(value: float) -> str:
    """``+0.267 %``: a change in percent at the prose's precision (``prose.format_number``), signed."""
    text = prose.format_number(float(value))
    return f"+{text} %" if value > 0 else f"{text} %"


def heldout_label(tokens: int) -> "prose.Message":
    """The shape of a quality figure: ``256 held-out tokens``."""
    return message("{tokens} held-out tokens", tokens=tokens)


def headline_figures(dense: dict, int8: dict, pairs: dict, *, eval_tokens: int, prompt: str,
                     new_tokens: int, rounds: int, bandwidth_gbps: float, bandwidth_source: str) -> list:
    """The chapter's headline figures, as ``ch.record`` keyword arguments, from the variants' rows
    (``dense``, ``int8``) and ``time_pair``'s timings. Every ratio comes from one run; a speed
    ratio carries its p10-p90 spread (``bench.speedup``)."""
    ctx = dict(dtype=message("{dense} vs int8 weights + {activations} activations", dense=dense["dtype"],
                             activations=int8["activations"]),
               code_path=message("Int8Linear impl={impl} vs dense {dtype}", impl=int8["impl"], dtype=dense["dtype"]))
    all_weights = message("all weights incl. embeddings")
    weight_ratio = int8["bytes_after"] / dense["bytes_after"]
    figs = [dict(key="int8_weight_bytes_ratio", value=weight_ratio, unit="ratio", key_figure=True,
                 shape=all_weights, dense_mb=dense["bytes_after"] / 1e6,
                 int8_mb=int8["bytes_after"] / 1e6, **ctx),
            dict(key="int8_byte_bound_speedup", value=1 / weight_ratio, unit="x",
                 shape=all_weights,
                 code_path=message("1 / int8_weight_bytes_ratio: the most a step bound by reading weights gains"),
                 dtype=ctx["dtype"]),
            dict(key="int8_ppl_delta_pct", value=perplexity_change_pct(int8["perplexity"], dense["perplexity"]),
                 unit="%", key_figure=True, shape=heldout_label(eval_tokens),
                 baseline_ppl=dense["perplexity"], int8_ppl=int8["perplexity"], **ctx)]
    for b, alt in sorted(pairs.items()):
        t_base, t_int8 = generation.decode_timing(alt["dense"]), generation.decode_timing(alt["w8a16"])
        p_base, p_int8 = generation.ttft_timing(alt["dense"]), generation.ttft_timing(alt["w8a16"])
        s, ttft = bench.speedup(t_base, t_int8), bench.speedup(p_int8, p_base)  # ttft: int8 / dense
        shape = message("batch {batch}, prompt {prompt} tokens, {new} new tokens", batch=b,
                        prompt=alt["w8a16"]["prompt_tokens"], new=new_tokens)
        common = dict(shape=shape, batch=b, prompt=prompt, new_tokens=new_tokens,
                      timing=message("{rounds} alternating rounds", rounds=rounds), **ctx)
        # the samples behind each ratio, its smaller side: a direction word needs decide.MIN_SAMPLES
        # (decode has one per step of every timed generate, TTFT one per generate)
        figs.append(dict(key=f"int8_decode_speedup_batch{b}", value=s.ratio, unit="ratio", key_figure=b == 1,
                         low=s.low, high=s.high, noisy=t_base.noisy or t_int8.noisy,
                         n_samples=min(len(t_base.samples), len(t_int8.samples)),
                         base_decode_ms=t_base.median_ms, int8_decode_ms=t_int8.median_ms, **common))
        figs.append(dict(key=f"int8_ttft_ratio_batch{b}", value=ttft.ratio, unit="x", key_figure=b == 1,
                         low=ttft.low, high=ttft.high, n_samples=min(len(p_base.samples), len(p_int8.samples)),
                         base_ttft_ms=p_base.median_ms, int8_ttft_ms=p_int8.median_ms, **common))
        if b == 1:
            # like with like: each model's peak while decoding (weights + what decoding added)
            figs.append(dict(key="int8_peak_memory_ratio", unit="ratio",
                             value=alt["w8a16"]["peak_memory_bytes"] / alt["dense"]["peak_memory_bytes"],
                             memory_kind=alt["w8a16"]["memory_kind"],
                             dense_peak_mb=alt["dense"]["peak_memory_bytes"] / 1e6,
                             int8_peak_mb=alt["w8a16"]["peak_memory_bytes"] / 1e6,
                             memory_growth_bytes={n: alt[n]["memory_growth_bytes"] for n in alt},
                             kv_cache_bytes=alt["w8a16"]["kv_cache_bytes"], **common))
            gbps = dense["bytes_after"] / (t_base.median_ms / 1e3) / 1e9
            figs.append(dict(key="dense_decode_weight_gbps", value=gbps, unit="GB/s", shape=shape,
                             weight_mb=dense["bytes_after"] / 1e6, bandwidth_gbps=bandwidth_gbps,
                             bandwidth_source=bandwidth_source, dtype=dense["dtype"],
                             code_path=message("dense weight bytes / dense decode ms per step (batch 1)")))
    return figs


def guide_ratio_rows(measured_speedup: Optional[dict], measured_memory: Optional[dict]) -> list[dict]:
    """The guide's INT8 ratios (each against its own baseline) beside the ratios measured here:
    speed from C51, C41 / C38 and the 4.2 ladder table, memory from C52 (``data/guide_claims.csv``).
    Each row names what each side compared (``guide_compared``; ``measured_compared``: the measured
    figure's code path, which names the int8 kernel and the dense baseline's dtype), so a verdict
    never sets a CPU kernel against a 16-bit or float32 baseline as if it were the guide's NPU test."""
    ladder_table = claims.GUIDE_LADDER  # the guide's 4.2 table, rungs +MindSpeed and +MindSpeed+INT8
    guide = [(message("4.1 speed FP16 -> INT8"), claims.guide_number("C51"), measured_speedup),
             (message("3.1 speed +INT8 over the original"), claims.guide_number("C41") / claims.guide_number("C38"),
              measured_speedup),
             (message("4.2 table +MindSpeed -> +MindSpeed+INT8"),
              ladder_table[3]["tokens_per_s"] / ladder_table[2]["tokens_per_s"], measured_speedup),
             (message("4.1 memory FP16 -> INT8 (GB)"), claims.guide_number("C52"), measured_memory)]
    # the guide's baseline dtype as the guide writes it, recorded so the prose names it from the row
    baseline = "FP16"
    rows = []
    for name, claim, m in guide:
        row = {"figure": name, "guide_claim_ratio": claim, "guide_baseline": baseline,
               "guide_compared": message("INT8 against {baseline}, Llama-2-7B on an Ascend 910B", baseline=baseline),
               "measured_compared": prose.recorded(m or {}, "code_path", "not measured"),
               "measured_here_ratio": m["value"] if m else math.nan,
               "measured_low": (m or {}).get("low", math.nan), "measured_high": (m or {}).get("high", math.nan)}
        if (m or {}).get("n_samples"):  # the measured ratio's samples: its verdict needs them
            row["n_samples"] = m["n_samples"]
        rows.append(row)
    return rows


def calibration_sweep(model_name: str, device, dtype, tokenizer, pool: list, counts: Iterable[int],
                      eval_ids, ref_logits, *, max_tokens: int, dynamic: Optional[dict] = None) -> list:
    """Static W8A8 with one activation scale per layer from ``n`` calibration sentences, for each
    ``n`` in ``counts``; then the dynamic per-token row (``dynamic``, a measured variant) beside it."""
    counts = list(counts)
    if not counts:
        return []
    if max(counts) > len(pool):
        raise ValueError(f"calibration_counts={counts} asks for more samples than the {len(pool)} "
                         "calibration sentences; lower it or lower eval_tokens")
    calib_model = build_variant("dense", model_name, device, dtype)[0]
    rows = []
    for n in progress.steps(list(counts), lambda n: message("{n} calibration samples", n=n)):
        scales = quant.calibrate(calib_model, tokenizer, pool[:n], max_tokens=max_tokens)
        lm, _, info = build_variant("w8a8_static", model_name, device, dtype, act_scales=scales)
        rows.append({"calibration_samples": n, "kernel": info["impl"],
                     **quality.evaluate(lm, eval_ids, ref_logits,
                                        label=f"w8a8_static from {n} calibration samples")})
        del lm
    del calib_model
    gc.collect()
    if dynamic:
        rows.append({"calibration_samples": "dynamic per-token", "kernel": dynamic["impl"],
                     **{k: dynamic[k] for k in QUALITY_KEYS}})
    return rows


def lowest_perplexity(rows: list) -> Optional[dict]:
    """The calibrated row (an integer sample count) with the lowest perplexity, or None."""
    calibrated = [r for r in rows if isinstance(r["calibration_samples"], int)]
    return min(calibrated, key=lambda r: r["perplexity"]) if calibrated else None


def plot_speed_vs_quality(rows: dict, ref_ppl: float, *, reference: str, device: str, model: str, lang: str = "en"):
    """Decode tokens/s at batch 1 against the perplexity change, one point per variant (symmetric log
    scale: down and to the right is better); emulated kernels have no speed and are listed beside the
    legend. The change is from the dense model when it was measured (the baseline of the summary's
    ``int8_ppl_delta_pct``, computed by the same ``perplexity_change_pct``), else from ``reference``
    (``ref_ppl``); the y label names which. Ticks are plain numbers at the prose's precision."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lang = plots.chart_language(lang)
    if "dense" in rows:
        base_ppl, base_name = rows["dense"]["perplexity"], prose.tell(lang, "dense {dtype}", dtype=rows["dense"]["dtype"])
    else:
        base_ppl, base_name = ref_ppl, reference
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    no_speed, markers = [], iter("osD^vP*Xh<>")
    for name, r in rows.items():
        delta = perplexity_change_pct(r["perplexity"], base_ppl)
        if 1 in r["timings"]:
            x = r["timings"][1]["tokens_per_s_per_user"]
            ax.scatter(x, delta, s=55, marker=next(markers),
                       label=f"{name}: {prose.format_number(float(x))} tok/s, {signed_pct(delta)}")
        else:
            no_speed.append(f"{name}: {signed_pct(delta)}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_yscale("symlog", linthresh=1.0)
    # symlog's default labels its minor ticks in scientific notation ("2.2554x10^-1"): plain numbers
    # on the decades, none on the minor ticks
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: prose.format_number(float(v))))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(prose.tell(lang, "decode tokens/s, batch 1 ({device})", device=device))
    ax.set_ylabel(prose.tell(lang, "perplexity change vs {base} (%)", base=base_name))
    ax.set_title(prose.tell(lang, "INT8 variants of {model}: speed vs quality (measured here)", model=model))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=prose.translate_cell("variant", lang),
              title_fontsize=8)
    if no_speed:
        ax.text(1.02, 0.02, prose.tell(lang, "no speed figure:") + "\n" + "\n".join(no_speed), transform=ax.transAxes,
                fontsize=8, va="bottom")
    fig.tight_layout()
    return fig


# --- the worked answers (solutions/05_int8_quantization_solutions.ipynb) ------------------------

def parameter_groups(model) -> dict:
    """Parameters per part of a Llama model (a tied ``lm_head`` shares the embedding's tensor and
    is counted once, as ``embed_tokens (tied lm_head)``)."""
    groups: dict = {}
    for name, p in model.named_parameters():
        key = ("embed_tokens (tied lm_head)" if "embed_tokens" in name else "attention" if "self_attn" in name
               else "mlp" if "mlp" in name else "lm_head" if "lm_head" in name else "norms")
        groups[key] = groups.get(key, 0) + p.numel()
    return groups


def emulated_w8a8(model_name: str, device, tokenizer, calibration: list, mode: str, max_tokens: int = 64):
    """A float32 model whose linears see int8-rounded weights (per output channel) and int8-rounded
    inputs with one scale ``per layer`` or ``per channel`` (static, the max |input| over the
    ``calibration`` sentences) or ``per token`` (dynamic). Quality only: an int8 GEMM cannot apply a
    per-input-channel scale itself (SmoothQuant folds it into the weights)."""
    if mode not in ("per layer", "per channel", "per token"):
        raise ValueError(f"mode={mode!r} is not valid; choose per layer, per channel or per token")
    lm, _ = models.load_model(model_name, dtype=torch.float32, device=device)
    lm.lm_head.weight = nn.Parameter(lm.lm_head.weight.detach().clone())  # untie: the embedding stays float
    linears = {n: mod for n, mod in lm.named_modules() if isinstance(mod, nn.Linear)}
    with torch.inference_mode():
        amax = quant.calibrate(lm, tokenizer, calibration, max_tokens=max_tokens, per_channel=True)
    for n, mod in linears.items():
        q, s = quant.quantize_weight(mod.weight.data)
        mod.weight.data = quant.dequantize_weight(q, s, torch.float32)
        scale = {"per layer": amax[n].max(), "per channel": amax[n]}.get(mode)
        scale = None if scale is None else scale.clamp(min=1e-8) / 127

        def fake_quant(mod, inp, scale=scale):
            x = inp[0]
            sc = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127 if scale is None else scale
            return (torch.round(x / sc).clamp(-127, 127) * sc,)
        mod.register_forward_pre_hook(fake_quant)
    return lm


# --- chapter 05: variants measured in interleaved rounds ------------------------------------------

def measure_interleaved(models_by_name: dict, tokenizer, prompts, max_new_tokens: int, device=None, *,
                        rounds: int = 3, repeats: int = 2, **kwargs) -> dict:
    """``generation.measure_generation`` of several models in turn, ``rounds`` times, samples pooled per model.

    On a shared machine the load drifts over minutes; measuring A, B, A, B, ... makes the drift hit
    every model alike, so a ratio of their medians compares the models, not the moments. Each
    round is the same protocol as a single ``generation.measure_generation``; the pooled result has its keys,
    with medians and p10/p90 over every round's samples and the largest memory growth of the rounds.
    """
    check_positive_int("rounds", rounds)
    runs: dict = {name: [] for name in models_by_name}
    for _ in range(rounds):
        for name, model in models_by_name.items():
            runs[name].append(generation.measure_generation(model, tokenizer, prompts, max_new_tokens, device,
                                                 repeats=repeats, **kwargs))
    return {name: generation.pool_runs(parts, rounds) for name, parts in runs.items()}


# --- chapter 05: the variants it builds and checks ------------------------------------------------

def bitsandbytes_config_takes(params=("load_in_8bit", "llm_int8_threshold")) -> dict:
    """Does transformers' ``BitsAndBytesConfig`` take the guide's arguments? (chapter 05 records it)."""
    from transformers import BitsAndBytesConfig

    have = set(inspect.signature(BitsAndBytesConfig).parameters)
    missing = [p for p in params if p not in have]
    return {"takes": not missing, "missing": missing, "params": list(params)}


def build_variant(name: str, model_name: str, device, dtype: torch.dtype, *,
                  act_scales: Optional[dict] = None):
    """Load ``model_name`` and turn it into variant ``name``; returns (model, tokenizer, info).

    Raises ``quant.VariantUnavailable`` (with the reason) where a variant cannot run here.
    """
    check_variants([name], "variant")
    device = backend.as_device(device)
    if name == "quantize_dynamic" and device.type != "cpu":
        raise quant.VariantUnavailable("quantize_dynamic has CPU kernels (fbgemm/qnnpack) only")
    if name == "torchao" and device.type == "npu":
        raise quant.VariantUnavailable("torchao's int8 weight-only kernels do not target the NPU")
    if name == "w8a8_static" and act_scales is None:
        raise quant.VariantUnavailable("w8a8_static needs act_scales from quant.calibrate")
    load_dtype = torch.float32 if name in ("fp32", "quantize_dynamic") else dtype
    model, tokenizer = load_model(model_name, dtype=load_dtype, device=device)
    info = {"variant": name, "description": quant.VARIANTS[name], "dtype": backend.dtype_name(load_dtype),
            "device": str(device), "bytes_before": weight_bytes(model)}
    if name in quant.INT8_VARIANTS:
        info.update(quant.quantize_model_int8(model, *quant.INT8_VARIANTS[name],
                                              act_scales=act_scales if name == "w8a8_static" else None))
    elif name == "torchao":
        info.update(quant.torchao_int8_weight_only(model))
    elif name == "quantize_dynamic":
        model, extra = quantize_dynamic_cpu(model)
        info.update(extra)
    else:  # fp32, dense
        info.update(bytes_after=info["bytes_before"], impl="dense", scheme="none",
                    activations=backend.dtype_name(load_dtype))
    info["speed_is_meaningful"] = "emulate" not in str(info.get("impl"))
    return model, tokenizer, info


def quantize_dynamic_cpu(model: nn.Module) -> tuple[nn.Module, dict]:
    """``torch.ao.quantization.quantize_dynamic`` (per-tensor W8 + dynamic per-tensor A8), CPU fp32.

    The cautionary case: fast, and on SmolLM2 it multiplies perplexity several times.
    """
    names = quant.check_model(model)
    first = model.get_submodule(names[0]).weight
    if first.device.type != "cpu" or first.dtype != torch.float32:
        raise ValueError(f"quantize_dynamic needs a float32 model on the CPU; got {first.dtype} on "
                         f"{first.device}")
    before = weight_bytes(model)
    with quant.quiet_imports():
        from torch.ao.quantization import quantize_dynamic

        model = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
    return model, {"bytes_before": before, "bytes_after": weight_bytes(model), "layers": len(names),
                   "impl": "torch.ao quantize_dynamic (fbgemm)", "scheme": "w8a8",
                   "activations": "dynamic per-tensor int8"}


def check_variants(names, parameter: str = "variants") -> list[str]:
    if isinstance(names, str) or not names:
        raise ValueError(f"{parameter}={names!r} is not valid; give a non-empty list from "
                         f"{', '.join(quant.VARIANTS)}")
    unknown = [n for n in names if n not in quant.VARIANTS]
    if unknown:
        raise ValueError(f"{parameter} contains {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(quant.VARIANTS)}")
    return list(names)


# --- chapter 05's worked answers (solutions/05): the facts each answer's paragraph is said from ----
# The paragraphs are blocks of templates/05_int8_quantization.answers.md.j2 (``prose.answer``).

def other_baseline_facts(speedup, chapter: dict, *, kernel: str, activations, dtype: str,
                         bytes_per_weight: int) -> dict:
    """Exercise 1: W8A16 over dense with a ``dtype`` baseline (``speedup``, a ``bench.Speedup``)
    beside the chapter's recorded ``int8_decode_speedup_batch1`` (``chapter``: its results.json) in
    the chapter's dtype, each with its spread and the samples it stands on; the dense step's bytes
    per weight in ``dtype``."""
    figure = chapter["metrics"]["int8_decode_speedup_batch1"]
    return {"here": {"ratio": speedup.ratio, "low": speedup.low, "high": speedup.high, "n_samples": speedup.samples},
            "chapter": {"ratio": figure["value"], "low": figure["low"], "high": figure["high"],
                        "n_samples": decide.samples_of(figure, decide.chapter_samples(chapter.get("parameters")))},
            "kernel": kernel, "activations": activations, "dtype": dtype,
            "chapter_dtype": chapter["device_choice"]["dtype"], "bytes_per_weight": bytes_per_weight}


def lm_head_facts(groups: dict, largest: tuple, full: dict, head_dense: dict, dtype: str) -> dict:
    """Exercise 2: the model's parameters by part (``parameter_groups``), its ``largest`` tensor
    (name, count), and the INT8 model with every linear (``full``) against the one that keeps
    ``lm_head`` dense (``head_dense``): rows with weight_MB, perplexity and speedup_vs_dense."""
    total = sum(groups.values())
    parts = [{"name": k, "pct": 100 * v / total} for k, v in sorted(groups.items(), key=lambda kv: -kv[1])]
    return {"parts": parts, "biggest": parts[0]["name"], "biggest_pct": parts[0]["pct"], "tensor": largest[0],
            "tensor_pct": 100 * largest[1] / total, "dtype": dtype,
            **{f"{k}{suffix}": float(row[k]) for suffix, row in (("", full), ("_head", head_dense))
               for k in ("weight_MB", "perplexity", "speedup_vs_dense")}}


def calibration_facts(perplexity: dict, samples: int) -> dict:
    """Exercise 3: perplexity with per-layer, per-channel and dynamic per-token activation scales
    (``perplexity`` by mode) from ``samples`` calibration sentences; the share of the per-layer gap to
    per-token that per-channel scales close (None when per layer is no worse than per token)."""
    gap_layer = perplexity["per layer"] - perplexity["per token"]
    gap_channel = perplexity["per channel"] - perplexity["per token"]
    return {"samples": samples, "layer": perplexity["per layer"], "channel": perplexity["per channel"],
            "token": perplexity["per token"], "closed_pct": 100 * (1 - gap_channel / gap_layer) if gap_layer > 0 else None}
