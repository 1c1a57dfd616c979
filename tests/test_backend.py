"""Device selection, torch_npu import failure modes, memory helpers, dtype names and chapter 00's
environment table."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from helpers import backend, environment_study


def _install_failing_torch_npu(monkeypatch, tmp_path, statement: str) -> None:
    """Put a ``torch_npu`` on sys.path whose import fails the way a broken install does."""
    (tmp_path / "torch_npu.py").write_text(statement + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(backend, "_NPU_IMPORT", None)


FAILURES = {
    "libhccl": ("ImportError", 'raise ImportError("libhccl.so: cannot open shared object file: '
                               'No such file or directory")'),
    "version mismatch": ("RuntimeError", 'raise RuntimeError("torch_npu 2.1.0.post10 requires '
                                         'torch 2.1.0 but found 2.13.0")'),
    "missing driver lib": ("OSError", 'raise OSError("libascend_hal.so: cannot open shared object")'),
    "missing dependency": ("ModuleNotFoundError", "import a_module_that_is_not_installed_xyz"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_import_torch_npu_failure_modes_are_caught_and_explained(monkeypatch, tmp_path, case):
    kind, statement = FAILURES[case]
    _install_failing_torch_npu(monkeypatch, tmp_path, statement)
    result = backend.import_torch_npu(refresh=True)
    assert not result.ok
    assert result.error.startswith(kind)
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.hint
    assert "set_env.sh" in result.hint


def test_torch_npu_not_installed_is_not_an_error_with_a_hint(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "torch_npu" not in p])
    monkeypatch.setattr(backend, "_NPU_IMPORT", None)
    result = backend.import_torch_npu(refresh=True)
    assert not result.ok
    assert result.error == "torch_npu is not installed"
    assert result.hint is None


def test_import_result_is_cached_until_refresh(monkeypatch, tmp_path):
    _install_failing_torch_npu(monkeypatch, tmp_path, FAILURES["libhccl"][1])
    first = backend.import_torch_npu(refresh=True)
    assert backend.import_torch_npu() is first
    assert backend.import_torch_npu(refresh=True) is not first


def test_broken_torch_npu_auto_falls_back_and_explicit_npu_raises(monkeypatch, tmp_path):
    _install_failing_torch_npu(monkeypatch, tmp_path, FAILURES["libhccl"][1])
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    choice = backend.pick_device("auto")
    assert choice.device.type == "cpu"
    assert "libhccl.so" in choice.reason
    with pytest.raises(RuntimeError) as err:
        backend.pick_device("npu")
    message = str(err.value)
    assert "device='npu'" in message and "devices found: cpu" in message
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in message and "set_env.sh" in message


def test_fake_npu_without_device(fake_torch_npu, monkeypatch):
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    assert backend.import_torch_npu().ok
    assert backend.available_devices() == ["cpu"]
    assert backend.pick_device("auto").device.type == "cpu"
    with pytest.raises(RuntimeError, match=r"devices found: cpu.*is_available\(\) is False"):
        backend.pick_device("npu:0")


def test_fake_npu_with_device_is_picked_first(fake_torch_npu, monkeypatch):
    fake_torch_npu.npu = fake_torch_npu.make_npu_namespace(available=True)
    monkeypatch.setattr(torch, "npu", fake_torch_npu.npu, raising=False)
    monkeypatch.setattr(backend, "cuda_available", lambda: True)
    assert backend.available_devices() == ["npu", "cuda", "cpu"]
    # torch.device("npu") exists only once the real torch_npu renamed the PrivateUse1 backend.
    monkeypatch.setattr(backend.torch, "device", lambda name: types.SimpleNamespace(type=name.split(":")[0]))
    choice = backend.pick_device("auto")
    assert choice.device.type == "npu" and "npu is available" in choice.reason
    assert backend.pick_device("cpu").device.type == "cpu"


def test_npu_query_failure_counts_as_no_npu(fake_torch_npu, monkeypatch):
    def broken():
        raise RuntimeError("drvErr: device not found")

    fake_torch_npu.npu.is_available = broken
    assert backend.npu_available() is False


@pytest.mark.parametrize("bad", ["gpu", "npu:x", "auto:0", "", "tpu:1"])
def test_bad_device_names_the_parameter_and_choices(bad):
    with pytest.raises(ValueError) as err:
        backend.pick_device(bad)
    assert "device=" in str(err.value) and "auto, npu, cuda, cpu" in str(err.value)


def test_cuda_requested_without_cuda(monkeypatch):
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    monkeypatch.setattr(backend, "npu_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"no cuda device; devices found: cpu"):
        backend.pick_device("cuda")


# --- synchronisation and memory per backend -------------------------------------------------

class _FakeDevice:
    def __init__(self, kind):
        self.type, self.index = kind, None


def test_synchronize_and_memory_dispatch_to_the_npu_module(fake_torch_npu, monkeypatch):
    monkeypatch.setattr(backend, "as_device", lambda d: _FakeDevice("npu"))
    calls = []
    fake_torch_npu.npu.reset_peak_memory_stats = lambda *a: calls.append("reset")
    fake_torch_npu.npu.empty_cache = lambda: calls.append("empty")
    fake_torch_npu.npu.memory_allocated = lambda *a: 1000
    fake_torch_npu.npu.max_memory_allocated = lambda *a: 12345
    backend.synchronize("npu")
    assert fake_torch_npu.CALLS[-1] == "synchronize"
    with backend.MemoryRegion("npu") as mem:
        assert calls == ["empty", "reset"]  # the peak is reset at the start of the region
    assert mem.peak_bytes == 12345 and mem.start_bytes == 1000 and mem.growth_bytes == 11345
    assert "reset at its start" in mem.kind
    backend.free_memory("npu")
    assert calls[-1] == "empty"


def test_cpu_synchronize_is_a_no_op():
    backend.synchronize("cpu")
    assert backend.device_module("cpu") is None


def test_cpu_memory_region_measures_growth_not_an_earlier_high_water_mark():
    big = torch.ones(256 * 2**20 // 4)  # an earlier, larger allocation sets a high-water mark
    del big
    with backend.MemoryRegion("cpu") as mem:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, inside the region
        del block
    assert 48 * 2**20 <= mem.growth_bytes < 200 * 2**20  # the region's own 64 MiB, not the 256 MiB
    with backend.MemoryRegion("cpu") as idle:
        pass
    assert idle.growth_bytes < 16 * 2**20


def test_cpu_memory_region_samples_when_clear_refs_is_forbidden(monkeypatch):
    monkeypatch.setattr(backend, "_reset_cpu_high_water_mark", lambda: False)
    with backend.MemoryRegion("cpu") as mem:
        block = torch.ones(96 * 2**20 // 4)
        import time

        time.sleep(0.05)  # long enough for the 2 ms sampler to see it
        del block
    assert "sampled" in mem.kind and mem.growth_bytes >= 64 * 2**20


# --- out of memory (the sweep helpers build on these two) -----------------------------------

@pytest.mark.parametrize("exc", [
    MemoryError(),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("NPU out of memory. Tried to allocate 1.00 GiB (NPU 0; 29.50 GiB total capacity)"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory"),
    RuntimeError("OOM when allocating tensor"),
])
def test_out_of_memory_is_recognised(exc):
    assert backend.is_out_of_memory(exc)


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
    ValueError("zoom factor"),
    KeyError("room"),
])
def test_other_errors_are_not_out_of_memory(exc):
    assert not backend.is_out_of_memory(exc)


def test_out_of_memory_on_torch_without_torch_outofmemoryerror(monkeypatch):
    monkeypatch.delattr(torch, "OutOfMemoryError")
    assert backend.is_out_of_memory(MemoryError())
    assert backend.is_out_of_memory(RuntimeError("NPU out of memory"))
    assert not backend.is_out_of_memory(RuntimeError("shape mismatch"))


def test_real_cpu_allocation_failure_is_out_of_memory_and_memory_is_freed():
    with pytest.raises(RuntimeError) as err:
        torch.empty(2**62, dtype=torch.uint8)
    assert backend.is_out_of_memory(err.value)
    backend.free_memory("cpu")  # must not raise on the CPU


# --- dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,dtype", [("fp16", torch.float16), ("bfloat16", torch.bfloat16),
                                        ("float32", torch.float32), (torch.float16, torch.float16)])
def test_parse_dtype(text, dtype):
    assert backend.named_dtype(text, "cpu") == dtype


def test_auto_is_not_a_name_here_but_the_measured_choice():
    with pytest.raises(ValueError, match=r"dtype='auto' is chosen by helpers.dtype_choice"):
        backend.named_dtype("auto", "cpu")


def test_unknown_dtype_names_the_parameter_and_choices():
    with pytest.raises(ValueError, match=r"dtype='int4' is not valid; choose one of auto, float32"):
        backend.named_dtype("int4", "cpu")


def test_bf16_where_the_device_lacks_it(fake_torch_npu, monkeypatch):
    fake_torch_npu.npu.is_bf16_supported = lambda: False
    monkeypatch.setattr(backend, "as_device", lambda d: _FakeDevice("npu"))
    with pytest.raises(ValueError, match=r"dtype=bfloat16 is not supported on this npu device"):
        backend.named_dtype("bf16", "npu")
    assert backend.named_dtype("fp16", "npu") == torch.float16


def test_the_environment_table_names_host_ram_on_a_cpu_and_device_memory_elsewhere():
    report = {"python": "3.11.7", "torch": "2.13.0+cpu", "torch_npu": None,
              "torch_npu_error": "torch_npu is not installed", "cann": None, "cuda": None, "device": "cpu",
              "device_properties": {"name": "Some CPU", "count": 1, "total_memory_bytes": 24 * 2**30},
              "cpu_model": "Some CPU", "torch_threads": 2, "workbook_commit": "abc1234", "transformers": "5.0"}
    table = environment_study.environment_table(report).set_index("fact")["value"]
    assert table["host RAM (GiB)"] == "24.0" and "device memory (GiB)" not in table
    assert table["torch_npu"] == "not loaded (torch_npu is not installed)" and table["CANN"] == "not found"
    npu = environment_study.environment_table({**report, "device": "npu:0", "torch_npu": "2.1.0.post10"})
    npu = npu.set_index("fact")["value"]
    assert npu["device memory (GiB)"] == "24.0" and npu["torch_npu"] == "2.1.0.post10"
