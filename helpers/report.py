"""The run's summary for ``07_report.ipynb``: chapter status, key figures, plots and an HTML page.

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
    """INT8 speed against quality (perplexity change), with the guide's speed claim as a line."""
    import matplotlib.pyplot as plt

    speed = _value(results, "05_int8_quantization.int8_decode_speedup_batch1")
    ppl = _value(results, "05_int8_quantization.int8_ppl_delta_pct")
    if speed is None and ppl is None:
        return None
    fig, ax = plt.subplots(figsize=FIGSIZE)
    if speed is not None and ppl is not None:
        ax.scatter([ppl], [speed], s=60, zorder=3, label="INT8 measured here")
        ax.annotate(f"{speed:.2f}x, {ppl:+.2f}% ppl", (ppl, speed), textcoords="offset points", xytext=(6, 6))
    elif speed is not None:
        ax.axhline(speed, color="#1f77b4", label=f"INT8 speedup measured here ({speed:.2f}x)")
        ax.set_xticks([])
        ax.text(0.5, 0.05, "perplexity not recorded in this run", transform=ax.transAxes, ha="center")
    else:
        ax.axvline(ppl, color="#1f77b4", label=f"perplexity change measured here ({ppl:+.2f}%; no speed)")
    claim = guide_value(claims_table, "05_int8_quantization.int8_decode_speedup_batch1")
    if claim is not None:
        ax.axhline(claim, color="#ff7f0e", ls="--", label=f"guide's claim {claim:.2f}x (no quality figure given)")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xlabel("perplexity change vs 16-bit (%)")
    ax.set_ylabel("decode speedup (x)")
    ax.set_title(f"INT8 speed vs quality on {_device(results, '05_int8_quantization')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    """How many claims got each verdict."""
    import matplotlib.pyplot as plt

    from .claims import VERDICTS

    counts = verdict_table["verdict"].value_counts()
    order = [v for v in VERDICTS if v in counts][::-1]
    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.barh(order, [counts[v] for v in order], color="#1f77b4")
    for i, v in enumerate(order):
        ax.text(counts[v], i, f" {counts[v]}", va="center")
    ax.set_xlabel("claims")
    ax.set_title(f"Verdicts on {len(verdict_table)} claims of the two guides")
    fig.tight_layout()
    return fig


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
    "vllm_tok_s": ("vLLM decode speed", "higher"),
    "endpoint_tok_s": ("serving endpoint decode speed", "higher"),
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
    """Claims per verdict class for the index, once chapter 07 has run; None before that.

    Counted with ``helpers.claims.verdicts`` + ``verdict_counts`` (the same functions chapter 07
    uses), keyed by whatever classes they define; a failing audit must not break the index.
    """
    data = load_all(run_dir).get(REPORT_CHAPTER)
    if not data or data.get("status") != "ok":
        return None
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
            "<p>Details, grouped by the guides' sections, are in chapter 07's claims report.</p>")
