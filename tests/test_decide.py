"""Every decision behind a direction word, tested both ways (helpers.decide)."""
import math

import pytest

from helpers import bench, decide, ladder


def timing(name, samples):
    return bench.Timing(name, list(samples))


def test_direction_needs_the_whole_spread_on_one_side():
    assert decide.direction(1.05, 1.30) == decide.FASTER
    assert decide.direction(0.70, 0.95) == decide.SLOWER
    assert decide.direction(0.91, 1.23) == decide.SAME  # the 1.05x of chapter 02 with its spread
    assert decide.direction(math.nan, 1.2) == decide.SAME


def _direction(speedup):
    return decide.direction(speedup.low, speedup.high)


def test_speedup_direction_of_overlapping_and_separate_timings():
    base = timing("base", [10, 10.5, 11, 11.5, 12])
    overlap = timing("overlap", [9.5, 10, 10.5, 11, 11.5])
    apart = timing("apart", [5, 5.2, 5.4, 5.6, 5.8])
    assert _direction(bench.speedup(base, overlap)) == decide.SAME
    assert _direction(bench.speedup(base, apart)) == decide.FASTER
    assert _direction(bench.speedup(apart, base)) == decide.SLOWER


def test_rank_names_a_best_only_beyond_the_noise():
    # chapter 06's "+ INT8" at 2.11x, 1 % above graph mode with overlapping p10-p90 spreads
    tie = decide.rank([("+ graph mode", 31.9, 30.0, 33.5), ("+ INT8", 32.2, 30.5, 34.0),
                       ("native eager", 15.3, 15.0, 15.6)])
    assert tie.best == "+ INT8" and not tie.clear
    assert set(tie.tied) == {"+ INT8", "+ graph mode"}
    clear = decide.rank([("+ graph mode", 31.9, 30.0, 33.5), ("+ INT8", 43.0, 42.0, 44.0)])
    assert clear.best == "+ INT8" and clear.clear and clear.tied == ["+ INT8"]
    assert clear.runner_up == "+ graph mode"
    assert decide.rank([("x", math.nan, 1, 2)]) is None


def test_met_against_a_goal():
    assert decide.met(2.25, 2.4, 2.2) == "met"
    assert decide.met(1.8, 2.1, 2.2) == "not met"
    assert decide.met(2.1, 2.3, 2.2) == "within the noise of the goal"


@pytest.mark.parametrize("claimed, measured, kw, want", [
    (1.78, 1.70, dict(low=1.5, high=1.9), "same effect"),
    (1.78, 1.05, dict(low=1.02, high=1.08), "smaller effect"),
    (1.78, 0.64, dict(low=0.6, high=0.7), "opposite effect"),
    (1.78, 1.02, dict(low=0.95, high=1.1), "no effect beyond the noise"),
    (1.2, 3.5, dict(low=3.3, high=3.7), "larger effect"),
])
def test_effect_of_ratios(claimed, measured, kw, want):
    assert decide.effect(claimed, measured, 1.0, **kw) == want


def test_effect_of_percentages_needs_a_magnitude_within_the_factor():
    # 58.9 % measured against a claimed 20 %: same direction, but not "the same effect"
    assert decide.effect(20, 58.9, 0.0, noise=2) == "larger effect"
    assert decide.effect(20, 25, 0.0, noise=2) == "same effect"
    assert decide.effect(15, 0.09, 0.0, noise=2) == "no effect beyond the noise"
    assert decide.effect(15, 0.09, 0.0, noise=0.01) == "smaller effect"
    assert decide.effect(15, -8, 0.0, noise=2) == "opposite effect"


def test_bandwidth_regime_needs_most_of_the_bandwidth():
    assert decide.bandwidth_regime(20, 25) == "at the bandwidth"
    assert decide.bandwidth_regime(7, 25) == "below the bandwidth"
    assert decide.bandwidth_regime(7, 0) == "not measured"


def test_changed_along_a_sweep():
    # 71 -> 154 ms per decode step over a prompt-length sweep is a change, not "barely changes"
    assert decide.changed([71, 90, 154], [(69, 73), (88, 92), (150, 158)]) == "grows"
    assert decide.changed([71, 72], [(69, 74), (70, 75)]) == "no change beyond the noise"
    assert decide.changed([100, 50]) == "shrinks"
    assert decide.changed([100, 104]) == "no change beyond the noise"
    assert decide.changed([100]) == "not measured"


def test_byte_bound_of_weight_only_int8_both_ways():
    # chapter 05: cutting the weights to 0.5x allows at most 2x on a step bound by reading weights
    assert decide.byte_bound(2.3, 2.6, 2.0) == "above the byte bound"
    assert decide.byte_bound(1.2, 1.6, 2.0) == "within the byte bound"
    assert decide.byte_bound(0.6, 0.7, 2.0) == "within the byte bound"
    assert decide.byte_bound(1.8, 2.2, 2.0) == "at the byte bound within the noise"
    assert decide.byte_bound(float("nan"), 2.2, 2.0) == "not measured"


# --- chapter 06: the ladder's best rung ------------------------------------------------------------

EAGER = ("eager", 10.0, 9.0, 11.0)  # tok/s: median, p10, p90


def test_best_gain_is_best_only_apart_from_the_others_and_above_the_baseline():
    clear = ladder.best_gain([("graph", 16.0, 15.0, 17.0), ("int8", 24.0, 23.0, 25.0)], EAGER)
    assert (clear.best, clear.decision, clear.tied) == ("int8", "best, clear", [])
    # chapter 06's case of issue 22: INT8 1 % above graph mode, their spreads overlapping
    tied = ladder.best_gain([("graph", 20.8, 19.5, 22.0), ("int8", 21.1, 20.0, 22.3)], EAGER)
    assert (tied.best, tied.decision, tied.tied) == ("int8", "best, tied", ["graph"])


def test_best_gain_inside_the_noise_of_the_baseline_is_no_gain():
    noisy = ladder.best_gain([("fused", 10.5, 9.5, 12.0)], EAGER)
    assert noisy.best == "fused" and noisy.decision == "no gain beyond the noise"
    slower = ladder.best_gain([("a", 8.0, 7.0, 8.5), ("b", 7.0, 6.0, 7.5)], EAGER)
    assert slower.decision == "no gain beyond the noise"
    unknown = ladder.best_gain([("a", 30.0, math.nan, math.nan)], EAGER)
    assert unknown.best == "a" and unknown.decision == "no gain beyond the noise"
    assert ladder.best_gain([("a", math.nan, 1, 2)], EAGER) is None and ladder.best_gain([], EAGER) is None
