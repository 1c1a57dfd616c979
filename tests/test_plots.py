"""Every bar is the sum of its own measured parts, and its label is that sum."""
import pytest

from helpers import generation, plots


def _gap():
    paths = {"eager, dynamic cache": {"decode_ms_per_token": 45.5, "weight_matmul_ms": 30.0},
             "graph, static cache": {"decode_ms_per_token": 26.5, "weight_matmul_ms": 21.0},
             "odd": {"decode_ms_per_token": 10.0, "weight_matmul_ms": 12.0}}
    return generation.decode_gap(paths, bytes_per_step=270e6, weight_bytes=268e6, bandwidth_gbps=24.0)


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
