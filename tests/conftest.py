"""Shared fixtures: a fake torch_npu (documented signatures, reference math) and a tiny Llama."""
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


def _load_fake():
    spec = importlib.util.spec_from_file_location("torch_npu", Path(__file__).parent / "fakes" / "fake_torch_npu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_torch_npu(monkeypatch):
    """Install the fake as ``torch_npu`` (and ``torch.npu``, reporting no device) for one test.

    Tests call helpers with ``impl="npu"`` (or the equivalent) on CPU tensors, so the NPU branch
    runs the fake's reference math. ``fake.CALLS`` lists the ops that were called.
    """
    fake = _load_fake()
    fake.npu = fake.make_npu_namespace(available=False)
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(torch, "npu", fake.npu, raising=False)
    monkeypatch.setattr(backend, "_NPU_IMPORT", None)
    yield fake
    backend._NPU_IMPORT = None


@pytest.fixture(scope="session")
def tiny_model():
    """A seeded 2-layer random Llama (float32) and a byte-level tokenizer; no files needed."""
    from helpers.models import tiny_llama

    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """Every notebook run once per session with the ``quick`` profile through the real runner.

    Shared by tests/test_notebooks.py (one test per chapter) and tests/test_browser.py (the pages).
    """
    reports = tmp_path_factory.mktemp("reports")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "helpers.run", "--profile", "quick", "--run-id", "quick",
             "--reports-dir", str(reports), "--solutions"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        )
        timed_out = ""
    except subprocess.TimeoutExpired as exc:
        timed_out = f" (the run was stopped after {RUN_TIMEOUT_S} s, WORKBOOK_TEST_RUN_TIMEOUT)"
        proc = SimpleNamespace(returncode=None, stdout=str(exc.stdout or ""), stderr=timed_out)
    run_dir = reports / "quick"
    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else None
    return {"proc": proc, "run_dir": run_dir, "run": run, "timed_out": timed_out}
