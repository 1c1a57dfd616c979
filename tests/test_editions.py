"""The Chinese edition is the English one in another language: same code, same order, own words.

The Chinese notebooks are generated (scripts/make_zh_notebooks.py): each is its English notebook with
the markdown cells translated from the catalog beside it (``<folder>/zh/<name>.po``). The tests
check that what is committed is what the generator writes, and what the translations say."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import prose

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import make_zh_notebooks  # noqa: E402

PAIRS = [(english, chinese) for english, _, chinese in make_zh_notebooks.pairs()]
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _ids(pair):
    return pair[0].parent.name + "/" + pair[0].stem


def _markdown(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "markdown"]


def _prose_only(text: str) -> str:
    """Markdown without code blocks, inline code, quotes of the guides (already Chinese) and links."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return text


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_every_chinese_notebook_is_the_generated_one(pair):
    english, chinese = pair
    found = make_zh_notebooks.problems(english, chinese.with_suffix(".po"), chinese)
    assert not found, found


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_headings_line_up(pair):
    english, chinese = pair
    if not chinese.exists():
        pytest.fail(f"{chinese.relative_to(REPO)} does not exist")

    def levels(path):
        return [len(m.group(1)) for cell in _markdown(path) for m in re.finditer(r"^(#+) ", cell, re.M)]

    assert levels(english) == levels(chinese), f"{chinese.name}: headings differ from {english.name}"


@pytest.mark.parametrize("pair", PAIRS, ids=_ids)
def test_the_chinese_markdown_is_chinese(pair):
    english, chinese = pair
    if not chinese.exists():
        pytest.fail(f"{chinese.relative_to(REPO)} does not exist")
    for i, cell in enumerate(_markdown(chinese)):
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


def test_the_generator_translates_markdown_keeps_code_and_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(make_zh_notebooks, "REPO", tmp_path)
    english, catalog_path, chinese = (tmp_path / "notebooks" / "a.ipynb", tmp_path / "notebooks" / "zh" / "a.po",
                                      tmp_path / "notebooks" / "zh" / "a.ipynb")
    _notebook(english, _md("# A\n\nSome words."), _code("x = 1"))
    assert make_zh_notebooks.update(english, catalog_path) == 1  # one message to translate
    catalog = make_zh_notebooks.read_catalog(catalog_path)
    with pytest.raises(make_zh_notebooks.Untranslated, match="cell 0 \\(untranslated\\)"):
        make_zh_notebooks.translate(english, catalog)
    catalog["# A\n\nSome words."].string = "# 甲\n\n一些话。"
    make_zh_notebooks.write(catalog, catalog_path)
    catalog = make_zh_notebooks.read_catalog(catalog_path)
    chinese.write_text(make_zh_notebooks.dumps(make_zh_notebooks.translate(english, catalog)))
    assert make_zh_notebooks.problems(english, catalog_path, chinese) == []
    cells = json.loads(chinese.read_text())["cells"]
    assert "".join(cells[0]["source"]) == "# 甲\n\n一些话。" and cells[1]["source"] == ["x = 1"]
    # code changed in the Chinese notebook only: not what the generator writes
    chinese.write_text(chinese.read_text().replace("x = 1", "x = 2"))
    assert "is not what" in make_zh_notebooks.problems(english, catalog_path, chinese)[0]
    # the English markdown changed: its message is new (fuzzy, the old translation as a start)
    _notebook(english, _md("# A\n\nSome other words."), _code("x = 1"))
    assert any("without a translation" in p for p in make_zh_notebooks.problems(english, catalog_path, chinese))
    assert make_zh_notebooks.update(english, catalog_path) == 1
    message = make_zh_notebooks.read_catalog(catalog_path).get("# A\n\nSome other words.")
    assert message.fuzzy and message.string == "# 甲\n\n一些话。"


def test_the_check_mode_of_the_generator_passes_on_the_repository():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "make_zh_notebooks.py"), "--check"],
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

    _, chinese = pair
    cells = json.loads(chinese.read_text(encoding="utf-8"))["cells"]
    problems = unexplained_parameters(cells, list(declared_parameters(chinese)))
    assert not problems, f"{chinese.relative_to(REPO)}: " + "; ".join(problems)


def test_the_parameter_explanation_check_can_fail():
    params = {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": ["x: int = 1  # x"]}
    note = {"cell_type": "markdown", "metadata": {}, "source": ["| 参数 | 含义 |\n|---|---|\n| `x` | 一个数 |"]}
    assert unexplained_parameters([note, params], ["x"]) == []
    assert unexplained_parameters([note, params], ["x", "y"])  # a new parameter without its row
    english = dict(note, source=["| `x` | a number |"])
    assert unexplained_parameters([english, params], ["x"]) == ["x: no Chinese in its explanation"]
    assert unexplained_parameters([params], ["x"]) == ["no markdown cell right above the parameters cell"]
