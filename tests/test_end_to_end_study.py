"""Chapter 03's study: the prefill's logits, where one decode step's time goes, the prompt-length
sweep, graph mode's static shapes and the guide's claims against the device bounds."""
import pytest
import torch

from helpers import end_to_end_study, roofline


def test_logits_of_last_position_compare_the_slice_with_plain_rows(tiny_model):
    model, _ = tiny_model
    out = end_to_end_study.logits_of_last_position(model, 8, min_iters=2, min_seconds=0.0)
    assert set(out) == {"slice", "2-D rows"}
    assert out["slice"]["stride"][0] == 8 * model.config.hidden_size  # the prompt's stride is kept
    assert out["2-D rows"]["stride"] == [8 * model.config.hidden_size, 1] or out["2-D rows"]["stride"][1] == 1
    assert all(r["median_ms"] > 0 and r["ops"] for r in out.values())


def test_top_ops_lists_matmuls(tiny_model):
    model, tok = tiny_model
    df = end_to_end_study.top_ops(model, tok, "hello there", steps=2, row_limit=30)
    assert {"op", "calls", "self_cpu_ms_per_step", "share_pct"} <= set(df.columns)
    assert df["op"].str.contains("mm|linear|addmm").any()


def test_decode_step_launches_counts_one_step(tiny_model):
    model, tok = tiny_model
    counts = end_to_end_study.decode_step_launches(model, tok, "count the launches")
    assert counts["ops"] > 10 and counts["by_op"].get("aten::linear", 0) + counts["by_op"].get("aten::mm", 0) >= 15


def test_eager_matmul_times_cover_every_linear_kind_at_its_shape(tiny_model):
    model, _ = tiny_model
    times = end_to_end_study.eager_matmul_times(model, 1, min_iters=2, min_seconds=0.0)
    kinds = set(times["matmul"])
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"} == kinds
    q = times.set_index("matmul").loc["q_proj"]
    assert q["layers"] == 2 and q["weight_bytes"] == 2 * 64 * 64 * 4 and q["shape"] == "(1, 64) x (64, 64)"
    assert (times["gbps"] > 0).all() and (times["ms_per_step"] > 0).all()
    with pytest.raises(ValueError, match="batch_size"):
        end_to_end_study.eager_matmul_times(model, 0)


def _path(step, matmul):
    return {"decode_ms_per_token": step, "weight_matmul_ms": matmul, "attention_ms": 0.5,
            "matmul_kernels": "aten::mm"}


def test_decode_gap_uses_each_paths_own_kernels():
    # a compiled path whose kernels beat the eager ones: no part of any path goes below zero
    gap = end_to_end_study.decode_gap({"eager": _path(30.0, 12.0), "graph": _path(9.0, 6.0)},
                                bytes_per_step=100e6, weight_bytes=90e6, bandwidth_gbps=20.0)
    rows = gap.set_index("path")
    assert (gap["rest_ms"] >= 0).all() and (gap["matmul_ms"] >= 0).all()
    assert rows.loc["graph", "rest_ms"] == pytest.approx(3.0)
    assert rows.loc["eager", "matmul_share_pct"] == pytest.approx(40.0)
    assert rows.loc["graph", "matmul_gbps"] == pytest.approx(90e6 / 6e-3 / 1e9)
    assert list(gap["roofline_ms"]) == pytest.approx([100e6 / 20e9 * 1e3] * 2)
    assert not gap["note"].any()
    odd = end_to_end_study.decode_gap({"x": _path(5.0, 6.0)}, 100e6, 90e6, 20.0)
    assert odd["note"].iloc[0]  # a profiled kernel time above the step is flagged, not hidden
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        end_to_end_study.decode_gap({"eager": _path(1.0, 0.5)}, 1.0, 1.0, 0.0)


def test_prompt_of_length(tiny_model):
    _, tok = tiny_model
    text, count = end_to_end_study.prompt_of_length(tok, 40)
    assert count == len(tok(text)["input_ids"]) and abs(count - 40) <= 2
    with pytest.raises(ValueError, match="n_tokens"):
        end_to_end_study.prompt_of_length(tok, 0)


def test_compiling_the_module_leaves_generate_eager(monkeypatch):
    assert end_to_end_study.compiled_module_runs_generate_compiled() is False
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)  # a compile that wrapped everything
    assert end_to_end_study.compiled_module_runs_generate_compiled() is True


def test_ceilings_table_adds_the_measured_rows():
    specs = roofline.load_specs()
    table = end_to_end_study.ceilings_table(roofline.llama2_weight_bytes(), specs, extra={"this cpu": 30.0})
    row = table[table["device"] == "this cpu"].iloc[0]
    assert row["status"] == "measured"
    assert row["ceiling_tok_s"] == pytest.approx(30e9 / 13_476_831_232)
