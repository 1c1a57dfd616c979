"""Committed notebooks are clean: no outputs, kernelspec python3, one well-formed parameters cell.

Also keeps machine-specific paths and credentials out of tracked files.
"""
from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((REPO / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))
# The Chinese edition (notebooks/zh, solutions/zh; TERMINOLOGY.md) is held to the same rules.
ZH_CHAPTERS = sorted((REPO / "notebooks" / "zh").glob("*.ipynb"))
ZH_SOLUTIONS = sorted((REPO / "solutions" / "zh").glob("*.ipynb"))
NOTEBOOKS = CHAPTERS + SOLUTIONS + ZH_CHAPTERS + ZH_SOLUTIONS
REQUIRED_PARAMETERS = ("run_dir", "profile")
# A solution runs with its chapter's parameters (COMMON format), so it declares these too.
SOLUTION_PARAMETERS = ("device", "model", "dtype", "run_dir", "profile")
SOLUTION_SUFFIX = "_solutions"


def _ids(path):
    return ("zh/" if path.parent.name == "zh" else "") + path.stem


def _parameters_cells(nb):
    return [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no .ipynb files"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_is_valid_and_committed_without_outputs(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs; clear them before committing"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
        assert "papermill" not in cell.get("metadata", {}), f"{path.name} cell {i}: executed copy?"
        assert "injected-parameters" not in cell.get("metadata", {}).get("tags", [])
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec"
    assert "papermill" not in nb.metadata, f"{path.name} is an executed copy (papermill metadata)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_exactly_one_parameters_cell_declaring_the_runner_parameters(path):
    nb = nbformat.read(str(path), as_version=4)
    cells = _parameters_cells(nb)
    assert len(cells) == 1, f"{path.name} has {len(cells)} cells tagged parameters; need exactly one"
    source = cells[0].source
    tree = ast.parse(source)
    declared = {}
    for node in tree.body:
        assert isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name), (
            f"{path.name}: the parameters cell holds only typed assignments `name: type = value`, "
            f"found: {ast.unparse(node)}")
        assert isinstance(node.value, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.UnaryOp)), (
            f"{path.name}: {node.target.id} must be a literal (papermill does not update derived values)")
        declared[node.target.id] = ast.literal_eval(node.value)
    required = SOLUTION_PARAMETERS if "solutions" in path.relative_to(REPO).parts else REQUIRED_PARAMETERS
    for name in required:
        assert name in declared, f"{path.name}: the parameters cell must declare {name}"
    assert declared["run_dir"] == "" and isinstance(declared["profile"], str)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_parameters_cell_is_commented_without_quotes_equals_or_parentheses(path):
    nb = nbformat.read(str(path), as_version=4)
    source = _parameters_cells(nb)[0].source
    assignments = {n.lineno for n in ast.parse(source).body}
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
    for line in assignments:
        assert line in comments, f"{path.name}: parameter on line {line} has no comment"
    for line, text in comments.items():
        bad = set(text) & set("'\"=()")
        assert not bad, f"{path.name}: comment on line {line} contains {sorted(bad)} ({text})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_papermill_sees_the_declared_parameters(path):
    import papermill

    found = papermill.inspect_notebook(str(path))
    assert set(REQUIRED_PARAMETERS) <= set(found)


def numbered_items(text: str) -> list[str]:
    """The numbered items of a Markdown list (up to the next heading), one string each."""
    items: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            break
        if re.match(r"^\d+\.\s", line):
            items.append(line.split(".", 1)[1].strip())
        elif items and line.strip():
            items[-1] += " " + line.strip()
    return items


# Each edition's headings: a chapter's exercises, and each worked answer in its solutions.
EXERCISES_HEADING = {"en": "## Exercises", "zh": "## 练习"}
SOLUTION_HEADING = re.compile(r"^## (?:Exercise|练习) (\d+)\b")


def exercises(chapter_nb, lang: str = "en") -> list[str]:
    """The numbered items under a chapter's ``## Exercises`` heading, one string each."""
    items: list[str] = []
    heading = EXERCISES_HEADING[lang]
    for cell in chapter_nb.cells:
        if cell.cell_type == "markdown" and heading in cell.source:
            items += numbered_items(cell.source.split(heading, 1)[1])
    return items


def solution_sections(solution_nb) -> dict[int, str]:
    """``## Exercise k`` -> the markdown from that heading up to the next ``## Exercise``."""
    sections: dict[int, str] = {}
    current = None
    for cell in solution_nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            found = SOLUTION_HEADING.match(line)
            if found:
                current = int(found.group(1))
                assert current not in sections, f"two '## Exercise {current}' headings"
                sections[current] = ""
            elif current is not None:
                sections[current] += line + "\n"
    return sections


def _words(text: str) -> list[str]:
    """Words of English, and each Chinese character on its own (Chinese has no spaces)."""
    return re.findall(r"[\u3400-\u4dbf\u4e00-\u9fff]|[^\W\u3400-\u4dbf\u4e00-\u9fff]+", text.lower())


def quotes(section: str, exercise: str, words: int = 8) -> bool:
    """Does ``section`` quote the exercise's first words (markdown and line breaks ignored)?"""
    wanted = " ".join(_words(exercise)[:words])
    return f" {wanted} " in f" {' '.join(_words(section))} "


EDITION_CHAPTERS = [pytest.param(p, lang, id=_ids(p))
                    for p, lang in [(p, "en") for p in CHAPTERS] + [(p, "zh") for p in ZH_CHAPTERS]]


def test_the_exercise_parser_and_the_quote_check_can_fail():
    chapter = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "## Exercises\n\n1. Run with `-p x=1`. What\n   changes?\n2. Second one.\n\n## Next")])
    assert exercises(chapter) == ["Run with `-p x=1`. What changes?", "Second one."]
    solution = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## Exercise 1\n\n> Run with `-p x=1`. What\n> changes?"),
        nbformat.v4.new_markdown_cell("## Exercise 2\n\n> Another question.")])
    sections = solution_sections(solution)
    assert sorted(sections) == [1, 2]
    assert quotes(sections[1], exercises(chapter)[0])
    assert not quotes(sections[2], exercises(chapter)[1])


def test_the_chinese_headings_and_quote_check_can_fail():
    chapter = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "## 练习\n\n1. 换一种数据类型比较各个实现：用 `-p x=1`\n   运行。\n2. 第二题。\n\n## 下一节")])
    items = exercises(chapter, "zh")
    assert items == ["换一种数据类型比较各个实现：用 `-p x=1` 运行。", "第二题。"]
    solution = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "## 练习 1\n\n> 换一种数据类型比较各个实现：用 `-p x=...`\n> 运行。\n\n## 练习 2\n\n> 另一题。")])
    sections = solution_sections(solution)
    assert sorted(sections) == [1, 2] and quotes(sections[1], items[0])
    assert not quotes(sections[2], items[1])
    # each Chinese character counts as a word: one changed character among the first eight fails
    assert not quotes("> 换一种数据种类比较各个实现", items[0])


@pytest.mark.parametrize("chapter, lang", EDITION_CHAPTERS)
def test_every_chapter_shows_its_exercises_in_the_committed_notebook(chapter, lang):
    """A reader browsing the repository sees the exercises: they are markdown, not text a run makes."""
    items = exercises(nbformat.read(str(chapter), as_version=4), lang)
    assert len(items) >= 2, (f"{chapter.name}: no numbered exercises under '{EXERCISES_HEADING[lang]}' "
                             "in the committed notebook; write them in its markdown")


@pytest.mark.parametrize("chapter, lang", EDITION_CHAPTERS)
def test_every_exercise_has_a_worked_answer_that_quotes_it(chapter, lang):
    # notebooks/NAME.ipynb -> solutions/NAME_solutions.ipynb, notebooks/zh/... -> solutions/zh/...
    solution = REPO / "solutions" / chapter.relative_to(REPO / "notebooks").with_name(
        f"{chapter.stem}{SOLUTION_SUFFIX}.ipynb")
    items = exercises(nbformat.read(str(chapter), as_version=4), lang)
    assert solution.exists(), f"{chapter.name} has {len(items)} exercises but no solutions/{solution.name}"
    sections = solution_sections(nbformat.read(str(solution), as_version=4))
    assert sorted(sections) == list(range(1, len(items) + 1)), (
        f"{solution.name} answers exercises {sorted(sections)}, the chapter has 1-{len(items)}")
    for k, text in enumerate(items, 1):
        assert quotes(sections[k], text), (
            f"{solution.name}: '## Exercise {k}' does not quote the chapter's exercise {k} "
            f"({' '.join(_words(text)[:8])} ...); did the exercise change?")


@pytest.mark.parametrize("solution", SOLUTIONS, ids=_ids)
def test_every_solution_belongs_to_a_chapter(solution):
    chapter = solution.stem[: -len(SOLUTION_SUFFIX)] if solution.stem.endswith(SOLUTION_SUFFIX) else ""
    assert chapter and (REPO / "notebooks" / f"{chapter}.ipynb").exists(), (
        f"solutions/{solution.name} must be named <chapter>{SOLUTION_SUFFIX}.ipynb after a notebook")


def _tracked_text_files():
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in out.stdout.splitlines():
        path = REPO / name
        if path.is_file() and path.suffix in {".py", ".ipynb", ".md", ".yaml", ".yml", ".txt",
                                               ".toml", ".sh", ".cfg", ""}:
            yield path


def test_no_machine_paths_or_tokens_in_tracked_files():
    machine_path = re.compile("/" + "work" + r"/(main|wt-|shared|\.library)")
    token = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")
    offenders = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if machine_path.search(text) or token.search(text):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"machine paths or tokens in: {offenders}"
