"""The run's summary for ``08_report.ipynb``: chapter status, key figures, plots and an HTML page.

Everything here reads what the chapters recorded (``results.json`` and the runner's ``run.json``);
nothing is re-measured. Each plot returns ``None`` when its chapter's figures are missing, so the
report renders for partial or failed runs. The guide's numbers drawn beside ours come from the
claims table (``helpers.claims``), never typed in here.
"""
from __future__ import annotations

import base64
import html
import io
import json
import time
from pathlib import Path
from typing import Any, Optional

from .claims import REPORT_CHAPTER, number, parse_args
from .results import load_all, metric

CHAPTERS = ("00_environment_check", "01_operator_verification", "02_ffn_fusion", "03_end_to_end",
            "04_batching", "05_int8_quantization", "06_optimization_ladder")
FIGSIZE = (7, 3.6)


def chapter_status(run_dir: "str | Path"):
    """One row per chapter: status (ok / skipped / failed / did not run), reason, figure count."""
    import pandas as pd

    run_dir = Path(run_dir)
    results = {k: v for k, v in load_all(run_dir).items() if k != REPORT_CHAPTER}
    runner: dict[str, dict] = {}
    try:
        runner = {e["notebook"]: e for e in json.loads((run_dir / "run.json").read_text())["notebooks"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    names = sorted(set(CHAPTERS) | set(results) | (set(runner) - {REPORT_CHAPTER}))
    rows = []
    for name in names:
        data, entry = results.get(name), runner.get(name, {})
        status = entry.get("status") or (data or {}).get("status") or "did not run"
        if status == "running" and data is not None and name not in runner:
            status = "did not finish"
        if data is None and not entry:
            status = "did not run"
        reason = entry.get("error") or (data or {}).get("status_reason") or ""
        rows.append({"chapter": name, "status": status, "reason": reason[:300],
                     "figures": len((data or {}).get("metrics", {})),
                     "device": str((data or {}).get("environment", {}).get("device", "")),
                     "duration_s": round(entry["duration_s"], 1) if entry.get("duration_s") else None})
    return pd.DataFrame(rows)


def key_figures(results: dict):
    """Every chapter's key figures with unit and context, as recorded."""
    import pandas as pd

    rows = []
    for chapter in sorted(results):
        if chapter == REPORT_CHAPTER:
            continue
        metrics = results[chapter].get("metrics", {})
        for key in results[chapter].get("key_figures", []):
            entry = metrics.get(key)
            if entry is None:
                continue
            rows.append({"chapter": chapter, "key": key, "value": entry.get("value"), "unit": entry.get("unit", ""),
                         **{k: entry.get(k, "") for k in ("device", "dtype", "shape", "code_path")}})
    return pd.DataFrame(rows, columns=["chapter", "key", "value", "unit", "device", "dtype", "shape", "code_path"])


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


def plot_roofline(results: dict):
    """Batch-1 decode measured in chapter 03 against chapter 00's bandwidth ceiling."""
    import matplotlib.pyplot as plt

    ceiling = _value(results, "00_environment_check.decode_ceiling_tok_s")
    measured = _value(results, "03_end_to_end.decode_tok_s_batch1")
    if measured is None:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    labels, values = ["measured decode (ch. 03)"], [measured]
    if ceiling:
        labels.append("bandwidth ceiling (ch. 00)")
        values.append(ceiling)
    ax.barh(labels, values, color=["#1f77b4", "#cccccc"][:len(values)])
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.1f}", va="center")
    pct = f" = {100 * measured / ceiling:.0f}% of the ceiling" if ceiling else ""
    ax.set_xlabel("tokens/s at batch 1")
    ax.set_title(f"Roofline on {_device(results, '03_end_to_end')}{pct}")
    fig.tight_layout()
    return fig


def plot_batching(results: dict, claims_table):
    """Throughput, latency and memory growth over batch 1: chapter 04 beside the guide's claim."""
    import matplotlib.pyplot as plt

    series = {"throughput ratio (x)": "batch_throughput_ratio_{}",
              "latency growth (%)": "batch_latency_growth_pct_{}",
              "memory growth (%)": "batch_memory_growth_pct_{}"}
    if all(_value(results, f"04_batching.{k.format(b)}") is None for k in series.values() for b in (4, 8)):
        return None
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
    for ax, (title, key) in zip(axes, series.items()):
        for label, source, marker in (("measured", "results", "o-"), ("guide's claim", "claims", "s--")):
            xs, ys = [1], [1.0 if "ratio" in key else 0.0]
            for b in (4, 8):
                dotted = f"04_batching.{key.format(b)}"
                v = _value(results, dotted) if source == "results" else guide_value(claims_table, dotted)
                if v is not None:
                    xs.append(b)
                    ys.append(v)
            if len(xs) > 1:
                ax.plot(xs, ys, marker, label=label)
        ax.set_xlabel("batch size")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([1, 4, 8])
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Batching: measured on {_device(results, '04_batching')} vs the guide's 910B table", fontsize=10)
    fig.tight_layout()
    return fig


def plot_int8(results: dict, claims_table):
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
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    labels = [f"guide: {expr} tok/s" for expr in guide] + (["measured here, batch 1"] if speed is not None else [])
    values = list(guide.values()) + ([speed] if speed is not None else [])
    colours = ["#ff7f0e"] * len(guide) + ["#1f77b4"] * (speed is not None)
    if values:
        left.barh(labels, values, color=colours)
        for i, v in enumerate(values):
            left.text(v, i, f" {v:.2f}x", va="center", fontsize=8)
        left.axvline(1.0, color="black", lw=0.8)
        left.set_xlim(0, max(values) * 1.25)
    left.set_xlabel("INT8 / 16-bit decode tok/s (x, higher is faster)")
    left.set_title("INT8 decode speedup", fontsize=10)
    if ppl is not None:
        right.barh([0], [ppl], color="#1f77b4", height=0.5)
        right.set_yticks([])
        span = max(abs(ppl) * 1.6, 0.5)
        right.set_xlim(-span, span)
        right.axvline(0, color="black", lw=0.8)
        right.text(ppl, 0, f" {ppl:+.2f}%", va="center", ha="left" if ppl >= 0 else "right", fontsize=8)
        right.set_title("perplexity change measured here\n(the guide gives no quality figure)", fontsize=9)
    else:
        right.text(0.5, 0.5, "perplexity not recorded in this run", ha="center", va="center",
                   transform=right.transAxes)
        right.set_yticks([])
        right.set_title("perplexity change", fontsize=10)
    right.set_xlabel("vs 16-bit (%, lower is better)")
    fig.suptitle(f"INT8 on {_device(results, '05_int8_quantization')} (measured) vs the guide's 910B figures",
                 fontsize=10)
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


def plot_ladder(results: dict):
    """Chapter 06's ladder beside the guide's, as ratios to each one's own baseline."""
    import pandas as pd

    from .ladder import plot_comparison

    rows = (results.get("06_optimization_ladder") or {}).get("tables", {}).get("ladder")
    if not rows:
        return None
    table = pd.DataFrame(rows)
    if "status" not in table or not (table["status"] == "ok").any():
        return None
    return plot_comparison(table, label=f"measured here ({_device(results, '06_optimization_ladder')})")


def plot_verdicts(verdict_table):
    """How many claims fall in each verdict class (colours as in the claims report's badges)."""
    import matplotlib.pyplot as plt

    from .claims import CLASS_COLOURS, verdict_counts

    counts = {k: v for k, v in verdict_counts(verdict_table).items() if v}
    order = list(counts)[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(order) + 1.2))
    ax.barh(order, [counts[c] for c in order], color=[CLASS_COLOURS[c] for c in order])
    for i, c in enumerate(order):
        ax.text(counts[c], i, f" {counts[c]}", va="center", fontsize=8)
    ax.set_xlim(0, max(counts.values()) * 1.15)
    ax.set_xlabel("claims")
    ax.set_title(f"Verdict classes of {len(verdict_table)} claims of the two guides", fontsize=10)
    fig.tight_layout()
    return fig


CLAIMS_PAGE_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0 auto;padding:1em 1.2em;max-width:1240px;line-height:1.4;color:#1f2328}
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #d0d7de}h3{font-size:1.05em;margin-top:1.2em}
table{border-collapse:collapse;width:100%;table-layout:fixed;font-size:88%}
td,th{border:1px solid #d0d7de;padding:4px 6px;vertical-align:top;text-align:left;overflow-wrap:anywhere;word-break:break-word}
th{background:#f6f8fa}
.claims col.id{width:4.5em}.claims col.claim{width:38%}.claims col.verdict{width:19%}
.zh{font-family:"Noto Sans CJK SC","Noto Sans SC","Microsoft YaHei",sans-serif;background:#f6f8fa;padding:2px 4px;
 white-space:pre-wrap;display:block;margin-bottom:3px}
.en{display:block;color:#3b434b}.value{display:block;color:#57606a;font-size:92%;margin-top:2px}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:1px 8px;font-size:85%;font-weight:600;white-space:normal}
.elsewhere{display:block;font-size:90%;color:#0969da;margin-top:3px}.by{display:block;font-size:85%;color:#57606a}
.legend col.c{width:15em}.legend col.n{width:5em}
img{max-width:100%;height:auto}
"""


def _badge(cls: str, text: str) -> str:
    from .claims import CLASS_COLOURS

    slug = cls.replace(" ", "-")
    return (f'<span class="badge v-{slug}" data-verdict-class="{html.escape(cls)}" '
            f'style="background:{CLASS_COLOURS.get(cls, "#57606a")}">{html.escape(text)}</span>')


def claims_table_html(audit) -> str:
    """The claims grouped by guide (seed) and section: quote + gloss, verdict badge, what decided it."""
    from .claims import GUIDES

    parts = []
    for seed, by_seed in audit.groupby("seed", sort=False):
        parts.append(f"<h2>{html.escape(GUIDES.get(seed, seed))}</h2>")
        for section, rows in by_seed.groupby("section", sort=False):
            parts.append(f"<h3>{html.escape(str(section))}</h3>")
            parts.append('<table class="claims"><colgroup><col class="id"><col class="claim"><col class="verdict">'
                         '<col></colgroup><tr><th>id</th><th>the guide says (Chinese quote, English gloss)</th>'
                         '<th>verdict</th><th>why (evidence)</th></tr>')
            for r in rows.to_dict(orient="records"):
                op = parse_args(r.get("args", "")).get("op", "") if r.get("rule") == "threshold" else ""
                value = f"{op} {r['claimed_value']} {r.get('unit', '')}".strip()
                about = {"npu": "about a 910B", "cuda": "about an A100"}.get(r.get("hardware", ""), "")
                about += f" running {r['model']}" if r.get("model") else ""
                shown_by = f" (run {r['elsewhere_run']})" if r.get("elsewhere_run") else ""
                elsewhere = (f'<span class="elsewhere">{html.escape(r["elsewhere"] + shown_by)}</span>'
                             if r.get("elsewhere") else "")
                by = ", ".join(x for x in (f"run {r['decided_by']}" if r.get("decided_by") else "",
                                           r.get("device_class") or "") if x)
                parts.append(
                    f"<tr><td>{html.escape(r['id'])}</td>"
                    f'<td><span class="zh" lang="zh">{html.escape(r["text_zh"])}</span>'
                    f'<span class="en">{html.escape(r["gloss_en"])}</span>'
                    f'<span class="value">claimed: {html.escape(value)}{"; " + about if about else ""}</span></td>'
                    f"<td>{_badge(r['verdict_class'], r['verdict'])}{elsewhere}</td>"
                    f"<td>{html.escape(r['detail'])}<span class=\"by\">evidence: {html.escape(r['evidence'])}"
                    f"{'; decided by ' + html.escape(by) if by else ''}</span></td></tr>")
            parts.append("</table>")
    return "".join(parts)


def claims_report_html(title: str, audit, blocks: list = ()) -> str:
    """The claims report: legend with counts, the grouped claims, then ``blocks`` (as ``html_page``)."""
    from .claims import VERDICT_CLASSES, verdict_counts

    counts = verdict_counts(audit)
    legend = "".join(f"<tr><td>{_badge(c, c)}</td><td>{counts[c]}</td><td>{html.escape(m)}</td></tr>"
                     for c, m in VERDICT_CLASSES.items())
    extra = []
    for kind, content in blocks:
        if content is None:
            continue
        if kind in ("h2", "h3", "p"):
            extra.append(f"<{kind}>{html.escape(str(content))}</{kind}>")
        elif kind == "table":
            extra.append(content.to_html(index=False, na_rep="", border=0))
        elif kind == "figure":
            extra.append(f'<img alt="figure" src="data:image/png;base64,{figure_png_base64(content)}">')
        else:
            raise ValueError(f"block kind {kind!r}; use h2, h3, p, table or figure")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{CLAIMS_PAGE_CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p><em>Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from the runs' "
            "results.json files; nothing re-measured. A verdict of reproduced or contradicted comes only from a "
            "measurement on the hardware class a claim is about, with a comparable model; the same technique "
            "measured elsewhere is shown in blue under the claim's own verdict.</em></p>"
            f'<h2>Verdict classes</h2><table class="legend"><colgroup><col class="c"><col class="n"><col></colgroup>'
            f'<tr><th>class</th><th>claims</th><th>meaning</th></tr>'
            f"{legend}</table>{claims_table_html(audit)}{''.join(extra)}</body></html>")


def write_claims_report(path: "str | Path", title: str, audit, blocks: list = ()) -> Path:
    """Write ``claims_report_html`` atomically (readers never see half a page)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(claims_report_html(title, audit, blocks), encoding="utf-8")
    tmp.replace(path)
    return path


# --- a code-free HTML page ---------------------------------------------------------------------

def figure_png_base64(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def html_page(title: str, blocks: list[tuple[str, Any]]) -> str:
    """Blocks are ("h2"|"p"|"pre", text), ("table", DataFrame) or ("figure", matplotlib figure)."""
    parts = []
    for kind, content in blocks:
        if content is None:
            continue
        if kind in ("h2", "h3", "p", "pre"):
            parts.append(f"<{kind}>{html.escape(str(content))}</{kind}>")
        elif kind == "table":
            parts.append(content.to_html(index=False, na_rep="", border=0, classes="data"))
        elif kind == "figure":
            parts.append(f'<img alt="figure" src="data:image/png;base64,{figure_png_base64(content)}">')
        else:
            raise ValueError(f"block kind {kind!r}; use h2, h3, p, pre, table or figure")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:90em}}table.data{{border-collapse:collapse;font-size:85%}}
table.data td,table.data th{{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}}
img{{max-width:100%}}</style></head><body><h1>{html.escape(title)}</h1>
<p><em>Generated {time.strftime("%Y-%m-%d %H:%M:%S")} from the run's results.json files; nothing re-measured.</em></p>
{''.join(parts)}</body></html>"""


def write_html(path: "str | Path", title: str, blocks: list[tuple[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(html_page(title, blocks), encoding="utf-8")
    tmp.replace(path)
    return path


# --- the runner's index page: key figures people can read, verdict counts by class ---------------

# key -> (human label, which way is better). "higher"/"lower" say which way is better; "" marks a
# figure with no better direction (a device name, a count, a yes/no check). Keys with a batch size or
# rung name at the end are matched by their prefix (see ``key_figure_label``).
KEY_FIGURE_LABELS: dict[str, tuple[str, str]] = {
    "device": ("device the run used", ""),
    "memory_bandwidth_gbps": ("memory bandwidth (large copy)", "higher"),
    "decode_ceiling_tok_s": ("batch-1 decode ceiling from bandwidth", "higher"),
    "rmsnorm_guide_shape_ms": ("RMSNorm time, fastest correct implementation", "lower"),
    "rmsnorm_noncontig_slowdown": ("RMSNorm slowdown on non-contiguous input", "lower"),
    "add_rmsnorm_fusion_speedup": ("fused add+RMSNorm speedup over eager", "higher"),
    "ffn_merged_speedup_decode": ("merged gate/up FFN speedup at decode shape", "higher"),
    "ffn_fused_max_abs_diff": ("fused FFN max abs difference vs reference", "lower"),
    "residual_norm_graph_speedup": ("residual+norm graph-mode speedup", "higher"),
    "ttft_ms": ("time to first token", "lower"),
    "decode_tok_s_batch1": ("decode speed at batch 1", "higher"),
    "decode_roofline_pct": ("batch-1 decode as share of the bandwidth ceiling", "higher"),
    "graph_mode_decode_speedup": ("graph-mode decode speedup over eager", "higher"),
    "graph_compiled_graphs": ("graphs compiled for decode", "lower"),
    "decode_kernel_floor_gbps": ("decode matmuls timed alone, achieved bandwidth", "higher"),
    "decode_overhead_share_pct": ("share of the eager decode step outside the matmul kernels", "lower"),
    "graph_compile_s": ("graph compile time", "lower"),
    "batched_outputs_match": ("batched outputs match unbatched", ""),
    "batched_outputs_match_working_dtype": ("batched outputs match unbatched (working dtype)", ""),
    "batch_throughput_ratio_": ("aggregate decode throughput vs batch 1, batch {}", "higher"),
    "kv_cache_mib_batch": ("KV-cache size, batch {}", "lower"),
    "int8_weight_bytes_ratio": ("INT8 weight bytes / 16-bit weight bytes", "lower"),
    "int8_ppl_delta_pct": ("INT8 perplexity change vs 16-bit", "lower"),
    "int8_decode_speedup_batch": ("INT8 decode speedup over 16-bit, batch {}", "higher"),
    "int8_ttft_ratio_batch": ("INT8 time to first token / 16-bit, batch {}", "lower"),
    "quantize_dynamic_ppl_ratio": ("quantize_dynamic perplexity / 16-bit", "lower"),
    "ladder_best_batch1_speedup": ("best batch-1 ladder rung over native eager", "higher"),
    "ladder_batch_throughput_ratio": ("batched ladder rung throughput over native eager batch 1", "higher"),
    "ladder_speedup_total": ("ladder speedup, last rung over first (older runs)", "higher"),
    "ladder_tok_s_": ("ladder rung {} decode speed", "higher"),
    "vllm_server_start_s": ("vLLM server start until healthy", "lower"),
    "serving_output_tok_s_c": ("served output throughput, concurrency {}", "higher"),
    "serving_ttft_p50_ms_c": ("served median time to first token, concurrency {}", "lower"),
    "engine_batch1_decode_ratio": ("vLLM batch-1 decode over our path's, same lengths", "higher"),
    "users_served_ratio": ("users served within the latency targets, vLLM over our path", "higher"),
    "claims_total": ("claims audited", ""),
    "claims_": ("claims with verdict: {}", ""),
}
UNIT_WORDS = {"x": "×", "ratio": "×"}


def key_figure_label(key: str) -> tuple[str, str]:
    """(human label, "higher" | "lower" | "") for a recorded key; unknown keys keep their name."""
    if key in KEY_FIGURE_LABELS:
        return KEY_FIGURE_LABELS[key]
    prefixes = sorted((k for k, (label, _) in KEY_FIGURE_LABELS.items() if "{}" in label),
                      key=len, reverse=True)
    for prefix in prefixes:
        if key.startswith(prefix) and len(key) > len(prefix):
            label, direction = KEY_FIGURE_LABELS[prefix]
            return label.format(key[len(prefix):].lstrip("_").replace("_", " ")), direction
    return key.replace("_", " "), ""


def round_figure(value: Any) -> str:
    """A figure at a precision its measurement supports: 3 significant digits, no float noise."""
    if isinstance(value, bool) or value is None:
        return "yes" if value is True else "no" if value is False else "–"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "–"
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 100:
            return f"{value:.0f}"
        if magnitude == 0:
            return "0"
        if magnitude >= 0.01:
            # three significant digits, trailing zeros kept: 1.00x reads as measured, 1x as exact
            return f"{value:#.3g}" if magnitude < 10 else f"{value:.1f}"
        return f"{value:.2e}"
    return str(value)


def describe_key_figure(key: str, entry: dict) -> dict:
    """What the index prints for one figure: label, rounded value with unit, direction, context."""
    label, direction = key_figure_label(key)
    unit = str(entry.get("unit") or "")
    value = round_figure(entry.get("value"))
    unit = UNIT_WORDS.get(unit, unit)
    shown = f"{value}{unit}" if unit in ("×", "%") else f"{value} {unit}".strip()
    context = ", ".join(str(entry[k]) for k in ("device", "dtype", "shape") if entry.get(k))
    return {"key": key, "label": label, "value": shown,
            "direction": {"higher": "higher is better", "lower": "lower is better"}.get(direction, ""),
            "context": context}


def key_figure_html(key: str, entry: dict) -> str:
    """One key figure as an HTML line for the index (the raw key kept as a tooltip)."""
    d = describe_key_figure(key, entry)
    direction = f' <span class="dir">({d["direction"]})</span>' if d["direction"] else ""
    context = f' <span class="ctx">{html.escape(d["context"])}</span>' if d["context"] else ""
    return (f'<span class="fig" title="{html.escape(key)}">{html.escape(d["label"])}: '
            f'<b>{html.escape(d["value"])}</b>{direction}{context}</span>')


def index_verdict_counts(run_dir: "str | Path") -> Optional[dict]:
    """Claims per verdict class for the index, once chapter 08 has run; None before that.

    Chapter 08's own ``verdict_counts`` table, so the index and the claims report (which may
    include other runs' folders) always agree; older runs without that table are counted again
    with ``helpers.claims.verdicts``. A failing audit must not break the index.
    """
    data = load_all(run_dir).get(REPORT_CHAPTER)
    if not data or data.get("status") != "ok":
        return None
    recorded = (data.get("tables") or {}).get("verdict_counts")
    if recorded:
        return {row["verdict_class"]: int(row["claims"]) for row in recorded}
    try:
        from . import claims

        return dict(claims.verdict_counts(claims.verdicts(run_dir)))
    except Exception:  # noqa: BLE001  (the index still renders without the counts)
        return None


def verdict_counts_html(counts: Optional[dict]) -> str:
    """The counts as a small table, each cell tagged with its class (``data-verdict-class``)."""
    if not counts:
        return ""
    from . import claims

    meanings = getattr(claims, "VERDICT_CLASSES", None) or getattr(claims, "VERDICTS", {})
    cells = "".join(
        f'<tr><td class="verdict" data-verdict-class="{html.escape(str(cls))}" '
        f'title="{html.escape(str(meanings.get(cls, "")))}">{html.escape(str(cls))}</td>'
        f"<td>{int(n)}</td></tr>" for cls, n in counts.items())
    return (f"<h2>Claims of the guides by verdict ({sum(int(n) for n in counts.values())} claims)</h2>"
            f'<table class="verdicts"><tr><th>verdict</th><th>claims</th></tr>{cells}</table>'
            "<p>Details, grouped by the guides' sections, are in chapter 08's claims report.</p>")
