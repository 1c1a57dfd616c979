"""Templates render only recorded figures, with direction words from helpers.decide.

The first part checks helpers.prose itself on a demo template. The second renders every chapter's
page (all of its blocks) once per recorded run of a float32 CPU, a bf16 CPU, a float16 CPU, an NPU
and a CUDA GPU (``tests/fixtures/runs``) and per variant of a quick run (``page_variants.py``: each
takes another branch of a template), in every language, and checks each page as a whole: every
number a recorded figure, every direction word a decision's, every dtype word the run's. The third
checks, on the same renders, that each variant says what its data shows: which message of the
template it says (in the reader's language, found through the chapter's catalog), which decision
and which recorded text, rather than pinning an English sentence.
"""
import copy
import functools
import json
import re
import sys
from pathlib import Path

import pytest
from babel.messages import pofile

from helpers import REPO, catalogs, decide, dtype_choice, prose, roofline

sys.path.insert(0, str(REPO / "scripts"))
import update_catalogs  # noqa: E402
from page_variants import KEPT_DENSE, VARIANTS, quick

RESULTS = {"chapter": "99_demo", "parameters": {"repeats": 5},
           "metrics": {"speedup": {"value": 1.05, "unit": "x", "low": 0.91, "high": 1.23, "dtype": "float32"},
                       "ttft_ms": {"value": 83.456, "unit": "ms"}},
           "tables": {"rows": [{"path": "eager", "step_ms": 45.5}, {"path": "graph", "step_ms": 26.5}]}}
TEMPLATE = """{% block summary %}
The change is {{ m.speedup | fig }} ({{ direction(m.speedup.low, m.speedup.high) }}) in {{ m.speedup.dtype | text }};
TTFT {{ m.ttft_ms | fig }}. {% for r in t.rows %}{{ r.path | text }}: {{ r.step_ms | num }} ms. {% endfor %}
{% endblock %}
{% block computes %}{{ m.ttft_ms.value * 2 }}{% endblock %}
"""


@pytest.fixture
def templates(tmp_path, monkeypatch):
    (tmp_path / "99_demo.md.j2").write_text(TEMPLATE, encoding="utf-8")
    monkeypatch.setattr(prose, "TEMPLATES", tmp_path)
    return tmp_path


def test_a_template_renders_recorded_figures_and_decisions(templates):
    text = prose.render("99_demo", "summary", RESULTS)
    assert "1.05x (no difference beyond the noise) in float32" in text
    assert "TTFT 83.5 ms" in text and "eager: 45.5 ms. graph: 26.5 ms." in text
    assert prose.blocks("99_demo") == ["summary", "computes"]


def test_audit_mode_names_the_source_of_every_number(templates):
    text = prose.render("99_demo", "summary", RESULTS, audit=True)
    marks = re.findall(r"⟦([^=⟧]+)=([^⟧]*)⟧", text)
    assert ("99_demo.speedup.value", "1.05x") in marks and ("99_demo.rows[1].step_ms", "26.5") in marks
    outside = re.sub(r"⟦[^⟧]*⟧", "", text)
    assert not re.search(r"\d", outside)


def test_too_few_samples_is_said_with_its_counts_marked(templates):
    (templates / "99_demo.md.j2").write_text(
        "{% block summary %}{{ direction(m.speedup.low, m.speedup.high) | say }}{% endblock %}", encoding="utf-8")
    few = {**RESULTS, "parameters": {"repeats": 3}}
    assert prose.render("99_demo", "summary", few) == "too few samples to say a direction (3 of the 5 needed)"
    text = prose.render("99_demo", "summary", few, audit=True)
    assert not re.search(r"\d", re.sub(r"⟦[^⟧]*⟧", "", text))
    assert prose.render("99_demo", "summary", RESULTS) == prose.words("en")["no difference beyond the noise"]


def test_templates_cannot_compute_numbers_or_take_them_from_the_notebook(templates):
    with pytest.raises(TypeError, match="templates do not compute numbers"):
        prose.render("99_demo", "computes", RESULTS)
    with pytest.raises(TypeError, match="only as recorded figures"):
        prose.render("99_demo", "summary", RESULTS, speed=3.0)
    with pytest.raises(KeyError, match="no block 'missing'"):
        prose.render("99_demo", "missing", RESULTS)
    with pytest.raises(ValueError, match="lang='xx'"):
        prose.render("99_demo", "summary", RESULTS, lang="xx")


def test_a_template_is_compiled_once_and_an_edit_is_read_again(templates):
    first = prose.chapter_environment("99_demo", "en").get_template("99_demo.md.j2")
    assert prose.chapter_environment("99_demo", "en").get_template("99_demo.md.j2") is first
    import os

    (templates / "99_demo.md.j2").write_text("{% block summary %}edited{% endblock %}", encoding="utf-8")
    stat = (templates / "99_demo.md.j2").stat()
    os.utime(templates / "99_demo.md.j2", (stat.st_atime, stat.st_mtime + 5))
    assert prose.render("99_demo", "summary", RESULTS) == "edited"


# --- every chapter's page, rendered once per recorded run and per variant, in every language --------

FIXTURE_RUNS = Path(__file__).parent / "fixtures" / "runs"
REAL_TEMPLATES = sorted(p for p in prose.TEMPLATES.glob("[0-9][0-9]_*.md.j2"))
# Words that state a direction or a dtype: a template never spells them (decisions say the first,
# the run's records the second), so no sentence can contradict the data beside it.
DIRECTION_WORDS = ("faster", "slower", "fastest", "slowest", "best", "worst", "same effect", "memory-bound",
                   "compute-bound", "grows", "shrinks", "beats", "improves", "speeds up", "barely")
DTYPE_WORDS = ("16-bit", "16 bit", "fp16", "bf16", "float16", "bfloat16", "float32", "fp32", "half precision")
# the same for the Chinese catalogs (the runtime catalog holds the decisions' phrases)
ZH_DIRECTION_WORDS = ("更快", "更慢", "最快", "最慢", "最好", "最佳", "效果相同", "内存受限", "带宽受限", "变快",
                      "变慢", "几乎不变", "16 位", "半精度")
# Chapters whose templates keep further words out of their own text (their sentences compare sizes
# and speeds that only a decision may order).
MORE_DIRECTION_WORDS = {
    "02_ffn_fusion": ("no difference", "met", "not met", "least time", "ahead", "beyond the noise", "float64",
                      "fp64"),
    "04_batching": ("quicker", "grew", "shrank", "nearly free", "bandwidth-bound", "within the noise",
                    "beyond the noise", "slow down", "slows down", "better", "worse", "larger", "smaller",
                    "higher", "lower", "increases", "decreases", "speed up"),
}
MARK = re.compile(f"{prose.AUDIT_OPEN}([^=]*)=([^{prose.AUDIT_CLOSE}]*){prose.AUDIT_CLOSE}")
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
CELLS = update_catalogs.every_cell()  # the notebooks' markdown cells, after the templates' sentences


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _cases():
    """``(chapter, case)``: every recorded run of every chapter, then every variant."""
    found = [(path.parent.name, path.parent.parent.name) for path in sorted(FIXTURE_RUNS.glob("*/*/results.json"))]
    return found + sorted(VARIANTS)


def _results(chapter: str, case: str) -> dict:
    if (chapter, case) in VARIANTS:
        return VARIANTS[(chapter, case)]()
    return _load(FIXTURE_RUNS / case / chapter / "results.json")


def _run(chapter: str, case: str, results: dict) -> dict:
    """The other chapters a page may read: the recorded run's, or the variant alone."""
    if (chapter, case) in VARIANTS:
        return {chapter: results}
    return {p.parent.name: _load(p) for p in (FIXTURE_RUNS / case).glob("*/results.json")}


@functools.lru_cache(maxsize=None)
def page(chapter: str, case: str, lang: str) -> dict:
    """Every block of a chapter's page for one run or variant, in audit mode (figures marked):
    rendered once per test run, whatever checks read it."""
    results = _results(chapter, case)
    run = _run(chapter, case, results)
    return {block: prose.render(chapter, block, copy.deepcopy(results), run, lang=lang, audit=True)
            for block in prose.blocks(chapter, lang)}


def plain(text: str) -> str:
    """An audit render as the reader sees it: each mark replaced by the text it marks."""
    return MARK.sub(lambda found: found.group(2), text)


def _source_without_comments(path: Path) -> str:
    """A template's text without its comments, and its catalogs' translations, which are what the
    other languages' readers see."""
    source = path.read_text(encoding="utf-8")
    text = re.sub(r"\{#.*?#\}", "", source, flags=re.S)
    for lang in prose.LANGUAGES:
        for domain in (path.name.split(".")[0], catalogs.RUNTIME_DOMAIN):
            po = prose.catalog_path(domain, lang)
            if po.exists():
                with open(po, "rb") as handle:
                    # the template's sentences (not its notebooks' cells; of runtime, the ones it says)
                    text += "\n" + "\n".join(PLACEHOLDER.sub(" ", m.string) for m in pofile.read_po(handle)
                                              if m.id and m.id not in CELLS
                                              and (domain != catalogs.RUNTIME_DOMAIN or f'"{m.id}"' in source))
    return text


def _recorded(results: dict, source: str):
    """The recorded value a mark names (``04_batching.key.field``, ``04_batching.table[i].column``,
    ``04_batching.parameters.name``), or a KeyError for one this page's chapter did not record."""
    head, *rest = re.split(r"\.(?![^\[]*\])", source.split(".", 1)[1])
    found = re.fullmatch(r"(\w+)\[(\d+)\]", head)
    if found:
        node = results["tables"][found.group(1)][int(found.group(2))]
    else:
        node = {"parameters": results.get("parameters"), "environment": results.get("environment")}.get(head)
        node = results["metrics"][head] if node is None else node
    for part in rest:
        item = re.fullmatch(r"(\w+)\[(\d+)\]", part)
        node = node[item.group(1)][int(item.group(2))] if item else node[part]
    return node["value"] if isinstance(node, dict) and "value" in node else node


@functools.lru_cache(maxsize=None)
def _literal_numbers(chapter: str, name: str = "") -> frozenset:
    """The numbers a chapter's template (or its file ``name``) and catalogs write themselves (the
    exercises' own, "batch-1")."""
    source = _source_without_comments(prose.TEMPLATES / (name or prose.template_name(chapter)))
    return frozenset(re.findall(r"\d+(?:\.\d+)?", re.sub(r"\{\{.*?\}\}|\{%.*?%\}", " ", source, flags=re.S)))


@functools.lru_cache(maxsize=None)
def _phrases() -> tuple:
    """Every decision phrase of every language, longest first (a page says them through | say)."""
    return tuple(sorted({p for lang in prose.LANGUAGES for p in prose.words(lang).values() if isinstance(p, str)},
                        key=len, reverse=True))


@pytest.mark.parametrize("template", REAL_TEMPLATES, ids=lambda p: p.name)
def test_templates_spell_no_direction_or_dtype_word(template):
    chapter = template.name.split(".")[0]
    text = _source_without_comments(template).lower()
    literal = re.sub(r"\{\{.*?\}\}|\{%.*?%\}", " ", text, flags=re.S)  # fixed text only
    for word in DIRECTION_WORDS + DTYPE_WORDS + MORE_DIRECTION_WORDS.get(chapter, ()):
        assert not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", literal), (
            f"{template.name} spells {word!r}: take it from a decision (| say) or from the run's records")
    for word in ZH_DIRECTION_WORDS:
        assert word not in literal, f"{template.name} spells {word!r}: take it from a decision (| say)"


@pytest.mark.parametrize("lang", prose.LANGUAGES)
@pytest.mark.parametrize("chapter, case", _cases(), ids=lambda v: str(v))
def test_every_page_states_recorded_numbers_decided_directions_and_the_runs_dtypes(chapter, case, lang):
    results = _results(chapter, case)
    run = _run(chapter, case, results)
    dtype = str(results.get("device_choice", {}).get("dtype") or "")
    for block, text in page(chapter, case, lang).items():
        assert text.strip(), f"{chapter}:{block} rendered nothing for {case}"
        for source_name, shown in MARK.findall(text):
            assert source_name.split(".")[0] in run or source_name.startswith(("100*", "other_dtype", "count")), (
                f"{chapter}:{block} ({case}) marks {source_name}, which this run did not record")
            if source_name.startswith(f"{chapter}.") and not re.search(r" (bytes|kB|MB|GB)$", shown):
                # a figure is shown as recorded: in the one number format (at a precision a template
                # may choose) or as its recorded text
                value = _recorded(results, source_name)
                # (a recorded message read back in the page's language through the runtime catalog)
                forms = ({str(value), str(prose.translate_cell(str(value), lang))}
                         | {prose.format_number(value, digits) for digits in range(1, 6)})
                assert any(shown.startswith(form) for form in forms), (
                    f"{chapter}:{block} ({case}) shows {shown!r} for {source_name}, recorded as {value!r}")
        outside = MARK.sub("", text)
        for phrase in _phrases():
            outside = outside.replace(phrase, " ")
        stray = [n for n in re.findall(r"\d+(?:\.\d+)?", outside) if n not in _literal_numbers(chapter)]
        assert not stray, f"{chapter}:{block} ({case}, {lang}) states numbers that are no recorded figure: {stray}"
        for word in DTYPE_WORDS:
            if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", outside.lower()) and word != dtype:
                raise AssertionError(f"{chapter}:{block} ({case}) says {word!r} outside the run's records ({dtype} run)")
        for word in DIRECTION_WORDS + MORE_DIRECTION_WORDS.get(chapter, ()):
            assert not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", outside, re.I), (
                f"{chapter}:{block} ({case}) says {word!r} without a decision")
        for word in ZH_DIRECTION_WORDS:
            assert word not in outside, f"{chapter}:{block} ({case}) says {word!r} without a decision"


def _answer_cases():
    """``(chapter, block, case, facts)``: every branch of every worked answer's paragraph."""
    from helpers import end_to_end_study as e

    def run(ms, p10, p90, two=None, total=500.0, samples=45):
        return {"decode_ms_per_token": ms, "decode_p10_ms": p10, "decode_p90_ms": p90, "ttft_ms": 100.0,
                "total_ms": total, "decode_two_generates_ms": two, "decode_samples_ms": [ms] * samples}

    def dtypes(ms, p10, p90, samples=45):
        return {"float16": {**run(10.0, 9.8, 10.2), "bytes_per_step": 1e8, "decode_samples": 45},
                "float32": {**run(ms, p10, p90), "bytes_per_step": 2e8, "decode_samples": samples}}

    specs = roofline.load_specs()
    row = specs[specs["variant"].str.startswith("910B1")].iloc[0]
    users = lambda per_user: e.aggregate_users_facts(2500, per_user, 6.7e9, row, "float32", "m")  # noqa: E731
    return [("03_end_to_end", "request_lengths", case, e.request_length_facts(runs)) for case, runs in (
                ("same", {8: run(30.0, 29.0, 31.0), 32: run(31.0, 30.0, 32.0, two=30.5, total=900.0)}),
                ("apart", {8: run(30.0, 29.0, 31.0), 32: run(40.0, 39.0, 41.0, total=1200.0)}),
                ("few", {8: run(30.0, 29.0, 31.0, samples=3), 32: run(40.0, 39.0, 41.0)}),
                ("unresolved", {8: run(float("nan"), float("nan"), float("nan")), 32: run(31.0, 30.0, 32.0)}))] + [
            ("03_end_to_end", "dtype_ratio", case, e.dtype_ratio_facts(by_dtype)) for case, by_dtype in (
                ("above", dtypes(25.2, 25.0, 25.5)), ("below", dtypes(12.0, 11.8, 12.2)),
                ("below, 1 within", dtypes(12.0, 8.0, 16.0)), ("follows", dtypes(20.0, 18.0, 22.0)),
                ("few", dtypes(25.2, 25.0, 25.5, samples=3)), ("no count", dtypes(25.2, 25.0, 25.5, samples=None)),
                ("unresolved", dtypes(float("nan"), float("nan"), float("nan"))), ("one dtype", {"float32": {}}))] + [
            ("03_end_to_end", "aggregate_users", "measured", users(29.3)),
            ("03_end_to_end", "aggregate_users", "unresolved", users(None))] + _operator_answer_cases() + _ffn_answer_cases() + _batching_answer_cases() + _int8_answer_cases() + _ladder_answer_cases() + _environment_answer_cases() + [
        ("07_serving", "saturation", "", {"start": 4, "end": 8, "gain": 1.1, "which": "ttft_p95_ms", "ttft_gain": 2.3,
                                           "good_pct": 60.0, "most": 8}),
        ("07_serving", "saturation_unmeasured", "", {"why": "vLLM is not installed"}),
        ("07_serving", "users_unmeasured", "", {"status": "skipped", "why": "vLLM is not installed"}),
        ("07_serving", "users", "tpot next", {"target_ms": 50.0, "served": 4, "served_tpot_ms": 41.0,
                                              "next": {"level": 8, "limited_by": "TPOT", "ms": 63.0, "needed": 19}}),
        ("07_serving", "users", "ttft next", {"target_ms": 50.0, "served": 4, "served_tpot_ms": None,
                                              "next": {"level": 8, "limited_by": "TTFT", "ms": None, "needed": 19}}),
        ("07_serving", "users", "last level", {"target_ms": 50.0, "served": 8, "served_tpot_ms": None, "next": None}),
        ("07_serving", "bench", "", {"ours_ms": 31.0, "bench_ms": 33.5, "ratio": 1.08}),
        ("07_serving", "bench_unmeasured", "", {"reason": "bench_serve is off in this profile"})] + [
        ("08_report", "judged", "", {"run": "r1", "claims": 87}), ("08_report", "no_change", "", {}),
        ("08_report", "class_changes", "", {"changed": 12, "claims": 87, "evidence": ["bound", "documentation"],
                                            "steady": 0, "measured": 12}),
        ("08_report", "bandwidth", "changed", {"old_gbps": 1600.0, "new_gbps": 800, "ids": ["C3", "C17"],
                                              "impossible_before": 9, "impossible_after": 11, "measured": 0}),
        ("08_report", "bandwidth", "none", {"old_gbps": 1600.0, "new_gbps": 800, "ids": [],
                                           "impossible_before": 9, "impossible_after": 9, "measured": 0}),
        ("08_report", "prompt_length", "", {"tokens": "5", "before": "plausible", "long_tokens": 2048, "ratio": 3.2,
                                            "claimed_ms": 50.0, "after": "physically impossible"})]


def _batching_answer_cases():
    from helpers import batching_study

    def padding(changed):
        return batching_study.padding_facts(
            [{"padding": side, "prompt_tokens": n, "match": side == "left" or n not in changed}
             for side in ("left", "right") for n in (3, 5, 9)])

    def sweep(tok_s, repeats=6):
        rows = [{"point": b, "tokens_per_s_aggregate": t, "decode_p10_ms": 1e3 * b / (t * 1.05),
                 "decode_p90_ms": 1e3 * b / (t * 0.95), "achieved_gbps": 10.0 * t / tok_s[0], "repeats": repeats}
                for b, t in zip((1, 2, 4, 8), tok_s)]
        return batching_study.aggregate_facts(rows, {"value": 40.0}, prose.message(
            "measured now ({size} MiB torch.sum on {device})", size=256, device="cpu"))

    gqa = batching_study.gqa_facts([
        {"model": "Llama-2-7B", "weights GB": 13.5, "KV per token KiB": 512.0, "growth batch 8 vs 1 %": 63.6},
        {"model": "Llama-2-70B", "weights GB": 138.0, "KV per token KiB": 320.0, "growth batch 8 vs 1 %": 3.9}])
    return [("04_batching", "padding", case, padding(changed)) for case, changed in (
                ("shorter ones", (3, 5)), ("mixed", (3, 9)), ("none", ()))] + [
            ("04_batching", "aggregate", case, sweep(*args)) for case, args in (
                ("stops", ([30.0, 58.0, 60.0, 61.0],)), ("every size", ([30.0, 58.0, 110.0, 200.0],)),
                ("few", ([30.0, 58.0, 60.0, 61.0], 3)), ("one size", ([30.0],)))] + [
            ("04_batching", "gqa", "", gqa)]


def _timing(ms, n=8):
    """A ``bench.Timing`` of ``n`` samples spread +-5 % around ``ms`` (test data for the answers)."""
    from helpers import bench

    return bench.Timing("t", [ms * 1e-3 * (0.95 + 0.1 * i / (n - 1)) for i in range(n)])


def _operator_answer_cases():
    import torch

    from helpers import operator_study

    def dtype_times(large_ms, n=8):
        timings = {(impl, dt): _timing(1.0 if dt == torch.bfloat16 else large_ms, n)
                   for impl in ("reference", "torch") for dt in (torch.bfloat16, torch.float32)}
        return operator_study.dtype_time_facts(timings, torch.bfloat16, torch.float32)

    def layout(low, n=10):
        return operator_study.layout_facts([{"impl": "torch", "slowdown": low + 0.2, "low": low, "high": low + 0.4,
                                             "n_samples": n},
                                            {"impl": "reference", "slowdown": 1.1, "low": 0.9, "high": 1.3,
                                             "n_samples": n}])

    def casts(extra):
        return operator_study.cast_facts({"float32": {"ops": 6, "by_op": {"aten::mul": 3, "aten::add": 3}},
                                          "float16": {"ops": 6 + extra, "by_op": {"aten::mul": 3, "aten::to": extra}}})

    setup = {"device": "cpu", "shape": "1x4096x4096", "here": "cpu", "dtype": "bfloat16"}
    return [("01_operator_verification", "setup", "", setup)] + [
            ("01_operator_verification", "dtype_times", case, facts) for case, facts in (
                ("follows", dtype_times(2.0)), ("does not", dtype_times(4.0)), ("few", dtype_times(4.0, n=3)))] + [
            ("01_operator_verification", "layout", case, facts) for case, facts in (
                ("reaches 3x", layout(3.1)), ("none", layout(1.5)), ("few", layout(3.1, n=2)))] + [
            ("01_operator_verification", "casts", case, casts(extra)) for case, extra in (("copies", 2), ("none", 0))]


def _environment_answer_cases():
    reason = prose.message("auto: {why}; running on the CPU", why="no NPU or CUDA device found")

    def buffer(low, high, n=20, noisy=False):
        return {"small_mib": 4, "gbps": 80.0, "p10": 76.0, "p90": 84.0, "large_mib": 256, "large_gbps": 40.0,
                "device": "cpu", "dtype": "float32", "ratio": {"value": (low + high) / 2, "low": low, "high": high,
                                                             "n_samples": n},
                "noisy": noisy, "stdev_pct": 12.0, "passes": n, "ms": 0.05}

    ceiling = {"dtype": "float16", "weights_gb": 13.5, "gbps": 40.0, "device": "cpu", "shape": "256 MiB",
               "here": 2.96, "npu_gbps": 1600, "npu": "910B1", "status": "unofficial", "npu_tok_s": 118.5, "times": 40.0}
    return [("00_environment_check", "setup", "", {"folder": "reports/r1", "device": "cpu", "model": "smollm2-135m"}),
            ("00_environment_check", "npu", "none", {"device": "cpu", "reason": reason, "npu": None,
                                                    "error": "device='npu' was requested, but torch_npu is not installed"}),
            ("00_environment_check", "npu", "found", {"device": "cpu", "reason": reason, "npu": "npu:0",
                                                     "npu_reason": "requested"})] + [
            ("00_environment_check", "small_buffer", case, facts) for case, facts in (
                ("cached", buffer(1.8, 2.2)), ("few", buffer(1.8, 2.2, n=3)), ("noisy", buffer(0.8, 1.3, noisy=True)),
                ("same", buffer(0.9, 1.1)))] + [("00_environment_check", "ceiling", "", ceiling)]


def _ladder_answer_cases():
    import pandas as pd

    from helpers import ladder

    chapter = quick("06_optimization_ladder")
    table = pd.DataFrame(prose.recorded_rows(chapter, "ladder"))
    no_graph = table.assign(status=table["status"].where(table["rung_id"] != "graph_mode", "failed"),
                            error=table["error"].where(table["rung_id"] != "graph_mode", "RuntimeError: no compiler"))

    def fusion(first, n=12):
        rows = [{"order": order, "rung": rung, "step_ratio": r, "low": r - 0.05, "high": r + 0.05, "n_samples": n}
                for order, rung, r in (("fused then int8", "+ fused", first), ("fused then int8", "both", 2.0),
                                       ("int8 then fused", "+ fused", 1.0), ("int8 then fused", "both", 2.1))]
        step = {"ratio": 1.02, "low": 0.97, "high": 1.08, "previous": "+ greedy loop", "n_samples": 48}
        return ladder.fusion_order_facts(rows, step if n > 5 else None, "float32")

    graph = table["rung_id"] == "graph_mode"  # the quick fixture skipped it: the fused rung's figures, 2x faster
    fused = table[table["rung_id"] == "fused_operators"].iloc[0]
    compiled = table.copy()
    for column in ("latency_ms", "decode_ms_per_token", "decode_p10_ms", "decode_p90_ms"):
        compiled.loc[graph, column] = fused[column] / 2
    compiled.loc[graph, ["status", "compile_s", "compiled_graphs", "batch_size"]] = ["ok", 30.0, 2, 1]
    compiled.loc[graph, "tokens_per_s"] = fused["tokens_per_s"] * 2
    compiled["decode_samples"] = 48.0  # the fixture predates the pooled count
    for column in ("rounds", "repeats", "n_samples"):  # whatever count the fused row states
        if column in table:
            compiled.loc[graph, column] = fused[column]
    return [("06_optimization_ladder", "compile_payoff", "ran", ladder.compile_payoff_facts(compiled, 16)),
            ("06_optimization_ladder", "compile_payoff", "skipped", ladder.compile_payoff_facts(table, 16)),
            ("06_optimization_ladder", "compile_payoff", "failed", ladder.compile_payoff_facts(no_graph, 16)),
            ("06_optimization_ladder", "fusion_order", "faster", fusion(1.2)),
            ("06_optimization_ladder", "fusion_order", "slower", fusion(0.8)),
            ("06_optimization_ladder", "fusion_order", "few", fusion(1.2, n=3)),
            ("06_optimization_ladder", "roofline_rank", "ranked", ladder.roofline_rank_facts(table)),
            ("06_optimization_ladder", "roofline_rank", "no roofline", ladder.roofline_rank_facts(
                table.assign(roofline_pct=None)))]


def _ffn_answer_cases():
    from helpers import operator_study

    def widths(wide_ms, narrow_ms, n=8, gbps=50.0):
        return operator_study.width_facts(_timing(wide_ms, n), _timing(narrow_ms, n), wide_bytes=2.6e8, narrow_bytes=2e8,
                                          wide_width=14336, narrow_width=11008, bandwidth_gbps=gbps,
                                          bandwidth_source=prose.message("measured now ({size} MiB torch.sum on {device})",
                                                                         size=256, device="cpu"))

    def shares(first, second, n=8):
        return operator_study.share_facts([{"dtype": "bfloat16", "share_pct": first, "low_pct": first - 1,
                                            "high_pct": first + 1, "n_samples": n},
                                           {"dtype": "float32", "share_pct": second, "low_pct": second - 1,
                                            "high_pct": second + 1, "n_samples": n}])

    return [("02_ffn_fusion", "widths", case, facts) for case, facts in (
                ("more than the bytes", widths(20.0, 10.0)), ("less", widths(10.5, 10.0)),
                ("same", widths(13.0, 10.0)), ("few", widths(20.0, 10.0, n=3)), ("cached", widths(5.0, 1.0)))] + [
            ("02_ffn_fusion", "no_graph", "", {})] + [
            ("02_ffn_fusion", "shares", case, facts) for case, facts in (
                ("apart", shares(5.0, 12.0)), ("overlap", shares(5.0, 5.5)), ("few", shares(5.0, 12.0, n=2)))]


def _int8_answer_cases():
    from helpers import bench, int8_study

    chapter = quick("05_int8_quantization")

    def baseline(ratio, low, high, samples=12):
        return int8_study.other_baseline_facts(bench.Speedup("dense", "w8a16", ratio, low, high, samples), chapter,
                                               kernel="int8pack", activations="float32", dtype="float32",
                                               bytes_per_weight=4)

    groups = {"embed_tokens (tied lm_head)": 28_311_552, "mlp": 79_626_240, "attention": 26_542_080, "norms": 34_560}
    rows = ({"weight_MB": 180.0, "perplexity": 20.5, "speedup_vs_dense": 1.41},
            {"weight_MB": 230.0, "perplexity": 20.4, "speedup_vs_dense": 1.22})
    return [("05_int8_quantization", "other_baseline", case, baseline(*args)) for case, args in (
                ("apart", (2.6, 2.5, 2.7)), ("within", (1.0, 0.5, 3.0)), ("few", (2.6, 2.5, 2.7, 3)))] + [
            ("05_int8_quantization", "lm_head", "tied", int8_study.lm_head_facts(
                groups, ("model.embed_tokens.weight", 28_311_552), *rows, dtype="float32"))] + [
            ("05_int8_quantization", "calibration", case, int8_study.calibration_facts(ppl, 16)) for case, ppl in (
                ("closes", {"per layer": 24.0, "per channel": 21.0, "per token": 20.0}),
                ("no gap", {"per layer": 20.0, "per channel": 20.5, "per token": 20.2}))]


@pytest.mark.parametrize("lang", prose.LANGUAGES)
@pytest.mark.parametrize("chapter, block, case, facts", _answer_cases(), ids=lambda v: str(v)[:24])
def test_every_worked_answer_states_its_facts_numbers_and_decided_directions(chapter, block, case, facts, lang):
    """The answers' paragraphs pass the checks of the chapters' pages (above): every number outside
    the template's own is one of the answer's facts, marked; directions only from decisions; no
    dtype but the facts'."""
    text = prose.answer(chapter, block, facts, lang=lang, audit=True)
    assert text.strip(), f"{chapter}:{block} ({case}) rendered nothing"
    for source_name, _ in MARK.findall(text):
        key = source_name.split(".")[2].split("[")[0] if source_name.startswith(f"{chapter}.answer.") else ""
        assert key in facts or source_name.startswith("count"), f"{block} ({case}) marks {source_name}"
    outside = MARK.sub("", text)
    for phrase in _phrases():
        outside = outside.replace(phrase, " ")
    literal = _literal_numbers(chapter, prose.answer_template_name(chapter))
    stray = [n for n in re.findall(r"\d+(?:\.\d+)?", outside) if n not in literal]
    assert not stray, f"{chapter}:{block} ({case}, {lang}) states numbers that are no fact: {stray}"
    for word in DTYPE_WORDS + DIRECTION_WORDS:
        assert not re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", outside, re.I), (
            f"{chapter}:{block} ({case}) says {word!r} outside its facts and decisions")
    for word in ZH_DIRECTION_WORDS:
        assert word not in outside, f"{chapter}:{block} ({case}) says {word!r} without a decision"


def test_the_answers_number_check_can_fail():
    chapter, block, _, facts = _answer_cases()[0]
    text = prose.answer(chapter, block, facts)  # figures unmarked
    literal = _literal_numbers(chapter, prose.answer_template_name(chapter))
    assert [n for n in re.findall(r"\d+(?:\.\d+)?", text) if n not in literal]


def test_the_number_check_can_fail():
    text = prose.render("02_ffn_fusion", "summary", quick("02_ffn_fusion"))  # figures unmarked
    assert [n for n in re.findall(r"\d+(?:\.\d+)?", text) if n not in _literal_numbers("02_ffn_fusion")]


@pytest.mark.parametrize("chapter", sorted({c for c, _ in _cases()}))
def test_the_quick_fixtures_are_real_quick_runs_without_sample_lists(chapter):
    path = FIXTURE_RUNS / "cpu-quick" / chapter / "results.json"
    results = _load(path)
    assert results["chapter"] == chapter and results["parameters"]["profile"] == "quick"
    assert results["status"] == "ok"
    assert "_samples_ms" not in path.read_text(encoding="utf-8")


def test_the_dtype_fixture_has_the_records_later_chapters_read():
    r = quick("00_environment_check")
    choice = r["metrics"]["dtype_choice"]
    for field in ("reason", "decision", "rows", "shapes_source", "cpu_capability", "threads",
                  "request_prompt_tokens", "request_new_tokens", "flip_longer_tokens", "flip_horizon_tokens"):
        assert field in choice, field
    for row in choice["rows"]:
        assert {"decode_ms", "prefill_short_ms", "prefill_long_ms", "request_ms", "timed_layers"} <= set(row)
    assert {"value", "p10", "p90", "noisy"} <= set(r["metrics"]["memory_bandwidth_gbps"])


def test_the_ladder_headline_is_the_table_s_own_ratio():
    results = quick("06_optimization_ladder")
    best = results["metrics"]["ladder_best_batch1_speedup"]
    row = next(r for r in results["tables"]["ladder"] if r["rung"] == best["rung"])
    assert best["value"] == pytest.approx(row["speedup"])
    assert (best["low"], best["high"]) == pytest.approx((row["speedup_low"], row["speedup_high"]))
    text = page("06_optimization_ladder", "cpu-quick", "en")["ladder"]
    assert "06_optimization_ladder.ladder_best_batch1_speedup.value=" in text
    assert f"={prose.format_number(row['speedup'])}x" in text  # the number shown is the table's


# --- what each variant says: the message, the decision, the recorded text --------------------------

@functools.lru_cache(maxsize=None)
def _messages(chapter: str) -> dict:
    """``{msgid: {lang: text}}`` of a chapter's template, from its catalogs (the English is the msgid)."""
    found = {}
    for lang in prose.LANGUAGES:
        if lang == prose.SOURCE_LANGUAGE:
            continue
        with open(prose.catalog_path(chapter, lang), "rb") as handle:
            for m in pofile.read_po(handle):
                if m.id and m.id not in CELLS:
                    found.setdefault(m.id, {prose.SOURCE_LANGUAGE: m.id})[lang] = m.string
    return found


def says(text: str, chapter: str, lang: str, start: str) -> bool:
    """Whether ``text`` says the template's message whose English starts with ``start``, in ``lang``:
    every fixed part of the message (between its placeholders) is in the text, spaces aside."""
    found = [m for m in _messages(chapter) if m.startswith(start)]
    assert len(found) == 1, f"{chapter}: {len(found)} messages start with {start!r}: {found}"
    squeeze = lambda s: re.sub(r"\s+", "", s)  # noqa: E731  (line breaks and CJK joining aside)
    parts = [squeeze(p.replace("%%", "%")) for p in PLACEHOLDER.split(_messages(chapter)[found[0]][lang])[::2]]
    return all(p in squeeze(text) for p in parts if p)


def _say(key, lang):
    return prose.words(lang)[key]


def _expect_00(case, blocks, lang):
    dtype = plain(blocks["dtype"])
    if case == "counted bf16 cpu":
        assert "**bfloat16**" in dtype and _say(decide.FASTER, lang) in dtype
    if case == "cpu-quick":  # the fixture records no sample count: no direction is said
        assert _say(decide.FASTER, lang) not in dtype
        assert _say("too few samples, not recorded", lang).format(need=decide.MIN_SAMPLES) in dtype
    if case == "counted float32 kept, spreads overlap":
        assert "**float32**" in dtype and _say(decide.SAME, lang) in dtype and _say(decide.FASTER, lang) not in dtype
    if case == "counted float32 kept, 16-bit slower":
        assert "**float32**" in dtype and _say(decide.SLOWER, lang) in dtype and _say(decide.FASTER, lang) not in dtype
    if case == "no 16-bit dtype runs":
        assert "RuntimeError: not implemented" in dtype and _say(decide.SAME, lang) not in dtype
        assert says(dtype, "00_environment_check", lang, "So the run works in **%(dtype)s**: no dtype")
    if case == "dtype set by the parameter":
        assert "`float32`" in dtype and says(dtype, "00_environment_check", lang, "The `dtype` parameter set")
    if case == "float16 until a longer prompt":
        assert "**float16**" in dtype and "249" in dtype and "**bfloat16**" in dtype
        assert says(dtype, "00_environment_check", lang, "So the run works in **%(dtype)s**: it serves the request in at least")
        assert says(dtype, "00_environment_check", lang, "With the same figures, prompts of")
    if case == "float32 kept, 16-bit slower":
        assert "249" not in dtype and f"{dtype_choice.FLIP_HORIZON_TOKENS:,}" in dtype
        assert says(dtype, "00_environment_check", lang, "No longer prompt, up to")
    if case in ("npu float16", "npu line complete"):
        assert "**float16**" in dtype and says(dtype, "00_environment_check", lang, "`dtype=auto` on `%(device)s`")
        assert "npu-smi 23.0.0" in blocks["npu_smi"]
    if case == "npu float16":
        line = plain(blocks["npu_line"])
        assert "`torch_npu.npu_swiglu`" in line and "`torchair mode`" in line
        assert says(blocks["bandwidth"], "00_environment_check", lang, " The samples spread")
    if case == "npu line complete":
        assert says(blocks["npu_line"], "00_environment_check", lang, "**%(line)s.** It has everything")
        assert not says(blocks["bandwidth"], "00_environment_check", lang, " The samples spread")
        assert "upgrade CANN" in blocks["pairing"]
    if case == "cpu-quick":
        assert "npu-smi 23.0.0" not in blocks["npu_smi"] and "`cpu`" in plain(blocks["npu_smi"])


def _merged_sentence(text):
    """The bullet about the merged gate_up (its bold title names it in every language)."""
    return next(s for s in plain(text).split("- **") if "gate_up" in s.split("**")[0])


def _expect_02(case, blocks, lang):
    chapter = "02_ffn_fusion"
    if case == "merged inside its noise":
        for block in ("ffn_variants", "summary"):
            sentence = _merged_sentence(blocks[block])
            assert "1.05x" in sentence and "0.910–1.23" in sentence
            assert _say(decide.SAME, lang) in sentence and _say(decide.FASTER, lang) not in sentence
    if case == "merged beyond its noise":
        assert _say(decide.FASTER, lang) in _merged_sentence(blocks["summary"])
    if case in ("precision bound missed", "precision bound met"):
        precision = plain(blocks["precision"])
        assert ("0.00500" in precision) == (case == "precision bound missed")
        assert (_say("not met", lang) in precision) == (case == "precision bound missed")
        assert _say("met", lang) in precision
    if case in ("cpu-quick", "float32"):
        used = "float32" if case == "float32" else "bfloat16"
        exercises = plain(blocks["exercises"])
        assert f"-p dtype={prose.other_dtype(used, 'cpu')}`" in exercises and f"-p dtype={used}`" not in exercises
    if case == "no graph mode":
        assert says(blocks["residual_norm"], chapter, lang, "Graph mode was not run")
        assert "Residual + RMSNorm" not in plain(blocks["summary"])
        assert "compile_ops=true" in blocks["exercises"]


def _expect_04(case, blocks, lang):
    chapter = "04_batching"
    if case == "float32-cpu":
        assert says(blocks["padding"], chapter, lang, "In %(dtype)s, the batched greedy outputs equal")
        run_blocks = " ".join(plain(v) for k, v in blocks.items() if k != "llama2_kv")
        assert "float32" in run_blocks and "float16" not in run_blocks  # nor bfloat16
        assert "float16" in plain(blocks["llama2_kv"])  # Llama-2-7B's dtype, recorded as such
    if case == "npu-batch8":
        assert says(blocks["padding"], chapter, lang, "In %(reference)s they match")
        assert "float32" in plain(blocks["padding"]) and "float16" in plain(blocks["padding"])
        assert says(blocks["memory"], chapter, lang, "So this figure does not show the batch")
        assert _say("at the bandwidth", lang) in blocks["memory"]
        assert says(blocks["summary"], chapter, lang, "**Batch %(batch)s:** %(throughput)sx the batch-1")
        assert says(blocks["ratios"], chapter, lang, "The guide's claim for Llama-2-7B on a 910B")
        assert "5.80x" in plain(blocks["ratios"])
    if case == "batch1-failed":
        assert says(blocks["ratios"], chapter, lang, "Batch 1 produced no usable decode figure")
        assert says(blocks["summary"], chapter, lang, "**Batch %(batch)s** did not complete")
        assert "oom" in plain(blocks["summary"]) and "OutOfMemoryError" in plain(blocks["summary"])
    if case == "padding-broken":
        assert says(blocks["padding"], chapter, lang, "In %(reference)s they differ too")


def _expect_06(case, blocks, lang):
    chapter = "06_optimization_ladder"
    results = _results(chapter, case)
    decision = results["metrics"]["ladder_best_batch1_speedup"]["decision"]
    assert _say(decision, lang) in blocks["ladder"]
    if case == "kept dense":
        assert KEPT_DENSE in plain(blocks["formats"])
    if case == "no llama.cpp":
        assert "llama-cpp-python is not installed" in plain(blocks["references"])
    if case == "graph":
        exercises = plain(blocks["exercises"])
        assert says(exercises, chapter, lang, "For exercise 1: the graph rung")
        assert "41.5" in exercises and not says(exercises, chapter, lang, "was off")
    if case == "cpu-quick":
        exercises = plain(blocks["exercises"])
        assert says(exercises, chapter, lang, "For exercise 1: graph mode did not")
        assert says(exercises, chapter, lang, "was off")
    if case == "blocked":
        assert says(blocks["references"], chapter, lang, "Where llama.cpp spends that part instead: its weight")


def _expect_07(case, blocks, lang):
    if case.startswith("relabelled"):
        device = case.split()[1].split(":")[0]
        assert device in blocks["tensor_parallel"] and device in blocks["summary"]


EXPECT = {"00_environment_check": _expect_00, "02_ffn_fusion": _expect_02, "04_batching": _expect_04,
          "06_optimization_ladder": _expect_06, "07_serving": _expect_07}


@pytest.mark.parametrize("lang", prose.LANGUAGES)
@pytest.mark.parametrize("chapter, case", [c for c in _cases() if c[0] in EXPECT and (
    c in VARIANTS or c[1] == "cpu-quick")], ids=lambda v: str(v))
def test_each_variant_says_what_its_data_shows(chapter, case, lang):
    EXPECT[chapter](case, page(chapter, case, lang), lang)


def test_the_message_check_can_fail():
    blocks = page("04_batching", "padding-broken", "zh")
    assert says(blocks["padding"], "04_batching", "zh", "In %(reference)s they differ too")
    assert not says(blocks["padding"], "04_batching", "zh", "In %(reference)s they match")
    assert not says(blocks["padding"], "04_batching", "en", "In %(reference)s they differ too")  # Chinese text
