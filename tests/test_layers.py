"""The package's layers (``helpers.LAYERS``): every import of a helpers module, at module level or
inside a function, points to a module listed before the importing one; no circle, counting the
imports inside functions; a lazy import of a helpers module only where the allowlist says why."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import helpers

PACKAGE = Path(helpers.__file__).resolve().parent

# (module, module it imports inside a function): why that import cannot sit at the top.
LAZY_ALLOWED = {
    ("llamacpp", "params"): "the measuring child runs llamacpp.py as a script, without its package",
    ("llamacpp", "generation"): "the measuring child runs llamacpp.py as a script, without its package",
    ("run", "report"): "python -m helpers.run does not import torch; report draws with ladder, which does",
    ("run", "backend"): "python -m helpers.run does not import torch; backend does (the run's device, once)",
}


def order() -> dict:
    names = [name for _, layer in helpers.LAYERS for name in layer]
    assert len(names) == len(set(names)), "a module is listed twice in helpers.LAYERS"
    return {name: i for i, name in enumerate(names)}


def module_of(path: Path) -> str:
    """The LAYERS name of a file: helpers/ops.py -> ops, helpers/serving/client.py -> serving."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def helper_imports(path: Path, package: Path = PACKAGE):
    """(imported helpers module, line, inside a function?) for every import in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package_parts = path.relative_to(package).parts[:-1]  # () for helpers/x.py, ("serving",) below
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                if child.level:  # relative: resolve against this file's package
                    base = list(package_parts[:len(package_parts) - (child.level - 1)])
                    parts = base + (child.module.split(".") if child.module else [])
                    if parts:
                        found.append((parts[0], child.lineno, in_function))
                    else:  # "from . import a, b": each name is a module (or a name of __init__)
                        found.extend((alias.name, child.lineno, in_function) for alias in child.names)
                elif child.module and child.module.split(".")[0] == "helpers":
                    parts = child.module.split(".")[1:]
                    if parts:
                        found.append((parts[0], child.lineno, in_function))
                    else:
                        found.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    parts = alias.name.split(".")
                    if parts[0] == "helpers" and len(parts) > 1:
                        found.append((parts[1], child.lineno, in_function))
            visit(child, inside)

    visit(tree, False)
    return found


def files():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def arrows():
    """(importer, imported, where, inside a function?) between helpers modules."""
    rank = order()
    out = []
    for path in files():
        me = module_of(path)
        for target, line, lazy in helper_imports(path):
            if target in rank and target != me:
                out.append((me, target, f"{path.relative_to(PACKAGE.parent)}:{line}", lazy))
    return out


def upward(found, rank):
    return [f"{where}: {me} imports {target}{' inside a function' if lazy else ''}, which is not below it"
            for me, target, where, lazy in found if rank[target] >= rank[me]]


def test_every_module_has_a_place_in_the_layers():
    rank = order()
    here = {module_of(p) for p in files()}
    assert not here - set(rank), f"modules missing from helpers.LAYERS: {sorted(here - set(rank))}"
    assert not set(rank) - here, f"helpers.LAYERS lists modules that do not exist: {sorted(set(rank) - here)}"


def test_no_import_runs_up_a_layer():
    problems = upward(arrows(), order())
    assert not problems, "\n".join(problems)


def test_lazy_imports_only_with_a_reason():
    lazy = [f"{where}: {me} imports {target} inside a function" for me, target, where, is_lazy in arrows()
            if is_lazy and (me, target) not in LAZY_ALLOWED]
    assert not lazy, "\n".join(lazy) + "\nmove it to the top of the file (or say why in LAZY_ALLOWED)"


def test_no_circle_counting_imports_inside_functions():
    graph = {}
    for me, target, _, _ in arrows():
        graph.setdefault(me, set()).add(target)
    state, stack = {}, []

    def walk(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                raise AssertionError("circle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    for node in list(graph):
        if node not in state:
            walk(node)


def test_the_check_fails_on_an_upward_import(tmp_path):
    """The rule can fail: a low module that imports a chapter study is reported, lazily or not."""
    rank = order()
    found = [("results", "ladder", "helpers/results.py:1", False),
             ("bench", "serving", "helpers/bench.py:9", True)]
    problems = upward(found, rank)
    assert len(problems) == 2 and "results imports ladder" in problems[0]
    assert "inside a function" in problems[1]


def test_the_reader_finds_imports_inside_functions(tmp_path):
    path = tmp_path / "ops.py"
    path.write_text("from . import backend\n\ndef f():\n    from .serving import x\n    from helpers import ladder\n")
    assert helper_imports(path, tmp_path) == [("backend", 1, False), ("serving", 4, True), ("ladder", 5, True)]


def test_every_module_docstring_names_its_layer_and_its_chapter():
    """README's layout and CONTRIBUTING's table point here: a reader opening any file learns where it
    sits (``layer: <name>``, a name of helpers.LAYERS) and which notebook teaches it."""
    layer_of = {name: layer for layer, names in helpers.LAYERS for name in names}
    missing = []
    for path in files():
        doc = " ".join((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split())
        layer = layer_of.get(module_of(path))
        if layer and f"layer: {layer}" not in doc.lower():
            missing.append(f"{path.relative_to(PACKAGE.parent)}: no 'layer: {layer}'")
        if not re.search(r"\b0\d_[a-z]+", doc):
            missing.append(f"{path.relative_to(PACKAGE.parent)}: names no chapter (NN_name)")
    assert not missing, "\n".join(missing)


# The chapters each study module serves; a function whose only users are one of these groups (its
# notebooks in both editions, their worked answers, their templates, its study module) is that
# chapter's own code and lives in the study module.
STUDY_CHAPTERS = {
    "environment_study": ("00",), "operator_study": ("01", "02"), "end_to_end_study": ("03",),
    "batching_study": ("04",), "int8_study": ("05",), "decode_loop": ("06",), "round_robin": ("06",), "ladder": ("06",),
    "rungs": ("06",), "mindspeed": ("06",),
    "serving": ("07",), "report": ("08",),
}


def _code_of_notebooks(chapter: str) -> str:
    text = []
    for folder in ("notebooks", "notebooks/zh", "solutions", "solutions/zh"):
        for path in sorted((PACKAGE.parent / folder).glob(f"{chapter}_*.ipynb")):
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            text += ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    for path in sorted((PACKAGE / "templates").glob(f"{chapter}_*.j2")):
        text.append(path.read_text(encoding="utf-8"))
    return "\n".join(text)


# One chapter's function that stays below the studies on purpose, and why.
KEPT_BELOW = {("quant", "quantize_model_int4"): "the weight formats live together: INT4 beside INT8 and W8A16",
              ("quant", "time_int4_activations"): "the INT4 kernel timed beside the INT8 ones (time_w8a16_kernels)"}


def test_no_module_below_the_studies_holds_one_chapters_function():
    rank = order()
    first_study = rank["environment_study"]
    chapters = sorted({c for group in STUDY_CHAPTERS.values() for c in group})
    notebook_code = {c: _code_of_notebooks(c) for c in chapters}
    sources = {path: path.read_text(encoding="utf-8") for path in files()}
    misplaced = []
    for path, text in sources.items():
        me = module_of(path)
        if rank.get(me, first_study) >= first_study:
            continue
        for node in ast.parse(text).body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            name = node.name
            used_by = set()
            rest = text.replace(ast.get_source_segment(text, node), "")
            if re.search(rf"\b{name}\b", rest):
                continue  # its own module uses it: part of that module's job
            for other, other_text in sources.items():
                if other == path or not re.search(rf"\b{name}\b", other_text):
                    continue
                group = STUDY_CHAPTERS.get(module_of(other))
                used_by.add(group if group else ("shared",))
            for c in chapters:
                if re.search(rf"\b{me}\.{name}\b", notebook_code[c]):
                    used_by.add(next((g for g in STUDY_CHAPTERS.values() if c in g)))
            if len(used_by) == 1 and ("shared",) not in used_by and (me, name) not in KEPT_BELOW:
                misplaced.append(f"{path.relative_to(PACKAGE.parent)}: {name} serves only chapter(s) "
                                 f"{'/'.join(next(iter(used_by)))}")
    assert not misplaced, "\n".join(misplaced) + "\nmove each into its chapter's study module"
