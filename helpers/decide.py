"""The decisions behind every direction word the workbook prints: faster, best, met, same effect.

Layer: foundations. Taught in ``03_end_to_end.ipynb`` (first used there) and used by every chapter's summary and by the
claims audit of the report chapter. A sentence may say "faster", "slower", "best" or "same effect"
only when one of these functions says so from the measured spreads; otherwise it says that the
difference is within the noise. Each function is small and tested both ways
(``tests/test_decide.py``), so a template never decides anything inside a string.

Spreads are the p10-p90 ranges of ``helpers.bench``. A ratio ``baseline / candidate`` has the
conservative spread ``baseline.p10 / candidate.p90`` to ``baseline.p90 / candidate.p10``
(``bench.speedup``): it lies wholly above 1 only when the two p10-p90 ranges do not overlap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

FASTER, SLOWER, SAME = "faster", "slower", "no difference beyond the noise"
# How far a measured effect may be from a claimed one and still be called "the same effect":
# within this factor of the claimed size, in the same direction.
SAME_EFFECT_FACTOR = 2.0


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in values)


def _side(low: float, high: float, mark: float, above: str, below: str, between: str,
          ties: str = "") -> str:
    """``above`` when the whole spread lies above ``mark``, ``below`` when it lies below, else
    ``between``; a spread that ends on the mark counts on the side ``ties`` names, if any."""
    low, high = min(low, high), max(low, high)
    if low > mark or (ties == "above" and low == mark):
        return above
    if high < mark or (ties == "below" and high == mark):
        return below
    return between


def direction(low: float, high: float, neutral: float = 1.0) -> str:
    """``faster`` when the whole spread of a speedup is above ``neutral``, ``slower`` when below.

    ``low``/``high`` are the spread of a ratio where > ``neutral`` means better (a speedup).
    Anything that straddles ``neutral`` (or is not a number) is ``no difference beyond the noise``.
    """
    return _side(low, high, neutral, FASTER, SLOWER, SAME) if _finite(low, high) else SAME


def time_ratio_direction(low: float, high: float) -> str:
    """For a ratio of times (candidate / baseline, > 1 means the candidate takes longer): ``slower``
    when the whole spread is above 1, ``faster`` when below, else no difference beyond the noise."""
    return _side(low, high, 1.0, SLOWER, FASTER, SAME) if _finite(low, high) else SAME


def met(low: float, high: float, goal: float) -> str:
    """A goal against a measured spread: ``met`` (all of it at or above the goal), ``not met``
    (all of it below) or ``within the noise of the goal``."""
    if not _finite(low, high, goal):
        return "not measured"
    return _side(low, high, goal, "met", "not met", "within the noise of the goal", ties="above")


def byte_bound(low: float, high: float, bound: float) -> str:
    """A measured speedup (its p10-p90 spread ``low``-``high``) against the most that cutting the
    bytes read allows (``bound``, e.g. 1 / the weight-bytes ratio of weight-only INT8, chapter 05):
    ``above the byte bound`` when the whole spread is above it (the gain is not the bytes alone),
    ``within the byte bound`` when the whole spread is at or below it, else
    ``at the byte bound within the noise``."""
    if not _finite(low, high, bound):
        return "not measured"
    return _side(low, high, bound, "above the byte bound", "within the byte bound",
                 "at the byte bound within the noise", ties="below")


def spreads_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Do two (low, high) ranges overlap? Two figures whose p10-p90 ranges overlap are not ranked."""
    (a_lo, a_hi), (b_lo, b_hi) = sorted(a), sorted(b)
    return a_lo <= b_hi and b_lo <= a_hi


@dataclass
class Ranking:
    """The best of several measured options, and whether it is best beyond the noise.

    ``best`` is the option with the highest median. ``clear`` is True only when its spread does not
    overlap the runner-up's; otherwise ``tied`` lists every option whose spread overlaps the best's
    (the best included), and a sentence must name them together, not crown one.
    """

    best: str
    clear: bool
    tied: list
    runner_up: Optional[str] = None


def rank(options: Iterable[tuple[str, float, float, float]], higher_is_better: bool = True
         ) -> Optional[Ranking]:
    """``options`` are (name, median, p10, p90) of a figure; higher is better (tok/s) unless
    ``higher_is_better=False`` (a time). Returns None when no option has a finite median.
    """
    rows = sorted((r for r in options if _finite(r[1])), key=lambda r: r[1], reverse=higher_is_better)
    if not rows:
        return None
    name, median, lo, hi = rows[0]
    spread = (lo, hi) if _finite(lo, hi) else (median, median)
    tied = [r[0] for r in rows
            if r[0] == name or not _finite(r[2], r[3]) or spreads_overlap(spread, (r[2], r[3]))]
    return Ranking(name, len(tied) == 1, tied, rows[1][0] if len(rows) > 1 else None)


def effect(claimed: float, measured: float, neutral: float, *, low: Optional[float] = None,
           high: Optional[float] = None, noise: float = 0.0,
           factor: float = SAME_EFFECT_FACTOR) -> str:
    """How a measured effect compares with a claimed one, both as distances from ``neutral``.

    ``neutral`` is "no effect": 1 for ratios, 0 for percentage changes. The measured effect is
    "no effect beyond the noise" when its spread (``low``-``high``, else ``measured`` ± ``noise``)
    contains ``neutral``. Otherwise it is "opposite effect" when its direction is not the claim's,
    "same effect" when its size (distance from neutral; log-distance for ratios) is within
    ``factor`` of the claimed size, else "smaller effect" / "larger effect".
    """
    if not _finite(claimed, measured, neutral):
        return "not measured"
    if low is None or high is None or not _finite(low, high):
        low, high = measured - noise, measured + noise
    if min(low, high) <= neutral <= max(low, high):
        return "no effect beyond the noise"
    want = (claimed > neutral) - (claimed < neutral)
    if want == 0:
        return "no effect claimed"
    if (measured > neutral) - (measured < neutral) != want:
        return "opposite effect"

    def size(v: float) -> float:
        return abs(math.log(v)) if neutral == 1.0 and v > 0 else abs(v - neutral)

    claimed_size, measured_size = size(claimed), size(measured)
    if claimed_size == 0:
        return "no effect claimed"
    if measured_size > claimed_size * factor:
        return "larger effect"
    if measured_size * factor < claimed_size:
        return "smaller effect"
    return "same effect"


def bandwidth_regime(achieved_gbps: float, bandwidth_gbps: float, bound_share: float = 0.6) -> str:
    """Is a step limited by moving bytes? ``at the bandwidth`` only when it reaches ``bound_share``
    of the measured read bandwidth; ``above the bandwidth`` past 100 % (the data stayed in the caches,
    so DRAM does not bound it); below that, the time goes elsewhere (kernels that do not stream at full
    speed, launches, Python), and calling it memory-bound would claim more than was measured."""
    if not _finite(achieved_gbps, bandwidth_gbps) or bandwidth_gbps <= 0:
        return "not measured"
    if achieved_gbps > bandwidth_gbps:
        return "above the bandwidth"
    return "at the bandwidth" if achieved_gbps >= bound_share * bandwidth_gbps else "below the bandwidth"


def changed(values: Sequence[float], spreads: Sequence[tuple[float, float]] = ()) -> str:
    """Does a figure change along a sweep? ``grows`` / ``shrinks`` when the last point's spread is
    apart from the first's in that direction, else ``no change beyond the noise``.

    Without spreads a change of more than 10 % counts (the workbook's noise flag threshold).
    """
    vals = [v for v in values if _finite(v)]
    if len(vals) < 2:
        return "not measured"
    first, last = vals[0], vals[-1]
    if spreads and len(spreads) == len(values) and all(_finite(*s) for s in spreads):
        apart = not spreads_overlap(spreads[0], spreads[-1])
    else:
        apart = bool(first) and abs(last / first - 1) > 0.10
    if apart:
        return "grows" if last > first else "shrinks"
    return "no change beyond the noise"


# --- chapter 06: the ladder's best rung ------------------------------------------------------------

