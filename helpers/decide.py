"""The decisions behind every direction word the workbook prints: faster, best, met, same effect.

Layer: foundations. Taught in ``03_end_to_end.ipynb`` (first used there) and used by every chapter's summary and by the
claims audit of the report chapter. A sentence may say "faster", "slower", "best" or "same effect"
only when one of these functions says so from the measured spreads; otherwise it says that the
difference is within the noise. Each function is small and tested both ways
(``tests/test_decide.py``), so a template never decides anything inside a string.

Spreads are the p10-p90 ranges of ``helpers.bench``. A ratio ``baseline / candidate`` has the
conservative spread ``baseline.p10 / candidate.p90`` to ``baseline.p90 / candidate.p10``
(``bench.speedup``): it lies wholly above 1 only when the two p10-p90 ranges do not overlap.

No word from too few samples. Every function that can say a direction takes ``samples``, the number
of samples behind the smaller side of the comparison (``MIN_SAMPLES`` or more are needed: with two
samples a p10-p90 range is only the min and max of two runs), and a percentile needs
``percentile_samples(q)`` samples (p95: 20). Below that the decision is ``too few samples: N of M``
(``too_few``), which the phrase tables render in both languages; ``samples=None`` (the count was not
recorded) is too few as well, so a caller that does not pass the count never claims a direction.
``EXACT`` marks a figure that was computed rather than sampled (a byte count, a max difference).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

FASTER, SLOWER, SAME = "faster", "slower", "no difference beyond the noise"
# How far a measured effect may be from a claimed one and still be called "the same effect":
# within this factor of the claimed size, in the same direction.
SAME_EFFECT_FACTOR = 2.0
# The fewest samples per side of a comparison from which a direction, "best", "grows" or "beyond the
# noise" is said: below it a p10-p90 range is little more than the extremes of a handful of runs.
MIN_SAMPLES = 5
# A figure that is computed, not sampled (bytes, a max difference, a threshold): no count applies.
EXACT = math.inf
TOO_FEW = "too few samples"
UNKNOWN_COUNT = "not recorded"


def too_few(samples: Optional[float], need: int = MIN_SAMPLES) -> str:
    """The decision for a comparison made from ``samples`` (None: not recorded) where ``need`` are
    required: ``too few samples: 2 of 5`` (``too few samples: not recorded of 5``)."""
    count = UNKNOWN_COUNT if samples is None else f"{int(samples)}"
    return f"{TOO_FEW}: {count} of {need}"


def is_too_few(decision: object) -> bool:
    """Is ``decision`` a ``too_few`` outcome (no direction may be read from it)?"""
    return str(decision).startswith(TOO_FEW + ":")


def parse_too_few(decision: object) -> Optional[tuple[Optional[int], int]]:
    """``(samples or None, need)`` of a ``too_few`` decision, None for any other decision."""
    text = str(decision)
    if not is_too_few(text):
        return None
    count, _, need = text[len(TOO_FEW) + 2:].rpartition(" of ")
    return (None if count == UNKNOWN_COUNT else int(count)), int(need)


def percentile_samples(q: float) -> int:
    """The fewest samples a percentile ``q`` (0-100) is read from: enough that at least one sample
    lies beyond it on its far side (p95: 20, p99: 100, p90 and p10: 10, the median: 2)."""
    if not (isinstance(q, (int, float)) and 0 < q < 100):
        raise ValueError(f"q={q!r} is not valid; a percentile lies strictly between 0 and 100")
    tail = min(q, 100 - q) / 100.0
    return max(2, math.ceil(round(1.0 / tail, 9)))


def enough(samples: Optional[float], need: int = MIN_SAMPLES) -> bool:
    """At least ``need`` samples (``EXACT`` always is; None, not recorded, never is)."""
    return isinstance(samples, (int, float)) and not isinstance(samples, bool) and samples >= need


def samples_of(figure: Optional[dict], default: Optional[float] = None) -> Optional[float]:
    """How many samples a recorded figure or table row stands on: its own ``n_samples``,
    ``iterations``, ``repeats`` or ``rounds`` (or those of its ``timing`` summary), else ``default``
    (the chapter's ``repeats`` / ``min_iters`` parameter, a lower bound of every timing it took).
    A record without any spread (no low/high, p10/p90) is ``EXACT``: it was not sampled."""
    if not isinstance(figure, dict):
        return default
    for source in (figure, figure.get("timing")):
        if isinstance(source, dict):
            for key in SAMPLE_KEYS:
                value = source.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                    return value
    return default if has_spread(figure) else EXACT


def chapter_samples(parameters: Optional[dict]) -> Optional[float]:
    """The fewest samples any timing of a chapter has when its figure does not say: the chapter's
    ``repeats`` (timed generate calls per point), ``rounds`` (chapter 07's request rounds) or
    ``min_iters`` (``bench.measure`` takes at least that many); None when it has none of them."""
    for key in ("repeats", "rounds", "min_iters"):
        value = (parameters or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


# the keys a recorded figure or row may state its sample count under, the most specific first
SAMPLE_KEYS = ("n_samples", "iterations", "repeats", "rounds")


def has_spread(figure: dict) -> bool:
    """Does a record carry a measured spread (low/high, p10/p90, or a ``*_low`` / ``*_p90_ms`` column)?"""
    return any(k in ("low", "high", "p10", "p90") or k.endswith(("_low", "_high", "_low_pct", "_high_pct"))
               or "_p10" in k or "_p90" in k or k.startswith(("p10_", "p90_"))
               for k in figure)


def finite(*values) -> bool:
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


def _against(low: float, high: float, mark: float, samples: Optional[float], above: str, below: str,
             between: str, ties: str) -> str:
    """``_side`` of a measured spread against a goal or bound ``mark``: ``not measured`` when a figure
    is not a number, ``too_few`` from fewer than ``MIN_SAMPLES`` samples."""
    if not finite(low, high, mark):
        return "not measured"
    return _side(low, high, mark, above, below, between, ties) if enough(samples) else too_few(samples)


def direction(low: float, high: float, neutral: float = 1.0, *, samples: Optional[float] = None) -> str:
    """``faster`` when the whole spread of a speedup is above ``neutral``, ``slower`` when below.

    ``low``/``high`` are the spread of a ratio where > ``neutral`` means better (a speedup).
    Anything that straddles ``neutral`` (or is not a number) is ``no difference beyond the noise``;
    from fewer than ``MIN_SAMPLES`` ``samples`` per side it is ``too_few``.
    """
    if not finite(low, high):
        return SAME
    return _side(low, high, neutral, FASTER, SLOWER, SAME) if enough(samples) else too_few(samples)


def time_ratio_direction(low: float, high: float, *, samples: Optional[float] = None) -> str:
    """For a ratio of times (candidate / baseline, > 1 means the candidate takes longer): ``slower``
    when the whole spread is above 1, ``faster`` when below, else no difference beyond the noise
    (``too_few`` from fewer than ``MIN_SAMPLES`` samples per side)."""
    if not finite(low, high):
        return SAME
    return _side(low, high, 1.0, SLOWER, FASTER, SAME) if enough(samples) else too_few(samples)


def met(low: float, high: float, goal: float, *, samples: Optional[float] = None) -> str:
    """A goal against a measured spread: ``met`` (all of it at or above the goal), ``not met``
    (all of it below) or ``within the noise of the goal``; ``too_few`` from fewer than
    ``MIN_SAMPLES`` samples (``EXACT`` for a computed figure against a threshold)."""
    return _against(low, high, goal, samples, "met", "not met", "within the noise of the goal", "above")


def byte_bound(low: float, high: float, bound: float, *, samples: Optional[float] = None) -> str:
    """A measured speedup (its p10-p90 spread ``low``-``high``) against the most that cutting the
    bytes read allows (``bound``, e.g. 1 / the weight-bytes ratio of weight-only INT8, chapter 05):
    ``above the byte bound`` when the whole spread is above it (the gain is not the bytes alone),
    ``within the byte bound`` when the whole spread is at or below it, else
    ``at the byte bound within the noise``."""
    return _against(low, high, bound, samples, "above the byte bound", "within the byte bound",
                    "at the byte bound within the noise", "below")


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
    # the too_few decision when the options had fewer than MIN_SAMPLES samples (then nothing is clear)
    too_few: Optional[str] = None


def rank(options: Iterable[tuple[str, float, float, float]], higher_is_better: bool = True, *,
         samples: Optional[float] = None) -> Optional[Ranking]:
    """``options`` are (name, median, p10, p90) of a figure; higher is better (tok/s) unless
    ``higher_is_better=False`` (a time). Returns None when no option has a finite median. From fewer
    than ``MIN_SAMPLES`` ``samples`` per option no option is clear: every option is tied and
    ``too_few`` holds the decision to say instead.
    """
    rows = sorted((r for r in options if finite(r[1])), key=lambda r: r[1], reverse=higher_is_better)
    if not rows:
        return None
    name, median, lo, hi = rows[0]
    spread = (lo, hi) if finite(lo, hi) else (median, median)
    runner_up = rows[1][0] if len(rows) > 1 else None
    if not enough(samples):
        return Ranking(name, False, [r[0] for r in rows], runner_up, too_few(samples))
    tied = [r[0] for r in rows
            if r[0] == name or not finite(r[2], r[3]) or spreads_overlap(spread, (r[2], r[3]))]
    return Ranking(name, len(tied) == 1, tied, runner_up)


def effect(claimed: float, measured: float, neutral: float, *, low: Optional[float] = None,
           high: Optional[float] = None, noise: float = 0.0,
           factor: float = SAME_EFFECT_FACTOR, samples: Optional[float] = None) -> str:
    """How a measured effect compares with a claimed one, both as distances from ``neutral``.

    ``neutral`` is "no effect": 1 for ratios, 0 for percentage changes. The measured effect is
    "no effect beyond the noise" when its spread (``low``-``high``, else ``measured`` ± ``noise``)
    contains ``neutral``. Otherwise it is "opposite effect" when its direction is not the claim's,
    "same effect" when its size (distance from neutral; log-distance for ratios) is within
    ``factor`` of the claimed size, else "smaller effect" / "larger effect". A measured effect from
    fewer than ``MIN_SAMPLES`` ``samples`` is ``too_few``.
    """
    if not finite(claimed, measured, neutral):
        return "not measured"
    if not enough(samples):
        return too_few(samples)
    if low is None or high is None or not finite(low, high):
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
    if not finite(achieved_gbps, bandwidth_gbps) or bandwidth_gbps <= 0:
        return "not measured"
    if achieved_gbps > bandwidth_gbps:
        return "above the bandwidth"
    return "at the bandwidth" if achieved_gbps >= bound_share * bandwidth_gbps else "below the bandwidth"


def changed(values: Sequence[float], spreads: Sequence[tuple[float, float]] = (), *,
            samples: Optional[float] = EXACT) -> str:
    """Does a figure change along a sweep? ``grows`` / ``shrinks`` when the last point's spread is
    apart from the first's in that direction, else ``no change beyond the noise``.

    Without spreads a change of more than 10 % counts (the workbook's noise flag threshold): that is
    for computed figures (bytes, perplexity), so ``samples`` defaults to ``EXACT``; with spreads the
    figures were sampled, and fewer than ``MIN_SAMPLES`` ``samples`` (None: not recorded) per point
    are ``too_few``.
    """
    vals = [v for v in values if finite(v)]
    if len(vals) < 2:
        return "not measured"
    first, last = vals[0], vals[-1]
    if spreads and (samples is EXACT or not enough(samples)):
        return too_few(None if samples is EXACT else samples)
    if spreads and len(spreads) == len(values) and all(finite(*s) for s in spreads):
        apart = not spreads_overlap(spreads[0], spreads[-1])
    else:
        apart = bool(first) and abs(last / first - 1) > 0.10
    return ("grows" if last > first else "shrinks") if apart else "no change beyond the noise"

