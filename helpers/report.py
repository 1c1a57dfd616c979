"""The run's summary for ``08_report.ipynb``: key figures, plots and the code-free claims report
(layer: chapter studies; taught in 08_report).

Everything here reads what the chapters recorded (``results.json`` through ``helpers.results``);
nothing is re-measured. Each plot returns ``None`` when its chapter's figures are missing, so the
report renders for partial or failed runs. The guide's numbers drawn beside ours come from the
claims table (``helpers.claims``), never typed in here. The key figures' labels on the runner's
index are here too; the pages themselves are ``helpers.pages`` templates.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from . import decide, ladder, pages, plots
from .claims import CLASS_COLOURS, GUIDES, VERDICT_CLASSES, number, parse_args, verdict_counts
from .prose import N_, format_number, message, recorded, recorded_rows, tell, tr, translate_cell
from .results import REPORT_CHAPTER, RunFolder, metric

def key_figures(results: dict):
    """Every chapter's key figures with unit and context, as recorded."""
    import pandas as pd

    context = ("device", "dtype", "shape", "code_path")
    rows = [{"chapter": chapter, "key": key, "value": entry.get("value"), "unit": entry.get("unit", ""),
             **{k: recorded(entry, k) for k in context}}
            for chapter in sorted(results) if chapter != REPORT_CHAPTER
            for key in results[chapter].get("key_figures", [])
            if (entry := results[chapter].get("metrics", {}).get(key)) is not None]
    return pd.DataFrame(rows, columns=["chapter", "key", "value", "unit", *context])


# The claim as each edition quotes it in its tables: the guide's Chinese, or its English gloss.
CLAIM_TEXT = {"en": "gloss_en", "zh": "text_zh"}


def claim_text_column(lang: str = "en") -> str:
    """The claims table's column that says a claim in ``lang`` (``CLAIM_TEXT``)."""
    if lang not in CLAIM_TEXT:
        raise ValueError(f"lang={lang!r} is not valid; choose one of {', '.join(CLAIM_TEXT)}")
    return CLAIM_TEXT[lang]


def guide_value(claims_table, metric_key: str) -> Optional[float]:
    """The guide's number for a metric, taken from the claims table row that names that metric."""
    for row in claims_table.to_dict(orient="records"):
        if parse_args(row["args"]).get("metric") == metric_key:
            try:
                return number(row["claimed_value"])
            except ValueError:
                return None
    return None


def _value(results: dict, dotted: str) -> Optional[float]:
    chapter, _, key = dotted.partition(".")
    value = metric(results.get(chapter), key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _device(results: dict, chapter: str) -> str:
    return str((results.get(chapter) or {}).get("environment", {}).get("device", "?"))


def plot_roofline(results: dict, lang: str = "en"):
    """Batch-1 decode measured in chapter 03 against chapter 00's bandwidth ceiling (``plots.plot_roofline``)."""
    return plots.plot_roofline(
        [("", _value(results, "03_end_to_end.decode_tok_s_batch1"),
          _value(results, "00_environment_check.decode_ceiling_tok_s"), None)],
        message("Roofline on {device}", device=_device(results, "03_end_to_end")),
        ceiling_name=message("bandwidth ceiling (ch. 00)"), lang=lang)


def plot_batching(results: dict, claims_table, lang: str = "en"):
    """Throughput, latency and memory growth over batch 1: chapter 04 beside the guide's claim."""
    import matplotlib.pyplot as plt

    series = {N_("throughput ratio (x)"): "batch_throughput_ratio_{}",
              N_("latency growth (%)"): "batch_latency_growth_pct_{}",
              N_("memory growth (%)"): "batch_memory_growth_pct_{}"}
    if all(_value(results, f"04_batching.{k.format(b)}") is None for k in series.values() for b in (4, 8)):
        return None
    lang = plots.chart_language(lang)
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
    for ax, (title, key) in zip(axes, series.items()):
        for label, read, marker in ((N_("measured"), lambda dotted: _value(results, dotted), "o-"),
                                    (N_("guide's claim"), lambda dotted: guide_value(claims_table, dotted), "s--")):
            points = [(1, 1.0 if "ratio" in key else 0.0)]  # batch 1: the baseline each figure is relative to
            points += [(b, v) for b in (4, 8) if (v := read(f"04_batching.{key.format(b)}")) is not None]
            if len(points) > 1:
                ax.plot(*zip(*points), marker, label=translate_cell(label, lang))
        ax.set_xlabel(tell(lang, "batch size"))
        ax.set_title(translate_cell(title, lang), fontsize=9)
        ax.set_xticks([1, 4, 8])
    axes[0].legend(fontsize=8)
    fig.suptitle(tell(lang, "Batching: measured on {device} vs the guide's 910B table",
                      device=_device(results, "04_batching")), fontsize=10)
    fig.tight_layout()
    return fig


def plot_int8(results: dict, claims_table, lang: str = "en"):
    """INT8 decode speedup beside the guide's three INT8 speedups, and the perplexity change, as bars.

    Bars start at zero (speedup) or straddle it (perplexity), so a single measurement never becomes a
    one-point axis. The guide's speedups are the expressions of claim C74 (its three INT8 figures).
    """
    import matplotlib.pyplot as plt

    speed = _value(results, "05_int8_quantization.int8_decode_speedup_batch1")
    ppl = _value(results, "05_int8_quantization.int8_ppl_delta_pct")
    if speed is None and ppl is None:
        return None
    guide = _guide_int8_speedups(claims_table)
    lang = plots.chart_language(lang)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    labels = ([tell(lang, "guide: {expression} tok/s", expression=expr) for expr in guide]
              + ([tell(lang, "measured here, batch 1")] if speed is not None else []))
    values = list(guide.values()) + ([speed] if speed is not None else [])
    colours = ["#ff7f0e"] * len(guide) + ["#1f77b4"] * (speed is not None)
    if values:
        left.barh(labels, values, color=colours)
        for i, v in enumerate(values):
            left.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
        left.axvline(1.0, color="black", lw=0.8)
        left.set_xlim(0, max(values) * 1.25)
    left.set_xlabel(tell(lang, "INT8 / dense decode tok/s (x, higher is faster)"))
    left.set_title(tell(lang, "INT8 decode speedup"), fontsize=10)
    right.set_yticks([])
    if ppl is not None:
        right.barh([0], [ppl], color="#1f77b4", height=0.5)
        span = max(abs(ppl) * 1.6, 0.5)
        right.set_xlim(-span, span)
        right.axvline(0, color="black", lw=0.8)
        right.text(ppl, 0, f" {ppl:+.2f}%", va="center", ha="left" if ppl >= 0 else "right", fontsize=8)
        right.set_title(tell(lang, "perplexity change measured here\n(the guide gives no quality figure)"), fontsize=9)
    else:
        right.text(0.5, 0.5, tell(lang, "perplexity not recorded in this run"), ha="center", va="center",
                   transform=right.transAxes)
        right.set_title(tell(lang, "perplexity change"), fontsize=10)
    right.set_xlabel(tell(lang, "vs dense (%, lower is better)"))
    fig.suptitle(tell(lang, "INT8 on {device} (measured) vs the guide's 910B figures",
                      device=_device(results, "05_int8_quantization")), fontsize=10)
    fig.tight_layout()
    return fig


def _guide_int8_speedups(claims_table) -> dict:
    """The guide's INT8 speedups as ``{expression: value}``, from the claims row that lists all three."""
    for row in claims_table.to_dict(orient="records"):
        args = parse_args(row["args"])
        if row["rule"] == "consistency" and "others" in args and "/" in str(row["claimed_value"]) \
                and "INT8" in str(row.get("gloss_en", "")):
            exprs = [str(row["claimed_value"])] + args["others"].split(",")
            return {e.strip(): number(e) for e in exprs}
    return {}


def plot_ladder(results: dict, lang: str = "en"):
    """Chapter 06's ladder beside the guide's, as ratios to each one's own baseline."""
    import pandas as pd

    rows = recorded_rows(results.get("06_optimization_ladder") or {}, "ladder")
    if not rows:
        return None
    table = pd.DataFrame(rows)
    if "status" not in table or not (table["status"] == "ok").any():
        return None
    return plots.plot_ladder(ladder.beside_the_guide(
        table, label=message("measured here ({device})", device=_device(results, "06_optimization_ladder"))),
        ladder.BESIDE_THE_GUIDE, lang=lang)


def plot_verdicts(verdict_table, lang: str = "en"):
    """How many claims fall in each verdict class (colours as in the claims report's badges)."""
    import matplotlib.pyplot as plt

    counts = {k: v for k, v in verdict_counts(verdict_table).items() if v}
    order = list(counts)[::-1]
    lang = plots.chart_language(lang)
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(order) + 1.2))
    ax.barh([translate_cell(c, lang) for c in order], [counts[c] for c in order],
            color=[CLASS_COLOURS[c] for c in order])
    for i, c in enumerate(order):
        ax.text(counts[c], i, f" {counts[c]}", va="center", fontsize=8)
    ax.set_xlim(0, max(counts.values()) * 1.15)
    ax.set_xlabel(tell(lang, "claims"))
    ax.set_title(tell(lang, "Verdict classes of {claims} claims of the two guides", claims=len(verdict_table)),
                 fontsize=10)
    fig.tight_layout()
    return fig


def verdict_legend(lang: str = "en"):
    """The verdict classes and what each means, in ``lang`` (chapter 08's legend, the pages' words).

    In another language than English the classes' keys (``helpers.claims.VERDICT_CLASSES``, the
    words the chapter's tables hold in their ``verdict_class`` column) are the index, beside their names.
    """
    import pandas as pd

    words = pages.labels("claims", lang)
    names = [pages.say("common.verdict_classes", c, lang) for c in VERDICT_CLASSES]
    table = pd.DataFrame({words["class"]: names,
                          words["meaning"]: [pages.say("common.class_meanings", c, lang) for c in VERDICT_CLASSES]})
    if names != list(VERDICT_CLASSES):
        table.index = pd.Index(list(VERDICT_CLASSES), name="verdict_class")
    return table


def without_gloss(text: str) -> str:
    """A heading of the claims table without its English gloss: ``第二步：RMSNorm 性能验证`` from
    ``第二步：RMSNorm 性能验证 (step 2: RMSNorm performance)`` (a Chinese page shows the guide's own words)."""
    return re.sub(r"\s*\([^()]*[A-Za-z][^()]*\)\s*$", "", str(text)) or str(text)


def write_claims_report(path: "str | Path", runs_named: str, audit, runs=None, status=None, sources=(),
                        figures=None, plots=(), lang: str = "en") -> Path:
    """``claims_report.html``: the verdict legend with counts, every claim grouped by guide and section
    (quote, gloss, badge, what decided it), then the runs, chapter statuses, key figures and plots."""
    heading = str if lang == "en" else without_gloss
    groups = []
    for seed, by_seed in audit.groupby("seed", sort=False):
        sections = []
        for section, rows in by_seed.groupby("section", sort=False):
            records = rows.to_dict(orient="records")
            for r in records:
                op = parse_args(r.get("args", "")).get("op", "") if r.get("rule") == "threshold" else ""
                r["shown_value"] = f"{op} {r['claimed_value']} {r.get('unit', '')}".strip()
            sections.append((heading(section), records))
        groups.append((heading(GUIDES.get(seed, seed)), sections))
    return pages.write(path, "claims", lang, runs_named=runs_named, groups=groups, counts=verdict_counts(audit),
                       colours=CLASS_COLOURS, runs=runs, status=status,
                       sources=sources, figures=figures, plots=[f for f in plots if f is not None])


# --- the runner's index page: key figures people can read, verdict counts by class ---------------

# Which way is better for a key figure ("higher" or "lower"); absent means no better direction (a
# device name, a count, a yes/no check). The labels are in the index's label table
# (``pages.LABELS``, translated in the runtime catalog); keys ending in "_" match a batch size or rung name after them.
FIGURE_DIRECTIONS = {
    "memory_bandwidth_gbps": "higher", "decode_ceiling_tok_s": "higher", "rmsnorm_guide_shape_ms": "lower",
    "rmsnorm_noncontig_slowdown": "lower", "add_rmsnorm_fusion_speedup": "higher",
    "ffn_merged_speedup_decode": "higher", "ffn_fused_max_abs_diff": "lower", "residual_norm_graph_speedup": "higher",
    "ttft_ms": "lower", "decode_tok_s_batch1": "higher", "decode_roofline_pct": "higher",
    "graph_mode_decode_speedup": "higher", "graph_compiled_graphs": "lower", "eager_matmul_gbps": "higher",
    "decode_matmul_share_pct": "higher", "graph_compile_s": "lower", "batch_throughput_ratio_": "higher",
    "kv_cache_mib_batch": "lower", "int8_weight_bytes_ratio": "lower", "int8_ppl_delta_pct": "lower",
    "int8_decode_speedup_batch": "higher", "int8_ttft_ratio_batch": "lower", "quantize_dynamic_ppl_ratio": "lower",
    "ladder_best_batch1_speedup": "higher", "ladder_batch_throughput_ratio": "higher",
    "ladder_speedup_total": "higher", "ladder_tok_s_": "higher", "vllm_server_start_s": "lower", "serving_output_tok_s_c": "higher", "serving_ttft_p50_ms_c": "lower",
    "engine_batch1_decode_ratio": "higher", "users_served_ratio": "higher",
    "ladder_best_batch1_vs_llamacpp": "higher", "llamacpp_decode_tok_s": "higher",
}
UNIT_WORDS = {"x": "×", "ratio": "×"}


def key_figure_label(key: str, lang: str = "en") -> tuple[str, str]:
    """(human label, "higher" | "lower" | "") for a recorded key; unknown keys keep their name."""
    labels = pages.labels("index", lang)["figures"]
    if key in labels:
        return labels[key], FIGURE_DIRECTIONS.get(key, "")
    for prefix in sorted((k for k in labels if "{}" in labels[k]), key=len, reverse=True):
        if key.startswith(prefix) and len(key) > len(prefix):
            ending = key[len(prefix):].lstrip("_").replace("_", " ")
            # claims_<class>: the verdict class in the page's language
            ending = pages.say("common.verdict_classes", ending, lang)
            return labels[prefix].format(ending), FIGURE_DIRECTIONS.get(prefix, "")
    return key.replace("_", " "), ""


def counted(word, n) -> str:
    """A counted word in the number ``n`` asks for: a label that is ``{one: ..., other: ...}`` gives
    ``one`` for exactly 1 ("1 claim", "1 op"), ``other`` otherwise; a plain label is the same for all."""
    return str(word["one" if n == 1 else "other"] if isinstance(word, dict) else word)


def describe_key_figure(key: str, entry: dict, lang: str = "en", samples: Optional[float] = None) -> dict:
    """What the index prints for one figure: label, rounded value with unit, direction, context.
    ``samples``: the chapter's count when the figure does not record its own (``decide.samples_of``);
    a ratio's spread says "too few samples" from fewer than ``decide.MIN_SAMPLES``."""
    label, direction = key_figure_label(key, lang)
    unit = str(entry.get("unit") or "")
    raw = entry.get("value")
    value = format_number(raw) if not isinstance(raw, bool) else pages.say(
        "common", "boolean_yes" if raw else "boolean_no", lang)
    labels = pages.labels("index", lang)
    unit = UNIT_WORDS.get(unit, unit)
    # a counted word (claims, ops) in the page's language and in the number the value asks for
    shown_unit = counted(labels["units"].get(unit, unit), raw)
    shown = f"{value}{unit}" if unit in ("×", "%") else f"{value} {shown_unit}".strip()
    # the context says where the figure was taken; a word the value already shows is not repeated
    # a recorded message (a shape "run's shape ... (the guide's is ...)") in the page's language
    context = pages.list_separator(lang).join(str(tr(recorded(entry, k), lang)) for k in ("device", "dtype", "shape")
                                              if entry.get(k) and str(entry[k]) != str(raw))
    spread = ""
    low, high = entry.get("low"), entry.get("high")
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and not isinstance(low, bool):
        bounds = {"low": format_number(float(low)), "high": format_number(float(high))}
        decision = decide.direction(low, high, samples=decide.samples_of(entry, samples))
        few = decide.parse_too_few(decision)
        if unit == "×" and few is not None:
            # too few samples for any word about the ratio's direction
            phrase = labels["too_few"] if few[0] is not None else labels["too_few_unknown"]
            spread = labels["spread_noise"].format(**bounds, noise=phrase.format(n=few[0], need=few[1]))
        elif unit == "×" and decision == decide.SAME:
            # a ratio whose spread holds 1: no direction to read
            spread = labels["spread_noise"].format(**bounds, noise=labels["within_noise"])
        else:
            spread = labels["spread"].format(**bounds)
    return {"key": key, "label": label, "value": shown, "context": context, "spread": spread,
            "direction": labels[direction] if direction else ""}


def index_verdict_counts(folder: RunFolder) -> Optional[dict]:
    """Claims per verdict class for the index, from the report chapter's own ``verdict_counts`` table
    (so the index and the claims report, which may include other runs' folders, always agree);
    None before that chapter has finished."""
    chapter = folder.chapters.get(REPORT_CHAPTER)
    if chapter is None or chapter.status != "ok":
        return None
    recorded = chapter.data["tables"].get("verdict_counts") or []
    return {row["verdict_class"]: int(row["claims"]) for row in recorded} or None


def batch1_protocol_table(results: dict):
    """Every chapter's batch-1, eager, dynamic-cache decode of the same request (the protocol chapter
    03 defines), side by side: they measure one thing, so what differs between them is the drift of
    the machine between chapters (or a parameter a reader changed for one chapter only)."""
    import pandas as pd

    rows = []

    def add(chapter, what, tok_s, prompt_tokens=None, new_tokens=None, dtype=None):
        if isinstance(tok_s, (int, float)) and tok_s == tok_s:
            rows.append({"chapter": chapter, "figure": what, "tok/s": float(tok_s), "prompt tokens": prompt_tokens,
                         "new tokens": new_tokens, "dtype": dtype})

    m03 = (results.get("03_end_to_end") or {}).get("metrics", {})
    if "decode_tok_s_batch1" in m03:
        e = m03["decode_tok_s_batch1"]
        add("03_end_to_end", message("the guide's request"), e.get("value"), None, None, e.get("dtype"))
    for r in (results.get("04_batching") or {}).get("tables", {}).get("batch_sweep") or []:
        if r.get("point") == 1 and r.get("status") == "ok":
            add("04_batching", message("batch sweep, batch 1"), r.get("tokens_per_s_per_user"), r.get("prompt_tokens"),
                r.get("new_tokens"), r.get("dtype"))
    r05 = results.get("05_int8_quantization") or {}
    protocol05 = r05.get("metrics", {}).get("int8_decode_speedup_batch1", {})
    for r in r05.get("tables", {}).get("variants") or []:
        if r.get("variant") == "dense":
            add("05_int8_quantization", message("dense model, batch 1"), r.get("decode_tok_s_b1"), None,
                protocol05.get("new_tokens"), r.get("dtype"))
    for r in (results.get("06_optimization_ladder") or {}).get("tables", {}).get("ladder") or []:
        if r.get("rung_id") == "native_eager" and r.get("status") == "ok":
            add("06_optimization_ladder", message("ladder, native eager"), r.get("tokens_per_s"), r.get("prompt_tokens"),
                r.get("new_tokens"), r.get("dtype"))
    return pd.DataFrame(rows)
