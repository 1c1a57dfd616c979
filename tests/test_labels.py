"""The pages' words in every language: one vocabulary of keys in helpers.claims, its names per language.

The English label table names the verdicts and verdict classes with the same words as
``helpers.claims`` (so an English page reads as before); the runtime catalog names every key in
Chinese, and the Chinese index, claims report and compare page use them while keeping the English
keys in their ``data-verdict-class`` attributes.
"""
from __future__ import annotations

import html
import json
import re

import pytest

from helpers import claims, pages, prose, report, run
from helpers.results import REPORT_CHAPTER, Results, read_run, workbook_chapters

CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _file(lang):
    return pages.label_table(lang)


def test_every_language_reads_the_same_table_and_a_counted_word_apart():
    assert pages.languages() == ["en", "zh"]
    assert _file("en") is pages.LABELS
    strings = set(pages.label_strings())
    # "claims" is a column (说法数) and a counted word (条): two messages, one per context
    assert {("counted word", "claims"), (None, "claims")} <= strings
    assert not {text for _, text in strings} & {"⚠", "?"}  # a sign is no message: the same everywhere
    zh = _file("zh")
    assert zh["index"]["units"]["claims"]["other"] == "条" and zh["claims"]["claims"] == "说法数"
    assert zh["common"]["load_sign"] == "⚠" and zh["common"]["status"]["failed"] == "失败"


def test_the_english_labels_are_the_vocabulary_of_helpers_claims():
    common = _file("en")["common"]
    assert list(common["verdict_classes"]) == list(claims.VERDICT_CLASSES)
    assert all(name == key for key, name in common["verdict_classes"].items())
    assert common["class_meanings"] == claims.VERDICT_CLASSES
    assert list(common["verdicts"]) == list(claims.VERDICTS)
    assert all(name == key for key, name in common["verdicts"].items())
    assert set(_file("en")["compare"]["hardware"]) == set(claims.HARDWARE)


def test_the_chinese_labels_name_every_verdict_and_class_in_chinese():
    common = _file("zh")["common"]
    for table in ("verdict_classes", "class_meanings", "verdicts", "status"):
        for key, word in common[table].items():
            assert isinstance(word, str) and CJK.search(word), f"the Chinese common.{table}.{key}: {word!r}"
    names = list(common["verdict_classes"].values())
    assert len(set(names)) == len(names), "two verdict classes share a Chinese name"
    for word in _file("zh")["index"]["figures"].values():
        assert CJK.search(word), word


def test_the_legend_of_chapter_08_in_each_edition():
    en = report.verdict_legend("en")
    assert list(en.columns) == ["class", "meaning"] and list(en["class"]) == list(claims.VERDICT_CLASSES)
    assert list(en["meaning"]) == list(claims.VERDICT_CLASSES.values())
    zh = report.verdict_legend("zh")
    assert list(zh.index) == list(claims.VERDICT_CLASSES) and zh.index.name == "verdict_class"
    assert list(zh.columns) == ["类别", "含义"] and zh.loc["physically impossible", "类别"] == "物理上不可能"


def test_key_figures_in_chinese():
    assert report.key_figure_label("claims_physically_impossible", "zh")[0] == "判定为“物理上不可能”的说法条数"
    assert report.key_figure_label("ttft_ms", "zh") == ("首 token 时延 (TTFT)", "lower")
    shown = report.describe_key_figure("batched_outputs_match", {"value": True, "unit": ""}, "zh")
    assert shown["value"] == "是"
    assert report.describe_key_figure("batched_outputs_match", {"value": False}, "en")["value"] == "no"
    assert report.describe_key_figure("ttft_ms", {"value": 1.0, "unit": "ms"}, "zh")["direction"] == "越低越好"
    # a recorded message among the context (the run's shape against the guide's) in the page's language
    entry = {"value": 1.39, "unit": "x", "device": "cpu", "dtype": "float32",
             "shape": "run's shape 1x32x1024 (the guide's is 1x4096x4096)",
             "shape_msg": {"msgid": "run's shape {size} (the guide's is {theirs})",
                           "args": {"size": "1x32x1024", "theirs": "1x4096x4096"}}}
    zh = report.describe_key_figure("add_rmsnorm_fusion_speedup", entry, "zh")["context"]
    assert zh.startswith("cpu、float32、") and "run's shape" not in zh and "1x4096x4096" in zh
    assert report.describe_key_figure("add_rmsnorm_fusion_speedup", entry, "en")["context"] == (
        "cpu, float32, run's shape 1x32x1024 (the guide's is 1x4096x4096)")


def test_a_template_names_recorded_keys_in_its_language():
    results = {"chapter": "08_report", "metrics": {"claims_total": {"value": 3, "runs": 1}},
               "tables": {"verdict_counts": [{"verdict_class": "guide inconsistent", "claims": 3}],
                          "claims": [], "chapter_status": [{"chapter": "00_environment_check", "status": "skipped"}]}}
    text = prose.render("08_report", "summary", results, lang="zh")
    assert "指南自相矛盾 3 条" in text and "00_environment_check 已跳过" in text
    assert "guide inconsistent" not in text and "skipped" not in text
    assert "3 guide inconsistent" in prose.render("08_report", "summary", results, lang="en")


def _small_run_with_report(run_dir, lang):
    from test_report import make_partial_run

    make_partial_run(run_dir)
    audit = claims.verdicts(run_dir)
    res = Results(REPORT_CHAPTER, run_dir)
    res.record("claims_physically_impossible", 1, "claims", key_figure=True)
    res.table("verdict_counts", [{"verdict_class": c, "claims": n} for c, n in claims.verdict_counts(audit).items()])
    res.finish()
    data = json.loads((run_dir / "run.json").read_text())
    data["lang"] = lang
    return audit, data


def test_the_chinese_index_and_claims_report(tmp_path):
    run_dir = tmp_path / "r-zh"
    audit, data = _small_run_with_report(run_dir, "zh")
    page = html.unescape(run.write_index(run_dir, data).read_text(encoding="utf-8"))
    assert '<html lang="zh-CN">' in page and "ascend-llama-workbook 运行" in page
    assert "指南说法按判定类别统计" in page and ">物理上不可能</span>" in page
    assert 'data-verdict-class="physically impossible"' in page  # the key stays the English one
    assert "判定为“物理上不可能”的说法条数" in page and ">失败</span>" in page
    for word in ("key figures", "Claims of the guides", "higher is better"):
        assert word not in page

    folder = read_run(run_dir, expected=workbook_chapters())
    path = report.write_claims_report(run_dir / REPORT_CHAPTER / "claims_report.html", "r-zh", audit,
                                      status=folder.status_table(), figures=report.key_figures(folder.results()),
                                      lang="zh")
    page = html.unescape(path.read_text(encoding="utf-8"))
    assert "指南说法审查：运行 r-zh" in page and "判定类别" in page and "含义" in page
    # the legend: every class in Chinese with its meaning
    for cls in claims.VERDICT_CLASSES:
        assert pages.say("common.verdict_classes", cls, "zh") in page
        assert pages.say("common.class_meanings", cls, "zh") in page
    # each claim: the guide's own text first, then the English gloss; its badge in Chinese
    first = audit.iloc[0]
    quote = page.index(first["text_zh"].strip()[:12])
    assert quote < page.index(first["gloss_en"].strip()[:30], quote)
    assert "API 不存在" in page and ">API does not exist<" not in page
    assert "依据：" in page and "evidence:" not in page


def test_the_english_pages_read_as_before(tmp_path):
    run_dir = tmp_path / "r-en"
    audit, data = _small_run_with_report(run_dir, "en")
    page = html.unescape(run.write_index(run_dir, data).read_text(encoding="utf-8"))
    assert '<html lang="en">' in page and ">physically impossible</span>" in page
    path = report.write_claims_report(run_dir / "claims_report.html", "r-en", audit)
    page = html.unescape(path.read_text(encoding="utf-8"))
    assert ">API does not exist</span>" in page and "evidence: documentation" in page
    assert claims.VERDICT_CLASSES["guide inconsistent"] in page


def test_the_compare_page_in_chinese(tmp_path):
    from test_compare import write_run, standard_chapters, LLAMA

    from helpers import compare

    npu = write_run(tmp_path, "npu-run", "npu:0", "float16", LLAMA, standard_chapters("npu:0", "float16", 20.0, 300.0, 55.0))
    cpu = write_run(tmp_path, "cpu-run", "cpu", "bfloat16", "smollm2-135m",
                    standard_chapters("cpu", "bfloat16", 30.0, 90.0, 35.0), profile="quick")
    out = compare.compare([npu, cpu], tmp_path / "zh", lang="zh")
    page = html.unescape(out["html"].read_text(encoding="utf-8"))
    assert '<html lang="zh-CN">' in page and "2 次工作手册运行的对比" in page
    assert "指南针对昇腾 NPU (910B)的说法" in page and "所有运行的说法审查" in page
    assert "<th>指南原文</th>" in page and "<th>说法（英文释义）</th>" not in page
    some_claim = out["claims"].iloc[0]
    assert some_claim["text_zh"].strip()[:10] in page
    assert pages.say("common.verdicts", some_claim["verdict"], "zh") in page
    assert "Comparison of" not in page and "Every key figure" not in page
    assert "Comparison of 2 workbook runs" in compare.compare([npu, cpu], tmp_path / "en")["html"].read_text()


@pytest.mark.parametrize("kind", pages.KINDS)
def test_a_language_without_labels_is_refused(kind):
    with pytest.raises(ValueError, match="lang='fr'.*labels in en, zh"):
        pages.labels(kind, "fr")
