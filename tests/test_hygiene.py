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
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
REQUIRED_PARAMETERS = ("run_dir", "profile")


def _parameters_cells(nb):
    return [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ has no .ipynb files"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
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
    for name in REQUIRED_PARAMETERS:
        assert name in declared, f"{path.name}: the parameters cell must declare {name}"
    assert declared["run_dir"] == "" and isinstance(declared["profile"], str)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_sees_the_declared_parameters(path):
    import papermill

    found = papermill.inspect_notebook(str(path))
    assert set(REQUIRED_PARAMETERS) <= set(found)


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
