"""The timing protocol: statistics, warm-up exclusion, synchronisation, inner-call batching, speedups.

Correctness only: nothing here asserts on how fast this shared machine is.
"""
from __future__ import annotations

import statistics
import types

import pytest
import torch

from helpers import backend, bench


def _timing(samples, name="t"):
    return bench.Timing(name, list(samples))


def test_statistics_of_known_samples():
    t = _timing([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0])
    assert t.median == 6.0
    assert t.p10 == pytest.approx(2.0)
    assert t.p90 == pytest.approx(10.0)
    assert t.stdev_pct == pytest.approx(100 * statistics.stdev(t.samples) / 6.0)
    assert t.noisy  # 55 %
    assert t.median_ms == 6000.0


def test_percentile_interpolates_and_handles_one_sample():
    t = _timing([0.0, 10.0])
    assert t.percentile(25) == pytest.approx(2.5)
    one = _timing([3.0])
    assert one.p10 == one.p90 == one.median == 3.0 and one.stdev_pct == 0.0 and not one.noisy


def test_noise_flag_threshold():
    steady = _timing([1.0, 1.01, 0.99, 1.0, 1.02])
    assert steady.stdev_pct < bench.NOISY_STDEV_PCT and not steady.noisy
    jumpy = _timing([1.0, 1.5, 0.7, 1.2, 0.9])
    assert jumpy.noisy


def test_summary_is_in_milliseconds_and_keeps_context():
    t = bench.Timing("op", [0.001, 0.002, 0.003], inner_calls=4, first_call_s=0.5, device="cpu",
                     meta={"dtype": "float32", "shape": "(2, 3)"})
    s = t.summary()
    assert s["median_ms"] == pytest.approx(2.0) and s["p10_ms"] < s["p90_ms"]
    assert s["iterations"] == 3 and s["inner_calls"] == 4 and s["first_call_s"] == 0.5
    assert s["dtype"] == "float32" and s["shape"] == "(2, 3)"
    assert "NOISY" in repr(t)


def test_speedup_is_a_ratio_of_medians_with_spread():
    base = _timing([2.0, 2.0, 2.0, 1.8, 2.2], "eager")
    fast = _timing([1.0, 1.0, 1.0, 0.9, 1.1], "fused")
    s = bench.speedup(base, fast)
    assert s.ratio == pytest.approx(2.0)
    assert s.low == pytest.approx(base.p10 / fast.p90)
    assert s.high == pytest.approx(base.p90 / fast.p10)
    assert s.low < s.ratio < s.high
    assert (s.baseline, s.candidate) == ("eager", "fused")
    assert bench.speedup(fast, base).ratio == pytest.approx(0.5)


class _Clock:
    """A fake perf_counter: each call of the timed function advances it by ``step`` seconds."""

    def __init__(self, step):
        self.now, self.step, self.calls = 0.0, step, 0

    def perf_counter(self):
        return self.now

    def fn(self):
        self.calls += 1
        self.now += self.step


def test_warmup_is_excluded_and_first_call_reported(monkeypatch):
    clock = _Clock(step=0.01)
    monkeypatch.setattr(bench.time, "perf_counter", clock.perf_counter)
    t = bench.measure(clock.fn, "cpu", warmup=3, min_iters=5, min_seconds=0.0,
                      min_sample_seconds=1e-3)
    assert len(t.samples) == 5 and t.inner_calls == 1
    assert clock.calls == 3 + 5  # 3 warm-up calls (the first timed as first_call_s), 5 samples
    assert t.first_call_s == pytest.approx(0.01)
    assert all(s == pytest.approx(0.01) for s in t.samples)


def test_slow_first_call_is_not_in_the_samples(monkeypatch):
    clock = _Clock(step=0.01)
    monkeypatch.setattr(bench.time, "perf_counter", clock.perf_counter)
    first = [True]

    def compiling():
        if first[0]:
            first[0] = False
            clock.now += 5.0  # a compile
        clock.fn()

    t = bench.measure(compiling, "cpu", warmup=2, min_iters=4, min_seconds=0.0)
    assert t.first_call_s == pytest.approx(5.01)
    assert max(t.samples) == pytest.approx(0.01)


def test_min_seconds_extends_sampling(monkeypatch):
    clock = _Clock(step=0.125)  # exact in binary, so the sum reaches 1.0 exactly
    monkeypatch.setattr(bench.time, "perf_counter", clock.perf_counter)
    t = bench.measure(clock.fn, "cpu", warmup=1, min_iters=2, min_seconds=1.0)
    assert len(t.samples) == 8  # 8 x 0.125 s reach min_seconds


def test_max_iters_caps_sampling(monkeypatch):
    clock = _Clock(step=0.1)
    monkeypatch.setattr(bench.time, "perf_counter", clock.perf_counter)
    t = bench.measure(clock.fn, "cpu", warmup=0, min_iters=2, min_seconds=100.0, max_iters=7)
    assert len(t.samples) == 7


def test_microsecond_calls_are_batched_into_inner_calls(monkeypatch):
    clock = _Clock(step=1e-5)
    monkeypatch.setattr(bench.time, "perf_counter", clock.perf_counter)
    t = bench.measure(clock.fn, "cpu", warmup=1, min_iters=3, min_seconds=0.0,
                      min_sample_seconds=1e-3)
    assert t.inner_calls == 100
    assert len(t.samples) == 3
    assert t.median == pytest.approx(1e-5)  # samples are per call, not per batch


def test_measure_synchronises_around_every_sample_on_an_accelerator(fake_torch_npu, monkeypatch):
    fake_dev = types.SimpleNamespace(type="npu", index=None)
    monkeypatch.setattr(bench, "as_device", lambda d: fake_dev)
    monkeypatch.setattr(backend, "as_device", lambda d: fake_dev)
    clock = _Clock(step=0.01)
    monkeypatch.setattr(bench.time, "perf_counter", clock.perf_counter)
    events = fake_torch_npu.CALLS
    events.clear()

    def fn():
        events.append("fn")
        clock.fn()

    bench.measure(fn, "npu", warmup=1, min_iters=3, min_seconds=0.0)
    timed = events[events.index("fn") + 1:]  # after the first call
    # every timed sample is fenced: sync, fn, sync
    for i, event in enumerate(timed):
        if event == "fn":
            assert timed[i - 1] == "synchronize" and timed[i + 1] == "synchronize"
    assert timed.count("fn") == 3


def test_meta_dtype_is_stored_by_name():
    t = bench.measure(lambda: None, "cpu", warmup=0, min_iters=1, min_seconds=0.0,
                      dtype=torch.bfloat16, shape=(1, 2), code_path="noop")
    assert t.meta == {"dtype": "bfloat16", "shape": (1, 2), "code_path": "noop"}
    assert t.name == "<lambda>"


@pytest.mark.parametrize("kwargs,match", [({"min_iters": 0}, "min_iters"), ({"warmup": -1}, "warmup")])
def test_bad_protocol_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench.measure(lambda: None, "cpu", **kwargs)


def test_memory_bandwidth_reports_consistent_figures():
    out = bench.memory_bandwidth("cpu", size_mib=4, min_iters=2, min_seconds=0.0)
    assert out["read_gbps"] > 0 and out["copy_gbps"] > 0
    assert out["read_gbps_p10"] <= out["read_gbps"] <= out["read_gbps_p90"]
    assert out["buffer_mib"] == 4 and out["device"] == "cpu" and out["dtype"] == "float32"
    with pytest.raises(ValueError, match="size_mib"):
        bench.memory_bandwidth("cpu", size_mib=0)


def test_reference_bandwidth_prefers_chapter_00_of_the_run(tmp_path):
    from helpers.results import Results

    r = Results("00_environment_check", tmp_path)
    r.record("memory_bandwidth_gbps", 12.5, "GB/s")
    value, source = bench.reference_bandwidth("cpu", tmp_path)
    assert value == 12.5 and "chapter 00" in source
