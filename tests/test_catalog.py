"""The gettext catalogs of the chapters (helpers/locale/<lang>/LC_MESSAGES/<chapter>.po): complete,
with the same placeholders as the English, without fuzzy entries, and up to date with what
scripts/update_catalogs.py extracts (the templates' sentences with babel.cfg's options, the
notebooks' markdown cells); each message in one catalog."""
from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest
from babel.messages import pofile

from helpers import catalogs, prose

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import update_catalogs  # noqa: E402

SINGLE = update_catalogs.chapters()
CELLS = update_catalogs.every_cell()
TRANSLATED = [lang for lang in prose.LANGUAGES if lang != prose.SOURCE_LANGUAGE]
CASES = [pytest.param(chapter, lang, id=f"{chapter}-{lang}") for chapter in SINGLE for lang in TRANSLATED]
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
CJK = re.compile(r"[\u4e00-\u9fff]")
SPREAD = re.compile(r"p10[–-]p90")


def _catalog(chapter, lang):
    with open(prose.catalog_path(chapter, lang), "rb") as handle:
        return pofile.read_po(handle)


def test_the_converted_chapters_are_found():
    assert {"01_operator_verification", "02_ffn_fusion"} <= set(SINGLE)
    for chapter in SINGLE:
        others = set(prose.TEMPLATES.glob(f"{chapter}.*.md.j2")) - {prose.TEMPLATES / prose.answer_template_name(chapter)}
        assert not others, f"{chapter} has both forms of template"
        assert prose.template_name(chapter, "zh") == prose.template_name(chapter, "en") == f"{chapter}.md.j2"


@pytest.mark.parametrize("chapter, lang", CASES)
def test_every_message_is_translated_with_its_placeholders_and_nothing_is_fuzzy(chapter, lang):
    catalog = _catalog(chapter, lang)
    assert not catalog.fuzzy, f"{chapter}.po: the header is marked fuzzy"
    messages = [m for m in catalog if m.id and m.id not in CELLS]  # a markdown cell is not %-formatted
    assert messages
    for m in messages:
        assert m.string, f"{chapter}.po ({lang}): {m.id!r} is not translated"
        assert "fuzzy" not in m.flags, f"{chapter}.po ({lang}): {m.id!r} is fuzzy; check it and remove the flag"
        assert sorted(PLACEHOLDER.findall(m.id)) == sorted(PLACEHOLDER.findall(m.string)), (
            f"{chapter}.po ({lang}): placeholders differ for {m.id!r}")
        # every message is %-formatted (newstyle gettext): a literal % is written %%
        assert "%" not in PLACEHOLDER.sub("", m.string).replace("%%", ""), f"{chapter}.po ({lang}): lone % in {m.string!r}"
        # a translation states no number the English does not (the figures are placeholders)
        # (the name of the spread, p10-p90, is a word, not a figure)
        assert set(re.findall(r"\d+(?:\.\d+)?", SPREAD.sub("", PLACEHOLDER.sub("", m.string)))) <= set(
            re.findall(r"\d+(?:\.\d+)?", PLACEHOLDER.sub("", m.id))), f"{chapter}.po ({lang}): numbers in {m.string!r}"
        if lang == "zh" and CJK.search(m.id) is None and re.search(r"[A-Za-z]{3,}\s+[A-Za-z]{3,}\s+[A-Za-z]{3,}",
                                                                  PLACEHOLDER.sub("", m.id)):
            assert CJK.search(m.string), f"{chapter}.po (zh): {m.id!r} is 'translated' without Chinese"
    assert not catalog.obsolete, f"{chapter}.po ({lang}) keeps obsolete entries: {list(catalog.obsolete)}"


@pytest.mark.parametrize("chapter, lang", CASES)
def test_the_catalog_is_up_to_date_with_its_template_and_notebooks(chapter, lang):
    wanted = {(m.context, m.id, update_catalogs.CELL in m.flags) for m in update_catalogs.chapter_messages(chapter) if m.id}
    in_catalog = {(m.context, m.id, update_catalogs.CELL in m.flags) for m in _catalog(chapter, lang) if m.id}
    missing, extra = wanted - in_catalog, in_catalog - wanted
    assert not missing and not extra, (
        f"{chapter}.po ({lang}) is out of date: run python scripts/update_catalogs.py {chapter}; "
        f"missing {sorted(missing)}, no longer in its sources {sorted(extra)}")


def test_a_sentence_two_chapters_share_is_in_the_runtime_catalog_only(tmp_path, monkeypatch):
    for name, body in (("97_one", "{% trans %}yes{% endtrans %} {% trans %}Own words.{% endtrans %}"),
                       ("98_two", "{{ pgettext('between items', ', ') }}{% trans %}yes{% endtrans %}")):
        (tmp_path / f"{name}.md.j2").write_text(f"{{% block b %}}{body}{{% endblock %}}\n", encoding="utf-8")
    monkeypatch.setattr(prose, "TEMPLATES", tmp_path)
    update_catalogs.runtime_messages.cache_clear()
    try:
        runtime = update_catalogs.runtime_messages()
        assert runtime.get("yes") is not None and runtime.get(", ", "between items") is not None
        assert [m.id for m in update_catalogs.chapter_messages("97_one") if m.id] == ["Own words."]
        assert [m.id for m in update_catalogs.chapter_messages("98_two") if m.id] == []
    finally:
        update_catalogs.runtime_messages.cache_clear()


def test_an_update_keeps_translations_marks_changed_ones_fuzzy_and_drops_gone_ones(tmp_path, monkeypatch, capsys):
    from babel.messages.catalog import Catalog

    monkeypatch.setattr(catalogs, "LOCALE", tmp_path)
    messages = Catalog()
    for text in ("Kept words here.", "Old sentence that changed a bit.", "Gone."):
        messages.add(text)
    update_catalogs.update("97_demo", copy.deepcopy(messages), {})
    po = catalogs.catalog_path("97_demo", "zh")
    catalog = pofile.read_po(po.open("rb"))
    assert [m.string for m in catalog if m.id] == ["", "", ""]
    for m, text in zip((m for m in catalog if m.id), ("留下的词。", "改了一点的旧句子。", "没了。")):
        m.string = text
    with po.open("wb") as handle:
        pofile.write_po(handle, catalog)
    messages = Catalog()
    for text in ("Kept words here.", "Old sentence that changed a bit!", "Moved here."):
        messages.add(text)
    update_catalogs.update("97_demo", messages, {("zh", None, "Moved here."): "搬来的。"})
    found = {m.id: m for m in pofile.read_po(po.open("rb")) if m.id}
    assert sorted(found) == ["Kept words here.", "Moved here.", "Old sentence that changed a bit!"]
    assert found["Kept words here."].string == "留下的词。" and not found["Kept words here."].fuzzy
    assert found["Old sentence that changed a bit!"].fuzzy  # the old translation as a start, to check
    assert found["Moved here."].string == "搬来的。" and not found["Moved here."].fuzzy
    assert "(1 to translate)" in capsys.readouterr().out


def test_a_chinese_render_uses_the_catalog_and_a_missing_catalog_is_an_error(tmp_path, monkeypatch):
    results = {"chapter": "98_demo", "metrics": {"x": {"value": 1.5, "unit": "x"}}}
    (tmp_path / "98_demo.md.j2").write_text(
        "{% block summary %}{% trans x=m.x | fig %}A ratio of {{ x }}, 10 % above.{% endtrans %}\n"
        "second line{% endblock %}\n", encoding="utf-8")
    monkeypatch.setattr(prose, "TEMPLATES", tmp_path)
    for module in (prose, catalogs):  # prose reads its templates' catalogs from catalogs.LOCALE
        monkeypatch.setattr(module, "LOCALE", tmp_path / "locale")
    assert prose.render("98_demo", "summary", results) == "A ratio of 1.50x, 10 % above.second line"
    with pytest.raises(FileNotFoundError, match="no zh catalog"):
        prose.render("98_demo", "summary", results, lang="zh")
    po = prose.catalog_path("98_demo", "zh")
    po.parent.mkdir(parents=True)
    catalogs.catalog_path(catalogs.RUNTIME_DOMAIN, "zh").write_text('msgid ""\nmsgstr ""\n', encoding="utf-8")
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=utf-8\\n"\n\n'
                  'msgid "A ratio of %(x)s, 10 %% above."\nmsgstr "比值为 %(x)s，高出 10 %%。"\n', encoding="utf-8")
    assert prose.render("98_demo", "summary", results, lang="zh") == "比值为 1.50x，高出 10 %。second line"


def test_a_line_break_between_two_chinese_characters_is_joined():
    assert prose.join_wide_lines("达到。\n  指南的数字") == "达到。指南的数字"
    assert prose.join_wide_lines("达到。\n  down 权重") == "达到。\n  down 权重"
    assert prose.join_wide_lines("一段。\n\n另一段") == "一段。\n\n另一段"


@pytest.mark.parametrize("chapter", SINGLE)
def test_the_chinese_render_of_every_fixture_shows_no_english_sentence(chapter):
    """Every message the Chinese page shows is a translated one: no English msgid survives there
    (a message that is missing or empty in the catalog would render in English)."""
    english = [PLACEHOLDER.split(m.id) for m in _catalog(chapter, "zh") if m.id and m.id not in CELLS]
    fragments = {part.strip() for parts in english for part in parts[::2] if len(part.strip().split()) >= 3}
    for path in sorted((REPO / "tests" / "fixtures" / "runs").glob(f"*/{chapter}/results.json")):
        results = json.loads(path.read_text(encoding="utf-8"))
        # a recorded text (a rule, a reason) is shown as it was recorded: a fragment it holds is not a
        # message left untranslated
        recorded = json.dumps(results, ensure_ascii=False)
        for block in prose.blocks(chapter, "zh"):
            text = prose.render(chapter, block, copy.deepcopy(results), lang="zh")
            shown = [f for f in fragments if f in text and f not in recorded]
            assert not shown, f"{path.parent.parent.name}: {chapter}:{block} (zh) shows English {shown}"
