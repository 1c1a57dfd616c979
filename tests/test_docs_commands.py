"""Every command in the docs runs as written.

The shell blocks (```bash) of the READMEs, CONTRIBUTING.md and the pages under docs/ are read with
mistune (the Markdown parser nbconvert brings) and split into commands with shlex. Then:

- each ``make`` target exists in the Makefile;
- each ``python -m helpers.X`` is run by the venv's Python (``.venv/bin/python`` or
  ``$VENV/bin/python``; a bare ``python`` lacks the workbook's dependencies) and answers
  ``--help`` with the documented arguments before it (so a misspelt option value or subcommand
  fails too);
- each ``scripts/...`` file exists, and its Python is the venv's too;
- no ``<placeholder>`` (the shell reads ``<`` as a redirection) and no command left in a block
  that is not tagged as shell.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import mistune
import pytest

REPO = Path(__file__).resolve().parent.parent
SHELL = {"bash", "sh", "shell", "console"}
VENV_PYTHONS = {".venv/bin/python", "$VENV/bin/python"}
OPERATORS = {"&&", "||", "|", ";", "&"}
COMMAND_START = re.compile(r"^\s*(make|python3?|\.venv/bin/python|\$VENV/bin/python)\s")


def documents() -> list[Path]:
    found = [REPO / "README.md", REPO / "README.zh.md", REPO / "CONTRIBUTING.md",
             REPO / "solutions" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [path for path in found if path.exists()]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """``(info, code)`` of every code block, also those inside lists and quotes."""
    blocks, todo = [], list(mistune.create_markdown(renderer=None)(text))
    while todo:
        token = todo.pop(0)
        if token["type"] == "block_code":
            blocks.append(((token.get("attrs") or {}).get("info", "") or "", token["raw"]))
        todo[:0] = token.get("children") or []
    return blocks


def commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block: continuations joined, comments dropped, split at
    ``&&``, ``|``, ``;``; leading ``NAME=value`` assignments removed."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for token in [*lexer, ";"]:
            if token in OPERATORS:
                while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                    current.pop(0)
                if current:
                    found.append(current)
                current = []
            else:
                current.append(token)
    return found


def makefile_targets(makefile: Path = REPO / "Makefile") -> tuple[set, set]:
    """``(rules, phony)``: the targets that have a rule, and those declared ``.PHONY``."""
    rules, phony = set(), set()
    for line in makefile.read_text().splitlines():
        if line.startswith((" ", "\t", "#")):
            continue
        match = re.match(r"^([^:=#?+!]+?)\s*::?(?!=)\s*(.*)$", line)
        if not match:
            continue
        names = match.group(1).split()
        if names == [".PHONY"]:
            phony.update(match.group(2).split())
        else:
            rules.update(name for name in names if not name.startswith("."))
    return rules, phony


def check(text: str, where: str, targets: set) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``(problems, helpers_calls)`` of one document; ``helpers_calls`` are ``(module, args)``."""
    problems, calls = [], []
    for info, code in code_blocks(text):
        if info.split(" ")[0] not in SHELL:
            if any(COMMAND_START.match(line) for line in code.splitlines()):
                problems.append(f"{where}: a command in a code block not tagged as shell "
                                f"(```bash): {code.strip().splitlines()[0]!r}")
            continue
        for command in commands(code):
            shown = " ".join(command)
            if "<" in command:  # comments are gone: a `<name>` left is a placeholder
                problems.append(f"{where}: `{shown}`: a <placeholder> the shell reads as a redirection")
            program, args = command[0], command[1:]
            if program == "make":
                for target in (a for a in args if not a.startswith("-") and "=" not in a):
                    if target not in targets:
                        problems.append(f"{where}: `{shown}`: the Makefile has no target {target!r}")
                continue
            if re.fullmatch(r"(.*/)?python[0-9.]*", program):
                runs_workbook = (args[:1] == ["-m"] and args[1:2] and args[1].startswith("helpers")) or \
                    (args[:1] and args[0].startswith("scripts/"))
                if runs_workbook and program not in VENV_PYTHONS:
                    problems.append(f"{where}: `{shown}`: use .venv/bin/python (or $VENV/bin/python "
                                    "in a class); only the venv has the workbook's dependencies")
                if args[:1] == ["-m"] and args[1:2] and args[1].startswith("helpers."):
                    calls.append((args[1], args[2:]))
            for arg in command:
                if arg.startswith("scripts/") and not (REPO / arg).exists():
                    problems.append(f"{where}: `{shown}`: {arg} does not exist")
    return problems, calls


# Runs each (module, args + --help) in one process, as `python -m module` would, and reports the
# exit codes: one interpreter start instead of one per command.
_HELP_DRIVER = r"""
import contextlib, io, json, runpy, sys, warnings
warnings.simplefilter("ignore")
answers = []
for module, args in json.loads(sys.argv[1]):
    sys.argv = [module, *args, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = "no exit"
    except SystemExit as exc:
        code = exc.code or 0
    except BaseException as exc:
        code = repr(exc)
    text = out.getvalue()
    answers.append([code, "usage:" in text, text[-600:]])
print(json.dumps(answers))
"""


def help_problems(calls: list[tuple[str, list[str]]]) -> list[str]:
    """Each call, run with ``--help`` appended by this venv's Python, must print its usage and exit 0."""
    calls = sorted({(module, tuple(args)) for module, args in calls})
    problems, runnable = [], []
    for module, args in calls:
        path = REPO.joinpath(*module.split(".")).with_suffix(".py")
        if not path.exists() or "__main__" not in path.read_text(encoding="utf-8"):
            problems.append(f"python -m {module}: no such command line in helpers/")
        else:
            runnable.append((module, list(args)))
    if runnable:
        proc = subprocess.run([sys.executable, "-c", _HELP_DRIVER, json.dumps(runnable)], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        answers = json.loads(proc.stdout.strip().splitlines()[-1])
        for (module, args), (code, usage, out) in zip(runnable, answers):
            if code != 0 or not usage:
                problems.append(f"python -m {module} {shlex.join(args)} --help: exit {code}: {out.strip()}")
    return problems


def test_every_command_in_the_docs_runs_as_written():
    targets, _ = makefile_targets()
    problems, calls = [], []
    for path in documents():
        found, called = check(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)), targets)
        problems += found
        calls += called
    assert {"README.md", "README.zh.md"} <= {p.name for p in documents()}
    assert calls, "no python -m helpers... command found: is the block reader broken?"
    problems += help_problems(calls)
    assert not problems, "\n".join(problems)


TEST_REFERENCE = re.compile(r"`(test_[a-z0-9_]+\.py)(?:::([a-z0-9_*]+))?`")


def missing_tests(text: str) -> list[str]:
    """The `test_x.py` and `test_x.py::test_name*` references (the troubleshooting table names the
    test that tries each row) that name no file or no test function."""
    missing = []
    for file, name in TEST_REFERENCE.findall(text):
        path = REPO / "tests" / file
        pattern = re.compile(r"^\s*def " + re.escape(name).replace(r"\*", r"\w*") + r"\(", re.M) if name else None
        if not path.exists() or (pattern and not pattern.search(path.read_text(encoding="utf-8"))):
            missing.append(f"{file}::{name}" if name else file)
    return missing


def test_the_tests_the_docs_name_exist():
    missing = {str(path.relative_to(REPO)): missing_tests(path.read_text(encoding="utf-8"))
               for path in documents()}
    assert not {k: v for k, v in missing.items() if v}
    assert missing_tests("`test_runner.py::test_no_such_*` `test_nowhere.py`") == [
        "test_runner.py::test_no_such_*", "test_nowhere.py"]


def test_every_phony_target_has_a_rule():
    rules, phony = makefile_targets()
    assert phony - rules == set()
    assert {"report", "test", "lab", "workshop-prep"} <= rules


@pytest.mark.parametrize("markdown, expected", [
    ("```bash\nmake reprot PROFILE=quick   # a typo\n```\n", "the Makefile has no target 'reprot'"),
    ("1. step\n\n   ```bash\n   make setup && make no-such-target\n   ```\n", "no target 'no-such-target'"),
    ("```bash\npython -m helpers.run --list\n```\n", "use .venv/bin/python"),
    ("```bash\n.venv/bin/python -m helpers.run --resume --run-id <id>  # -> reports/<id>\n```\n",
     "--run-id < id >`: a <placeholder>"),
    ("```\nmake report\n```\n", "not tagged as shell"),
    ("```bash\n.venv/bin/python scripts/no_such_script.py\n```\n", "scripts/no_such_script.py does not exist"),
])
def test_the_check_fails_on_a_made_up_target_and_the_other_mistakes(markdown, expected):
    problems, _ = check(markdown, "doc.md", makefile_targets()[0])
    assert any(expected in problem for problem in problems), problems


def test_a_wrong_option_value_or_a_missing_entry_point_fails_the_help_check():
    problems = help_problems([("helpers.run", ["--lang", "fr"]), ("helpers.no_such_module", []),
                              ("helpers.run", ["--only", "00"])])
    assert len(problems) == 2, problems
    assert "invalid choice: 'fr'" in problems[0] or "invalid choice: 'fr'" in problems[1]
    assert any("helpers.no_such_module: no such command line" in p for p in problems)


def test_the_command_reader_splits_lists_and_drops_assignments_and_comments():
    code = "WORKBOOK_CACHE=/x make report ARGS=\"--only 00 03\"  # comment\ncd a && \\\n  make lab\n"
    assert commands(code) == [["make", "report", "ARGS=--only 00 03"], ["cd", "a"], ["make", "lab"]]
