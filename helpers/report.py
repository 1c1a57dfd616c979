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
