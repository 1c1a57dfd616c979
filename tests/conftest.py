"""Shared fixtures: a fake torch_npu (documented signatures, reference math) and a tiny Llama."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
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
