"""The gettext catalogs of the one-file chapter templates (helpers/locale/<lang>/LC_MESSAGES/<chapter>.po):
complete, with the same placeholders as the English, without fuzzy entries, and up to date with
the templates (what `pybabel extract` finds with babel.cfg's options is what the .po holds)."""
from __future__ import annotations

import configparser
import copy
import json
import re
from pathlib import Path

import pytest
from babel.messages import extract, pofile

from helpers import catalogs, prose

REPO = Path(__file__).resolve().parent.parent
SINGLE = sorted(p.name[:-len(".md.j2")] for p in prose.TEMPLATES.glob("[0-9][0-9]_*.md.j2")
                if p.name.count(".") == 2)
TRANSLATED = [lang for lang in prose.LANGUAGES if lang != prose.SOURCE_LANGUAGE]
CASES = [pytest.param(chapter, lang, id=f"{chapter}-{lang}") for chapter in SINGLE for lang in TRANSLATED]
PLACEHOLDER = re.compile(r"%\((\w+)\)s")
CJK = re.compile(r"[\u4e00-\u9fff]")
SPREAD = re.compile(r"p10[–-]p90")


def _catalog(chapter, lang):
    with open(prose.catalog_path(chapter, lang), "rb") as handle:
        return pofile.read_po(handle)


def _extracted(chapter):
    """``{(context, msgid)}`` of a template, extracted the way `pybabel extract -F babel.cfg` does."""
    config = configparser.ConfigParser()
    config.read(REPO / "babel.cfg", encoding="utf-8")
    section = next(s for s in config.sections() if s.startswith("jinja2:"))
    options = dict(config[section])
    found = set()
    # the chapter's page and, where it has one, its worked answers' template share the catalog
    for path in (prose.TEMPLATES / f"{chapter}.md.j2", prose.TEMPLATES / prose.answer_template_name(chapter)):
        if path.exists():
            with open(path, "rb") as handle:
                for _, message, _, context in extract.extract("jinja2", handle, options=options):
                    found.add((context, message if isinstance(message, str) else message[0]))
    return found


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
    messages = [m for m in catalog if m.id]
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
def test_the_catalog_is_up_to_date_with_its_template(chapter, lang):
    in_template = _extracted(chapter)
    in_catalog = {(m.context, m.id) for m in _catalog(chapter, lang) if m.id}
    missing, extra = in_template - in_catalog, in_catalog - in_template
    assert not missing and not extra, (
        f"{chapter}.po ({lang}) is out of date: run python scripts/update_catalogs.py {chapter}; "
        f"missing {sorted(missing)}, no longer in the template {sorted(extra)}")


def test_the_up_to_date_check_can_fail(tmp_path, monkeypatch):
    (tmp_path / "98_demo.md.j2").write_text(
        "{% block summary %}{% trans x=m.x | num %}New {{ x }} sentence.{% endtrans %}{% endblock %}\n",
        encoding="utf-8")
    monkeypatch.setattr(prose, "TEMPLATES", tmp_path)
    assert _extracted("98_demo") == {(None, "New %(x)s sentence.")}


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
    english = [PLACEHOLDER.split(m.id) for m in _catalog(chapter, "zh") if m.id]
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
