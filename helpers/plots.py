"""The chapters' figures (matplotlib), each drawn from a table the chapter recorded
(layer: foundations; taught where each figure appears).

Taught where each figure appears: ``plot_decode_gap`` in ``03_end_to_end.ipynb``,
``plot_batch_sweep`` in ``04_batching.ipynb``, the ladder (``plot_ladder``) in
``06_optimization_ladder.ipynb``, ``08_report.ipynb`` and the compare page, the roofline
(``plot_roofline``) in the report and the compare page: each chart drawn once. A function here draws
what its table says and nothing else: every bar is the sum of its own measured parts, and its label
is that sum (``tests/test_plots.py`` checks both on a case where a compiled path's kernels beat the
eager ones). Every chart takes ``lang``: its titles, axes and legends come from the runtime catalog
in that language when a font for it is installed (``chart_language``), and a title passed in as a
``prose.Message`` is said in the same language.
"""
from __future__ import annotations

import math

from . import prose

PART_COLOURS = {"matmul_ms": "#4c72b0", "rest_ms": "#c44e52"}


# Fonts that draw Chinese, the first one matplotlib finds is used (fonts-noto-cjk in CI, the others on
# common desktops). Without one a Chinese chart would show empty boxes: its text stays English.
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN",
             "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback", "SimHei", "Microsoft YaHei",
             "PingFang SC", "Heiti SC")


def cjk_font():
    """The first of ``CJK_FONTS`` matplotlib knows on this machine, or None."""
    from matplotlib import font_manager

    names = {f.name for f in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONTS if name in names), None)


def chart_language(lang: str = "en") -> str:
    """The language a chart's titles, axes and legends are written in: ``lang``, with matplotlib set
    to draw it (a CJK font first in ``font.sans-serif``); English where no font for ``lang`` is
    installed, so a chart never shows boxes for missing glyphs."""
    if lang == prose.SOURCE_LANGUAGE:
        return lang
    font = cjk_font()
    if font is None:
        return prose.SOURCE_LANGUAGE
    from matplotlib import rcParams

    if rcParams["font.sans-serif"][:1] != [font]:
        rcParams["font.sans-serif"] = [font, *[f for f in rcParams["font.sans-serif"] if f != font]]
    rcParams["axes.unicode_minus"] = False  # CJK fonts often lack the Unicode minus sign
    return lang


def error_bars(mid, low, high):
    """``yerr`` for ``errorbar``: a (2, N) array of the distance from each median down to its low and
    up to its high. Plain numbers, not pandas Series: matplotlib reads a one-point Series with
    ``float()``, which pandas deprecates (a warning, an error in later pandas)."""
    import numpy as np

    mid, low, high = (np.asarray(v, dtype=float) for v in (mid, low, high))
    return np.stack([mid - low, high - mid])


def decode_gap_parts(gap) -> list[dict]:
    """Bar heights per path of an ``end_to_end_study.decode_gap`` table: the step, its weight-matmul
    kernel part (at most the step) and the rest; both parts non-negative and adding up to the step."""
    bars = []
    for row in gap.to_dict(orient="records"):
        step = float(row["step_ms"])
        split = row.get("matmul_ms") is not None and row["matmul_ms"] == row["matmul_ms"]  # not NaN
        matmul = min(max(float(row["matmul_ms"]), 0.0), step) if split else 0.0
        bars.append({"path": row["path"], "step_ms": step, "matmul_ms": matmul, "rest_ms": step - matmul,
                     "split": split})
    return bars


def plot_decode_gap(gap, title: str = "", figsize=(7, 4.5), lang: str = "en"):
    """Stacked bars per path: that path's own weight-matmul kernel time and the rest of its step,
    labelled with the step time; a dashed line at the roofline (bytes per step / bandwidth). Its
    words in ``lang`` (``chart_language``)."""
    import matplotlib.pyplot as plt

    lang = chart_language(lang)
    bars = decode_gap_parts(gap)
    fig, ax = plt.subplots(figsize=figsize)
    names, matmul = [b["path"] for b in bars], [b["matmul_ms"] for b in bars]
    ax.bar(names, matmul, color=PART_COLOURS["matmul_ms"],
           label=prose.tell(lang, "weight-matmul kernels this path ran"))
    ax.bar(names, [b["rest_ms"] for b in bars], bottom=matmul, color=PART_COLOURS["rest_ms"],
           label=prose.tell(lang, "rest of the step: attention, norms, launches, Python"))
    for i, b in enumerate(bars):
        share = (prose.tell(lang, "\nmatmul {pct:.0f} %", pct=100 * b["matmul_ms"] / b["step_ms"])
                 if b["split"] and b["step_ms"] else "")
        ax.text(i, b["step_ms"], f"{b['step_ms']:.1f} ms{share}", ha="center", va="bottom", fontsize=9)
    roofline = float(gap["roofline_ms"].iloc[0]) if len(gap) else math.nan
    if roofline == roofline:
        ax.axhline(roofline, color="black", linestyle="--", linewidth=1,
                   label=prose.tell(lang, "roofline: bytes / bandwidth = {ms:.1f} ms", ms=roofline))
    ax.set_ylabel(prose.tell(lang, "ms per decode step (batch 1)"))
    ax.set_title(prose.tr(title, lang) or prose.tell(lang, "Where one decode step goes"))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=1)
    top = max([b["step_ms"] for b in bars] + [roofline if roofline == roofline else 0.0])
    ax.set_ylim(0, top * 1.3 if top > 0 else 1)
    fig.tight_layout()
    return fig


def fusion_saving_bars(share, variants, lang: str = "en") -> list:
    """The bars of ``plot_fusion_savings``: (column, legend label) for the elementwise share (the
    ceiling of what fusing can save) and each variant's signed saving against ``unfused``."""
    return [("elementwise_share_pct", prose.tell(lang, "elementwise share of unfused time (ceiling)"))] + [
        (f"saved_pct_{v}", prose.tell(lang, "saved by {variant} (negative: its median is above unfused)", variant=v))
        for v in variants if v != "unfused" and f"saved_pct_{v}" in share]


def plot_fusion_savings(share, variants, clip_pct: float = -150.0, figsize_width: float = 9, lang: str = "en"):
    """Chapter 02: per FFN case, the elementwise share of the unfused time beside each variant's
    saving (% of the unfused median, negative when the variant's median is above it). The axis is
    clipped at ``clip_pct`` so one variant many times slower does not squash the rest; a clipped bar
    is drawn to the edge and labelled with its value."""
    import matplotlib.pyplot as plt

    lang = chart_language(lang)
    bars = fusion_saving_bars(share, variants, lang)
    colours = ["#c63", "#69c", "#3a7", "#a6c", "#999"]
    fig, ax = plt.subplots(figsize=(figsize_width, 0.9 + 0.9 * len(share)))
    height = 0.8 / len(bars)
    lowest = min([0.0] + [float(share[col].min()) for col, _ in bars])
    left = max(lowest * 1.1, clip_pct)
    for k, (col, label) in enumerate(bars):
        ys = [j + (k - (len(bars) - 1) / 2) * height for j in range(len(share))]
        values = [float(v) for v in share[col]]
        ax.barh(ys, [max(v, left) for v in values], height=height, color=colours[k % len(colours)],
                label=label)
        for y, v in zip(ys, values):
            if v < left:
                ax.annotate(f"{v:.0f}%", (left, y), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=7, color="white", weight="bold")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlim(left, 105)
    ax.set_yticks(range(len(share)), [c.replace(", T=", "\nT=") for c in share["case"]])
    ax.invert_yaxis()
    clipped = prose.tell(lang, "; axis clipped at {pct:.0f}%", pct=left) if lowest < left else ""
    ax.set_xlabel(prose.tell(lang, "% of unfused FFN median time (saving < 0: median above unfused{clipped})",
                             clipped=clipped))
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def plot_batch_sweep(sweep, ratios, guide: dict, title: str = "", figsize=(11, 7), lang: str = "en"):
    """Chapter 04's sweep on four panels against the batch size (log axis, plain tick labels):
    aggregate and per-user tokens/s; decode per step (p10-p90 bars) and TTFT; the throughput gain
    over batch 1 with its spread beside the ideal (= batch) and the guide's claimed gains; and memory:
    what the generates added over the region beside the KV cache from the config (log axis, since
    the growth can be far above the cache).

    ``sweep`` is ``generation.sweep_table`` (only rows with a resolved decode are drawn), ``ratios``
    ``batching_study.batch_ratios``, ``guide`` ``{batch: {"throughput": x, ...}}`` (the guide's claims).
    """
    import matplotlib.pyplot as plt
    import pandas as pd

    lang = chart_language(lang)
    ok = sweep[sweep["status"] == "ok"].sort_values("point")
    if "decode_resolved" in ok:
        ok = ok[ok["decode_resolved"].astype(bool)]
    ratios = pd.DataFrame(list(ratios))
    fig, axes = plt.subplots(2, 2, figsize=figsize)
    speed, latency, gain, memory = axes.flat
    speed.plot(ok["point"], ok["tokens_per_s_aggregate"], marker="o", label=prose.tell(lang, "aggregate"))
    speed.plot(ok["point"], ok["tokens_per_s_per_user"], marker="o", label=prose.tell(lang, "per user"))
    speed.set(ylabel="tokens/s", title=prose.tell(lang, "throughput vs batch"))
    latency.errorbar(ok["point"], ok["decode_ms_per_token"], marker="o", capsize=3,
                     label=prose.tell(lang, "decode per step"),
                     yerr=error_bars(ok["decode_ms_per_token"], ok["decode_p10_ms"], ok["decode_p90_ms"]))
    latency.plot(ok["point"], ok["ttft_ms"], marker="s", label="TTFT")
    latency.set(ylabel=prose.tell(lang, "ms (median, p10-p90)"), title=prose.tell(lang, "latency vs batch"))
    if len(ratios):
        spread = error_bars(ratios["throughput_ratio"], ratios["throughput_low"], ratios["throughput_high"])
        gain.errorbar(ratios["batch"], ratios["throughput_ratio"], yerr=spread, marker="o", capsize=3,
                      label=prose.tell(lang, "measured (p10-p90)"))
        gain.plot(ratios["batch"], ratios["batch"], ls="--", color="grey", label=prose.tell(lang, "ideal = batch"))
    claimed = sorted((b, c["throughput"]) for b, c in guide.items())
    gain.plot([1] + [b for b, _ in claimed], [1.0] + [x for _, x in claimed], marker="x", ls="none",
              color="tab:red", label=prose.tell(lang, "guide's claim (Llama-2-7B)"))
    gain.set(ylabel=prose.tell(lang, "aggregate throughput / batch 1 (x)"), title=prose.tell(lang, "throughput gain"))
    memory.plot(ok["point"], ok["memory_growth_bytes"] / 2 ** 20, marker="o",
                label=prose.tell(lang, "growth over the region"))
    memory.plot(ok["point"], ok["kv_cache_bytes"] / 2 ** 20, marker="s", ls="--",
                label=prose.tell(lang, "KV cache (config)"))
    memory.set(yscale="log", ylabel=prose.tell(lang, "MiB (log scale)"),
               title=prose.tell(lang, "memory the request adds"))
    ticks = sorted({1, *ok["point"].astype(int), *guide})
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])  # batch sizes as plain numbers, not powers of two
        # an x-range of its own: one batch size (or a panel without points) would give a zero range
        ax.set_xlim(min(ticks) / 1.5, max(ticks) * 1.5)
        ax.minorticks_off()
        ax.set_xlabel(prose.tell(lang, "batch size"))
        ax.legend(fontsize=8)
    fig.suptitle(prose.tr(title, lang), fontsize=10)
    fig.tight_layout()
    return fig


def plot_roofline(runs: list, title: str, *, measured_name: str = "", ceiling_name: str = "", lang: str = "en"):
    """Batch-1 decode against its bandwidth ceiling, per run: the measured tok/s and the ceiling as
    horizontal bars, the measured one labelled with its share of the ceiling. ``runs`` holds
    ``(label, measured, ceiling, pct)`` per run (``label`` '' for a single run; ``ceiling`` and
    ``pct`` None when not recorded; ``pct`` None with a ceiling: measured over ceiling). None when
    no run measured its decode. Chapter 08 draws its run, ``helpers.compare`` every run."""
    import matplotlib.pyplot as plt

    if all(measured is None for _, measured, _, _ in runs):
        return None
    lang = chart_language(lang)
    measured_name = prose.tr(measured_name, lang) or prose.tell(lang, "measured decode (ch. 03)")
    ceiling_name = prose.tr(ceiling_name, lang) or prose.tell(lang, "bandwidth ceiling")
    bars = []  # (label, value, colour, text) per bar
    for label, measured, ceiling, pct in runs:
        prefix = f"{prose.tr(label, lang)}: " if label else ""
        if pct is None and measured is not None and ceiling:
            pct = 100 * measured / ceiling
        bars.append((prefix + measured_name, measured or 0.0, "#1f77b4",
                     prose.tell(lang, " not measured") if measured is None
                     else f" {measured:.1f}" + (prose.tell(lang, " = {pct:.0f}% of the ceiling", pct=pct)
                                                if pct is not None else "")))
        if ceiling:
            bars.append((prefix + ceiling_name, ceiling, "#cccccc", f" {ceiling:.1f}"))
    labels, values, colours, texts = map(list, zip(*bars))
    fig, ax = plt.subplots(figsize=(max(8.5, 4.0 + 1.5 * len(runs)), 1.0 + 0.6 * len(labels)))
    rows = list(range(len(labels)))[::-1]  # the first run on top
    ax.barh(rows, values, color=colours)
    for y, v, text in zip(rows, values, texts):
        ax.text(v, y, text, va="center", fontsize=8)
    ax.set_yticks(rows, labels, fontsize=8)
    longest = max(values + [0.0])
    ax.set_xlim(0, longest * 1.45 if longest > 0 else 1.0)  # room for the labels; never a zero range
    ax.set_xlabel(prose.tell(lang, "tokens/s at batch 1"))
    ax.set_title(prose.tr(title, lang), fontsize=10)
    fig.tight_layout()
    return fig


def plot_ladder(ladders: list, title: str = "", lang: str = "en"):
    """One panel per ladder: a bar per rung, each labelled with its ratio to the ladder's first rung
    with a figure, and a dashed line at that first rung. ``ladders`` holds dicts with ``title``,
    ``rungs`` (``(name, value or None)``: a rung without a figure gets no bar, its name says why),
    ``ylabel`` and optionally ``colour`` and ``empty`` (what a panel without rungs says). None when
    no ladder has a figure. Chapter 06 draws the guide's ladder beside its own
    (``ladder.beside_the_guide``), chapter 08 the run's, ``helpers.compare`` one per run."""
    import matplotlib.pyplot as plt

    def known(value) -> bool:
        return value is not None and value == value  # not None, not NaN

    if not any(known(v) for ladder in ladders for _, v in ladder["rungs"]):
        return None
    lang = chart_language(lang)
    title = prose.tr(title, lang) or prose.tell(
        lang, "Optimisation ladders: each rung's ratio to its ladder's first rung")
    fig, axes = plt.subplots(1, len(ladders), figsize=(min(13.0, max(6.0, 3.6 * len(ladders))), 3.8),
                             squeeze=False)
    for ax, ladder in zip(axes[0], ladders):
        ax.set_title(prose.translate_cell(ladder["title"], lang), fontsize=8)
        rungs = ladder["rungs"]
        first = next((float(v) for _, v in rungs if known(v)), None)
        if first is None:
            empty = prose.tr(ladder.get("empty") or prose.message("no ladder"), lang)
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=8)
            ax.set(xticks=[], yticks=[])
            continue
        heights = [float(v) if known(v) else 0.0 for _, v in rungs]
        ax.bar(range(len(rungs)), heights, color=ladder.get("colour", "#1f77b4"))
        for i, (_, v) in enumerate(rungs):
            if known(v) and first > 0:  # a ratio to a first rung of 0 has no meaning
                ax.text(i, float(v), f"{float(v) / first:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.axhline(first, color="black", lw=0.8, ls="--")
        ax.set_xticks(range(len(rungs)))
        ax.set_xticklabels([prose.translate_cell(name, lang) for name, _ in rungs], rotation=35, ha="right", fontsize=7)
        ax.set_ylim(0, max(heights) * 1.2 if max(heights) > 0 else 1.0)  # never a zero range
        ax.set_ylabel(prose.tr(ladder["ylabel"], lang), fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
