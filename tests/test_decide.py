"""Every decision behind a direction word, tested both ways (helpers.decide)."""
import math

import pytest

from helpers import bench, decide, ladder


N = decide.MIN_SAMPLES  # enough samples for every word: the cases below are about the spreads


def timing(name, samples):
    return bench.Timing(name, list(samples))


def test_direction_needs_the_whole_spread_on_one_side():
    assert decide.direction(1.05, 1.30, samples=N) == decide.FASTER
    assert decide.direction(0.70, 0.95, samples=N) == decide.SLOWER
    assert decide.direction(0.91, 1.23, samples=N) == decide.SAME  # the 1.05x of chapter 02 with its spread
    assert decide.direction(math.nan, 1.2, samples=N) == decide.SAME


def _direction(speedup):
    return decide.direction(speedup.low, speedup.high, samples=5)


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
                       ("native eager", 15.3, 15.0, 15.6)], samples=N)
    assert tie.best == "+ INT8" and not tie.clear
    assert set(tie.tied) == {"+ INT8", "+ graph mode"}
    clear = decide.rank([("+ graph mode", 31.9, 30.0, 33.5), ("+ INT8", 43.0, 42.0, 44.0)], samples=N)
    assert clear.best == "+ INT8" and clear.clear and clear.tied == ["+ INT8"]
    assert clear.runner_up == "+ graph mode"
    assert decide.rank([("x", math.nan, 1, 2)]) is None


def test_met_against_a_goal():
    assert decide.met(2.25, 2.4, 2.2, samples=N) == "met"
    assert decide.met(1.8, 2.1, 2.2, samples=N) == "not met"
    assert decide.met(2.1, 2.3, 2.2, samples=N) == "within the noise of the goal"


@pytest.mark.parametrize("claimed, measured, kw, want", [
    (1.78, 1.70, dict(low=1.5, high=1.9), "same effect"),
    (1.78, 1.05, dict(low=1.02, high=1.08), "smaller effect"),
    (1.78, 0.64, dict(low=0.6, high=0.7), "opposite effect"),
    (1.78, 1.02, dict(low=0.95, high=1.1), "no effect beyond the noise"),
    (1.2, 3.5, dict(low=3.3, high=3.7), "larger effect"),
])
def test_effect_of_ratios(claimed, measured, kw, want):
    assert decide.effect(claimed, measured, 1.0, **kw, samples=N) == want


def test_effect_of_percentages_needs_a_magnitude_within_the_factor():
    # 58.9 % measured against a claimed 20 %: same direction, but not "the same effect"
    assert decide.effect(20, 58.9, 0.0, noise=2, samples=N) == "larger effect"
    assert decide.effect(20, 25, 0.0, noise=2, samples=N) == "same effect"
    assert decide.effect(15, 0.09, 0.0, noise=2, samples=N) == "no effect beyond the noise"
    assert decide.effect(15, 0.09, 0.0, noise=0.01, samples=N) == "smaller effect"
    assert decide.effect(15, -8, 0.0, noise=2, samples=N) == "opposite effect"


def test_bandwidth_regime_needs_most_of_the_bandwidth():
    assert decide.bandwidth_regime(20, 25) == "at the bandwidth"
    assert decide.bandwidth_regime(7, 25) == "below the bandwidth"
    assert decide.bandwidth_regime(7, 0) == "not measured"


def test_changed_along_a_sweep():
    # 71 -> 154 ms per decode step over a prompt-length sweep is a change, not "barely changes"
    assert decide.changed([71, 90, 154], [(69, 73), (88, 92), (150, 158)], samples=N) == "grows"
    assert decide.changed([71, 72], [(69, 74), (70, 75)], samples=N) == "no change beyond the noise"
    assert decide.changed([100, 50]) == "shrinks"
    assert decide.changed([100, 104]) == "no change beyond the noise"
    assert decide.changed([100]) == "not measured"


def test_byte_bound_of_weight_only_int8_both_ways():
    # chapter 05: cutting the weights to 0.5x allows at most 2x on a step bound by reading weights
    assert decide.byte_bound(2.3, 2.6, 2.0, samples=N) == "above the byte bound"
    assert decide.byte_bound(1.2, 1.6, 2.0, samples=N) == "within the byte bound"
    assert decide.byte_bound(0.6, 0.7, 2.0, samples=N) == "within the byte bound"
    assert decide.byte_bound(1.8, 2.2, 2.0, samples=N) == "at the byte bound within the noise"
    assert decide.byte_bound(float("nan"), 2.2, 2.0) == "not measured"


# --- chapter 06: the ladder's best rung ------------------------------------------------------------

EAGER = ("eager", 10.0, 9.0, 11.0)  # tok/s: median, p10, p90


def test_best_gain_is_best_only_apart_from_the_others_and_above_the_baseline():
    clear = ladder.best_gain([("graph", 16.0, 15.0, 17.0), ("int8", 24.0, 23.0, 25.0)], EAGER, samples=N)
    assert (clear.best, clear.decision, clear.tied) == ("int8", "best, clear", [])
    # chapter 06's case of issue 22: INT8 1 % above graph mode, their spreads overlapping
    tied = ladder.best_gain([("graph", 20.8, 19.5, 22.0), ("int8", 21.1, 20.0, 22.3)], EAGER, samples=N)
    assert (tied.best, tied.decision, tied.tied) == ("int8", "best, tied", ["graph"])


def test_best_gain_inside_the_noise_of_the_baseline_is_no_gain():
    noisy = ladder.best_gain([("fused", 10.5, 9.5, 12.0)], EAGER, samples=N)
    assert noisy.best == "fused" and noisy.decision == "no gain beyond the noise"
    slower = ladder.best_gain([("a", 8.0, 7.0, 8.5), ("b", 7.0, 6.0, 7.5)], EAGER, samples=N)
    assert slower.decision == "no gain beyond the noise"
    unknown = ladder.best_gain([("a", 30.0, math.nan, math.nan)], EAGER, samples=N)
    assert unknown.best == "a" and unknown.decision == "no gain beyond the noise"
    assert ladder.best_gain([("a", math.nan, 1, 2)], EAGER, samples=N) is None and ladder.best_gain([], EAGER, samples=N) is None


# --- no word from too few samples ------------------------------------------------------------------

def test_a_direction_needs_five_samples_per_side():
    # the same spread: a direction from 5 samples, "too few" from the quick profile's 2 repeats
    assert decide.direction(1.05, 1.30, samples=5) == decide.FASTER
    assert decide.direction(1.05, 1.30, samples=2) == "too few samples: 2 of 5"
    assert decide.time_ratio_direction(1.2, 1.4, samples=2) == "too few samples: 2 of 5"
    assert decide.time_ratio_direction(1.2, 1.4, samples=7) == decide.SLOWER
    # "no difference beyond the noise" is a word about the noise too: not from 2 samples either
    assert decide.direction(0.9, 1.1, samples=2) == "too few samples: 2 of 5"
    # a caller that does not pass the count claims nothing
    assert decide.direction(1.05, 1.30) == "too few samples: not recorded of 5"


def test_every_direction_word_is_too_few_from_two_samples():
    two = dict(samples=2)
    assert decide.is_too_few(decide.met(2.25, 2.4, 2.2, **two))
    assert decide.is_too_few(decide.byte_bound(2.3, 2.6, 2.0, **two))
    assert decide.is_too_few(decide.effect(1.78, 1.70, 1.0, low=1.5, high=1.9, **two))
    assert decide.is_too_few(decide.changed([71, 154], [(69, 73), (150, 158)], **two))
    found = decide.rank([("a", 10.0, 9.0, 11.0), ("b", 20.0, 19.0, 21.0)], **two)
    assert not found.clear and found.too_few == "too few samples: 2 of 5" and found.tied == ["b", "a"]
    gain = ladder.best_gain([("int8", 24.0, 23.0, 25.0)], EAGER, **two)
    assert gain.decision == "too few samples: 2 of 5"
    # computed figures (no spread) are exact: a max difference against its threshold, bytes
    assert decide.met(0.01, 0.01, 0.005, samples=decide.EXACT) == "met"
    assert decide.changed([100, 50]) == "shrinks"


def test_a_percentile_needs_enough_samples_for_its_tail():
    assert decide.percentile_samples(95) == 20 and decide.percentile_samples(99) == 100
    assert decide.percentile_samples(90) == decide.percentile_samples(10) == 10
    with pytest.raises(ValueError, match="q=100"):
        decide.percentile_samples(100)


def test_too_few_parses_back_and_counts_come_from_the_record():
    assert decide.parse_too_few("too few samples: 2 of 5") == (2, 5)
    assert decide.parse_too_few(decide.too_few(None)) == (None, 5)
    assert decide.parse_too_few("faster") is None
    assert decide.samples_of({"value": 1.2, "low": 1.1, "high": 1.3, "n_samples": 12}) == 12
    assert decide.samples_of({"value": 1.2, "low": 1.1, "high": 1.3, "timing": {"iterations": 3}}) == 3
    assert decide.samples_of({"value": 1.2, "low": 1.1, "high": 1.3}, 7) == 7  # the chapter's repeats
    assert decide.samples_of({"value": 1.2, "low": 1.1, "high": 1.3}) is None
    assert decide.samples_of({"value": 0.01, "guide_threshold": 0.005}) == decide.EXACT
    assert decide.chapter_samples({"repeats": 2, "min_iters": 5}) == 2
    assert decide.chapter_samples({"min_iters": 5}) == 5 and decide.chapter_samples({}) is None


def test_a_template_gets_the_count_from_the_recorded_figure():
    from helpers import prose

    template = '{{ direction(m.s.low, m.s.high) | say }}'

    def render(results):
        env = prose.environment(prose.Renderer())
        context = prose.context_of(results)
        return env.from_string(template).render(**context)

    figure = {"value": 1.2, "unit": "x", "low": 1.1, "high": 1.3}
    five = {"chapter": "x", "parameters": {"repeats": 5}, "metrics": {"s": figure}}
    two = {"chapter": "x", "parameters": {"repeats": 2}, "metrics": {"s": figure}}
    unknown = {"chapter": "x", "parameters": {}, "metrics": {"s": figure}}
    assert render(five) == prose.words("en")["faster"]
    assert render(two) == "too few samples to say a direction (2 of the 5 needed)"
    assert "not recorded" in render(unknown)
    own = {"chapter": "x", "parameters": {"repeats": 2}, "metrics": {"s": {**figure, "n_samples": 9}}}
    assert render(own) == prose.words("en")["faster"]
    env = prose.environment(prose.Renderer(), "zh")
    assert env.from_string(template).render(**prose.context_of(two)) == "样本太少，不足以判断方向：只有 2 个，需要 5 个"


def test_a_speedup_carries_the_fewer_samples_of_its_two_timings():
    s = bench.speedup(timing("a", [2.0] * 7), timing("b", [1.0] * 5))
    assert s.samples == 5 and decide.direction(s.low, s.high, samples=s.samples) == decide.FASTER
    few = bench.speedup(timing("a", [2.0] * 7), timing("b", [1.0] * 2))
    assert decide.parse_too_few(decide.direction(few.low, few.high, samples=few.samples)) == (2, 5)


def test_say_phrases_every_decision_outside_a_template_too():
    from helpers import prose

    assert prose.say(decide.FASTER) == prose.words("en")["faster"]
    assert prose.say(decide.too_few(2)) == "too few samples to say a direction (2 of the 5 needed)"
    assert "not recorded" in prose.say(decide.too_few(None))
    assert prose.say(decide.too_few(2), "zh") == "样本太少，不足以判断方向：只有 2 个，需要 5 个"
    with pytest.raises(KeyError, match="no phrase for the decision 'sideways'"):
        prose.say("sideways")


# decide's functions whose count of samples must be passed: without one they never say a direction
# (``changed`` needs it only for sampled spreads: without spreads its figures are computed)
COUNTED = {"direction", "time_ratio_direction", "met", "byte_bound", "rank", "effect", "changed"}


def _cells():
    """The code cells of every notebook and worked answer, as (where, source): test_tolerance's reader
    (which also yields the helpers' modules) without the modules."""
    from test_tolerance import _code_cells

    return ((where, source) for where, source in _code_cells() if where.suffix == ".ipynb")


def _uncounted_decisions(cells):
    """Each call of a counted decide function without ``samples=``, and each phrase-table lookup
    (``prose.words``) in ``cells`` of (where, source)."""
    import ast

    found = []
    for where, source in cells:
        for call in ast.walk(ast.parse(source)):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name)):
                continue
            module, name = call.func.value.id, call.func.attr
            if module == "decide" and name in COUNTED:
                spreads = len(call.args) > 1 or any(k.arg == "spreads" for k in call.keywords)
                if not any(k.arg == "samples" for k in call.keywords) and (name != "changed" or spreads):
                    found.append(f"{where}: decide.{name} without samples= (line {call.lineno} of its cell)")
            if module == "prose" and name == "words":
                found.append(f"{where}: prose.words looked up (line {call.lineno}); prose.say phrases too-few too")
    return found


def test_every_notebook_decision_passes_its_count_of_samples_and_is_phrased_by_say():
    # A decision called without its count is too_few by design; a worked answer that forgot the count
    # printed "too few samples: not recorded of 5" as its verdict, or failed looking it up (KeyError).
    found = _uncounted_decisions(_cells())
    assert not found, "; ".join(found)


def test_the_notebook_decision_check_fails_on_a_call_without_its_count():
    bad = [("a", "said = decide.direction(low, high)\nWORDS = prose.words('en')"),
           ("b", "decide.changed(values, spreads)")]
    assert len(_uncounted_decisions(bad)) == 3
    good = [("c", "decide.direction(low, high, samples=s.samples)\nprose.say(said, LANG)"),
            ("d", "decide.changed(byte_counts)")]
    assert _uncounted_decisions(good) == []
