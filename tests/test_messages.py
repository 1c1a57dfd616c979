"""What helpers say at run time (reasons, labels, a table's words, chart text, the worked answers) is a
``prose.Message``: recorded as its catalog key and arguments beside the English, shown in the reader's
language through the ``runtime`` catalog (helpers/locale/<lang>/LC_MESSAGES/runtime.po), which is
complete and up to date with what scripts/update_catalogs.py extracts."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from babel.messages import pofile

from helpers import catalogs, plots, prose, results

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import update_catalogs  # noqa: E402

TRANSLATED = [lang for lang in prose.LANGUAGES if lang != prose.SOURCE_LANGUAGE]
# a placeholder with its conversion and format spec: {ratio:.2f}, {value!r}, {name}
PLACEHOLDER = re.compile(r"\{(\w+)((?:![rsa])?(?::[^{}]*)?)\}")
HAN = re.compile(r"[\u4e00-\u9fff]")


def _catalog(lang):
    with open(catalogs.catalog_path(catalogs.RUNTIME_DOMAIN, lang), "rb") as handle:
        return pofile.read_po(handle)


def catalog_problems(catalog) -> list[str]:
    """Every message translated, nothing fuzzy or obsolete, the same placeholders (names and format
    specs) as the English, and a Chinese sentence where the English has one."""
    problems = ["the header is marked fuzzy"] if catalog.fuzzy else []
    for m in (m for m in catalog if m.id):
        if not m.string:
            problems.append(f"{m.id!r} is not translated")
        elif "fuzzy" in m.flags:
            problems.append(f"{m.id!r} is fuzzy")
        elif sorted(PLACEHOLDER.findall(m.id)) != sorted(PLACEHOLDER.findall(m.string)):
            problems.append(f"{m.id!r}: placeholders differ in {m.string!r}")
        elif (catalog.locale and catalog.locale.language == "zh" and not HAN.search(m.string)
              and re.search(r"[A-Za-z]{3,}\s+[A-Za-z]{3,}\s+[A-Za-z]{3,}", PLACEHOLDER.sub("", m.id))):
            problems.append(f"{m.id!r} is 'translated' without Chinese: {m.string!r}")
    problems += [f"obsolete entry {key!r}" for key in catalog.obsolete]
    return problems


@pytest.mark.parametrize("lang", TRANSLATED)
def test_every_runtime_message_is_translated_with_its_placeholders(lang):
    assert not catalog_problems(_catalog(lang))


def test_the_catalog_check_finds_a_missing_a_fuzzy_and_a_mismatched_translation():
    catalog = _catalog("zh")
    catalog.add("an untranslated sentence of three words", "")
    catalog.add("a fuzzy one {n}", "模糊 {n}", flags=["fuzzy"])
    catalog.add("a ratio of {ratio:.2f}", "比值 {ratio:.1f}")
    catalog.add("English words stay English", "English words stay English")
    found = "\n".join(catalog_problems(catalog))
    for needle in ("is not translated", "is fuzzy", "placeholders differ", "without Chinese"):
        assert needle in found, needle


@pytest.mark.parametrize("lang", TRANSLATED)
def test_the_runtime_catalog_is_up_to_date_with_the_code(lang):
    extracted = {(m.context, m.id) for m in update_catalogs.runtime_messages() if m.id}
    in_catalog = {(m.context, m.id) for m in _catalog(lang) if m.id}
    missing, extra = extracted - in_catalog, in_catalog - extracted
    assert not missing and not extra, (
        f"run `python scripts/update_catalogs.py runtime` and translate: missing {sorted(missing)[:5]}, "
        f"no longer in the code {sorted(extra)[:5]}")


def test_a_message_is_english_text_and_its_key():
    m = prose.message("run's shape {size} (the guide's is {theirs})", size="1x2", theirs="1x4")
    assert m == "run's shape 1x2 (the guide's is 1x4)" and isinstance(m, str)
    assert prose.tr(m, "en") == str(m)
    assert prose.tr(m, "zh") == "本次运行的 shape 1x2（指南的是 1x4）"
    nested = prose.message("{reason}; from {tokens}-token prompts on it would be {dtype}", reason=m, tokens=512,
                           dtype="float32")
    assert "本次运行的 shape" in prose.tr(nested, "zh") and "512" in prose.tr(nested, "zh")
    assert prose.tr("a recorded text of an older run", "zh") == "a recorded text of an older run"
    with pytest.raises(ValueError, match="lang='fr' is not valid"):
        prose.tr(m, "fr")


def test_results_json_keeps_the_english_and_the_key_beside_it(tmp_path):
    reason = prose.message("float32: no 16-bit dtype runs correctly here ({why})",
                           why=[prose.message("{dtype}: {problem}", dtype="float16", problem="NaN logits")])
    r = results.Results("99_x", tmp_path)
    r.record("dtype_choice", "float32", reason=reason, note="plain text stays plain")
    r.finish("skipped", prose.message("int8 is off in this profile"))
    data = json.loads(r.path.read_text(encoding="utf-8"))
    entry = data["metrics"]["dtype_choice"]
    assert entry["reason"] == "float32: no 16-bit dtype runs correctly here (float16: NaN logits)"
    assert entry["reason_msg"]["msgid"] == reason.msgid and "note_msg" not in entry
    assert data["status_reason"] == "int8 is off in this profile" and data["status_reason_msg"]
    back = prose.recorded(entry, "reason")
    assert back == entry["reason"] and "没有能正确运行" in prose.tr(back, "zh")
    # an older record without the key: its text, as recorded
    assert prose.recorded({"reason": "old text"}, "reason") == "old text"
    # a recorded table keeps its English cells and columns (no _msg column)
    r.table("t", pd.DataFrame([{"case": prose.message("guide's shape {size}", size="1x2")}]))
    assert json.loads(r.path.read_text())["tables"]["t"] == [{"case": "guide's shape 1x2"}]


def test_a_template_says_a_recorded_message_in_its_language(tmp_path):
    r = results.Results("99_x", tmp_path)
    r.record("device", "cpu", device_reason=prose.message("auto: {why}; running on the CPU",
                                                          why=prose.message("no NPU or CUDA device found")))
    recorded = json.loads(r.path.read_text(encoding="utf-8"))
    env = prose.environment(prose.Renderer(), "zh")
    text = env.from_string("{{ m.device.device_reason | text }}").render(prose.context_of(recorded))
    assert text == "auto：没有找到 NPU 或 CUDA 设备；在 CPU 上运行"
    env = prose.environment(prose.Renderer(), "en")
    assert env.from_string("{{ m.device.device_reason | text }}").render(prose.context_of(recorded)) == \
        "auto: no NPU or CUDA device found; running on the CPU"


def test_show_translates_the_page_s_copy_of_a_table():
    shape = prose.message("run's shape {size} (the guide's is {theirs})", size="1x256x2048", theirs="1x4096x4096")
    frame = pd.DataFrame({"impl": ["torch", "torch"], "layout": ["contiguous", "non-contiguous"],
                          "median_ms": [1.5, 2.5], "case": [shape, "an unknown label"]})
    shown = prose.show(frame, "zh")
    assert list(shown.columns) == ["实现", "内存布局", "中位数 ms", "场景"]
    assert list(shown["内存布局"]) == ["连续", "非连续"]
    assert list(shown["实现"]) == ["torch", "torch"]  # an identifier is no word of the catalog
    assert shown["场景"][0] == "本次运行的 shape 1x256x2048（指南的是 1x4096x4096）"
    assert shown["场景"][1] == "an unknown label" and list(shown["中位数 ms"]) == [1.5, 2.5]
    assert list(frame.columns) == ["impl", "layout", "median_ms", "case"]  # the recorded frame is untouched
    assert prose.show(frame, "en") is frame
    assert prose.show("not a table", "zh") == "not a table"
    numbers = prose.show(pd.DataFrame({"x": [""], "y": [None]}), "zh")  # an empty cell is no catalog lookup
    assert numbers["x"][0] == ""
    # English text is never read back into a message: only a word of the catalog is translated
    assert prose.translate_cell(str(shape), "zh") == str(shape)


def test_a_table_cell_made_by_a_message_is_recorded_with_it_and_read_back_in_any_language(tmp_path):
    cast = prose.message("{dtype} (cast from {model_dtype} at each quantized linear, output cast back)",
                         dtype="bfloat16", model_dtype="float32")
    cell = prose.message("int4 g32 weights, {activations} activations", activations=cast)
    needs = prose.message("{budget:g} ms needs utilisation (%)", budget=1.5)
    r = results.Results("99_demo", run_dir=tmp_path)
    r.table("kernels", pd.DataFrame({"kernel": [cell, "plain"], "column": [needs, "x"]}))
    data = json.loads(r.path.read_text(encoding="utf-8"))
    assert data["tables"]["kernels"][0]["kernel"] == str(cell)  # the table itself keeps its English text
    assert set(data[results.TABLE_MESSAGES]["kernels"]) == {"0"}  # only the cells a message made
    rows = prose.recorded_rows(data, "kernels")
    said = prose.translate_cell(rows[0]["kernel"], "zh")
    assert said.startswith("int4 g32 权重") and "由 float32 转换" in said
    assert prose.translate_cell(rows[0]["column"], "zh") == "1.5 ms 所需利用率 (%)"
    assert rows[1] == {"kernel": "plain", "column": "x"}
    page = prose.context_of(data)["t"]["kernels"][0]["kernel"].value  # what a template's ``text`` filter gets
    assert prose.translate_cell(page, "zh") == said


def test_a_decision_inside_a_message_is_said_with_the_phrase_table():
    d = prose.decision("same effect")
    assert d == "same effect" and prose.tr(d, "zh") == prose.say("same effect", "zh")


def test_charts_speak_the_edition_only_when_a_font_can_draw_it(monkeypatch):
    from matplotlib import rcParams

    monkeypatch.setattr(plots, "cjk_font", lambda: None)
    assert plots.chart_language("zh") == "en"  # no empty boxes: English
    before = list(rcParams["font.sans-serif"])
    monkeypatch.setattr(plots, "cjk_font", lambda: "Noto Sans CJK SC")
    try:
        assert plots.chart_language("zh") == "zh"
        assert rcParams["font.sans-serif"][0] == "Noto Sans CJK SC"
    finally:
        rcParams["font.sans-serif"] = before
    assert plots.chart_language("en") == "en"
