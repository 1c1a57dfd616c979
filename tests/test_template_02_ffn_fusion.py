"""Chapter 02's template, rendered from the chapter's real quick run (``tests/fixtures/runs``) and
from variants of it: every number is a recorded figure, every direction a decision, every dtype
the run's."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from helpers import prose

CHAPTER = "02_ffn_fusion"
REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "runs" / "cpu-quick" / CHAPTER / "results.json"
SOURCE = (prose.TEMPLATES / prose.template_name(CHAPTER)).read_text(encoding="utf-8")  # one file, both languages
# Words that state a direction or name a dtype: a template only says them through a decision
# (``| say``) or a recorded field, so none may appear in its literal text.
DIRECTION_WORDS = ("faster", "slower", "fastest", "slowest", "best", "worst", "same effect",
                   "memory-bound", "compute-bound", "grows", "shrinks", "beyond the noise",
                   "no difference", "met", "not met", "least time", "ahead")
DTYPE_WORDS = ("fp16", "bf16", "float16", "bfloat16", "float32", "fp32", "16-bit", "half precision",
               "float64", "fp64")
# A number on its own; digits glued to a word are part of a name (the dtype of other_dtype, "7B").
NUMBER = re.compile(r"(?<![A-Za-z_])\d+(?:[.,]\d+)*(?:e-?\d+)?")
MARK = re.compile(f"{prose.AUDIT_OPEN}[^{prose.AUDIT_CLOSE}]*{prose.AUDIT_CLOSE}")


def _results():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _literal_text(source: str) -> str:
    """The template's own words: without Jinja comments, tags and expressions."""
    return re.sub(r"\{#.*?#\}|\{%.*?%\}|\{\{.*?\}\}", " ", source, flags=re.S)


def _render_all(results, audit=False):
    return {block: prose.render(CHAPTER, block, results, audit=audit) for block in prose.blocks(CHAPTER)}


def test_the_fixture_is_a_real_quick_run_without_sample_lists():
    results = _results()
    assert results["chapter"] == CHAPTER and results["parameters"]["profile"] == "quick"
    assert results["status"] == "ok"
    assert "_samples_ms" not in FIXTURE.read_text(encoding="utf-8")
    assert set(results["key_figures"]) == {"ffn_merged_speedup_decode", "ffn_fused_max_abs_diff",
                                           "residual_norm_graph_speedup"}


def test_every_block_renders_numbers_only_from_recorded_figures():
    literal = set(NUMBER.findall(SOURCE))
    for block, text in _render_all(_results(), audit=True).items():
        assert text.strip(), f"block {block} rendered nothing"
        outside = MARK.sub(" ", text)
        stray = [n for n in NUMBER.findall(outside) if n not in literal]
        assert not stray, f"block {block}: numbers {stray} are not recorded figures"


def test_the_number_check_can_fail():
    literal = set(NUMBER.findall(SOURCE))
    text = prose.render(CHAPTER, "summary", _results(), audit=False)  # figures unmarked
    assert [n for n in NUMBER.findall(text) if n not in literal]


@pytest.mark.parametrize("word", DIRECTION_WORDS + DTYPE_WORDS)
def test_no_direction_or_dtype_word_is_literal_template_text(word):
    found = re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", _literal_text(SOURCE), re.I)
    assert not found, f"{prose.template_name(CHAPTER)} spells {word!r}; say it through a decision or a recorded field"


def test_a_ratio_inside_its_noise_is_never_called_faster():
    results = copy.deepcopy(_results())
    results["metrics"]["ffn_merged_speedup_decode"].update(value=1.05, low=0.91, high=1.23)
    for block in ("ffn_variants", "summary"):
        text = prose.render(CHAPTER, block, results)
        sentence = next(line for line in text.split("- **") if "Merged gate_up" in line)
        assert "1.05x" in sentence and "0.910–1.23" in sentence
        assert "no difference beyond the noise" in sentence and "faster" not in sentence
    results["metrics"]["ffn_merged_speedup_decode"].update(value=1.4, low=1.2, high=1.6)
    text = prose.render(CHAPTER, "summary", results)
    assert "faster beyond the noise" in next(s for s in text.split("- **") if "Merged gate_up" in s)


def test_the_guides_precision_bound_is_judged_from_the_recorded_difference():
    results = copy.deepcopy(_results())
    results["metrics"]["ffn_fused_max_abs_diff"]["value"] = 5e-3
    text = prose.render(CHAPTER, "precision", results)
    assert "below 1e-3, is not met" in text and "0.00500" in text
    results["metrics"]["ffn_fused_max_abs_diff"]["value"] = 5e-4
    assert "below 1e-3, is met" in prose.render(CHAPTER, "precision", results)


def _as_float32(results):
    """The same run as if its working dtype were float32 (a CPU without bf16)."""
    other = copy.deepcopy(results)
    for entry in other["metrics"].values():
        if entry.get("dtype") == "bfloat16":
            entry["dtype"] = "float32"
    return other


def test_the_exercises_line_names_this_runs_dtype_and_the_other_one():
    """The exercises are markdown in the notebook; the template adds only this run's values."""
    run = _results()
    dtype = run["metrics"]["ffn_merged_speedup_decode"]["dtype"]
    for results in (run, _as_float32(run)):
        text = prose.render(CHAPTER, "exercises", results)
        used = results["metrics"]["ffn_merged_speedup_decode"]["dtype"]
        assert f"-p dtype={prose.other_dtype(used, 'cpu')}`" in text and f"-p dtype={used}`" not in text
        assert f"computed in {used}" in text and not re.findall(r"^\d+\. ", text, re.M)
    assert dtype in ("bfloat16", "float32")


def test_a_run_without_graph_mode_renders_every_block():
    results = copy.deepcopy(_results())
    results["parameters"]["compile_ops"] = False
    del results["metrics"]["residual_norm_graph_speedup"]
    results["tables"]["residual_norm_graph"] = []
    results["tables"]["ffn_variants"] = [r for r in results["tables"]["ffn_variants"]
                                         if r["variant"] in ("unfused", "merged")]
    texts = _render_all(results)
    assert "Graph mode was not run" in texts["residual_norm"]
    assert "Residual + RMSNorm" not in texts["summary"]
    assert "compile_ops=true" in texts["exercises"]
