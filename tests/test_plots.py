"""Every bar is the sum of its own measured parts, and its label is that sum."""
import pytest

from helpers import batching_study, end_to_end_study, generation, plots


def _gap():
    paths = {"eager, dynamic cache": {"decode_ms_per_token": 45.5, "weight_matmul_ms": 30.0},
             "graph, static cache": {"decode_ms_per_token": 26.5, "weight_matmul_ms": 21.0},
             "odd": {"decode_ms_per_token": 10.0, "weight_matmul_ms": 12.0}}
    return end_to_end_study.decode_gap(paths, bytes_per_step=270e6, weight_bytes=268e6, bandwidth_gbps=24.0)


def test_decode_gap_bars_add_up_to_their_labels():
    gap = _gap()
    fig = plots.plot_decode_gap(gap)
    ax = fig.axes[0]
    heights = {}
    for patch in ax.patches:
        assert patch.get_height() >= 0
        x = round(patch.get_x() + patch.get_width() / 2)
        heights[x] = heights.get(x, 0.0) + patch.get_height()
    labels = [t.get_text().split(" ms")[0] for t in ax.texts]
    for i, step in enumerate(gap["step_ms"]):
        assert heights[i] == pytest.approx(step)
        assert float(labels[i]) == pytest.approx(step, abs=0.05)
    # the graph path's matmul part is its own kernels (21 ms), not the eager 30 ms
    parts = plots.decode_gap_parts(gap)
    assert parts[1]["matmul_ms"] == pytest.approx(21.0) and parts[1]["rest_ms"] == pytest.approx(5.5)
    assert parts[2]["matmul_ms"] == pytest.approx(10.0) and parts[2]["rest_ms"] == 0.0
    roofline = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert roofline and roofline[0].get_ydata()[0] == pytest.approx(270e6 / 24e9 * 1e3)


def test_batch_sweep_plot_draws_its_tables_and_the_guides_claims():
    import pandas as pd
    from test_batching_study import _point

    mib = 2 ** 20
    rows = [_point(1, [9.0, 10.0, 12.0], [50.0] * 3, 100 * mib, 1 * mib),
            _point(2, [10.0, 11.0, 12.0], [90.0] * 3, 150 * mib, 2 * mib),
            _point(4, [11.0, 12.5, 13.0], [150.0] * 3, 250 * mib, 4 * mib),
            {"point": 8, "status": "oom", "error": "out of memory"}]
    for r in rows[:3]:
        r.update(tokens_per_s_per_user=1e3 / r["decode_ms_per_token"], decode_p10_ms=9.0, decode_p90_ms=13.0,
                 tokens_per_s_aggregate=r["point"] * 1e3 / r["decode_ms_per_token"],
                 ttft_ms=r["ttft_samples_ms"][1])
    sweep = generation.sweep_table(rows)
    ratios = batching_study.batch_ratios(rows)
    guide = {4: {"throughput": 3.2}, 8: {"throughput": 5.8}}
    fig = plots.plot_batch_sweep(sweep, ratios, guide, "test")
    speed, latency, gain, memory = fig.axes
    ok = sweep[sweep.status == "ok"]
    assert list(speed.lines[0].get_ydata()) == pytest.approx(list(ok.tokens_per_s_aggregate))
    assert list(latency.lines[0].get_ydata()) == pytest.approx(list(ok.decode_ms_per_token))
    drawn = {line.get_label(): line for line in gain.lines}
    measured = gain.containers[0].lines[0]  # the errorbar's data line
    assert list(measured.get_ydata()) == pytest.approx([r["throughput_ratio"] for r in ratios])
    assert list(drawn["ideal = batch"].get_ydata()) == [1, 2, 4]
    claimed = drawn["guide's claim (Llama-2-7B)"]
    assert list(claimed.get_xdata()) == [1, 4, 8] and list(claimed.get_ydata()) == [1.0, 3.2, 5.8]
    growth, kv = memory.lines
    assert list(growth.get_ydata()) == [100, 150, 250] and list(kv.get_ydata()) == [1, 2, 4]
    assert memory.get_yscale() == "log"
    assert [t.get_text() for t in gain.get_xticklabels()] == ["1", "2", "4", "8"]
    assert pd.DataFrame(ratios).batch.tolist() == [1, 2, 4]


def test_a_ladder_bar_is_labelled_with_its_ratio_to_the_first_rung_with_a_figure():
    import matplotlib.pyplot as plt

    assert plots.plot_ladder([{"title": "none", "rungs": [("a", None)], "ylabel": "x"}]) is None
    fig = plots.plot_ladder([{"title": "run", "rungs": [("failed", None), ("a", 20.0), ("b", 30.0)],
                              "ylabel": "tok/s"},
                             {"title": "empty", "rungs": [], "ylabel": "tok/s", "empty": "no ladder here"}])
    left, right = fig.axes
    assert [p.get_height() for p in left.patches] == [0.0, 20.0, 30.0]  # the failed rung: no bar
    assert [t.get_text() for t in left.texts] == ["1.00x", "1.50x"]
    assert [t.get_text() for t in right.texts] == ["no ladder here"]
    plt.close(fig)


def test_the_roofline_bar_states_its_share_of_the_ceiling():
    import matplotlib.pyplot as plt

    assert plots.plot_roofline([("a", None, 30.0, None)], "t") is None
    fig = plots.plot_roofline([("a", 15.0, 30.0, None), ("b", 10.0, None, 25.0), ("c", None, 40.0, None)], "t")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == [" 15.0 = 50% of the ceiling", " 30.0", " 10.0 = 25% of the ceiling", " not measured", " 40.0"]
    plt.close(fig)


def test_charts_never_get_a_zero_x_or_y_range():
    import warnings

    from test_batching_study import _point

    row = _point(1, [9.0, 10.0, 12.0], [50.0] * 3, 100 * 2 ** 20, 2 ** 20)
    row.update(tokens_per_s_per_user=100.0, decode_p10_ms=9.0, decode_p90_ms=12.0, tokens_per_s_aggregate=100.0,
               ttft_ms=50.0)
    sweep = generation.sweep_table([row])
    with warnings.catch_warnings():
        # matplotlib warns on identical low and high limits (and non-positive ones on a log axis);
        # only those fail here: the legacy set's older matplotlib also warns about pyparsing's renames
        warnings.filterwarnings("error", message="Attempt(ing)? to set (identical|non-positive)")
        fig = plots.plot_batch_sweep(sweep, batching_study.batch_ratios([row]), {}, "one batch size")
        for ax in fig.axes:  # a single batch size still gets an x-range around it
            low, high = ax.get_xlim()
            assert low < 1 < high
        fig = plots.plot_ladder([{"title": "zero", "rungs": [("a", 0.0)], "ylabel": "x"}])
        low, high = fig.axes[0].get_ylim()
        assert low < high
        fig = plots.plot_roofline([("a", 0.0, None, None)], "t")
        low, high = fig.axes[0].get_xlim()
        assert low < high
