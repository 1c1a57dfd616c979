"""Several runs of the workbook on one page: ``python -m helpers.compare RUN_DIR RUN_DIR [...]``
(layer: entry points; taught with 08_report).

Reads what each run recorded through ``helpers.results.read_run`` (taught with the report chapter,
``08_report.ipynb``); nothing is re-measured. Writes ``reports/compare-<id>/index.html`` (the
``compare`` page of ``helpers.pages``) and ``figures.csv``: every key figure of every chapter, one
column per run with its device, dtype, model, profile, shape and code path, and the ratio of each run
to the reference run (the first one) where the two figures measure the same thing: same metric and
unit, same model, same dtype and same shape, both chapters finished. Every other cell says why no
ratio is given. The guide's 910B-vs-A100 table (from ``data/guide_claims.csv``) is shown beside the
runs' measured figures, labelled as the guide's claim, and the claims audit is merged over all runs.

Missing, failed or unfinished chapters and unreadable files (another results.json schema among
them) are shown with their status and reason on the page, never a crash. ``--lang zh`` writes the
page with the Chinese labels (the runtime catalog's translation of ``pages.LABELS``): verdicts and classes by their Chinese
names, and each claim in the guide's own words instead of the English gloss.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import REPO, pages, plots
from . import claims as claims_mod  # as claims_mod: functions here hold a claims table named claims
from .results import FINISHED, REPORT_CHAPTER, RunFolder, device_class, most_common, read_run

# Headline figures: (chapter, metric) pairs the plots and the guide table read.
DECODE_B1 = ("03_end_to_end", "decode_tok_s_batch1")
TTFT = ("03_end_to_end", "ttft_ms")
ROOFLINE = ("03_end_to_end", "decode_roofline_pct")
LADDER = "06_optimization_ladder"
LADDER_PREFIX = "ladder_tok_s_"
BATCHING = "04_batching"
# The guide's 910B-vs-A100 benchmark table: its section in data/guide_claims.csv.
GUIDE_TABLE_SECTION = "性能基准对比"


# --- reading one run --------------------------------------------------------------------------

@dataclass
class Run:
    """One run folder (``helpers.results.RunFolder``) with what identifies it on the page."""

    folder: RunFolder
    label: str = ""
    chapters: dict = field(init=False)  # chapter -> results.json, readable ones but the report chapter's
    status: dict = field(init=False)  # chapter -> status (``helpers.results.STATUSES``)
    reasons: dict = field(init=False)  # chapter -> error, skip reason or why unreadable
    notes: list = field(init=False)

    def __post_init__(self):
        folder = self.folder
        self.chapters = folder.results()
        shown = [c for c in folder.chapters.values() if c.name != REPORT_CHAPTER]
        self.status = {c.name: c.status for c in shown}
        self.reasons = {c.name: c.reason.strip().splitlines()[-1][:300] for c in shown if c.reason.strip()}
        self.notes = list(folder.notes)
        recorded: dict = {}  # a chapter's own notes (e.g. CPU load while timing), each text once
        for chapter, data in self.chapters.items():
            for text in data.get("notes") or []:
                recorded.setdefault(str(text), []).append(chapter)
        self.notes += [f"noted by {', '.join(chapters)}: {text}" for text, chapters in recorded.items()]
        if not self.chapters:
            self.notes.append("no readable results.json in this folder: nothing to compare")

    @property
    def path(self) -> Path:
        return self.folder.path

    @property
    def run_id(self) -> str:
        return str(self.folder.run.get("run_id") or self.path.name)

    @property
    def device(self) -> str:
        return self.folder.device

    @property
    def device_class(self) -> str:
        return device_class(self.device)

    @property
    def device_name(self) -> str:
        names = [(d["environment"].get("device_properties") or {}).get("name") for d in self.chapters.values()
                 if isinstance(d["environment"].get("device_properties"), dict)]
        return most_common(names) or str((self.folder.run.get("environment") or {}).get("device_name") or "")

    @property
    def model(self) -> str:
        recorded = self.chapters.get("00_environment_check", {}).get("metrics", {}).get("model", {})
        return str(recorded.get("value") or "") or most_common(
            d["parameters"].get("model") for d in self.chapters.values())

    @property
    def dtype(self) -> str:
        recorded = self.chapters.get("00_environment_check", {}).get("metrics", {}).get("model", {})
        return (str(recorded.get("dtype") or "")
                or most_common(e.get("dtype") for d in self.chapters.values()
                               for k, e in d["metrics"].items() if k in d["key_figures"])
                or most_common(d["parameters"].get("dtype") for d in self.chapters.values()))

    @property
    def profile(self) -> str:
        return str(self.folder.run.get("profile") or "") or most_common(
            d["parameters"].get("profile") for d in self.chapters.values())

    def describe(self) -> str:
        return " · ".join(filter(None, (self.device_class or self.device or "device ?", self.dtype or "dtype ?",
                                        self.model or "model ?", self.profile and f"profile {self.profile}")))


def label_runs(runs: list[Run]) -> list[Run]:
    """Unique, short labels: the folder name (as the claims audit's ``decided_by`` names a run), with
    the parent folder (or a number) where names repeat."""
    names = [r.path.resolve().name for r in runs]
    counts = Counter(names)
    seen: Counter = Counter()
    for run, name in zip(runs, names):
        label = name
        if counts[name] > 1:
            label = f"{run.path.resolve().parent.name}/{name}"
            seen[label] += 1
            if seen[label] > 1:
                label = f"{label} ({seen[label]})"
        run.label = label
    return runs


# --- figures and their comparability ----------------------------------------------------------

@dataclass
class Cell:
    """One run's figure for one row of the comparison, with its context or the reason it is absent."""

    value: Any = None
    unit: str = ""
    device: str = ""
    dtype: str = ""
    model: str = ""
    shape: str = ""
    code_path: str = ""
    status: str = ""  # the chapter's status in that run
    missing: str = ""  # why there is no value

    @property
    def number(self) -> Optional[float]:
        return _as_number(self.value)


def _as_number(value: Any) -> Optional[float]:
    """A recorded value as a float; None for anything else (a bool is a yes/no, not a number)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def chapter_cell(run: Run, chapter: str, **figure) -> Cell:
    """A figure of a readable chapter: the chapter's device and model unless the figure names its own."""
    data = run.chapters[chapter]
    device = figure.pop("device", "") or data.get("environment", {}).get("device") or run.device
    return Cell(device=str(device), model=str(data.get("parameters", {}).get("model") or run.model),
                status=run.status.get(chapter, "not run"), **figure)


def chapter_dtype(run: Run, chapter: str) -> str:
    """The dtype most of a chapter's figures name, else the run's."""
    return most_common(e.get("dtype") for e in run.chapters[chapter]["metrics"].values()) or run.dtype


def figure_cell(run: Run, chapter: str, key: str) -> Cell:
    data = run.chapters.get(chapter)
    status = run.status.get(chapter, "not run")
    if data is None:
        why = run.reasons.get(chapter, "")
        return Cell(status=status, missing=f"chapter {status}" + (f": {why}" if why else ""))
    entry = data["metrics"].get(key)
    if entry is None or entry.get("value") is None:
        return Cell(status=status, missing=f"not recorded (chapter {status})")
    return chapter_cell(run, chapter, value=entry.get("value"), device=entry.get("device"),
                        **{k: str(entry.get(k) or "") for k in ("unit", "dtype", "shape", "code_path")})


def why_not_comparable(ref: Cell, other: Cell, ref_label: str, other_label: str) -> str:
    """'' when ``other / ref`` measures the same thing twice; else every reason it does not."""
    pair = ((ref, ref_label), (other, other_label))
    if ref.missing or other.missing:
        return "; ".join(f"no figure in {label} ({c.missing})" for c, label in pair if c.missing)
    reasons = [f"chapter {c.status} in {label}" for c, label in pair if c.status not in FINISHED]
    if ref.number is None or other.number is None:
        reasons.append("not a number")
    for name in ("unit", "model", "dtype", "shape"):
        a, b = getattr(ref, name), getattr(other, name)
        if a != b:
            reasons.append(f"{name} differs ({a or 'none'} vs {b or 'none'})")
    if not reasons and ref.number == 0:
        reasons.append(f"the {ref_label} figure is 0")
    return "; ".join(reasons)


def batch_sweep_cell(run: Run, batch: int, column: str = "tokens_per_s_aggregate",
                     unit: str = "tok/s") -> Cell:
    """A point of chapter 04's batch sweep table (decode rate at batch 8 is not a key figure)."""
    data = run.chapters.get(BATCHING)
    status = run.status.get(BATCHING, "not run")
    if data is None:
        return Cell(status=status, missing=f"chapter {status}")
    rows = [r for r in data.get("tables", {}).get("batch_sweep") or [] if isinstance(r, dict)]
    row = next((r for r in rows if r.get("point") == batch), None)
    if row is None:
        ran = sorted(r.get("point") for r in rows if isinstance(r.get("point"), int))
        return Cell(status=status, missing=f"batch {batch} not in this run's sweep (ran {ran or 'none'})")
    if row.get("status") != "ok" or row.get(column) is None:
        why = f"batch {batch}: {row.get('status', '?')} {row.get('error') or ''}"
        return Cell(status=status, missing=why.strip())
    new_tokens = data.get("parameters", {}).get("new_tokens", "?")
    return chapter_cell(run, BATCHING, value=row[column], unit=unit, dtype=chapter_dtype(run, BATCHING),
                        shape=f"batch {batch}, prompt {row.get('prompt_tokens', '?')} tokens, "
                              f"{new_tokens} new tokens",
                        code_path=str(row.get("code_path") or f"chapter 04 batch_sweep table, {column}"))


DERIVED = {
    ("04_batching", "decode_tok_s_batch8"): lambda run: batch_sweep_cell(run, 8),
}
KEY_FIGURE = "key figure"


def cell_for(run: Run, chapter: str, key: str) -> Cell:
    return DERIVED[(chapter, key)](run) if (chapter, key) in DERIVED else figure_cell(run, chapter, key)


def compared(runs: list[Run], reference: int = 0):
    """Per row (every key figure any run marks, then the derived ones some run has), in chapter
    order: chapter, key, source and per run ``(run, cell, ratio to the reference, why no ratio)``."""
    keys = list(dict.fromkeys((c, k) for c in sorted({c for r in runs for c in r.chapters})
                              for r in runs for k in r.chapters.get(c, {}).get("key_figures", [])))
    keys += [k for k in DERIVED if k not in keys and any(cell_for(r, *k).number is not None for r in runs)]
    ref = runs[reference]
    for chapter, key in sorted(keys, key=lambda k: k[0]):  # stable: chapters in order, keys as recorded
        source = KEY_FIGURE if (chapter, key) not in DERIVED else \
            "chapter 04 batch_sweep table, batch 8 aggregate"
        ref_cell = cell_for(ref, chapter, key)
        per_run = []
        for run in runs:
            cell = cell_for(run, chapter, key)
            why = "reference run" if run is ref else why_not_comparable(ref_cell, cell, ref.label, run.label)
            ratio = cell.number / ref_cell.number if not why else None  # the reference's why is "reference run"
            per_run.append((run, cell, ratio, why))
        yield chapter, key, source, per_run


def comparison_table(runs: list[Run], reference: int = 0):
    """Long-form table: one row per figure and run, with the ratio to the reference run or why not."""
    import pandas as pd

    return pd.DataFrame([
        {"chapter": chapter, "figure": key, "source": source, "run": run.label, "value": cell.value,
         "unit": cell.unit, "device": cell.device or run.device, "dtype": cell.dtype,
         "model": cell.model or run.model, "profile": run.profile, "shape": cell.shape,
         "code_path": cell.code_path, "chapter_status": cell.status, "missing": cell.missing,
         "reference": runs[reference].label, "ratio_to_reference": ratio, "why_no_ratio": why}
        for chapter, key, source, per_run in compared(runs, reference)
        for run, cell, ratio, why in per_run])


def wide_table(long):
    """One row per figure, one group of columns per run (value and context), ratios to the reference."""
    import pandas as pd

    out = []
    for (chapter, key), group in long.groupby(["chapter", "figure"], sort=False):
        row = {"chapter": chapter, "figure": key, "source": group["source"].iloc[0]}
        for _, r in group.iterrows():
            for col in ("value", "unit", "device", "dtype", "model", "profile", "shape", "code_path",
                        "chapter_status", "missing"):
                row[f"{r['run']}: {col}"] = r[col]
            if r["run"] != r["reference"]:
                row[f"{r['run']} / {r['reference']}"] = r["ratio_to_reference"]
                row[f"{r['run']} / {r['reference']}: why no ratio"] = r["why_no_ratio"]
        out.append(row)
    return pd.DataFrame(out)


# --- the guide's table beside the runs --------------------------------------------------------

def guide_benchmark_claims(claims_table=None):
    """The guide's 910B-vs-A100 rows (decode tok/s, first-token ms, memory GB) from the claims table.

    Each row keeps the hardware it is about (the table's ``hardware`` column), the model and the
    weights' dtype, so nothing here is typed twice.
    """
    table = claims_mod.load_claims() if claims_table is None else claims_table
    rows = table[table["section"].astype(str).str.contains(GUIDE_TABLE_SECTION) & (table["kind"] == "performance")]
    out = []
    for claim in rows.to_dict(orient="records"):
        args = claims_mod.parse_args(claim["args"])
        hardware = str(claim.get("hardware") or "")
        about = claims_mod.HARDWARE.get(hardware)
        if claim["unit"] not in ("tok/s", "ms", "GB") or not about:
            continue
        out.append({"id": claim["id"], "unit": claim["unit"], "about": about, "hardware": hardware,
                    "device": args.get("device", ""), "model": str(claim.get("model") or ""),
                    "weights": args.get("weights", ""), "value": claims_mod.number(claim["claimed_value"]),
                    "text_zh": claim["text_zh"], "gloss_en": claim["gloss_en"], "metric": args.get("metric", "")})
    return out


def memory_cell(run: Run) -> Cell:
    """Peak memory of batch-1 generation, in GB like the guide's table.

    From chapter 06's first ladder rung (native eager, batch 1: what the claims audit reads), else
    chapter 04's batch-1 sweep point.
    """
    rows = (run.chapters.get(LADDER) or {}).get("tables", {}).get("ladder") or []
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    peak = first.get("peak_memory_bytes")
    if first.get("status") == "ok" and isinstance(peak, (int, float)) and peak > 0:
        return chapter_cell(run, LADDER, value=peak / 1e9, unit="GB",
                            dtype=str(first.get("dtype") or chapter_dtype(run, LADDER)),
                            shape=f"batch {first.get('batch_size') or 1}",
                            code_path=f"chapter 06 ladder, rung {first.get('rung', '?')}, peak memory")
    cell = batch_sweep_cell(run, 1, column="peak_memory_bytes", unit="bytes")
    if cell.number is not None:
        sweep = run.chapters[BATCHING].get("tables", {}).get("batch_sweep") or []
        kind = next((r.get("memory_kind") for r in sweep if isinstance(r, dict) and r.get("point") == 1), "")
        cell.value, cell.unit = cell.number / 1e9, "GB"
        cell.code_path = f"chapter 04 batch_sweep, batch 1, {kind or 'peak memory'}"
    elif cell.missing.startswith("chapter"):
        cell.missing = f"chapters 04 and 06 did not record it ({cell.missing} for 04)"
    return cell


def guide_table(runs: list[Run], claims_table=None, verdict_table=None, lang: str = "en"):
    """Rows: decode tok/s, first token ms, memory GB. Columns: the guide's claims per hardware, then each run.

    With the merged claims audit (``verdict_table``), each claim cell also says its verdict and which run
    decided it. Row and column names come from the compare page's label table.
    """
    import pandas as pd

    text = pages.labels("compare", lang)
    names, rows_named = text["guide_columns"], text["guide_rows"]
    measured = {"tok/s": lambda r: figure_cell(r, *DECODE_B1), "ms": lambda r: figure_cell(r, *TTFT),
                "GB": memory_cell}
    claims = guide_benchmark_claims(claims_table)
    decided = {v["id"]: text["guide_verdict"].format(verdict=pages.say("common.verdicts", v["verdict"], lang))
               + (text["guide_decided"].format(run=v["decided_by"]) if v.get("decided_by") else "")
               for v in (verdict_table.to_dict(orient="records") if verdict_table is not None else [])}
    rows = []
    for unit, read in measured.items():
        row = {names["figure"]: rows_named[unit]}
        for claim in (c for c in claims if c["unit"] == unit):
            about = ", ".join(filter(None, (claim["model"], claim["weights"])))
            hardware = text["hardware"].get(claim["hardware"], claim["about"])
            row[names["claim"].format(about=hardware)] = text["guide_claim"].format(
                value=f"{claim['value']:g}", unit=unit, id=claim["id"], about=f"; {about}" if about else ""
            ) + decided.get(claim["id"], "")
        for run in runs:
            cell = read(run)
            row[names["measured"].format(run=run.label)] = (
                f"{_short(cell.number)} {cell.unit} ({cell.model}, {cell.dtype or '?'}, "
                f"{device_class(cell.device) or cell.device}; {cell.shape})"
                if cell.number is not None else (cell.missing or "not a number"))
        rows.append(row)
    return pd.DataFrame(rows)


def merged_claims(runs: list[Run]):
    """(the claims audit over all runs, '') or (None, why it failed): the page renders either way."""
    try:
        return claims_mod.verdicts([str(r.path) for r in runs]), ""
    except Exception as exc:  # noqa: BLE001  (a broken claims table must not lose the comparison)
        return None, f"{type(exc).__name__}: {exc}"


# --- plots ------------------------------------------------------------------------------------

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _short(value: float) -> str:
    """A bar label without exponents: 1799, 42.8, 2.02."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def plot_runs(runs: list[Run], series: list, ylabel: str, title: str, fmt="{}", width=2.0, height=3.6):
    """Bars per run, side by side for each series ``(cells, colour or None, legend label or None)``;
    None when no run measured any of them."""
    import matplotlib.pyplot as plt

    if all(c.number is None for cells, _, _ in series for c in cells):
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, width * len(runs)), height))
    each = 0.8 / len(series)
    for k, (cells, color, label) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * each for i in range(len(runs))]
        heights = [c.number if c.number is not None else 0.0 for c in cells]
        ax.bar(xs, heights, width=each, color=color or [COLORS[i % len(COLORS)] for i in range(len(runs))],
               label=label)
        top = max(heights + [1e-9])
        for x, c in zip(xs, cells):
            text = fmt.format(_short(c.number)) if c.number is not None else "not\nmeasured"
            ax.text(x, (c.number or 0.0) + top * 0.02, text, ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, top * 1.25)
    ax.set_ylabel(ylabel)
    if len(series) > 1:  # room above the tallest bar for the legend
        top = max([c.number for cells, _, _ in series for c in cells if c.number is not None] + [1e-9])
        ax.set_ylim(0, top * 1.3)
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([f"{r.label}\n{r.device_class or r.device or '?'} · {r.dtype or '?'}\n{r.model or '?'}"
                        for r in runs], fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_decode(runs: list[Run]):
    """Decode tok/s at batch 1 (chapter 03) and batch 8 (chapter 04's sweep, aggregate) per run."""
    batch1 = [figure_cell(r, *DECODE_B1) for r in runs]
    batch8 = [batch_sweep_cell(r, 8) for r in runs]
    return plot_runs(runs, [(batch1, "#1f77b4", "batch 1 (ch. 03, per user)"),
                            (batch8, "#ff7f0e", "batch 8 (ch. 04 sweep, aggregate)")],
                     "tokens/s", "Decode rate per run (each bar: its run's model, dtype, device)",
                     width=2.2, height=3.8)


def plot_ttft(runs: list[Run]):
    return plot_runs(runs, [([figure_cell(r, *TTFT) for r in runs], None, None)], "ms",
                     "Time to first token per run (chapter 03; shape in the figures table)")


def plot_roofline(runs: list[Run]):
    """Each run's batch-1 decode (chapter 03) against the roofline chapter 03 recorded with it."""
    rows = []
    for run in runs:
        entry = (run.chapters.get(ROOFLINE[0]) or {}).get("metrics", {}).get(ROOFLINE[1]) or {}
        rows.append((run.label, figure_cell(run, *DECODE_B1).number, _as_number(entry.get("ceiling_tok_s")),
                     figure_cell(run, *ROOFLINE).number))
    return plots.plot_roofline(rows, "Batch-1 decode as a share of each run's own bandwidth roofline (chapter 03)",
                               ceiling_name="its roofline (ch. 03)")


def ladder_rungs(run: Run) -> list[tuple[str, float]]:
    """Per-rung tok/s (``ladder_tok_s_<rung>``) in the order chapter 06 recorded them."""
    metrics = (run.chapters.get(LADDER) or {}).get("metrics", {})
    return [(key[len(LADDER_PREFIX):], value) for key, entry in metrics.items()
            if key.startswith(LADDER_PREFIX) and (value := _as_number(entry.get("value"))) is not None]


def plot_ladder(runs: list[Run]):
    """One panel per run: its ladder's rungs in tok/s, each as a ratio to that run's first rung."""
    panels = [{"title": f"{run.label}\n{run.device_class or '?'} · {run.dtype or '?'} · {run.model or '?'}",
               "rungs": [(name.replace("_", " "), value) for name, value in ladder_rungs(run)],
               "ylabel": "tokens/s", "colour": COLORS[0],
               "empty": f"no ladder in this run\n(chapter 06 {run.status.get(LADDER, 'not run')})"} for run in runs]
    return plots.plot_ladder(panels, "Optimisation ladder per run (chapter 06): tok/s per rung, ratio to the run's "
                                     "first rung;\nbatch rungs are aggregate over the batch")


# --- the page ---------------------------------------------------------------------------------

def figures_view(runs: list[Run], reference: int = 0) -> list[dict]:
    """The key-figures table as the template draws it: per row, each run's cell and each ratio or why not."""
    rows = []
    for chapter, key, source, per_run in compared(runs, reference):
        cells, ratios = [], []
        for run, cell, ratio, why in per_run:
            context = " · ".join(filter(None, (device_class(cell.device) or cell.device, cell.dtype,
                                               cell.model, cell.shape, cell.code_path)))
            cells.append({"missing": cell.missing, "value": pages.cell_text(cell.value)[:120],
                          "unit": cell.unit, "context": context,
                          "status": "" if cell.status in FINISHED else cell.status})
            if run is not runs[reference]:
                ratios.append((f"{ratio:.3g}x" if ratio is not None else "", why))
        rows.append({"chapter": chapter, "key": key, "source": "" if source == KEY_FIGURE else source,
                     "cells": cells, "ratios": ratios})
    return rows


def compare(run_dirs: list, out_dir: "str | Path", reference: int = 0, claims_table=None, lang: str = "en") -> dict:
    """Read the runs, write ``index.html`` and ``figures.csv`` into ``out_dir``; return what was written."""
    if len(run_dirs) < 2:
        raise ValueError(f"RUN_DIR: got {len(run_dirs)} run folder(s); give two or more to compare "
                         "(make compare RUNS=\"reports/a reports/b\")")
    resolved = [Path(p).resolve() for p in run_dirs]
    repeated = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if repeated:
        raise ValueError(f"RUN_DIR: {', '.join(repeated)} given more than once; give different run folders")
    if not 0 <= reference < len(run_dirs):
        raise ValueError(f"reference={reference}: choose 0..{len(run_dirs) - 1} (the position of a RUN_DIR)")
    runs = label_runs([Run(read_run(p)) for p in run_dirs])
    long = comparison_table(runs, reference)
    table, claims_error = merged_claims(runs)
    guide = guide_table(runs, claims_table, table, lang)
    charts = [("decode", plot_decode(runs)), ("ttft", plot_ttft(runs)), ("roofline", plot_roofline(runs)),
              ("ladder", plot_ladder(runs))]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "figures.csv"
    wide_table(long).to_csv(csv_path, index=False)
    # The claim as the reader's edition quotes it: the guide's own Chinese on a Chinese page.
    claim_text = "gloss_en" if lang == "en" else "text_zh"
    columns = ["id", "section", claim_text, "verdict", "verdict_class", "decided_by", "device_class", "elsewhere",
               "elsewhere_run", "detail"]
    shown = None
    if table is not None:
        shown = table[columns].copy()
        shown["verdict"] = [pages.say("common.verdicts", v, lang) for v in shown["verdict"]]
        shown["verdict_class"] = [pages.say("common.verdict_classes", v, lang) for v in shown["verdict_class"]]
    html_path = pages.write(
        out_dir / "index.html", "compare", lang, runs=runs, reference=runs[reference].label, guide=guide,
        figures=figures_view(runs, reference), plots=charts, claims=shown,
        claims_error=claims_error, counts={} if table is None else claims_mod.verdict_counts(table),
        widths={"id": 4, "section": 11, claim_text: 19, "verdict": 9, "verdict_class": 9, "decided_by": 8,
                "device_class": 5, "elsewhere": 11, "elsewhere_run": 7, "detail": 24})
    return {"html": html_path, "csv": csv_path, "runs": runs, "figures": long, "guide": guide,
            "claims": table, "claims_error": claims_error}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="two or more run folders (reports/<run-id>)")
    parser.add_argument("--id", help="name of the comparison: reports/compare-<id>/ (default: date and time)")
    parser.add_argument("--reports-dir", default=os.environ.get("WORKBOOK_REPORTS", str(REPO / "reports")),
                        help="where compare-<id>/ is written (default: reports/ or WORKBOOK_REPORTS)")
    parser.add_argument("--reference", type=int, default=0,
                        help="position of the run the ratios divide by (default 0: the first RUN_DIR)")
    parser.add_argument("--lang", default="en", choices=pages.languages(), help="language of the page's labels")
    args = parser.parse_args(argv)
    compare_id = args.id or time.strftime("%Y%m%d-%H%M%S")
    if not compare_id or "/" in compare_id or compare_id.startswith("."):
        print(f"error: --id {compare_id!r}: use a plain folder name such as npu-vs-a100", file=sys.stderr)
        return 2
    out_dir = Path(args.reports_dir) / f"compare-{compare_id}"
    try:
        written = compare(args.run_dirs, out_dir, reference=args.reference, lang=args.lang)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {out_dir} ({exc.strerror or exc}); pass --reports-dir or set "
              "WORKBOOK_REPORTS to a writable folder", file=sys.stderr)
        return 2
    for run in written["runs"]:
        print(f"{run.label}: {run.describe()} ({len(run.notes)} note(s))")
    print(f"wrote {written['html']}\nwrote {written['csv']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
