"""The papermill runner: keeps going after a failed or crashed notebook and reports it.

Runs ``python -m helpers.run`` as a subprocess on the fixture notebooks in
``tests/fixtures/runner_notebooks`` (they do not import torch, so each takes about a second).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from helpers import run as runner

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "runner_notebooks"
SOLUTION_FIXTURES = REPO / "tests" / "fixtures" / "runner_solutions"


# Credentials a user may have exported; none may reach a report file.
SECRETS = {"HF_TOKEN": "hf_" + "C" * 34, "AWS_SECRET_ACCESS_KEY": "aws-secret-value-456",
           "MODELSCOPE_API_TOKEN": "ms-secret-value-123", "OBS_SECRET_KEY": "obs-secret-value-789"}


# A relative model cache given to the runner (as make test-legacy once did): it means REPO/<this>, and
# must reach the kernels (whose cwd is the notebook's folder) as that absolute folder.
RELATIVE_CACHE = os.path.join("reports", "runner-test-cache")


def run_cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "helpers.run", "--notebooks-dir", str(FIXTURES),
                           "--no-html", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **SECRETS, "WORKBOOK_CACHE": RELATIVE_CACHE})


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "fixture.yaml"
    path.write_text(textwrap.dedent("""\
        cell_timeout: 120
        all:
          value: 2
        notebooks:
          04_after:
            value: 3
    """))
    return path


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory, profile_file):
    """One run over ok, failing, dying, ok and ok notebooks (in that order), with solutions.

    Solutions exist for 01 (ok), 02 (its chapter fails), 04 (the solution fails) and 05 (ok).
    """
    reports = tmp_path_factory.mktemp("reports")
    proc = run_cli("--profile", profile_file, "--reports-dir", reports, "--run-id", "r1",
                   "--only", "01", "02", "03", "04", "05", "-p", "nap=0",
                   "--solutions", "--solutions-dir", SOLUTION_FIXTURES)
    run_dir = reports / "r1"
    return proc, run_dir, json.loads((run_dir / "run.json").read_text())


def _entry(run, name):
    return next(e for e in run["notebooks"] if e["notebook"] == name)


def test_exit_code_is_non_zero_and_failures_are_named(failing_run):
    proc, _, run = failing_run
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED notebooks: 02_fails, 03_dies, 04_after_solutions" in proc.stderr
    assert run["status"] == "failed"
    assert [e["status"] for e in run["notebooks"]] == ["ok", "failed", "failed", "ok", "ok"]


def test_the_run_goes_on_after_a_failure(failing_run):
    _, run_dir, run = failing_run
    after = json.loads((run_dir / "04_after" / "results.json").read_text())
    assert after["status"] == "ok"
    assert _entry(run, "04_after")["status"] == "ok"


def test_failing_notebook_is_kept_with_papermills_error_banner(failing_run):
    _, run_dir, run = failing_run
    entry = _entry(run, "02_fails")
    assert entry["error"] == "ValueError: deliberate failure for the runner test"
    assert entry["failure"] == "error"
    nb = nbformat.read(str(run_dir / "02_fails.ipynb"), as_version=4)
    banner = [c for c in nb.cells if "papermill-error-cell-tag" in str(c.get("metadata", {}))]
    assert banner, "papermill's error banner is missing"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any(o.get("ename") == "ValueError" for o in outputs)


def test_kernel_death_is_reported_as_such_not_a_hang(failing_run):
    _, run_dir, run = failing_run
    entry = _entry(run, "03_dies")
    assert entry["failure"] == "kernel_died"
    assert entry["error"].startswith("kernel died")
    assert entry["duration_s"] < 120  # the cell timeout: the runner noticed, it did not wait it out
    nb = nbformat.read(str(run_dir / "03_dies.ipynb"), as_version=4)
    assert "workbook-failure" in nb.cells[0].metadata.get("tags", [])
    assert "kernel died" in nb.cells[0].source


def test_index_lists_every_notebook_with_status_figures_and_links(failing_run):
    _, run_dir, _ = failing_run
    page = (run_dir / "index.html").read_text()
    for name in ("01_ok", "02_fails", "03_dies", "04_after"):
        assert f"<td>{name}</td>" in page
    # five chapters, plus solutions: 01 ok, 02 skipped (chapter failed), 04 failed, 05 ok
    assert page.count("<tr class='failed'>") == 3 and page.count("<tr class='ok'>") == 5
    assert 'href="02_fails.ipynb"' in page and 'href="04_after/results.json"' in page
    assert "deliberate failure for the runner test" in page and "kernel died" in page
    # a key figure read back from results.json, labelled by helpers.report (the raw key as tooltip)
    assert 'title="fixture_value">fixture value: <b>3 count</b>' in page and ">cpu</span>" in page


def test_profile_values_and_overrides_are_injected(failing_run):
    _, run_dir, run = failing_run
    first = json.loads((run_dir / "01_ok" / "results.json").read_text())
    after = json.loads((run_dir / "04_after" / "results.json").read_text())
    assert first["parameters"] == {"value": 2, "profile": "fixture"}  # `all`
    assert after["parameters"]["value"] == 3  # the notebook's own section wins over `all`
    assert _entry(run, "01_ok")["parameters"]["run_dir"] == str(run_dir)
    assert run["overrides"] == {"nap": 0}
    assert _entry(run, "04_after")["ignored_overrides"] == ["nap"]  # only 05_naps declares it


def test_a_relative_model_cache_reaches_the_kernel_absolute(failing_run):
    _, run_dir, _ = failing_run
    seen = json.loads((run_dir / "01_ok" / "kernel.json").read_text())
    assert Path(seen["cwd"]).resolve() == FIXTURES.resolve()  # the kernel runs in the notebook's folder
    assert seen["WORKBOOK_CACHE"] == str(REPO / RELATIVE_CACHE)  # not FIXTURES/reports/...
    assert not (FIXTURES / "reports").exists()


def test_the_kernel_tcp_warning_is_silenced(failing_run):
    proc, _, _ = failing_run
    assert "without encryption" not in proc.stderr + proc.stdout


def test_run_files_never_include_secrets(failing_run):
    _, run_dir, _ = failing_run
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) >= 6
    for path in files:
        text = path.read_text(errors="replace")
        assert not any(value in text for value in SECRETS.values()), path.name


def test_solutions_run_after_their_chapter_in_the_same_run_folder(failing_run):
    _, run_dir, run = failing_run
    solution = _entry(run, "01_ok")["solution"]
    assert solution["status"] == "ok" and solution["output"] == "01_ok_solutions.ipynb"
    assert solution["parameters"] == {"value": 2, "run_dir": str(run_dir), "profile": "fixture"}
    nb = nbformat.read(str(run_dir / "01_ok_solutions.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "answer from 01_ok: fixture_value = 2 value = 2" in text  # read the chapter's results
    # the chapter's profile section reaches its solution too
    assert _entry(run, "04_after")["solution"]["parameters"]["value"] == 3
    page = (run_dir / "index.html").read_text()
    assert "<td>01_ok_solutions</td>" in page and 'href="01_ok_solutions.ipynb"' in page


def test_a_failing_solution_is_reported_and_loses_nothing(failing_run):
    _, run_dir, run = failing_run
    failed = _entry(run, "04_after")["solution"]
    assert failed["status"] == "failed"
    assert failed["error"] == "ValueError: deliberate failure in a solution"
    assert (run_dir / "04_after_solutions.ipynb").exists()
    assert _entry(run, "04_after")["status"] == "ok"  # the chapter's own result stands
    assert _entry(run, "05_naps")["status"] == "ok"  # and the run went on
    assert _entry(run, "05_naps")["solution"]["status"] == "ok"
    assert "deliberate failure in a solution" in (run_dir / "index.html").read_text()


def test_a_solution_of_a_failed_chapter_is_skipped_with_the_reason(failing_run):
    _, _, run = failing_run
    skipped = _entry(run, "02_fails")["solution"]
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == "its chapter 02_fails is failed"
    assert "solution" not in _entry(run, "03_dies")  # no solutions notebook for it


# --- in-process checks of the argument handling (no kernels) ---------------------------------

def test_command_line_overrides_win_and_unknown_ones_are_reported(tmp_path):
    profile = {"name": "p", "all": {"value": 2}, "notebooks": {"01_ok": {"value": 3}}}
    chosen = runner.notebook_parameters(FIXTURES / "01_ok.ipynb", profile,
                                        {"value": 9, "batch_size": 4}, tmp_path)
    assert chosen["parameters"] == {"value": 9, "run_dir": str(tmp_path), "profile": "p"}
    assert chosen["ignored_overrides"] == ["batch_size"]


def test_a_typo_in_a_parameter_is_an_error_with_the_closest_names():
    books = runner.select_notebooks(REPO / "notebooks", ["03", "06"])
    with pytest.raises(SystemExit) as err:
        runner.check_overrides({"graph_mod": True, "repeats": 2}, books)
    message = str(err.value)
    assert "-p graph_mod=...: no selected notebook declares 'graph_mod'; did you mean graph_mode" in message
    assert "repeats" not in message.split("did you mean")[1]  # a declared name passes
    runner.check_overrides({"graph_mode": True, "repeats": 2}, books)  # no error


def test_a_parameter_only_other_notebooks_declare_is_an_error():
    only_00 = runner.select_notebooks(REPO / "notebooks", ["00"])
    with pytest.raises(SystemExit, match=r"no selected notebook declares 'graph_mode'; \(--list"):
        runner.check_overrides({"graph_mode": True}, only_00)


def test_runner_parameters_cannot_be_overridden_with_p():
    books = runner.select_notebooks(FIXTURES, ["01"])
    with pytest.raises(SystemExit, match=r"-p run_dir=...: run_dir is set by the runner; use --run-id"):
        runner.check_overrides({"run_dir": "/tmp/x"}, books)


def test_a_typo_stops_the_command_line_before_anything_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "helpers.run", "--profile", "quick", "--reports-dir",
                           str(tmp_path), "--run-id", "typo", "--solutions", "-p", "graph_mod=true"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "did you mean graph_mode" in proc.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "latest").exists()


@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.orig_argv, which the runner check reads, is 3.10+")
def test_the_runner_process_does_not_import_torch(tmp_path):
    """torch takes 1-2 s to import; the runner only parses and starts kernels, so a typo is instant."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "helpers.run", "--profile", "quick",
                           "--reports-dir", str(tmp_path), "-p", "graph_mod=true"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "did you mean graph_mode" in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "helpers" in imported and "helpers.results" in imported
    assert "torch" not in imported


def test_declared_parameters_have_type_default_and_comment():
    found = runner.declared_parameters(FIXTURES / "05_naps.ipynb")
    assert found["nap"] == {"type": "float", "default": "0.0",
                            "comment": "seconds to sleep, so a test can interrupt the run"}
    assert list(found) == ["value", "nap", "run_dir", "profile"]


def test_list_shows_type_value_origin_and_comment(tmp_path, capsys):
    code = runner.main(["--profile", "quick", "--only", "03", "-p", "repeats=5", "--reports-dir",
                        str(tmp_path), "--run-id", "l", "--list"])
    out = capsys.readouterr().out
    assert code == 0 and not (tmp_path / "l").exists()
    assert "  repeats: int = 5  [-p]  # timed runs per measurement" in out
    assert "  prompt_lengths: list = [16, 64, 256]  [profile quick]  # prompt lengths" in out
    assert "  prompt: str = " in out


def test_the_chinese_edition_is_generated_before_it_runs(tmp_path, monkeypatch, capsys):
    """A fresh clone has only the chapters' catalogs: --lang zh writes the notebooks first."""
    from helpers import editions

    for folder, name in (("notebooks", "03_end_to_end"), ("solutions", "03_end_to_end_solutions")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / f"{name}.ipynb").write_bytes((REPO / folder / f"{name}.ipynb").read_bytes())
    monkeypatch.setattr(editions, "REPO", tmp_path)
    monkeypatch.setattr(runner, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(runner, "SOLUTIONS", tmp_path / "solutions")
    code = runner.main(["--lang", "zh", "--solutions", "--reports-dir", str(tmp_path / "r"), "--list"])
    assert code == 0 and "03_end_to_end" in capsys.readouterr().out
    chinese = editions._load(tmp_path / "notebooks" / "zh" / "03_end_to_end.ipynb")
    assert chinese["cells"][0]["source"][0].startswith("# 03")
    assert (tmp_path / "solutions" / "zh" / "03_end_to_end_solutions.ipynb").exists()


def test_a_chinese_notebook_that_cannot_be_generated_stops_the_run_and_is_named(tmp_path, monkeypatch, capsys):
    from helpers import editions

    (tmp_path / "notebooks").mkdir(parents=True)
    english = json.loads((REPO / "notebooks" / "03_end_to_end.ipynb").read_text())
    english["cells"].append({"cell_type": "markdown", "id": "new", "metadata": {}, "source": ["A new paragraph."]})
    (tmp_path / "notebooks" / "03_end_to_end.ipynb").write_text(json.dumps(english))
    monkeypatch.setattr(editions, "REPO", tmp_path)
    monkeypatch.setattr(runner, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(runner, "SOLUTIONS", tmp_path / "solutions")
    code = runner.main(["--lang", "zh", "--reports-dir", str(tmp_path / "r"), "--list"])
    err = capsys.readouterr().err
    assert code == 2 and "error: notebooks/03_end_to_end.ipynb" in err and "(missing)" in err
    assert not (tmp_path / "notebooks" / "zh" / "03_end_to_end.ipynb").exists()


def test_a_solution_takes_its_chapters_profile_section(tmp_path):
    profile = {"name": "p", "all": {"value": 2}, "notebooks": {"01_ok": {"value": 3}}}
    chosen = runner.notebook_parameters(SOLUTION_FIXTURES / "01_ok_solutions.ipynb", profile, {},
                                        tmp_path, section="01_ok")
    assert chosen["parameters"]["value"] == 3
    assert runner.solution_for(FIXTURES / "01_ok.ipynb", SOLUTION_FIXTURES).name == "01_ok_solutions.ipynb"
    assert runner.solution_for(FIXTURES / "03_dies.ipynb", SOLUTION_FIXTURES) is None


def test_overrides_are_yaml_literals():
    assert runner.parse_overrides(["batch_sizes=[1, 2]", "device=cpu", "flag=true", "x="]) == {
        "batch_sizes": [1, 2], "device": "cpu", "flag": True, "x": ""}
    with pytest.raises(SystemExit, match=r"-p 'device': use -p name=value"):
        runner.parse_overrides(["device"])


def test_a_relative_path_override_reaches_the_kernel_absolute(tmp_path, monkeypatch):
    # each kernel runs in its notebook's folder: `-p model=.cache/wide/x.gguf` as the docs write it
    (tmp_path / "wide").mkdir()
    (tmp_path / "wide" / "x.gguf").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    got = runner.parse_overrides(["model=wide/x.gguf", "device=cpu"])
    assert got == {"model": str(tmp_path / "wide" / "x.gguf"), "device": "cpu"}


def test_unknown_profile_names_the_choices():
    with pytest.raises(SystemExit) as err:
        runner.load_profile("fastest")
    assert "--profile 'fastest' not found; choose one of default, npu, quick, smoke" in str(err.value)


def test_unknown_notebook_selection_names_the_choices():
    with pytest.raises(SystemExit, match=r"--only 99: no such notebook; choose from 01_ok, 02_fails"):
        runner.select_notebooks(FIXTURES, ["99"])
    assert [p.stem for p in runner.select_notebooks(FIXTURES, ["01", "04_after"])] == ["01_ok", "04_after"]


def test_unwritable_reports_folder_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code = runner.main(["--profile", "quick", "--reports-dir", str(blocker), "--run-id", "x",
                        "--notebooks-dir", str(FIXTURES), "--only", "01"])
    err = capsys.readouterr().err
    assert code == 2
    assert str(blocker / "x") in err and "--reports-dir" in err and "WORKBOOK_REPORTS" in err


def test_resume_without_an_earlier_run_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="--resume needs --run-id"):
        runner.main(["--profile", "quick", "--reports-dir", str(tmp_path), "--resume",
                     "--notebooks-dir", str(FIXTURES)])


# Profiles for some chapters only (none today: the smoke profile of make test covers every chapter).
PARTIAL_PROFILES = set()


def test_every_profile_is_a_mapping_with_known_notebooks():
    real = {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}
    answers = {p.stem for p in (REPO / "solutions").glob("*_solutions.ipynb")}  # a section of their own
    for name in runner.available_profiles():
        profile = runner.load_profile(name)
        assert isinstance(profile["all"], dict) and isinstance(profile["notebooks"], dict)
        known = real | answers
        assert set(profile["notebooks"]) <= known, f"profile {name} names {set(profile['notebooks']) - known}"
        if name not in PARTIAL_PROFILES:
            assert real <= set(profile["notebooks"]), f"profile {name} misses {real - set(profile['notebooks'])}"
        for section, values in profile["notebooks"].items():  # every value is one the notebook declares
            book = (REPO / ("solutions" if section in answers else "notebooks") / f"{section}.ipynb")
            unknown = set(values) - set(runner.declared_parameters(book))
            if section in answers:  # an answer also takes its chapter's section, so its own holds only its own
                assert not unknown, f"profile {name}, {section}: {sorted(unknown)} are not its parameters"
        assert "trust_remote_code" not in json.dumps(profile)  # off unless a user sets it


def test_the_smoke_profile_runs_vllm_eager_and_its_answers_take_their_own_section(tmp_path):
    profile = runner.load_profile("smoke")
    answer = REPO / "solutions" / "03_end_to_end_solutions.ipynb"
    chosen = runner.notebook_parameters(answer, profile, {}, tmp_path, "03_end_to_end")["parameters"]
    assert chosen["short_tokens"] == 2 and chosen["repeats"] == 1  # its own section, then its chapter's
    # vLLM's torch.compile warm-up is what makes a start take minutes on a CPU; the smoke runs need none
    assert profile["notebooks"]["07_serving"]["enforce_eager"] is True
    assert runner.load_profile("quick")["notebooks"]["07_serving"]["enforce_eager"] is True
    assert runner.load_profile("default")["notebooks"]["07_serving"].get("enforce_eager", False) is False


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.ipynb"))
                         + sorted((REPO / "solutions").glob("*.ipynb")), ids=lambda p: p.stem)
def test_the_fast_parameter_reader_agrees_with_papermill(path):
    import papermill

    inspected = papermill.inspect_notebook(str(path))
    declared = runner.declared_parameters(path)
    assert list(declared) == list(inspected)
    for name, info in declared.items():
        assert info["type"] == inspected[name]["inferred_type_name"], name
        assert info["comment"] == inspected[name]["help"], name


def test_an_index_that_cannot_be_written_loses_no_notebook(tmp_path, monkeypatch, capsys):
    """A broken page (here: write_index raising) is reported; every notebook still runs and records."""
    def broken(*a, **k):
        raise KeyError("labels")
    monkeypatch.setattr(runner, "write_index", broken)
    code = runner.main(["--profile", "quick", "--notebooks-dir", str(FIXTURES), "--reports-dir", str(tmp_path),
                        "--no-html", "--only", "01", "04", "--run-id", "noindex"])
    err = capsys.readouterr().err
    assert code == 1 and "index.html not written (KeyError" in err
    recorded = json.loads((tmp_path / "noindex" / "run.json").read_text())
    assert [e["status"] for e in recorded["notebooks"]] == ["ok", "ok"]


def test_a_slow_cell_is_named_while_it_runs_and_timed_when_it_ends(tmp_path, monkeypatch, capsys):
    """The runner says which cell of which chapter it is in: a cell still running after
    SLOW_CELL_S gets a line with its number (as the executed notebook shows it) and first line."""
    monkeypatch.setattr(runner, "SLOW_CELL_S", 0.5)
    code = runner.main(["--profile", "quick", "--notebooks-dir", str(FIXTURES), "--reports-dir", str(tmp_path),
                        "--no-html", "--only", "05", "--run-id", "slow", "-p", "nap=2"])
    out = capsys.readouterr().out
    assert code == 0, out
    # code cells: parameters, papermill's injected parameters, the nap, the results
    assert "[1/1] 05_naps ...\n    cell [3] of 4 running for 0.5 s: import time\n" in out, out
    assert "    cell [3] done in 2." in out, out
    assert "cell [1]" not in out and "cell [2]" not in out, out  # quick cells are not named


def test_the_kept_copy_shows_a_progress_line_once_and_links_from_the_run_folder(tmp_path):
    """A progress bar's redraws are merged as JupyterLab shows them (its last state, one line), and
    a link to the glossary is rewritten so it works from the run folder."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("Terms: see the [glossary](../docs/glossary.md) and [web](https://x.org)."),
        nbformat.v4.new_code_cell("", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text=f"\r{i}/3 rung [00:0{i}]") for i in range(4)]
            + [nbformat.v4.new_output("stream", name="stdout", text="\ndone\n")])])
    copy = tmp_path / "reports" / "run-1" / "00_x.ipynb"
    copy.parent.mkdir(parents=True)
    nbformat.write(nb, str(copy))
    runner.keep_output(copy, None, with_html=False, source=REPO / "notebooks")
    kept = nbformat.read(str(copy), as_version=4)
    assert [o["text"] for o in kept.cells[1].outputs] == ["3/3 rung [00:03]\ndone\n"]
    link = os.path.relpath(REPO / "docs" / "glossary.md", copy.parent)
    assert kept.cells[0].source == f"Terms: see the [glossary]({link}) and [web](https://x.org)."
    assert (copy.parent / link).resolve() == (REPO / "docs" / "glossary.md").resolve()
    # a link to nothing beside the notebook stays as written
    assert runner.relink("[a](missing.md)", REPO / "notebooks", copy.parent) == "[a](missing.md)"
