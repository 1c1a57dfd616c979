"""Shared fixtures: a strict fake torch_npu + torchair per supported torch_npu line, and a tiny Llama."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
# On a CPU shared with other jobs the quick run can take far longer than its 10 minutes; notebooks
# that finished before the limit are still judged from run.json, the rest fail by name.
RUN_TIMEOUT_S = int(os.environ.get("WORKBOOK_TEST_RUN_TIMEOUT", 40 * 60))
sys.path.insert(0, str(REPO))

from helpers import backend  # noqa: E402


FAKES = Path(__file__).parent / "fakes"


def _load_fakes_module(name, folder=FAKES):
    spec = importlib.util.spec_from_file_location(f"_workbook_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Wall time per phase, printed at the end of the session (tests/phase_times.py): make test's budget.
PHASE_TIMES = _load_fakes_module("phase_times", Path(__file__).parent).PhaseTimes()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    PHASE_TIMES.current = (item.nodeid, "setup")  # a session fixture started now is timed apart from this test
    try:
        yield
    finally:
        PHASE_TIMES.current = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    PHASE_TIMES.current = (item.nodeid, "call")  # ... also one a test asks for in its body
    try:
        yield
    finally:
        PHASE_TIMES.current = None


def pytest_runtest_logreport(report):
    PHASE_TIMES.add(report.nodeid, report.when, report.duration, report.keywords)


def pytest_terminal_summary(terminalreporter):
    lines = PHASE_TIMES.lines()
    if len(lines) > 1:
        terminalreporter.write_sep("-", "wall time per phase")
        for line in lines:
            terminalreporter.write_line(line)


npu_line = _load_fakes_module("npu_line")
_fake_torch_npu_builder = _load_fakes_module("fake_torch_npu")
_fake_torchair_builder = _load_fakes_module("fake_torchair")
# One strict fake per supported torch_npu line (tests/fakes/line_*.py); the test ids are the versions.
NPU_LINES = {npu_line.load(name).NAME: name for name in npu_line.LINE_FILES}


def install_fake_npu_line(monkeypatch, line_file: str, available: bool = False):
    """Install one line's fake ``torch_npu`` (and ``torch.npu``) and its fake ``torchair``."""
    line = npu_line.load(line_file)
    fake = _fake_torch_npu_builder.build(line)
    fake.npu = fake.make_npu_namespace(available=available)
    fake.torchair = _fake_torchair_builder.build(line, fake)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setitem(sys.modules, "torchair", fake.torchair)
    monkeypatch.setattr(torch, "npu", fake.npu, raising=False)
    monkeypatch.setattr(backend, "_NPU_IMPORT", None)
    return fake


# The legacy pinned set (make test-legacy: transformers 4.57.x, numpy 1.x, pandas and matplotlib of
# requirements-legacy.txt; the same torch) reruns only the unit tests whose outcome can depend on those
# pins, marked `legacy` here: every test that builds a transformers model (the tiny_model fixture), and
# these files. The rest (prose, templates, reports from recorded runs, the runner, the fakes of torch_npu
# on plain tensors, setup) runs the same code on the same torch either way, once, in make test.
LEGACY_FILES = {
    "test_transformers_lines.py": "the shims for both transformers lines",
    "test_versions.py": "version checks and the transformers range",
    "test_models.py": "loading, the GGUF conversion and its cache folder per transformers line",
    "test_generation.py": "generate, the DynamicCache/StaticCache calls, timing figures",
    "test_end_to_end_study.py": "one decode step of a transformers model taken apart, torch.compile's module",
    "test_batching_study.py": "padded batches through generate, the guide's padding call on a tokenizer",
    "test_static_decode.py": "the static cache and compiled decode over transformers' Llama",
    "test_profiling.py": "profiled decode steps of a transformers model",
    "test_rungs.py": "the ladder's rungs applied to a transformers model",
    "test_ladder.py": "the ladder over a transformers model",
    "test_quant.py": "INT8/INT4 linears swapped into transformers models, quality (perplexity)",
    "test_ops.py": "the operators checked against transformers' LlamaRMSNorm and rotary embedding",
    "test_roofline.py": "model configs read through transformers",
    "test_ffn_fusion.py": "the fused MLP inside a transformers model",
    "test_workshop.py": "the class cache converted and loaded under the installed transformers",
    "test_bench.py": "timing statistics computed with numpy",
    "test_results.py": "numpy and pandas values written to results.json",
    "test_plots.py": "figures drawn with the pinned matplotlib from pandas tables",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in LEGACY_FILES or "tiny_model" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.legacy)


@pytest.fixture(params=list(NPU_LINES), ids=list(NPU_LINES))
def fake_torch_npu(request, monkeypatch):
    """One supported torch_npu line's strict fake as ``torch_npu`` (``torch.npu`` reports no device),
    with that line's fake ``torchair``; every test using it runs once per line.

    Tests call helpers with ``impl="npu"`` (or the equivalent) on CPU tensors, so the NPU branch
    runs the fake's reference math. ``fake.CALLS`` lists the ops that were called, ``fake.LINE`` is
    the line's facts (tests/fakes/line_*.py) and ``fake.torchair`` its torchair.
    """
    fake = install_fake_npu_line(monkeypatch, NPU_LINES[request.param])
    yield fake
    backend._NPU_IMPORT = None
    forget_fake_modules_in_dynamo()


def forget_fake_modules_in_dynamo():
    """Drop the aliases dynamo installs in the globals of the frames it compiles for
    ``import torch_npu`` / ``import torchair`` (``__import_torch_npu``): the next test's line brings
    other module objects, and a guard on the stale alias would fail."""
    torch._dynamo.reset()
    import torch._dynamo.symbolic_convert as convert

    # dynamo caches importlib.import_module per name (functools.cache): it would keep the old fake
    getattr(convert._import_module, "cache_clear", lambda: None)()
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            for alias in ("__import_torch_npu", "__import_torchair"):
                namespace.pop(alias, None)


@pytest.fixture(scope="session")
def tiny_model():
    """A seeded 2-layer random Llama (float32) and a byte-level tokenizer; no files needed."""
    from helpers.model_files import tiny_llama

    return tiny_llama(seed=0)


def run_workbook(args: list[str], extra_env: "dict | None" = None):
    """``python -m helpers.run <args>`` from the repository; (process, "" or why it was stopped)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    try:
        proc = subprocess.run([sys.executable, "-m", "helpers.run", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        return proc, ""
    except subprocess.TimeoutExpired as exc:
        timed_out = f" (the run was stopped after {RUN_TIMEOUT_S} s, WORKBOOK_TEST_RUN_TIMEOUT)"
        return SimpleNamespace(returncode=None, stdout=str(exc.stdout or ""), stderr=timed_out), timed_out


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """Every notebook run once per session with the ``quick`` profile through the real runner.

    Shared by tests/test_notebooks.py (one test per chapter) and tests/test_browser.py (the pages).
    """
    reports = tmp_path_factory.mktemp("reports")
    with PHASE_TIMES.fixture("quick run: every chapter + answers (fixture quick_run)"):
        proc, timed_out = run_workbook(["--profile", "quick", "--run-id", "quick",
                                        "--reports-dir", str(reports), "--solutions"])
    run_dir = reports / "quick"
    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else None
    return {"proc": proc, "run_dir": run_dir, "run": run, "timed_out": timed_out}


# The Chinese edition's quick run: two chapters that measure something, and the report chapter, whose
# claims report and verdict counts the browser test reads. One run, without the answers (their code is
# the English edition's, which the English quick run executes); the model cache is the English run's
# (WORKBOOK_CACHE or the repository's .cache/, already converted by then), so nothing is converted twice.
ZH_QUICK_CHAPTERS = ("01_operator_verification", "03_end_to_end", "08_report")
ZH_EDITION = REPO / "notebooks" / "zh"


def zh_quick_chapters() -> list[str]:
    """The chapters of the Chinese quick run: those of ``ZH_QUICK_CHAPTERS`` whose Chinese edition is in
    this tree (tests/test_notebooks.py fails when fewer than two measuring chapters are)."""
    return [name for name in ZH_QUICK_CHAPTERS if (ZH_EDITION / f"{name}.ipynb").exists()]


@pytest.fixture(scope="session")
def zh_quick_run(tmp_path_factory):
    """The Chinese edition of ``zh_quick_chapters()`` run once with the ``quick`` profile (``--lang zh``)."""
    chapters = zh_quick_chapters()
    reports = tmp_path_factory.mktemp("reports-zh")
    run_dir = reports / "quick-zh"
    if not chapters:
        return {"proc": SimpleNamespace(returncode=None, stdout="", stderr="no Chinese chapter in notebooks/zh"),
                "run_dir": run_dir, "run": None, "timed_out": "", "chapters": chapters}
    with PHASE_TIMES.fixture("Chinese quick run (fixture zh_quick_run)"):
        proc, timed_out = run_workbook(["--profile", "quick", "--lang", "zh", "--run-id", "quick-zh",
                                        "--reports-dir", str(reports), "--only", *chapters])
    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else None
    return {"proc": proc, "run_dir": run_dir, "run": run, "timed_out": timed_out, "chapters": chapters}



# The dtype runs: the chapters whose numerics or kernels depend on the dtype, run for real in each
# dtype the quick run's dtype=auto did not pick (profiles/dtypes.yaml: fewer iterations, the guide's
# RMSNorm shape). No answers (the quick run executes them), no llama.cpp (the profile turns chapter
# 06's row off: the build is not what these runs test).
DTYPE_CHAPTERS = ("01_operator_verification", "02_ffn_fusion", "03_end_to_end", "05_int8_quantization",
                  "06_optimization_ladder")
ALL_DTYPES = ("float32", "bfloat16", "float16")


def auto_dtype_of(run_dir: Path) -> "str | None":
    """The dtype dtype=auto worked in, as the first of ``DTYPE_CHAPTERS`` that ran recorded it."""
    from helpers.results import read_run

    if not run_dir.is_dir():
        return None
    chapters = read_run(run_dir).chapters
    for name in DTYPE_CHAPTERS:
        data = chapters[name].data if name in chapters else None
        dtype = ((data or {}).get("device_choice") or {}).get("dtype")
        if dtype in ALL_DTYPES:
            return dtype
    return None


@pytest.fixture(scope="session")
def dtype_runs(quick_run, tmp_path_factory):
    """``DTYPE_CHAPTERS`` run once per session for each dtype of ``ALL_DTYPES`` but the one the
    quick run's dtype=auto picked (all three when the quick run recorded none), through the runner
    with ``-p dtype=<d>``: {"auto": picked or None, "runs": {dtype: {proc, run_dir, run, timed_out}}}."""
    auto = auto_dtype_of(quick_run["run_dir"])
    reports = tmp_path_factory.mktemp("reports-dtypes")
    runs = {}
    for dtype in (d for d in ALL_DTYPES if d != auto):
        run_id = f"dtypes-{dtype}"
        with PHASE_TIMES.fixture(f"dtype run {dtype}: chapters 01 02 03 05 06 (fixture dtype_runs)"):
            proc, timed_out = run_workbook(["--profile", "dtypes", "--run-id", run_id, "--reports-dir",
                                            str(reports), "-p", f"dtype={dtype}", "--only", *DTYPE_CHAPTERS])
        run_dir = reports / run_id
        run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else None
        runs[dtype] = {"proc": proc, "run_dir": run_dir, "run": run, "timed_out": timed_out}
    return {"auto": auto, "runs": runs}
