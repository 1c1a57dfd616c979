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


# --- unresolved figures: sentences, the plot and the worked answers say so (issue fixtures) -------

import copy  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from helpers import prose, roofline  # noqa: E402

FIXTURE_03 = Path(__file__).parent / "fixtures" / "runs" / "cpu-float32" / "03_end_to_end" / "results.json"


def _fixture_03():
    return json.loads(FIXTURE_03.read_text(encoding="utf-8"))


@pytest.mark.parametrize("lang, grows", [("en", "grows"), ("zh", "增长")])
def test_an_unresolved_sweep_point_gives_no_direction_and_is_named(lang, grows):
    """The fixture's longest prompt (250 tokens) has no decode figure: the sentence used to say
    '– ms after the longest, –x (grows beyond the noise)'."""
    results = _fixture_03()
    assert results["tables"]["prompt_length_sweep"][-1]["decode_resolved"] is False
    text = " ".join(prose.render("03_end_to_end", "sweep", results, lang=lang).split())
    decode = text.split("**", 4)[-1]  # the decode step's bullet
    assert grows not in decode and "–" not in decode and "250" in decode
    assert ("did not resolve" if lang == "en" else "没有得出") in decode


def test_a_resolved_sweep_still_reads_its_direction_from_the_spreads():
    results = _fixture_03()
    # the fixture is a quick run (3 generates per point); a direction needs 5, as a full run times
    for row in results["tables"]["prompt_length_sweep"]:
        row.update(decode_ms_per_token=100.0, decode_p10_ms=99.0, decode_p90_ms=101.0, decode_resolved=True,
                   repeats=5)
    results["tables"]["prompt_length_sweep"][-1].update(decode_ms_per_token=150.0, decode_p10_ms=149.0,
                                                        decode_p90_ms=151.0)
    results["metrics"]["decode_growth_ratio"]["value"] = 1.5
    text = " ".join(prose.render("03_end_to_end", "sweep", results).split())
    assert "150 ms after the longest, 1.50x (grows" in text and "did not resolve" not in text
    for row in results["tables"]["prompt_length_sweep"]:
        row["repeats"] = 3  # the same spreads from 3 generates a point: no direction
    text = " ".join(prose.render("03_end_to_end", "sweep", results).split())
    assert "150 ms after the longest, 1.50x (too few samples" in text and "grows" not in text


@pytest.mark.parametrize("lang, says", [("en", "did not resolve"), ("zh", "没有得出")])
def test_request_and_summary_say_when_the_batch1_decode_did_not_resolve(lang, says):
    results = _fixture_03()
    results["metrics"]["decode_tok_s_batch1"].update(value=None, decode_ms_per_token=None, low=None, high=None)
    for block in ("request", "summary"):
        text = " ".join(prose.render("03_end_to_end", block, results, lang=lang).split())
        assert says in text, block


def test_the_sweep_plot_marks_the_lengths_it_cannot_draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = pd.DataFrame(_fixture_03()["tables"]["prompt_length_sweep"])
    assert end_to_end_study.unresolved_decode_lengths(sweep) == [250]
    fig = end_to_end_study.plot_prompt_sweep(sweep, "fixture")
    decode_panel = fig.axes[1]
    texts = " ".join(t.get_text() for t in decode_panel.texts)
    assert "did not resolve at 250" in texts
    drawn = [list(line.get_xdata()) for line in decode_panel.get_lines()]
    assert [16, 63] in drawn and [250] in drawn  # the resolved points, and the mark at 250
    plt.close(fig)


def _run(decode_ms, p10, p90, two=None, ttft=100.0, total=500.0, samples=45):
    return {"decode_ms_per_token": decode_ms, "decode_p10_ms": p10, "decode_p90_ms": p90, "ttft_ms": ttft,
            "total_ms": total, "decode_two_generates_ms": two, "decode_samples_ms": [decode_ms] * samples}


def _answer(block, facts, lang="en"):
    return prose.answer("03_end_to_end", block, facts, lang=lang)


def test_the_users_answer_says_so_when_the_chapter_figure_is_none():
    """Chapter 03's worked answer divided the claim by None: TypeError in the quick zh run."""
    specs = roofline.load_specs()
    b910 = specs[specs["variant"].str.startswith("910B1")].iloc[0]
    results = _fixture_03()
    results["metrics"]["decode_tok_s_batch1"]["value"] = None
    per_user = results["metrics"]["decode_tok_s_batch1"]["value"]
    facts = end_to_end_study.aggregate_users_facts(2500, per_user, roofline.llama2_weight_bytes("int8"), b910,
                                                   "float32", "smollm2-135m")
    assert facts["users"] is None and facts["need_tbps"] > 0
    assert "did not resolve" in _answer("aggregate_users", facts)
    facts = end_to_end_study.aggregate_users_facts(2500, 20.0, roofline.llama2_weight_bytes("int8"), b910,
                                                   "float32", "smollm2-135m")
    assert facts["users"] == 125.0 and "125 concurrent users" in _answer("aggregate_users", facts)


def test_a_time_ratio_above_the_bytes_ratio_is_not_read_as_overhead():
    """The run that prompted this: float32 2.52x the time of the 16-bit step for 2.00x the bytes."""
    above = {"float16": {**_run(10.0, 9.8, 10.2), "bytes_per_step": 1e8, "decode_samples": 45},
             "float32": {**_run(25.2, 25.0, 25.5), "bytes_per_step": 2e8, "decode_samples": 45}}
    facts = end_to_end_study.dtype_ratio_facts(above)
    assert (facts["small"], facts["large"], facts["bytes_ratio"]) == ("float16", "float32", 2.0)
    assert facts["time"]["ratio"] == pytest.approx(2.52) and facts["time"]["n_samples"] == 45
    text = _answer("dtype_ratio", facts)
    assert "2.00x" in text and "2.52x" in text and "above the bytes ratio" in text and "not overhead" in text
    below = copy.deepcopy(above)
    below["float32"].update(_run(12.0, 11.8, 12.2))
    assert "the rest of the step follows the bytes" in _answer("dtype_ratio", end_to_end_study.dtype_ratio_facts(below))
    within = copy.deepcopy(above)
    within["float32"].update(_run(20.0, 18.0, 22.0))
    assert "follows the bytes:" in _answer("dtype_ratio", end_to_end_study.dtype_ratio_facts(within))
    unresolved = copy.deepcopy(above)
    unresolved["float32"].update(_run(float("nan"), float("nan"), float("nan")))
    facts = end_to_end_study.dtype_ratio_facts(unresolved)
    assert facts["unresolved"] == ["float32"] and "time" not in facts
    # the same spreads from 3 decode samples on one side, or an unrecorded count: no direction
    few = copy.deepcopy(above)
    few["float16"]["decode_samples"] = 3
    said = _answer("dtype_ratio", end_to_end_study.dtype_ratio_facts(few))
    assert prose.say("too few samples: 3 of 5") in said and "above the bytes ratio" not in said
    del few["float16"]["decode_samples"]
    assert end_to_end_study.dtype_ratio_facts(few)["time"]["n_samples"] is None
    assert "not recorded" in _answer("dtype_ratio", end_to_end_study.dtype_ratio_facts(few))
    assert "no second dtype" in _answer("dtype_ratio", end_to_end_study.dtype_ratio_facts({"float32": above["float32"]}))


def test_the_request_length_answer_handles_an_unresolved_cross_check():
    runs = {8: _run(30.0, 29.0, 31.0, two=None, total=300.0), 32: _run(31.0, 30.0, 32.0, two=30.5, total=1000.0)}
    facts = end_to_end_study.request_length_facts(runs)
    assert [c["two_ms"] for c in facts["checks"]] == [None, 30.5] and facts["decode"]["n_samples"] == 45
    text = _answer("request_lengths", facts)
    assert "8 tokens: no figure" in text and "32 tokens: 30.5 ms against 31.0 ms" in text
    assert prose.say("no difference beyond the noise") in text
    apart = {8: _run(30.0, 29.0, 31.0, total=300.0), 32: _run(40.0, 39.0, 41.0, total=1000.0)}
    assert "spreads are apart" in _answer("request_lengths", end_to_end_study.request_length_facts(apart))
    apart[8]["decode_samples_ms"] = [30.0] * 3  # the same spreads from 3 stamped steps: no direction
    said = _answer("request_lengths", end_to_end_study.request_length_facts(apart))
    assert prose.say("too few samples: 3 of 5") in said and "spreads are apart" not in said
    runs[8]["decode_ms_per_token"] = float("nan")
    facts = end_to_end_study.request_length_facts(runs)
    assert facts["unresolved"] == [8] and "decode" not in facts
    assert "did not resolve at 8 new tokens" in _answer("request_lengths", facts)


@pytest.mark.parametrize("edition", ["solutions", "solutions/zh"])
def test_the_worked_answer_cell_runs_on_a_chapter_whose_decode_is_none(edition):
    """The cell of exercise 3 itself, run on the fixture with the batch-1 figure set to None."""
    from IPython.display import Markdown

    from helpers.results import metric

    path = Path(__file__).resolve().parent.parent / edition / "03_end_to_end_solutions.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    cell = next("".join(c["source"]) for c in cells if c["cell_type"] == "code" and "claim = 2500" in "".join(c["source"]))
    chapter = _fixture_03()
    chapter["metrics"]["decode_tok_s_batch1"]["value"] = None
    shown = []
    lang = "zh" if edition.endswith("zh") else "en"  # the edition's LANG (its setup cell sets it)
    exec(cell, {"end_to_end_study": end_to_end_study, "prose": prose, "roofline": roofline, "metric": metric, "chapter": chapter,
                "model": "smollm2-135m", "Markdown": Markdown, "display": lambda x: shown.append(x.data),
                "LANG": lang})
    assert len(shown) == 1 and {"en": "did not resolve", "zh": "无法分辨"}[lang] in shown[0], shown
