"""The Chinese edition is the English one in another language: same code, same order, own words.

The Chinese notebooks are generated (helpers.editions, by make setup and the runner): each is its
English notebook with the markdown cells translated from its chapter's catalog
(``helpers/locale/zh/LC_MESSAGES/<chapter>.po``); only the catalogs are committed. The tests check that
every notebook can be generated, that a reader's edits are never overwritten, and what the translations say."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import editions, prose

REPO = Path(__file__).resolve().parent.parent
PAIRS = [(english, chinese) for english, _, chinese in editions.pairs()]
CATALOG = {chinese: catalog for _, catalog, chinese in editions.pairs()}
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _ids(pair):
    return pair[0].parent.name + "/" + pair[0].stem


def _markdown(notebook: dict) -> list[str]:
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"]


def _prose_only(text: str) -> str:
    """Markdown without code blocks, inline code, quotes of the guides (already Chinese) and links."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return text


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_every_chinese_notebook_can_be_generated_from_its_catalog(pair):
    english, chinese = pair
    found = editions.problems(english, CATALOG[chinese])
    assert not found, found


def _generated(chinese: Path) -> dict:
    english = REPO / chinese.parent.parent.name / chinese.name
    return editions.translate(english, editions.read_catalog(CATALOG[chinese]))


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_headings_line_up(pair):
    english, chinese = pair

    def levels(notebook):
        return [len(m.group(1)) for cell in _markdown(notebook) for m in re.finditer(r"^(#+) ", cell, re.M)]

    assert levels(editions._load(english)) == levels(_generated(chinese)), (
        f"{chinese.name}: headings differ from {english.name}")


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_the_chinese_markdown_is_chinese(pair):
    english, chinese = pair
    for i, cell in enumerate(_markdown(_generated(chinese))):
        text = _prose_only(cell)
        words = re.findall(r"[A-Za-z]{3,}", text)
        # English left untranslated: a paragraph of English words with no Chinese beside it
        assert len(words) < 12 or CJK.search(text), f"{chinese.name}: markdown cell {i} reads as English"


def _notebook(path: Path, *cells) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def _md(text):
    return {"cell_type": "markdown", "id": "m", "metadata": {}, "source": [text]}


def _code(text):
    return {"cell_type": "code", "id": "c", "metadata": {}, "source": [text], "outputs": [], "execution_count": None}


def _catalog(path: Path, translations: dict) -> None:
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    catalog = Catalog(locale="zh")
    for msgid, msgstr in translations.items():
        catalog.add(msgid, msgstr)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        write_po(handle, catalog)


def _sandbox(tmp_path, monkeypatch):
    monkeypatch.setattr(editions, "REPO", tmp_path)
    monkeypatch.setattr(editions, "catalog_path", lambda chapter, lang: tmp_path / "locale" / f"{chapter}.po")
    return tmp_path / "notebooks" / "a.ipynb", tmp_path / "locale" / "a.po", tmp_path / "notebooks" / "zh" / "a.ipynb"


def test_the_generator_translates_markdown_keeps_code_and_names_what_is_missing(tmp_path, monkeypatch):
    english, catalog_path, chinese = _sandbox(tmp_path, monkeypatch)
    _notebook(english, _md("# A\n\nSome words."), _code("x = 1"))
    _catalog(catalog_path, {"# A\n\nSome words.": ""})
    assert any("cell 0 (untranslated)" in p for p in editions.problems(english, catalog_path))
    done = editions.generate()
    assert done.kept == [] and done.errors[0].startswith("notebooks/a.ipynb: 1 markdown cell(s)")
    assert not chinese.exists()
    _catalog(catalog_path, {"# A\n\nSome words.": "# 甲\n\n一些话。"})
    assert editions.problems(english, catalog_path) == [] and editions.generate() == ([], [])
    cells = json.loads(chinese.read_text())["cells"]
    assert "".join(cells[0]["source"]) == "# 甲\n\n一些话。" and cells[1]["source"] == ["x = 1"]
    # the English markdown changed: the cell has no translation until the catalog is updated
    _notebook(english, _md("# A\n\nSome other words."), _code("x = 1"))
    assert any("cell 0 (missing)" in p for p in editions.problems(english, catalog_path))


def test_a_notebook_its_reader_edited_is_kept_and_one_only_run_is_regenerated(tmp_path, monkeypatch):
    english, catalog_path, chinese = _sandbox(tmp_path, monkeypatch)
    _notebook(english, _md("# A"), _code("x = 1"))
    _catalog(catalog_path, {"# A": "# 甲"})
    assert editions.generate() == ([], [])
    # run in JupyterLab: outputs and a kernel choice, no cell changed -> regenerated when the code changes
    ran = json.loads(chinese.read_text())
    ran["cells"][1].update(outputs=[{"output_type": "stream", "name": "stdout", "text": ["1\n"]}], execution_count=1)
    ran["metadata"]["kernelspec"] = {"name": "workbook", "display_name": "workbook", "language": "python"}
    chinese.write_text(json.dumps(ran))
    assert editions.write_notebook(english, catalog_path, chinese) == "up to date"
    _notebook(english, _md("# A"), _code("x = 2"))
    assert editions.generate() == ([], [])
    assert json.loads(chinese.read_text())["cells"][1]["source"] == ["x = 2"]
    # the reader's own code in a cell: kept, and said so
    edited = json.loads(chinese.read_text())
    edited["cells"][1]["source"] = ["x = 42  # my answer"]
    chinese.write_text(json.dumps(edited))
    _notebook(english, _md("# A"), _code("x = 3"))
    done = editions.generate()
    assert done.errors == [] and len(done.kept) == 1 and done.kept[0].startswith("notebooks/zh/a.ipynb was edited")
    assert json.loads(chinese.read_text())["cells"][1]["source"] == ["x = 42  # my answer"]
    chinese.unlink()  # deleting it brings the generated one back
    assert editions.generate() == ([], []) and json.loads(chinese.read_text())["cells"][1]["source"] == ["x = 3"]


def test_the_check_mode_of_the_generator_passes_on_the_repository():
    out = subprocess.run([sys.executable, "-m", "helpers.editions", "--check"], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


PARAMETER_ROW = re.compile(r"^\| `(\w+)` \| (.+) \|$", re.M)


def unexplained_parameters(cells: list, declared: list) -> list[str]:
    """What keeps a Chinese notebook's parameters from being explained in Chinese: the code (and so
    the comments) of the parameters cell is the English edition's, so the markdown cell just above
    it has a row ``| `name` | 说明 |`` per declared parameter, in the cell's order."""
    index = next((i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    if not index or cells[index - 1]["cell_type"] != "markdown":
        return ["no markdown cell right above the parameters cell"]
    rows = dict(PARAMETER_ROW.findall("".join(cells[index - 1]["source"])))
    problems = [] if list(rows) == list(declared) else [
        f"the rows name {list(rows)}, the parameters cell declares {list(declared)}"]
    return problems + [f"{name}: no Chinese in its explanation" for name, text in rows.items()
                       if not CJK.search(text)]


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_the_chinese_edition_explains_every_parameter_in_chinese(pair):
    from helpers.run import declared_parameters

    english, chinese = pair
    cells = _generated(chinese)["cells"]
    problems = unexplained_parameters(cells, list(declared_parameters(english)))
    assert not problems, f"{chinese.relative_to(REPO)}: " + "; ".join(problems)


def test_the_parameter_explanation_check_can_fail():
    params = {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": ["x: int = 1  # x"]}
    note = {"cell_type": "markdown", "metadata": {}, "source": ["| 参数 | 含义 |\n|---|---|\n| `x` | 一个数 |"]}
    assert unexplained_parameters([note, params], ["x"]) == []
    assert unexplained_parameters([note, params], ["x", "y"])  # a new parameter without its row
    english = dict(note, source=["| `x` | a number |"])
    assert unexplained_parameters([english, params], ["x"]) == ["x: no Chinese in its explanation"]
    assert unexplained_parameters([params], ["x"]) == ["no markdown cell right above the parameters cell"]
