"""Run the workbook headlessly: ``python -m helpers.run --profile quick`` (layer: entry points;
runs every chapter, 00_environment_check to 08_report, and writes the run's index page).

Each notebook is executed with papermill into ``reports/<run-id>/``, with the profile's
parameters (``profiles/<name>.yaml``) and ``-p name=value`` overrides injected. A failing or
crashing notebook is recorded with its error and the run goes on; the exit code is non-zero when
any notebook failed. ``run.json`` and ``index.html`` are rewritten after every notebook, so an
interrupted run keeps what finished, and ``--resume`` skips chapters that already succeeded.

With ``--solutions``, each chapter's worked answers (``solutions/<chapter>_solutions.ipynb``)
run right after it into the same run folder; a failing solution is reported like a failing
chapter. A ``-p name=value`` that no selected notebook declares stops the run before anything
executes, naming the closest declared parameters; ``--list`` shows every parameter.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import html
import io
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import tokenize
import traceback
from pathlib import Path
from typing import Optional

import yaml

from . import REPO, editions, pages
from .claims import CLASS_COLOURS
from .decide import chapter_samples
from .results import (FINISHED, LOAD_PER_CORE_WARNING, REPORT_CHAPTER, RESULTS_NAME, load_results, read_run,
                      write_json_atomic)

NOTEBOOKS = REPO / "notebooks"
PROFILES = REPO / "profiles"
SOLUTIONS = REPO / "solutions"
EDITIONS = ("en", "zh")  # notebooks/ is the English edition, notebooks/zh/ the Chinese one
RUNNER_OPTIONS = {"run_dir": "--run-id / --reports-dir", "profile": "--profile"}


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.yaml"))


def load_profile(name: str) -> dict:
    path = Path(name) if name.endswith((".yaml", ".yml")) else PROFILES / f"{name}.yaml"
    if not path.exists():
        raise SystemExit(f"--profile {name!r} not found; choose one of {', '.join(available_profiles())} "
                         "or give a path to a .yaml file")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"profile {path} must be a YAML mapping")
    return {"all": {}, "notebooks": {}, **data, "name": path.stem}


def parse_overrides(pairs: list[str]) -> dict:
    """``-p batch_sizes=[1,2]`` -> {"batch_sizes": [1, 2]}; values are parsed as YAML literals.

    A string naming a file or folder relative to where the runner was started (``-p
    model=.cache/wide/x.gguf``) is made absolute: each kernel runs in its notebook's folder."""
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"-p {pair!r}: use -p name=value")
        key, value = pair.split("=", 1)
        value = yaml.safe_load(value) if value.strip() else ""
        if isinstance(value, str) and value and not os.path.isabs(value) and os.path.exists(value):
            value = os.path.abspath(value)
        out[key.strip()] = value
    return out


def select_notebooks(folder: Path, only: Optional[list[str]]) -> list[Path]:
    """The notebooks of ``folder`` whose names start with one of ``only`` (all when it is empty)."""
    books = sorted(p for p in folder.glob("*.ipynb") if not p.name.startswith("_"))
    unknown = [o for o in only or [] if not any(p.stem.startswith(o) for p in books)]
    if unknown:
        raise SystemExit(f"--only {' '.join(unknown)}: no such notebook; choose from "
                         f"{', '.join(p.stem for p in books)}")
    return [p for p in books if not only or any(p.stem.startswith(o) for o in only)]


def declared_parameters(path: Path) -> dict:
    """``name -> {"type", "default", "comment"}`` from the notebook's ``parameters`` cell.

    Read with ``ast`` and ``tokenize`` rather than papermill (whose import takes seconds), so
    checking a command line costs milliseconds; papermill injects by the same names.
    """
    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"{path}: not a readable notebook ({exc})") from exc
    source = next(("".join(c["source"]) for c in cells
                   if "parameters" in c.get("metadata", {}).get("tags", [])), "")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise SystemExit(f"{path}: the parameters cell does not parse ({exc})") from exc
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    out = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names, kind = [node.target.id], ast.unparse(node.annotation)
        elif isinstance(node, ast.Assign):
            names, kind = [t.id for t in node.targets if isinstance(t, ast.Name)], ""
        else:
            continue
        for name in names:
            out[name] = {"type": kind, "default": ast.unparse(node.value) if node.value else "",
                         "comment": comments.get(node.lineno, "")}
    return out


def check_overrides(overrides: dict, books: list[Path]) -> None:
    """Stop before anything runs when a ``-p`` name is declared by none of ``books``.

    Parameters go only to the notebooks that declare them, so a typo would otherwise be dropped
    without a word and the run would silently be a different experiment.
    """
    declared = [name for book in books for name in declared_parameters(book)
                if name not in RUNNER_OPTIONS]
    problems = []
    for name in overrides:
        if name in RUNNER_OPTIONS:
            problems.append(f"-p {name}=...: {name} is set by the runner; use {RUNNER_OPTIONS[name]}")
        elif name not in declared:
            close = difflib.get_close_matches(name, list(dict.fromkeys(declared)), n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            problems.append(f"-p {name}=...: no selected notebook declares {name!r}; {hint}"
                            f"(--list shows every parameter of {', '.join(b.stem for b in books)})")
    if problems:
        raise SystemExit("error: " + "\nerror: ".join(problems))


def notebook_parameters(path: Path, profile: dict, overrides: dict, run_dir: Path,
                        section: Optional[str] = None) -> dict:
    """The profile's values for the parameters this notebook declares (others would only warn).

    ``section`` is the profile section to use (default: the notebook's own name); a solutions
    notebook takes its chapter's section, then its own, so it sees the chapter's shapes.
    """
    declared = set(declared_parameters(path))
    own = {}
    for name in dict.fromkeys([section or path.stem, path.stem]):
        own.update(profile["notebooks"].get(name) or {})
    merged = {**profile.get("all", {}), **own, **overrides,
              "run_dir": str(run_dir), "profile": profile["name"]}
    return {"parameters": {k: v for k, v in merged.items() if k in declared},
            "ignored_overrides": sorted(set(overrides) - declared)}


def solution_for(book: Path, folder: Path) -> Optional[Path]:
    """``<folder>/<chapter>_solutions.ipynb`` when it exists."""
    path = Path(folder) / f"{book.stem}_solutions.ipynb"
    return path if path.exists() else None


def list_parameters(books: list[Path], profile: dict, overrides: dict, run_dir: Path,
                    solutions: dict) -> str:
    """Each notebook's parameters: name, type, the value this run would use, and the comment."""
    lines = []
    pairs = [(p, book.stem) for book in books for p in (book, solutions.get(book)) if p]
    for path, section in pairs:  # a solution takes its chapter's profile section
        lines.append(path.stem)
        chosen = notebook_parameters(path, profile, overrides, run_dir, section)["parameters"]
        for name, info in declared_parameters(path).items():
            default = info["default"]
            with contextlib.suppress(ValueError, SyntaxError):  # an expression stays as written
                default = ast.literal_eval(default)
            value = chosen.get(name, default)
            origin = ("  [runner]" if name in RUNNER_OPTIONS else "  [-p]" if name in overrides
                      else f"  [profile {profile['name']}]" if value != default else "")
            kind = f": {info['type']}" if info["type"] else ""
            comment = f"  # {info['comment']}" if info["comment"] else ""
            lines.append(f"  {name}{kind} = {json.dumps(value)}{origin}{comment}")
    return "\n".join(lines)


def describe_failure(exc: BaseException, cell_timeout: Optional[int]) -> tuple[str, str]:
    """(error | kernel_died | timeout, message), so reports can tell a crash from a failing cell."""
    name = type(exc).__name__
    if name == "DeadKernelError":
        return "kernel_died", ("kernel died (killed by the OS, usually out of memory, or crashed "
                               "in native code); try smaller shapes or batch sizes in the profile")
    timed_out = name in ("CellTimeoutError", "TimeoutError") or "timed out" in str(exc).lower()
    if name == "PapermillExecutionError":
        return "timeout" if timed_out else "error", f"{exc.ename}: {exc.evalue}".strip()
    if timed_out:
        return "timeout", f"a cell ran longer than --cell-timeout {cell_timeout} s: {exc}"
    return "error", f"{name}: {exc}"


# A markdown link to a file of the repository: ``[glossary](../docs/glossary.md)``.
RELATIVE_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s]+)\)")


def relink(text: str, source: Path, copy: Path) -> str:
    """``text``'s relative links to files beside ``source`` (a notebook's folder), made relative to
    ``copy`` (where its executed copy lies), so the glossary link works from the run folder too."""
    def moved(found):
        target = source / found.group(1)
        return f"]({os.path.relpath(target, copy)})" if target.exists() else found.group(0)
    return RELATIVE_LINK.sub(moved, text)


def keep_output(notebook: Path, failure: Optional[str], with_html: bool,
                source: Optional[Path] = None) -> Optional[str]:
    """Finish the kept copy of an executed notebook (if papermill wrote one); returns the name of
    its HTML copy, or None.

    ``failure`` puts a red banner on top, for a failure papermill did not annotate (it adds its
    own for a failing cell, not when the kernel died or the run was interrupted); without it the
    kept copy would look like a clean partial run. Each cell's stream output is merged as a notebook
    front end shows it (a progress line redrawn in place keeps its last state, not every redraw:
    ``helpers.progress``), and links to the repository's files (the glossary) are made relative to
    the copy's folder when ``source``, the notebook's own folder, is given. The HTML copy is for
    browsers.
    """
    try:
        import nbformat
        from nbconvert.preprocessors import CoalesceStreamsPreprocessor

        nb = nbformat.read(str(notebook), as_version=4)
        if failure and not any("workbook-failure" in c.metadata.get("tags", []) for c in nb.cells):
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(
                '<span style="color:red; font-size:1.4em;">Run failed: '
                f"{html.escape(failure)}</span>\n\n"
                "Cells below ran until the failure; later cells have no output.",
                metadata={"tags": ["workbook-failure"]}))
        nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
        for cell in nb.cells:
            if source is not None and cell.cell_type == "markdown":
                cell.source = relink(cell.source, source, notebook.parent)
        nbformat.write(nb, str(notebook))
        if with_html:
            from nbconvert import HTMLExporter

            body, _ = HTMLExporter().from_notebook_node(nb)
            page = notebook.with_suffix(".html")
            page.write_text(body, encoding="utf-8")
            return page.name
    except Exception:  # noqa: BLE001  (the run.json entry still carries the error)
        pass
    return None


def refresh_index(run_dir: Path, run: dict) -> Optional[Path]:
    """``write_index`` during a run: a page that cannot be written (a missing label, a bad
    figure) is reported and the run goes on, so no chapter's result is lost to the index."""
    try:
        return write_index(run_dir, run)
    except Exception as exc:  # noqa: BLE001  (the notebooks' results matter more than the page)
        print(f"warning: index.html not written ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
        return None


def write_index(run_dir: Path, run: dict) -> Path:
    """``index.html``: every chapter of the run folder (``helpers.results.read_run``), as the runner sees it."""
    # report draws chapter 08's charts with the ladder's, which imports torch: only here, not at the
    # runner's start (tests/test_layers.py's LAZY_ALLOWED)
    from .report import describe_key_figure, index_verdict_counts

    folder = read_run(run_dir, run=run)
    lang = run.get("lang", "en")
    text = pages.labels("index", lang)

    def links(entry: dict, results: Optional[str] = None) -> list:
        rels = {"notebook": entry.get("output"), "html": entry.get("html"), "results": results}
        return [(text[f"link_{kind}"], rel) for kind, rel in rels.items() if rel]

    rows, loaded = [], []  # loaded: the chapters with figures measured under load
    for chapter in folder.chapters.values():
        data, entry = chapter.data or {}, chapter.entry
        metrics = data.get("metrics", {})
        results = f"{chapter.name}/{RESULTS_NAME}" if chapter.data else None
        samples = chapter_samples(data.get("parameters"))
        load = pages.load_warning(data.get("load"), lang)
        if load:
            loaded.append(chapter.name)
        rows.append({"name": chapter.name, "status": chapter.status, "entry": entry, "solution_of": "",
                     "figures": [describe_key_figure(k, metrics[k], lang, samples) for k in data.get("key_figures", [])
                                 if k in metrics],
                     "load": load,
                     # a finished notebook without results.json (the report chapter's own page) has no detail
                     "detail": "" if chapter.data is None and chapter.status in FINISHED else chapter.reason,
                     "links": links(entry, results)
                     + [(art["label"], art["path"]) for art in data.get("artifacts", [])]})
        solution = entry.get("solution")
        if solution:
            rows.append({"name": solution["notebook"], "status": solution["status"], "entry": solution,
                         "solution_of": chapter.name, "figures": [], "load": "",
                         "detail": solution.get("error") or solution.get("reason") or "",
                         "links": links(solution)})
    return pages.write(Path(run_dir) / "index.html", "index", lang=lang, folder=folder, run=folder.run, rows=rows,
                       counts=index_verdict_counts(folder), colours=CLASS_COLOURS,
                       report_chapter=REPORT_CHAPTER, loaded=loaded,
                       threshold=f"{LOAD_PER_CORE_WARNING:g}")


def _environment_summary() -> dict:
    try:
        import torch

        from .backend import device_properties, import_torch_npu, pick_device

        device = pick_device("auto").device
        return {"device": str(device), "device_name": device_properties(device).get("name"),
                "torch": torch.__version__,
                "torch_npu": getattr(import_torch_npu().module, "__version__", None)}
    except Exception as exc:  # the index must render even if torch is broken
        return {"device": f"unknown ({exc})"}


# A cell still running after this many seconds is named in the runner's output (its number, as the
# executed notebook shows it, and its first line), and its duration once it ends.
SLOW_CELL_S = float(os.environ.get("WORKBOOK_SLOW_CELL_S", "10"))


def cell_lines_engine() -> str:
    """Register (once) and name papermill's nbclient engine with the runner's lines about slow cells:
    ``    cell [12] of 31 running for 10 s: table = round_robin.run_ladder(...`` while it runs, then
    ``    cell [12] done in 145.2 s``, so a long chapter says where it is."""
    from papermill.engines import NBClientEngine, papermill_engines

    class CellLines(NBClientEngine):
        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
            code = [i for i, c in enumerate(nb_man.nb.cells) if c.cell_type == "code"]
            start, complete, now = nb_man.cell_start, nb_man.cell_complete, {}

            def announce(number: int, cell) -> None:
                first = next((line for line in cell.source.splitlines()
                              if line.strip() and not line.lstrip().startswith("#")), "")
                first = first if len(first) <= 72 else first[:69] + "..."
                print(f"    cell [{number}] of {len(code)} running for {SLOW_CELL_S:g} s: {first}", flush=True)
                now["announced"] = True

            def cell_start(cell, cell_index=None, **kw):
                if cell.cell_type == "code" and cell_index in code:
                    number = code.index(cell_index) + 1
                    timer = threading.Timer(SLOW_CELL_S, announce, (number, cell))
                    timer.daemon = True
                    now.update(timer=timer, started=time.perf_counter(), number=number, announced=False)
                    timer.start()
                return start(cell, cell_index, **kw)

            def cell_complete(cell, cell_index=None, **kw):
                timer = now.pop("timer", None)
                if timer is not None:
                    timer.cancel()
                    if now.get("announced"):
                        print(f"    cell [{now['number']}] done in {time.perf_counter() - now['started']:.1f} s",
                              flush=True)
                return complete(cell, cell_index, **kw)

            nb_man.cell_start, nb_man.cell_complete = cell_start, cell_complete
            return super().execute_managed_notebook(nb_man, kernel_name, **kwargs)

    if "workbook" not in papermill_engines._engines:
        papermill_engines.register("workbook", CellLines)
    return "workbook"


def _run_notebook(entry: dict, path: Path, run_dir: Path, cell_timeout: Optional[int],
                  no_html: bool, kernel: str = "python3") -> None:
    """Run one notebook into ``run_dir`` and record the outcome in ``entry``.

    Every failure is recorded and swallowed so the run goes on; Ctrl-C is recorded and re-raised.
    """
    import papermill

    output = run_dir / path.name
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(path), str(output), parameters=entry["parameters"], kernel_name=kernel,
            engine_name=cell_lines_engine(),
            cwd=str(path.parent), execution_timeout=cell_timeout, progress_bar=False,
            log_output=False, request_save_on_cell_execute=True,
            # ipykernel warns on stderr that local TCP is unencrypted; it is harmless noise here.
            extra_arguments=["--IPKernelApp.log_level=ERROR"])
        entry["status"] = "skipped" if (load_results(run_dir, path.stem) or {}).get("status") == "skipped" else "ok"
    except KeyboardInterrupt:
        entry.update(status="failed", error="interrupted (Ctrl-C)", failure="interrupted",
                     duration_s=time.perf_counter() - start)
        keep_output(output, entry["error"], with_html=False, source=path.parent)
        raise
    except Exception as exc:  # noqa: BLE001  (every failure is recorded, the run goes on)
        failure, error = describe_failure(exc, cell_timeout)
        entry.update(status="failed", error=error, failure=failure)
        if type(exc).__module__.split(".")[0] not in ("papermill", "nbclient"):
            entry["traceback"] = traceback.format_exc(limit=5)
    entry["duration_s"] = time.perf_counter() - start
    failure = entry["error"] if entry.get("failure") not in (None, "error") else None
    page = keep_output(output, failure, with_html=not no_html, source=path.parent)
    if page is not None:
        entry["html"] = page
    print(f"    {entry['status']} in {entry['duration_s']:.1f} s"
          + (f": {entry['error']}" if entry.get("error") else ""), flush=True)


def _terminate_like_ctrl_c(signum, frame):
    """SIGTERM (``kill``, a CI job's timeout) takes the Ctrl-C path: the running notebook is marked
    interrupted, its kernel is shut down, and ``run.json`` says how to resume."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[list[str]] = None) -> int:
    signal.signal(signal.SIGTERM, _terminate_like_ctrl_c)
    # A shell starts background jobs with SIGINT ignored, and Python then never raises
    # KeyboardInterrupt; an explicit interrupt (kill -INT) must still stop the run cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(prog="python -m helpers.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=os.environ.get("WORKBOOK_PROFILE") or "default", help=f"one of {', '.join(available_profiles())} "
                        "or a path to a YAML file (default: default)")
    parser.add_argument("--only", nargs="+", metavar="NB", help="notebook names or prefixes, e.g. 00 03")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override a notebook parameter (YAML literal), e.g. -p device=cpu")
    parser.add_argument("--run-id", help="folder name under --reports-dir (default: time + profile)")
    parser.add_argument("--reports-dir", default=os.environ.get("WORKBOOK_REPORTS", str(REPO / "reports")))
    parser.add_argument("--notebooks-dir", help="default: notebooks/ (--lang zh: notebooks/zh/)")
    parser.add_argument("--resume", action="store_true",
                        help="skip notebooks that already succeeded in the run given by --run-id "
                        "(default: the run reports/latest points to)")
    parser.add_argument("--cell-timeout", type=int, default=None,
                        help="seconds one cell may run (default: the profile's cell_timeout)")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML copies of notebooks")
    parser.add_argument("--kernel", default="python3", metavar="NAME",
                        help="the Jupyter kernel to run the notebooks with (default python3, this venv's); "
                             "e.g. the one `make kernel` registered, with the environment its kernel.json carries "
                             "(`python -m helpers.workshop name` prints its name)")
    parser.add_argument("--list", action="store_true",
                        help="list notebooks and their parameters (type, value, comment)")
    parser.add_argument("--solutions", action="store_true",
                        help="after each chapter, run its worked answers to the exercises "
                        "(<chapter>_solutions.ipynb in --solutions-dir) into the same run folder")
    parser.add_argument("--solutions-dir", help="default: solutions/ (--lang zh: solutions/zh/)")
    parser.add_argument("--lang", choices=EDITIONS, default="en",
                        help="the edition to run: en (notebooks/, solutions/) or zh (notebooks/zh/, "
                        "solutions/zh/, Chinese prose and pages; the same code, so the same figures)")
    args = parser.parse_args(argv)
    # An edition is a folder beside the English one, generated from it and its catalogs (helpers.editions).
    edition = "" if args.lang == "en" else args.lang
    if edition and not (args.notebooks_dir and args.solutions_dir):
        done = editions.generate()
        for word, notes in (("warning", done.kept), ("error", done.errors)):
            for note in notes:
                print(f"{word}: {note}", file=sys.stderr)
        if done.errors:
            return 2

    profile = load_profile(args.profile)
    overrides = parse_overrides(args.param)
    books = select_notebooks(Path(args.notebooks_dir or NOTEBOOKS / edition), args.only)
    solutions_dir = Path(args.solutions_dir or SOLUTIONS / edition)
    solutions = {b: s for b in books if args.solutions and (s := solution_for(b, solutions_dir)) is not None}
    check_overrides(overrides, books + list(solutions.values()))
    reports = Path(args.reports_dir).resolve()
    latest = reports / "latest"
    if args.resume and not args.run_id:
        if not latest.is_symlink():
            raise SystemExit("--resume needs --run-id of an earlier run (no reports/latest to resume)")
        args.run_id = os.readlink(latest)
    run_id = args.run_id or "-".join(filter(None, [time.strftime("%Y%m%d-%H%M%S"), profile["name"], edition]))
    run_dir = reports / run_id
    if args.list:
        print(list_parameters(books, profile, overrides, run_dir, solutions))
        return 0
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=run_dir).close()
    except OSError as exc:
        print(f"error: the reports folder {run_dir} is not writable ({exc.strerror or exc}); "
              "pass --reports-dir (or set WORKBOOK_REPORTS) to a writable folder", file=sys.stderr)
        return 2
    cell_timeout = args.cell_timeout or profile.get("cell_timeout")

    previous = {}  # only --resume reads the earlier attempt
    run_file = run_dir / "run.json"
    if args.resume and run_file.exists():
        try:
            previous = {e["notebook"]: e for e in json.loads(run_file.read_text())["notebooks"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"warning: {run_file} is unreadable ({exc}); rerunning every notebook",
                  file=sys.stderr)
    # reports/latest -> this run, set at the start so an interrupted run can be resumed.
    with contextlib.suppress(OSError):
        latest.unlink(missing_ok=True)
        latest.symlink_to(run_id)
    run = {"run_id": run_id, "profile": profile["name"], "lang": args.lang,
           "started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "status": "running", "overrides": overrides, "environment": _environment_summary(),
           "notebooks": []}
    env = {"WORKBOOK_RUN_DIR": str(run_dir), "WORKBOOK_PROFILE": profile["name"],
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # Each kernel's cwd is its notebook's folder: a relative WORKBOOK_CACHE (make test-legacy's
    # .venv-legacy/model-cache) would otherwise build a second cache under notebooks/. It is meant
    # relative to where the runner was started, so it is made absolute here, once.
    if os.environ.get("WORKBOOK_CACHE"):
        env["WORKBOOK_CACHE"] = os.path.abspath(os.environ["WORKBOOK_CACHE"])

    def run_one(step: str, path: Path, section: str, entry: dict) -> None:
        chosen = notebook_parameters(path, profile, overrides, run_dir, section)
        entry.update(parameters=chosen["parameters"], output=path.name)
        if chosen["ignored_overrides"]:
            entry["ignored_overrides"] = chosen["ignored_overrides"]
        print(f"{step} {path.stem} ...", flush=True)
        _run_notebook(entry, path, run_dir, cell_timeout, args.no_html, args.kernel)

    def resumed(step: str, earlier: dict) -> dict:
        print(f"{step} {earlier['notebook']}: {earlier['status']} in an earlier attempt, skipped",
              flush=True)
        return {**earlier, "resumed": True}

    print(f"workbook run {run_id}: profile {profile['name']}, {len(books)} notebook(s)"
          + (f" + {len(solutions)} solutions notebook(s)" if solutions else "") + f" -> {run_dir}",
          flush=True)
    saved = dict(os.environ)
    os.environ.update(env)  # the kernels inherit the runner's environment
    try:
        for i, book in enumerate(books, 1):
            step, earlier = f"[{i}/{len(books)}]", previous.get(book.stem, {})
            entry = {"notebook": book.stem, "status": "running"}
            run["notebooks"].append(entry)  # before it runs, so an interrupted run records it
            if earlier.get("status") in ("ok", "skipped"):
                entry.update(resumed(step, earlier))
            else:
                run_one(step, book, book.stem, entry)
            solution, done = solutions.get(book), earlier.get("solution") or {}
            if solution is not None and entry.get("resumed") and done.get("status") == "ok":
                entry["solution"] = resumed(step, done)
            elif solution is not None and entry["status"] != "ok":
                entry["solution"] = {"notebook": solution.stem, "status": "skipped",
                                     "reason": f"its chapter {book.stem} is {entry['status']}"}
            elif solution is not None:
                entry["solution"] = {"notebook": solution.stem, "status": "running"}
                run_one(step, solution, book.stem, entry["solution"])
            write_json_atomic(run_file, run)
            refresh_index(run_dir, run)
    except KeyboardInterrupt:
        run["status"] = "interrupted"
        write_json_atomic(run_file, run)
        refresh_index(run_dir, run)
        print("interrupted: finished chapters are kept; rerun with "
              f"--run-id {run_id} --resume to continue", file=sys.stderr)
        return 130
    finally:
        os.environ.clear()
        os.environ.update(saved)

    failed = [e["notebook"] for top in run["notebooks"] for e in (top, top.get("solution") or {})
              if e.get("status") == "failed"]
    run["status"] = "failed" if failed else "ok"
    run["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json_atomic(run_file, run)
    index = refresh_index(run_dir, run)
    print(f"report: {index}" if index else f"report: {run_dir} (no index.html, see the warning above)")
    if failed:
        print(f"FAILED notebooks: {', '.join(failed)} (their executed copies show the error)",
              file=sys.stderr)
    return 1 if failed or index is None else 0


if __name__ == "__main__":
    sys.exit(main())
