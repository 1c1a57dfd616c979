"""Several runs of the workbook on one page: ``python -m helpers.compare RUN_DIR RUN_DIR [...]``.

Reads what each run recorded (``<run>/<chapter>/results.json`` and ``run.json``); nothing is
re-measured. Writes ``reports/compare-<id>/index.html`` and ``figures.csv``: every key figure of every
chapter, one column per run with its device, dtype, model, profile, shape and code path, and the ratio
of each run to the reference run (the first one) where the two figures measure the same thing: same
metric and unit, same model, same dtype and same shape, both chapters finished. Every other cell says
why no ratio is given. The guide's 910B-vs-A100 table (from ``data/guide_claims.csv``) is shown beside
the runs' measured figures, labelled as the guide's claim, and the claims audit is merged over all runs
when ``helpers.claims.verdicts`` accepts several run folders.

Runs from other versions of the workbook (another results.json schema, missing or failed chapters,
unreadable files) are read with a note on the page, never a crash.
"""
from __future__ import annotations

import argparse
import base64
import html
import inspect
import io
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .results import RESULTS_NAME, SCHEMA

REPO = Path(__file__).resolve().parent.parent
REPORT_CHAPTER = "08_report"
DEVICE_CLASSES = ("npu", "cuda", "cpu")
# The chapter statuses whose figures may be put into a ratio (a failed chapter's figures are shown, not compared).
FINISHED = ("ok", "skipped")
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
    """One run folder as read: chapters (normalised results), statuses and what identifies the run."""

    path: Path
    label: str = ""
    run_id: str = ""
    profile: str = ""
    chapters: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)  # chapter -> ok / skipped / failed / did not finish
    reasons: dict = field(default_factory=dict)  # chapter -> error or skip reason
    notes: list = field(default_factory=list)
    device: str = ""
    device_name: str = ""
    dtype: str = ""
    model: str = ""

    @property
    def device_class(self) -> str:
        return device_class(self.device)

    def describe(self) -> str:
        return " · ".join(filter(None, (self.device_class or self.device or "device ?", self.dtype or "dtype ?",
                                        self.model or "model ?", self.profile and f"profile {self.profile}")))


def device_class(device: str) -> str:
    """``"npu:0"`` -> ``"npu"``; ``"cuda:1"`` -> ``"cuda"``; anything else that is not a device -> ''."""
    kind = str(device or "").split(":")[0].strip().lower()
    return kind if kind in DEVICE_CLASSES else ""


def _read_json(path: Path) -> tuple[Any, str]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), ""
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"


def normalise_results(data: Any, chapter: str) -> tuple[Optional[dict], list[str]]:
    """A chapter's results.json in today's shape, and notes on whatever had to be adapted.

    Older files may lack ``schema``, ``key_figures`` or ``status``, or store a figure as a bare value
    instead of ``{"value": ..., "unit": ..., context}``.
    """
    notes: list[str] = []
    if not isinstance(data, dict):
        return None, [f"{chapter}: results.json is not a JSON object; chapter ignored"]
    schema = data.get("schema")
    if schema != SCHEMA:
        notes.append(f"{chapter}: results.json schema {schema if schema is not None else 'absent (older workbook)'}"
                     f", this version writes schema {SCHEMA}; figures read where their fields match")
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        notes.append(f"{chapter}: no metrics mapping; no figures read")
        metrics = {}
    bare = [k for k, v in metrics.items() if not isinstance(v, dict)]
    metrics = {str(k): (v if isinstance(v, dict) else {"value": v}) for k, v in metrics.items()}
    if bare:
        notes.append(f"{chapter}: {len(bare)} figure(s) stored without unit or context (older schema): "
                     "shown, never put into a ratio")
        for key in bare:
            metrics[key]["bare"] = True
    key_figures = data.get("key_figures")
    if not isinstance(key_figures, list):
        notes.append(f"{chapter}: no key_figures list (older schema); its figures appear where another run "
                     "marks them as key figures")
        key_figures = []
    tables = data.get("tables") if isinstance(data.get("tables"), dict) else {}
    out = {**data, "metrics": metrics, "key_figures": [str(k) for k in key_figures], "tables": tables,
           "parameters": data.get("parameters") if isinstance(data.get("parameters"), dict) else {},
           "environment": data.get("environment") if isinstance(data.get("environment"), dict) else {}}
    return out, notes


def _runner_entries(run_dir: Path, notes: list[str]) -> tuple[dict, dict]:
    path = run_dir / "run.json"
    if not path.exists():
        notes.append("no run.json (not made by the runner, or an older workbook): chapter statuses come from "
                     "the results.json files")
        return {}, {}
    data, problem = _read_json(path)
    if problem or not isinstance(data, dict):
        notes.append(f"run.json {problem or 'is not a JSON object'}: chapter statuses come from the results.json files")
        return {}, {}
    entries = {}
    for entry in data.get("notebooks") or []:
        if isinstance(entry, dict) and entry.get("notebook"):
            entries[str(entry["notebook"])] = entry
    return data, entries


def _most_common(values) -> str:
    values = [str(v) for v in values if v not in (None, "", "auto")]
    return Counter(values).most_common(1)[0][0] if values else ""


def load_run(path: "str | Path") -> Run:
    """Read one run folder. Raises only when the folder itself does not exist."""
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"RUN_DIR {str(path)!r} is not a folder; give run folders such as "
                                "reports/<run-id> (each made by make report / python -m helpers.run)")
    run = Run(path=run_dir)
    run_file, entries = _runner_entries(run_dir, run.notes)
    run.run_id = str(run_file.get("run_id") or run_dir.name) if run_file else run_dir.name
    run.profile = str(run_file.get("profile") or "") if run_file else ""
    for results_path in sorted(run_dir.glob(f"*/{RESULTS_NAME}")):
        chapter = results_path.parent.name
        if chapter == REPORT_CHAPTER:
            continue
        raw, problem = _read_json(results_path)
        if problem:
            run.notes.append(f"{chapter}: results.json {problem}; chapter ignored")
            run.status[chapter] = "unreadable"
            continue
        data, notes = normalise_results(raw, chapter)
        run.notes.extend(notes)
        if data is None:
            run.status[chapter] = "unreadable"
            continue
        run.chapters[chapter] = data
    for chapter in sorted(set(run.chapters) | set(entries)):
        if chapter == REPORT_CHAPTER:
            continue
        data, entry = run.chapters.get(chapter), entries.get(chapter, {})
        status = str(entry.get("status") or (data or {}).get("status")
                     or ("status not recorded" if data is not None else "did not run"))
        if status == "running":
            status = "did not finish"
        if data is None and status in FINISHED:
            status = "results.json missing"
        if run.status.get(chapter) != "unreadable":
            run.status[chapter] = status
        reason = str(entry.get("error") or (data or {}).get("status_reason") or "")
        if reason:
            run.reasons[chapter] = reason.strip().splitlines()[-1][:300] if status == "failed" else reason[:300]
        if status not in FINISHED:
            run.notes.append(f"{chapter}: {status}" + (f" ({run.reasons[chapter]})" if reason else "")
                             + "; its figures are shown but not put into ratios")
    if not run.chapters:
        run.notes.append("no readable results.json in this folder: nothing to compare")
    recorded: dict = {}  # a chapter's own notes (e.g. CPU load while timing), each text once
    for chapter, data in run.chapters.items():
        notes = data.get("notes")
        for text in notes if isinstance(notes, list) else [notes] if notes else []:
            recorded.setdefault(str(text), []).append(chapter)
    run.notes.extend(f"noted by {', '.join(chapters)}: {text}" for text, chapters in recorded.items())
    # What identifies the run: chapter 00's records first, then what the chapters agree on.
    env00 = run.chapters.get("00_environment_check", {})
    model_entry = env00.get("metrics", {}).get("model", {}) if env00 else {}
    run.device = str(env00.get("metrics", {}).get("device", {}).get("value") or "") if env00 else ""
    run.device = run.device or _most_common(d.get("environment", {}).get("device") for d in run.chapters.values())
    run.device_name = _most_common(d.get("environment", {}).get("device_properties", {}).get("name")
                                   if isinstance(d.get("environment", {}).get("device_properties"), dict) else None
                                   for d in run.chapters.values())
    if not run.device_name and isinstance(run_file, dict):
        run.device_name = str((run_file.get("environment") or {}).get("device_name") or "")
    run.model = str(model_entry.get("value") or "") or _most_common(
        d.get("parameters", {}).get("model") for d in run.chapters.values())
    run.dtype = str(model_entry.get("dtype") or "") or _most_common(
        e.get("dtype") for d in run.chapters.values() for k, e in d["metrics"].items() if k in d["key_figures"]) \
        or _most_common(d.get("parameters", {}).get("dtype") for d in run.chapters.values())
    run.profile = run.profile or _most_common(d.get("parameters", {}).get("profile") for d in run.chapters.values())
    return run


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
    bare: bool = False  # recorded without context (older schema)

    @property
    def number(self) -> Optional[float]:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            return None
        return float(self.value)


def figure_cell(run: Run, chapter: str, key: str) -> Cell:
    data = run.chapters.get(chapter)
    status = run.status.get(chapter, "did not run")
    if data is None:
        why = run.reasons.get(chapter, "")
        return Cell(status=status, missing=f"chapter {status}" + (f": {why}" if why else ""))
    entry = data["metrics"].get(key)
    if entry is None or entry.get("value") is None:
        return Cell(status=status, missing=f"not recorded (chapter {status})")
    return Cell(value=entry.get("value"), unit=str(entry.get("unit") or ""),
                device=str(entry.get("device") or data.get("environment", {}).get("device") or run.device),
                dtype=str(entry.get("dtype") or ""), model=str(data.get("parameters", {}).get("model") or run.model),
                shape=str(entry.get("shape") or ""), code_path=str(entry.get("code_path") or ""),
                status=status, bare=bool(entry.get("bare")))


def why_not_comparable(ref: Cell, other: Cell, ref_label: str, other_label: str) -> str:
    """'' when ``other / ref`` measures the same thing twice; else every reason it does not."""
    if ref.missing or other.missing:
        return "; ".join(f"no figure in {label} ({c.missing})" for c, label in ((ref, ref_label), (other, other_label))
                         if c.missing)
    reasons = []
    for cell, label in ((ref, ref_label), (other, other_label)):
        if cell.status not in FINISHED:
            reasons.append(f"chapter {cell.status} in {label}")
        if cell.bare:
            reasons.append(f"recorded without unit or context in {label} (older schema)")
    if ref.number is None or other.number is None:
        reasons.append("not a number")
    for name in ("unit", "model", "dtype", "shape"):
        a, b = getattr(ref, name), getattr(other, name)
        if a != b:
            reasons.append(f"{name} differs ({a or 'none'} vs {b or 'none'})")
    if not reasons and ref.number == 0:
        reasons.append(f"the {ref_label} figure is 0")
    return "; ".join(reasons)


def figure_rows(runs: list[Run]) -> list[tuple[str, str]]:
    """(chapter, key) for every key figure any run marks, chapters in order, keys in recorded order."""
    rows: list[tuple[str, str]] = []
    chapters = sorted({c for r in runs for c in r.chapters})
    for chapter in chapters:
        for run in runs:
            for key in run.chapters.get(chapter, {}).get("key_figures", []):
                if (chapter, key) not in rows:
                    rows.append((chapter, key))
    return rows


def batch_sweep_cell(run: Run, batch: int, column: str = "tokens_per_s_aggregate", unit: str = "tok/s") -> Cell:
    """A point of chapter 04's batch sweep table (decode rate at batch 8 is not a key figure)."""
    data = run.chapters.get(BATCHING)
    status = run.status.get(BATCHING, "did not run")
    if data is None:
        return Cell(status=status, missing=f"chapter {status}")
    rows = data.get("tables", {}).get("batch_sweep") or []
    row = next((r for r in rows if isinstance(r, dict) and r.get("point") == batch), None)
    if row is None:
        ran = sorted(r.get("point") for r in rows if isinstance(r, dict) and isinstance(r.get("point"), int))
        return Cell(status=status, missing=f"batch {batch} not in this run's sweep (ran {ran or 'none'})")
    if row.get("status") != "ok" or row.get(column) is None:
        return Cell(status=status, missing=f"batch {batch}: {row.get('status', '?')} {row.get('error') or ''}".strip())
    dtypes = [e.get("dtype") for e in data["metrics"].values() if e.get("dtype")]
    return Cell(value=row[column], unit=unit, device=str(data.get("environment", {}).get("device") or run.device),
                dtype=_most_common(dtypes) or run.dtype, model=str(data.get("parameters", {}).get("model") or run.model),
                shape=f"batch {batch}, prompt {row.get('prompt_tokens', '?')} tokens, "
                      f"{data.get('parameters', {}).get('new_tokens', '?')} new tokens",
                code_path=str(row.get("code_path") or f"chapter 04 batch_sweep table, {column}"), status=status)


DERIVED = {
    ("04_batching", "decode_tok_s_batch8"): lambda run: batch_sweep_cell(run, 8),
}


def cell_for(run: Run, chapter: str, key: str) -> Cell:
    if (chapter, key) in DERIVED:
        return DERIVED[(chapter, key)](run)
    return figure_cell(run, chapter, key)


def comparison_table(runs: list[Run], reference: int = 0):
    """Long-form table: one row per figure and run, with the ratio to the reference run or why not."""
    import pandas as pd

    ref = runs[reference]
    rows = []
    keys = figure_rows(runs) + [k for k in DERIVED if k not in figure_rows(runs)
                                and any(cell_for(r, *k).number is not None for r in runs)]
    keys = sorted(keys, key=lambda k: k[0])  # stable: chapters in order, keys as recorded
    for chapter, key in keys:
        source = "key figure" if (chapter, key) not in DERIVED else "chapter 04 batch_sweep table, batch 8 aggregate"
        ref_cell = cell_for(ref, chapter, key)
        for run in runs:
            cell = cell_for(run, chapter, key)
            ratio, why = None, ""
            if run is not ref:
                why = why_not_comparable(ref_cell, cell, ref.label, run.label)
                ratio = None if why else cell.number / ref_cell.number
            rows.append({"chapter": chapter, "figure": key, "source": source, "run": run.label,
                         "value": cell.value, "unit": cell.unit, "device": cell.device or run.device,
                         "dtype": cell.dtype, "model": cell.model or run.model, "profile": run.profile,
                         "shape": cell.shape, "code_path": cell.code_path, "chapter_status": cell.status,
                         "missing": cell.missing, "reference": ref.label, "ratio_to_reference": ratio,
                         "why_no_ratio": why if run is not ref else "reference run"})
    return pd.DataFrame(rows)


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

    Each row keeps the hardware it is about (the table's ``hardware`` column, or the rule's ``device``
    argument in an older table), the model and the weights' dtype, so nothing here is typed twice.
    """
    from . import claims as claims_mod

    table = claims_mod.load_claims() if claims_table is None else claims_table
    rows = table[table["section"].astype(str).str.contains(GUIDE_TABLE_SECTION) & (table["kind"] == "performance")]
    names = getattr(claims_mod, "HARDWARE", {})
    out = []
    for claim in rows.to_dict(orient="records"):
        args = claims_mod.parse_args(claim["args"])
        hardware = str(claim.get("hardware") or "")
        about = names.get(hardware) or args.get("device", "")
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
    data = run.chapters.get(LADDER)
    rows = (data or {}).get("tables", {}).get("ladder") or []
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    peak = first.get("peak_memory_bytes")
    if first.get("status") == "ok" and isinstance(peak, (int, float)) and peak > 0:
        dtypes = [e.get("dtype") for e in data["metrics"].values() if e.get("dtype")]
        return Cell(value=peak / 1e9, unit="GB", device=str(data.get("environment", {}).get("device") or run.device),
                    dtype=str(first.get("dtype") or _most_common(dtypes) or run.dtype),
                    model=str(data.get("parameters", {}).get("model") or run.model),
                    shape=f"batch {first.get('batch_size') or 1}",
                    code_path=f"chapter 06 ladder, rung {first.get('rung', '?')}, peak memory",
                    status=run.status.get(LADDER, ""))
    cell = batch_sweep_cell(run, 1, column="peak_memory_bytes", unit="bytes")
    if cell.number is not None:
        sweep = run.chapters[BATCHING].get("tables", {}).get("batch_sweep") or []
        kind = next((r.get("memory_kind") for r in sweep if isinstance(r, dict) and r.get("point") == 1), "")
        cell.value, cell.unit = cell.number / 1e9, "GB"
        cell.code_path = f"chapter 04 batch_sweep, batch 1, {kind or 'peak memory'}"
    elif cell.missing.startswith("chapter"):
        cell.missing = f"chapters 04 and 06 did not record it ({cell.missing} for 04)"
    return cell


def guide_table(runs: list[Run], claims_table=None, verdict_table=None):
    """Rows: decode tok/s, first token ms, memory GB. Columns: the guide's claims per hardware, then each run.

    With the merged claims audit (``verdict_table``), each claim cell also says its verdict and which run
    decided it.
    """
    import pandas as pd

    measured = {"tok/s": ("decode tok/s, batch 1", lambda r: figure_cell(r, *DECODE_B1)),
                "ms": ("first-token latency (TTFT), ms", lambda r: figure_cell(r, *TTFT)),
                "GB": ("memory, GB", memory_cell)}
    claims = guide_benchmark_claims(claims_table)
    decided = {}
    if verdict_table is not None and {"id", "verdict"} <= set(verdict_table.columns):
        for v in verdict_table.to_dict(orient="records"):
            by = v.get("decided_by") or ""
            decided[v["id"]] = f"{v['verdict']}" + (f", decided by {by}" if by else "")
    rows = []
    for unit, (label, read) in measured.items():
        row = {"figure": label}
        for claim in (c for c in claims if c["unit"] == unit):
            about = ", ".join(filter(None, (claim["model"], claim["weights"])))
            row[f"guide's claim about {claim['about']}"] = (f"{claim['value']:g} {unit} (claim {claim['id']}"
                                                           + (f"; {about}" if about else "") + ")"
                                                           + (f": {decided[claim['id']]}" if claim["id"] in decided
                                                              else ""))
        for run in runs:
            cell = read(run)
            row[f"measured: {run.label}"] = (f"{_short(cell.number)} {cell.unit} ({cell.model}, {cell.dtype or '?'}, "
                                             f"{device_class(cell.device) or cell.device}; {cell.shape})"
                                             if cell.number is not None else (cell.missing or "not a number"))
        rows.append(row)
    return pd.DataFrame(rows)


# --- the merged claims audit ------------------------------------------------------------------

CLAIMS_UNAVAILABLE = ("The claims audit for several runs is unavailable in this version of the workbook "
                      "(helpers.claims.verdicts takes one run folder here); each run's own chapter 08 page "
                      "holds its single-run audit.")


def multi_run_claims_available() -> bool:
    """True when helpers.claims.verdicts accepts a list of run folders (the documented interface)."""
    from . import claims as claims_mod

    if not hasattr(claims_mod, "VERDICT_CLASSES"):
        return False
    params = list(inspect.signature(claims_mod.verdicts).parameters)
    return bool(params) and params[0] == "run_dirs"


def merged_claims(runs: list[Run]):
    """(verdict table over all runs, '') or (None, why not)."""
    if not multi_run_claims_available():
        return None, CLAIMS_UNAVAILABLE
    from . import claims as claims_mod

    table = claims_mod.verdicts([str(r.path) for r in runs])
    return table, ""


# --- plots ------------------------------------------------------------------------------------

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _run_ticks(runs: list[Run]) -> list[str]:
    return [f"{r.label}\n{r.device_class or r.device or '?'} · {r.dtype or '?'}\n{r.model or '?'}" for r in runs]


def _short(value: float) -> str:
    """A bar label without exponents: 1799, 42.8, 2.02."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _bars(ax, runs, cells, ylabel, fmt="{}", offset=0.0, width=0.8, color=None, label=None):
    xs = [i + offset for i in range(len(runs))]
    heights = [c.number if c.number is not None else 0.0 for c in cells]
    bars = ax.bar(xs, heights, width=width, color=color or [COLORS[i % len(COLORS)] for i in range(len(runs))],
                  label=label)
    top = max(heights + [1e-9])
    for x, c in zip(xs, cells):
        text = fmt.format(_short(c.number)) if c.number is not None else "not\nmeasured"
        ax.text(x, (c.number or 0.0) + top * 0.02, text, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, top * 1.25)
    ax.set_ylabel(ylabel)
    return bars


def plot_decode(runs: list[Run]):
    """Decode tok/s at batch 1 (chapter 03) and batch 8 (chapter 04's sweep, aggregate) per run."""
    import matplotlib.pyplot as plt

    b1 = [figure_cell(r, *DECODE_B1) for r in runs]
    b8 = [batch_sweep_cell(r, 8) for r in runs]
    if all(c.number is None for c in b1 + b8):
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(runs)), 3.8))
    _bars(ax, runs, b1, "tokens/s", offset=-0.2, width=0.4, color="#1f77b4", label="batch 1 (ch. 03, per user)")
    _bars(ax, runs, b8, "tokens/s", offset=0.2, width=0.4, color="#ff7f0e",
          label="batch 8 (ch. 04 sweep, aggregate)")
    top = max([c.number for c in b1 + b8 if c.number is not None] + [1e-9])
    ax.set_ylim(0, top * 1.3)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(_run_ticks(runs), fontsize=8)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("Decode rate per run (each bar: its run's model, dtype, device)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_single(runs: list[Run], key: tuple[str, str], ylabel: str, title: str, fmt="{}"):
    import matplotlib.pyplot as plt

    cells = [figure_cell(r, *key) for r in runs]
    if all(c.number is None for c in cells):
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 2.0 * len(runs)), 3.6))
    _bars(ax, runs, cells, ylabel, fmt=fmt)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(_run_ticks(runs), fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_ttft(runs: list[Run]):
    return plot_single(runs, TTFT, "ms", "Time to first token per run (chapter 03; shape in the figures table)")


def plot_roofline(runs: list[Run]):
    return plot_single(runs, ROOFLINE, "% of its own roofline",
                       "Batch-1 decode as a share of each run's own bandwidth roofline (chapter 03)", fmt="{}%")


def ladder_rungs(run: Run) -> list[tuple[str, float]]:
    """Per-rung tok/s (``ladder_tok_s_<rung>``) in the order chapter 06 recorded them."""
    data = run.chapters.get(LADDER) or {}
    out = []
    for key, entry in data.get("metrics", {}).items():
        value = entry.get("value")
        if key.startswith(LADDER_PREFIX) and isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((key[len(LADDER_PREFIX):], float(value)))
    return out


def plot_ladder(runs: list[Run]):
    """One panel per run: its ladder's rungs in tok/s, each as a ratio to that run's first rung."""
    import matplotlib.pyplot as plt

    ladders = [(run, ladder_rungs(run)) for run in runs]
    if not any(rungs for _, rungs in ladders):
        return None
    fig, axes = plt.subplots(1, len(runs), figsize=(min(13.0, max(6.0, 3.6 * len(runs))), 3.8), squeeze=False)
    for ax, (run, rungs) in zip(axes[0], ladders):
        ax.set_title(f"{run.label}\n{run.device_class or '?'} · {run.dtype or '?'} · {run.model or '?'}", fontsize=8)
        if not rungs:
            ax.text(0.5, 0.5, f"no ladder in this run\n(chapter 06 {run.status.get(LADDER, 'did not run')})",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        names, values = zip(*rungs)
        ax.bar(range(len(values)), values, color=COLORS[0])
        for i, v in enumerate(values):
            ax.text(i, v, f"{v / values[0]:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels([n.replace("_", " ") for n in names], rotation=35, ha="right", fontsize=7)
        ax.set_ylim(0, max(values) * 1.2)
        ax.set_ylabel("tokens/s", fontsize=8)
    fig.suptitle("Optimisation ladder per run (chapter 06): tok/s per rung, ratio to the run's first rung; "
                 "batch rungs are aggregate over the batch", fontsize=9)
    fig.tight_layout()
    return fig


# --- the page ---------------------------------------------------------------------------------

def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)[:120]
    return str(value)


def _cell_html(cell: Cell, run: Run) -> str:
    if cell.missing:
        return f'<span class="why">{html.escape(cell.missing)}</span>'
    context = " · ".join(filter(None, (device_class(cell.device) or cell.device, cell.dtype, cell.model,
                                       cell.shape, cell.code_path)))
    status = "" if cell.status in FINISHED else f' <span class="why">(chapter {html.escape(cell.status)})</span>'
    return (f'<b>{html.escape(_fmt(cell.value))}</b> {html.escape(cell.unit)}{status}'
            f'<div class="ctx">{html.escape(context)}</div>')


def _breakable(name: str) -> str:
    """An identifier that may wrap after its underscores in a narrow column."""
    return html.escape(name).replace("_", "_<wbr>")


def _table_html(frame, classes: str = "data", widths: Optional[dict] = None) -> str:
    """A DataFrame as a fixed-layout table; ``widths`` (column -> %) keeps long text columns readable."""
    text = frame.to_html(index=False, na_rep="", border=0, classes=classes, escape=True)
    if widths:
        total = sum(widths.get(c, 5) for c in frame.columns)
        cols = "".join(f"<col style='width:{100 * widths.get(c, 5) / total:.1f}%'>" for c in frame.columns)
        start = text.index(">", text.index("<table")) + 1
        text = f"{text[:start]}<colgroup>{cols}</colgroup>{text[start:]}"
    return text


def figures_html(runs: list[Run], long) -> str:
    """The key-figures table: one column per run and one per ratio to the reference."""
    ref = long["reference"].iloc[0] if len(long) else ""
    others = [r for r in runs if r.label != ref]
    head = "".join(f"<th>{html.escape(r.label)}<div class='ctx'>{html.escape(r.describe())}</div></th>" for r in runs)
    head += "".join(f"<th>{html.escape(r.label)} / {html.escape(ref)}</th>" for r in others)
    body = []
    for (chapter, key), group in long.groupby(["chapter", "figure"], sort=False):
        cells = []
        for run in runs:
            cells.append(f"<td>{_cell_html(cell_for(run, chapter, key), run)}</td>")
        for run in others:
            r = group[group["run"] == run.label].iloc[0]
            if r["ratio_to_reference"] is not None and r["ratio_to_reference"] == r["ratio_to_reference"]:
                cells.append(f"<td class='ratio'><b>{r['ratio_to_reference']:.3g}x</b></td>")
            else:
                cells.append(f"<td><span class='why'>no ratio: {html.escape(r['why_no_ratio'])}</span></td>")
        source = group["source"].iloc[0]
        note = "" if source == "key figure" else f"<div class='ctx'>{html.escape(source)}</div>"
        body.append(f"<tr><td>{_breakable(chapter)}</td><td>{_breakable(key)}{note}</td>{''.join(cells)}</tr>")
    n = len(runs) + len(others)
    return (f"<table class='data figures'><colgroup><col style='width:12%'><col style='width:14%'>"
            + "".join(f"<col style='width:{74 / max(n, 1):.1f}%'>" for _ in range(n))
            + f"</colgroup><thead><tr><th>chapter</th><th>figure</th>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


def runs_table(runs: list[Run]):
    import pandas as pd

    rows = []
    for run in runs:
        counts = Counter(run.status.values())
        rows.append({"run": run.label, "run id": run.run_id, "device": run.device or "?",
                     "device name": run.device_name, "dtype": run.dtype or "?", "model": run.model or "?",
                     "profile": run.profile or "?",
                     "chapters": ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none",
                     "notes": len(run.notes)})
    return pd.DataFrame(rows)


STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1220px;overflow-wrap:anywhere}
table.data{border-collapse:collapse;font-size:82%;width:100%;table-layout:fixed}
table.data td,table.data th{border:1px solid #ccc;padding:3px 5px;vertical-align:top;text-align:left}
.ctx{color:#555;font-size:85%;font-weight:normal}.why{color:#8a4b00}.ratio{background:#eef6ee}
.claim{background:#fff4e0}img{max-width:100%;height:auto}pre{white-space:pre-wrap}
h2{margin-top:1.6em;border-bottom:1px solid #ddd}"""


def page_html(runs: list[Run], long, guide, claims_table, claims_note: str, plots: list) -> str:
    ref = long["reference"].iloc[0] if len(long) else runs[0].label
    parts = [f"<h1>Comparison of {len(runs)} workbook runs</h1>",
             f"<p><em>Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from each run's results.json files; "
             "nothing re-measured. Each figure is from the machine that produced its run.</em></p>",
             "<h2>Runs</h2>", _table_html(runs_table(runs))]
    notes = [(r.label, n) for r in runs for n in r.notes]
    if notes:
        parts.append("<h3>Notes on reading the runs</h3><ul>" + "".join(
            f"<li><b>{html.escape(label)}</b>: {html.escape(n)}</li>" for label, n in notes) + "</ul>")
    parts.append("<h2>Headline figures</h2>")
    for title, fig in plots:
        if fig is None:
            parts.append(f"<p class='why'>{html.escape(title)}: not recorded in any of these runs.</p>")
        else:
            parts.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{_png(fig)}'>")
    parts.append("<h2>The guide's 910B vs A100 table beside these runs (性能基准对比)</h2>"
                 "<p>The first columns are <b>the guide's claims</b> (Llama-2-7B fp16 on one 910B and one A100 "
                 "80GB, from <code>data/guide_claims.csv</code>); the others are measured in each run, with its "
                 "model, dtype, device and shape. A figure measured on another model, dtype or device is not the "
                 "guide's number reproduced or contradicted: the claims audit below says which run decides each "
                 "claim.</p>")
    parts.append(_table_html(guide, "data guide"))
    parts.append(f"<h2>Every key figure, run by run</h2><p>Ratios are <b>run / {html.escape(ref)}</b>, given only "
                 "when both figures have the same metric and unit, model, dtype and shape and both chapters "
                 "finished; otherwise the cell says why not. The CSV beside this page has the same table with "
                 "every field in its own column.</p>")
    parts.append(figures_html(runs, long))
    parts.append("<h2>Claims audit over all runs</h2>")
    if claims_table is None:
        parts.append(f"<p class='why'>{html.escape(claims_note)}</p>")
    else:
        from . import claims as claims_mod

        counts = claims_mod.verdict_counts(claims_table)
        parts.append("<p>A claim about a 910B is decided by an NPU run, one about an A100 by a CUDA run; "
                     "<i>decided by</i> names the run whose measurement decided it (empty when documentation, "
                     "specs or the guide's own text decided it).</p>")
        meanings = getattr(claims_mod, "VERDICT_CLASSES", {})
        parts.append("<ul>" + "".join(
            f"<li><b>{html.escape(str(k))}</b>: {v} claim(s)"
            + (f" <span class='ctx'>({html.escape(str(meanings[k]))})</span>" if k in meanings else "") + "</li>"
            for k, v in counts.items() if v) + "</ul>")
        cols = [c for c in ("id", "section", "gloss_en", "verdict", "verdict_class", "decided_by", "device_class",
                            "elsewhere", "elsewhere_run", "detail") if c in claims_table.columns]
        widths = {"id": 4, "section": 11, "gloss_en": 19, "verdict": 9, "verdict_class": 9, "decided_by": 8,
                  "device_class": 5, "elsewhere": 11, "elsewhere_run": 7, "detail": 24}
        parts.append(_table_html(claims_table[cols], "data claims", widths))
    return (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width'><title>Comparison of {len(runs)} workbook runs</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


def compare(run_dirs: list, out_dir: "str | Path", reference: int = 0, claims_table=None) -> dict:
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
    runs = label_runs([load_run(p) for p in run_dirs])
    long = comparison_table(runs, reference)
    table, claims_note = merged_claims(runs)
    guide = guide_table(runs, claims_table, table)
    plots = [("decode tok/s at batch 1 and 8", plot_decode(runs)), ("TTFT", plot_ttft(runs)),
             ("decode as a share of the roofline", plot_roofline(runs)), ("optimisation ladder", plot_ladder(runs))]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "figures.csv"
    wide_table(long).to_csv(csv_path, index=False)
    html_path = out_dir / "index.html"
    tmp = html_path.with_suffix(".tmp")
    tmp.write_text(page_html(runs, long, guide, table, claims_note, plots), encoding="utf-8")
    tmp.replace(html_path)
    return {"html": html_path, "csv": csv_path, "runs": runs, "figures": long, "guide": guide,
            "claims": table, "claims_note": claims_note}


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="two or more run folders (reports/<run-id>)")
    parser.add_argument("--id", help="name of the comparison: reports/compare-<id>/ (default: date and time)")
    parser.add_argument("--reports-dir", default=os.environ.get("WORKBOOK_REPORTS", str(REPO / "reports")),
                        help="where compare-<id>/ is written (default: reports/ or WORKBOOK_REPORTS)")
    parser.add_argument("--reference", type=int, default=0,
                        help="position of the run the ratios divide by (default 0: the first RUN_DIR)")
    args = parser.parse_args(argv)
    compare_id = args.id or time.strftime("%Y%m%d-%H%M%S")
    if not compare_id or "/" in compare_id or compare_id.startswith("."):
        print(f"error: --id {compare_id!r}: use a plain folder name such as npu-vs-a100", file=sys.stderr)
        return 2
    out_dir = Path(args.reports_dir) / f"compare-{compare_id}"
    try:
        written = compare(args.run_dirs, out_dir, reference=args.reference)
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
