"""Shared fixtures: a strict fake torch_npu + torchair per supported torch_npu line, and a tiny Llama."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
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
PHASE_TIMES_MODULE = _load_fakes_module("phase_times", Path(__file__).parent)
PHASE_TIMES = PHASE_TIMES_MODULE.PhaseTimes()
# The notebook runs this session made (notebook_runs), for the coverage lines at its end.
RUNS_OF_SESSION = []


def pytest_configure(config):
    """The Chinese notebooks are generated, not committed (helpers.editions, as make setup does): the
    tests that read them (tests/test_hygiene.py) find them in a fresh clone too. Once, before xdist's
    workers collect."""
    if not hasattr(config, "workerinput"):
        from helpers import editions

        done = editions.generate()
        for note in done.errors + done.kept:
            print(f"conftest: {note}", file=sys.stderr)


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
    if RUNS_OF_SESSION:
        terminalreporter.write_sep("-", "coverage: chapter x edition x dtype x answer runs of this session")
        for line in PHASE_TIMES_MODULE.coverage_lines(RUNS_OF_SESSION):
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


# --- the notebook runs of make test ---------------------------------------------------------------
# Three runs through the real runner, with the smoke profile (profiles/smoke.yaml: the fewest repeats
# and shortest requests that still run every code path):
#   en:    the English edition, every chapter and its worked answer, on the embedded SmolLM2-135M in the
#          dtype dtype=auto picks (chapter 00 measures the pick, the later chapters reuse it);
#   zh:    the Chinese edition, every chapter and its worked answer, on the small random Llama of
#          `scripts/make_wide_llama.py --small`, in the first dtype dtype=auto did not pick;
#   dtype: the chapters whose numerics or kernels depend on the dtype, on the same small Llama, in the
#          other one.
# So every chapter and answer runs in both editions, and each dtype-dependent chapter in all three
# dtypes. The English chapter 00 runs first, alone and on both cores, so its dtype pick is measured on an
# otherwise idle machine. Then two lanes share the two cores: the rest of the English run (--resume keeps
# chapter 00), and the Chinese run followed by the dtype run, one torch thread each. The English lane
# keeps two threads but sets OMP_WAIT_POLICY=PASSIVE: OpenMP threads that spin at their barriers while a
# core is taken lose most of their time (docs/testing.md gives the measurement). The figures of these runs
# are checks that the code runs, not figures to quote (each page records the load).
DTYPE_CHAPTERS = ("01_operator_verification", "02_ffn_fusion", "03_end_to_end", "05_int8_quantization",
                  "06_optimization_ladder")
ALL_DTYPES = ("float32", "bfloat16", "float16")
PICK_WAIT_S = 600  # the longest wait for the English chapter 00's dtype pick


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


def smoke_dtypes(auto: "str | None") -> tuple:
    """(the Chinese run's dtype, the dtype run's dtype): the two of ``ALL_DTYPES`` that ``auto`` is not
    (with no recorded pick, float32 is left to the English run)."""
    others = [d for d in ALL_DTYPES if d != (auto or "float32")]
    return others[0], others[1]


def small_model_path() -> Path:
    """The small random Llama as one GGUF (``make_wide_llama.py --small``), written once into the model
    cache (``WORKBOOK_CACHE`` or .cache/): the same arguments write the same bytes, so a later session
    reuses it, and its converted folder, as they are."""
    from helpers.model_files import cache_root

    spec = importlib.util.spec_from_file_location("make_wide_llama", REPO / "scripts" / "make_wide_llama.py")
    wide = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wide)
    small = dict(wide.SMALL)
    path = cache_root() / "small" / f"small-random-llama-{small['layers']}l.F16.gguf"
    if not path.exists():
        wide.build(path, small.pop("layers"), "F16", 0, **small)
    return path


def start_workbook(args: list[str], extra_env: "dict | None" = None) -> subprocess.Popen:
    """``python -m helpers.run <args>`` from the repository, started (its output captured)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    return subprocess.Popen([sys.executable, "-m", "helpers.run", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_workbook(proc: subprocess.Popen, deadline: float):
    """Wait for a run of ``start_workbook`` until ``deadline`` (monotonic seconds), then stop it the way
    Ctrl-C does (its finished chapters are kept); ((returncode, stdout, stderr), "" or why it was stopped)."""
    try:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return SimpleNamespace(returncode=proc.returncode, stdout=out or "", stderr=err or ""), ""
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        timed_out = f" (the run was stopped after {RUN_TIMEOUT_S} s, WORKBOOK_TEST_RUN_TIMEOUT)"
        return SimpleNamespace(returncode=None, stdout=out or "", stderr=(err or "") + timed_out), timed_out


def wait_for_pick(run_dir: Path, proc: subprocess.Popen, wait_s: float) -> "str | None":
    """The dtype the run's chapter 00 recorded for dtype=auto, once it is there (None if the run ends or
    ``wait_s`` passes first)."""
    from helpers.dtype_choice import recorded_dtype_choice
    from helpers.backend import dtype_name

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        choice = recorded_dtype_choice(run_dir)
        if choice is not None:
            return dtype_name(choice.dtype)
        if proc.poll() is not None:
            return None
        time.sleep(2)
    return None


@pytest.fixture(scope="session")
def notebook_runs(tmp_path_factory):
    """The three runs described above, waited for: ``{"auto": the English pick or None, "model": the small
    GGUF, "runs": {"en" | "zh" | "dtype": {proc, run_dir, run, timed_out, dtype, lang, chapters}}}``."""
    reports = tmp_path_factory.mktemp("reports")
    model = small_model_path()
    common = ["--profile", "smoke", "--reports-dir", str(reports), "--solutions"]
    one_thread = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with PHASE_TIMES.fixture("notebook runs: English chapter 00, then the rest of the English run beside the "
                             "Chinese run and the dtype run (fixture notebook_runs)"):
        deadline = time.monotonic() + RUN_TIMEOUT_S
        first = start_workbook([*common, "--run-id", "smoke-en", "--only", "00"])
        auto = wait_for_pick(reports / "smoke-en", first, PICK_WAIT_S)
        zh_dtype, other_dtype = smoke_dtypes(auto)
        plans = {"en": {"run_id": "smoke-en", "dtype": auto, "lang": "en", "model": "smollm2-135m", "only": []},
                 "zh": {"run_id": f"smoke-zh-{zh_dtype}", "dtype": zh_dtype, "lang": "zh", "model": str(model),
                        "only": []},
                 "dtype": {"run_id": f"smoke-en-{other_dtype}", "dtype": other_dtype, "lang": "en",
                           "model": str(model), "only": list(DTYPE_CHAPTERS)}}
        # no HTML copies of these notebooks (the English run makes them, and the pages are checked there);
        # the answers of the dtype-dependent chapters run in two dtypes already (English and Chinese runs)
        second_lane = [("zh", [*common, "--lang", "zh", "--run-id", plans["zh"]["run_id"], "--no-html",
                               "-p", f"model={model}", "-p", f"dtype={zh_dtype}"]),
                       ("dtype", ["--profile", "smoke", "--reports-dir", str(reports), "--no-html",
                                  "--run-id", plans["dtype"]["run_id"], "-p", f"model={model}",
                                  "-p", f"dtype={other_dtype}", "--only", *DTYPE_CHAPTERS])]
        finished = {}

        def run_second_lane():
            for key, args in second_lane:
                finished[key] = finish_workbook(start_workbook(args, one_thread), deadline)

        lane = threading.Thread(target=run_second_lane)
        lane.start()
        first, first_timed_out = finish_workbook(first, deadline)
        # both threads still (dtype=auto reuses chapter 00's pick only at the thread count it was made at),
        # waiting passively at OpenMP barriers while the other lane holds a core
        rest, timed_out = finish_workbook(start_workbook([*common, "--run-id", "smoke-en", "--resume"],
                                                         {"OMP_WAIT_POLICY": "PASSIVE"}), deadline)
        rest.stdout, rest.stderr = first.stdout + rest.stdout, first.stderr + rest.stderr
        finished["en"] = rest, first_timed_out or timed_out
        lane.join()
        runs = {}
        for key in ("en", "zh", "dtype"):
            proc, timed_out = finished[key]
            plan = plans[key]
            run_dir = reports / plan["run_id"]
            run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else None
            runs[key] = {"proc": proc, "run_dir": run_dir, "run": run, "timed_out": timed_out,
                         "dtype": plan["dtype"] or (auto_dtype_of(run_dir) if key == "en" else None),
                         "lang": plan["lang"],
                         "chapters": plan["only"] or sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))}
            RUNS_OF_SESSION.append({"lang": plan["lang"], "dtype": runs[key]["dtype"],
                                    "model": "smollm2-135m" if key == "en" else "small random Llama",
                                    "profile": "smoke", "run": run})
    return {"auto": auto, "model": model, "runs": runs}


@pytest.fixture(scope="session")
def en_run(notebook_runs):
    """The English edition's run: every chapter of ``notebooks/`` and its answer, on the embedded model.

    Shared by tests/test_notebooks.py (one test per chapter) and tests/test_browser.py (the pages).
    """
    return notebook_runs["runs"]["en"]


@pytest.fixture(scope="session")
def zh_run(notebook_runs):
    """The Chinese edition's run: every chapter of ``notebooks/zh`` and its answer, on the small Llama."""
    return notebook_runs["runs"]["zh"]


@pytest.fixture(scope="session")
def dtype_runs(notebook_runs):
    """The runs that cover ``DTYPE_CHAPTERS`` in a dtype dtype=auto did not pick: ``{"auto": picked or
    None, "runs": {dtype: {proc, run_dir, run, timed_out}}}`` (the Chinese run and the dtype run)."""
    runs = {notebook_runs["runs"][key]["dtype"]: notebook_runs["runs"][key] for key in ("zh", "dtype")}
    return {"auto": notebook_runs["auto"], "runs": runs}
