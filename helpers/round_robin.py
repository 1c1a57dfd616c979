"""The round-robin engine of chapter 06's ladder (layer: chapter studies; taught in
06_optimization_ladder): rungs prepared one after another, then timed again in rounds, every ok
rung once per round, so a change of machine state (load, clocks, another process) hits every rung
alike.

A rung is a name (the label a page shows), a description, a ``prepare`` callable that returns a
model variant (or raises: the rung is then recorded as failed with its error, and the ladder goes
on) and an id that code matches. One ``measure`` object turns each variant into metrics, so every
rung is timed the same way in the same run; speedups are ratios over the first rung that
succeeded. What the chapter records and decides from the table is ``helpers.ladder``'s.
"""
from __future__ import annotations

import contextlib
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from . import progress
from .prose import N_
from .bench import Timing, speedup


COLUMNS = ("rung", "rung_id", "description", "status", "latency_ms", "tokens_per_s", "peak_memory_bytes",
           "roofline_pct", "speedup", "speedup_low", "speedup_high", "error")


class RungSkipped(Exception):
    """Raise from ``prepare`` when a rung does not apply here (e.g. NPU runtime options on a CPU)."""


@dataclass
class Rung:
    """``name`` is the label a page shows (translated there); ``id`` is what code matches (the name
    when not given): a page or an answer asks for ``"int8_weights"``, not for the words "+ INT8"."""
    name: str
    description: str
    prepare: Callable[[], Any]
    id: str = ""

    def __post_init__(self):
        self.id = self.id or self.name


def _as_rung(item) -> Rung:
    if isinstance(item, Rung):
        return item
    if isinstance(item, (tuple, list)) and len(item) == 3 and callable(item[2]):
        return Rung(str(item[0]), str(item[1]), item[2])
    raise ValueError(f"rung {item!r} is not valid; give Rung(name, description, prepare) or a "
                     "(name, description, prepare) tuple with a callable prepare")


def run_ladder(rungs: Iterable, measure: Callable[[Any], dict], *,
               roofline_tok_s: Optional[float] = None,
               cleanup: Optional[Callable[[Any], None]] = None,
               on_rung: Optional[Callable[[dict], None]] = None,
               rounds: int = 0, between_rounds: Optional[Callable[[int], None]] = None):
    """Prepare and measure each rung; a failing rung is recorded and the ladder continues.

    ``measure(variant)`` returns at least ``latency_ms`` (the whole request) and ``tokens_per_s``;
    optional ``roofline_tok_s`` (overrides the ladder's, e.g. fewer weight bytes after INT8),
    ``batch_size`` and ``timing`` (a ``bench.Timing``: the speedup and its spread then come from
    ``bench.speedup``). Speedup is over the first rung that succeeded at the same batch size; a rung
    at another batch size gets the throughput ratio over the batch-1 rung just before it (the same
    weights and code path, only the batch changed: like with like). Extra keys are kept as columns.

    ``rounds`` > 0 measures the rungs interleaved: every rung is first built and measured once (its
    warm-up, and the profile of its step), all variants are kept, then each round times every ok
    rung once more, round robin, so a change of machine state (load, clocks, another process) hits
    every rung alike; the figures and ratios are those of the rounds, pooled
    (``measure.again(variant)`` and ``measure.pooled(variant, outs, row)``, as
    ``generation_measure`` gives them). ``between_rounds(i)`` runs before round ``i`` (chapter 06
    times llama.cpp and float32 eager there, so they are interleaved with the rungs too).
    ``cleanup(variant)`` frees each variant once the ladder is done; ``on_rung(row)`` sees each row
    as it is built. Returns a pandas DataFrame with ``COLUMNS`` first.
    """
    import pandas as pd

    rungs = [_as_rung(r) for r in rungs]
    if not rungs:
        raise ValueError("rungs is empty; give at least one (name, description, prepare) rung")
    for names in ([r.name for r in rungs], [r.id for r in rungs]):
        if len(set(names)) != len(names):
            raise ValueError(f"rung names and ids must be unique, got {names}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds={rounds!r} is not valid; give an integer >= 0 (0: each rung timed once, "
                         "as it is built)")
    if rounds and not (callable(getattr(measure, "again", None)) and callable(getattr(measure, "pooled", None))):
        raise ValueError("rounds > 0 needs a measure with .again(variant) and .pooled(variant, outs, row), "
                         "e.g. ladder.generation_measure(...)")
    rows: list[dict] = []
    kept: list = []  # (row, variant) of the ok rungs, timed again in the rounds
    try:
        for rung in progress.steps(rungs, lambda r: r.name):
            row: dict = {"rung": rung.name, "rung_id": rung.id, "description": rung.description, "status": "ok", "error": ""}
            variant = None
            start = time.perf_counter()
            try:
                variant = rung.prepare()
                row["prepare_s"] = time.perf_counter() - start
                # with rounds, the figures are the rounds': the first measurement warms the variant up
                first = getattr(measure, "warm", measure) if rounds else measure
                metrics = dict(first(variant))
                for key in ("latency_ms", "tokens_per_s"):
                    if key not in metrics:
                        raise KeyError(f"measure() returned no {key!r}; it returned {sorted(metrics)}")
                row.update(metrics)
            except RungSkipped as exc:  # its reason as given (a message is said in the reader's language)
                row.update(status="skipped", error=exc.args[0] if exc.args else str(exc))
            except Exception as exc:  # noqa: BLE001  (one broken rung must not stop the ladder)
                _failed(row, exc)
            if variant is not None and rounds:
                kept.append((row, variant))
            elif variant is not None and cleanup is not None:
                with contextlib.suppress(Exception):
                    cleanup(variant)
            rows.append(row)
            if on_rung is not None:
                on_rung(row)
        outs: dict = {id(row): [] for row, _ in kept}
        for i in progress.steps(range(rounds), lambda _: N_("round of every rung")):
            if between_rounds is not None:
                between_rounds(i)
            for row, variant in kept:
                if row["status"] != "ok":
                    continue
                try:
                    outs[id(row)].append(measure.again(variant))
                except Exception as exc:  # noqa: BLE001
                    _failed(row, exc)
        for row, variant in kept:
            if rounds and row["status"] == "ok":
                row.update(measure.pooled(variant, outs[id(row)], row), rounds=rounds)
    finally:
        if cleanup is not None:
            for _, variant in kept:
                with contextlib.suppress(Exception):
                    cleanup(variant)
    _ratios(rows, roofline_tok_s)
    table = pd.DataFrame(rows)
    table = table.assign(**{col: None for col in COLUMNS if col not in table.columns})
    if "timing" in table.columns:
        table["timing"] = table["timing"].map(lambda t: t.summary() if isinstance(t, Timing) else t)
    return table[list(COLUMNS) + [c for c in table.columns if c not in COLUMNS]]


def _failed(row: dict, exc: Exception) -> None:
    first_line = (str(exc).strip().splitlines() or [""])[0]
    row.update(status="failed", error=f"{type(exc).__name__}: {first_line}"[:300],
               traceback=traceback.format_exc(limit=3))


def _ratios(rows: list, roofline_tok_s: Optional[float]) -> None:
    """Each ok row's roofline share and speedup: over the first ok row at its batch size, or (another
    batch size) its throughput over the ok batch-1 row just before it."""
    baseline = previous = None  # the first ok row; the last ok row at the baseline's batch size
    for row in rows:
        if row["status"] != "ok":
            continue
        ceiling = row.get("roofline_tok_s", roofline_tok_s)
        row["roofline_pct"] = 100.0 * row["tokens_per_s"] / ceiling if ceiling else None
        baseline = baseline or row
        same_batch = row.get("batch_size", 1) == baseline.get("batch_size", 1)
        if same_batch and isinstance(row.get("timing"), Timing) and isinstance(baseline.get("timing"), Timing):
            s = speedup(baseline["timing"], row["timing"])
            row.update(speedup=s.ratio, speedup_low=s.low, speedup_high=s.high)
        elif same_batch:
            row["speedup"] = baseline["latency_ms"] / row["latency_ms"]
        else:  # a bigger batch serves more users per call: throughput over the rung it builds on
            ref = previous or baseline
            row.update(speedup=row["tokens_per_s"] / ref["tokens_per_s"], speedup_over=ref["rung"])
        if same_batch:
            previous = row
