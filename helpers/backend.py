"""Device selection, synchronisation, memory growth of a region and the environment report.

Taught in ``00_environment_check.ipynb``; every other chapter calls ``pick_device``,
``synchronize`` and the memory helpers from here so that NPU, CUDA and CPU share one code path.
"""
from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

DEVICE_CHOICES = ("auto", "npu", "cuda", "cpu")

# torch_npu registers a ``torch.backends`` entry point; on a machine with the wheel but without
# CANN, even ``import torch`` fails unless TORCH_DEVICE_BACKEND_AUTOLOAD=0. The message users see
# names it (defined in the package so that ``import helpers`` can use it before torch loads).
from . import TORCH_NPU_AUTOLOAD_HINT as AUTOLOAD_HINT  # noqa: E402


@dataclass
class NpuImport:
    """Outcome of trying to import torch_npu, with the reason when it failed."""

    module: Any = None
    error: Optional[str] = None
    hint: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.module is not None


_NPU_IMPORT: Optional[NpuImport] = None


def import_torch_npu(refresh: bool = False) -> NpuImport:
    """Import torch_npu if it can be imported; never raise.

    A missing wheel raises ImportError, a wheel without CANN raises ImportError (``libhccl.so``) or
    OSError, and a torch/torch_npu mismatch raises RuntimeError, so all three are caught.
    """
    global _NPU_IMPORT
    if _NPU_IMPORT is not None and not refresh:
        return _NPU_IMPORT
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ModuleNotFoundError as exc:
        if getattr(exc, "name", None) == "torch_npu":
            _NPU_IMPORT = NpuImport(error="torch_npu is not installed")
        else:
            _NPU_IMPORT = NpuImport(error=f"{type(exc).__name__}: {exc}", hint=AUTOLOAD_HINT)
    except (ImportError, RuntimeError, OSError) as exc:
        _NPU_IMPORT = NpuImport(error=f"{type(exc).__name__}: {exc}", hint=AUTOLOAD_HINT)
    else:
        _NPU_IMPORT = NpuImport(module=torch_npu)
    return _NPU_IMPORT


def npu_available() -> bool:
    if not import_torch_npu().ok:
        return False
    try:
        return bool(torch.npu.is_available()) and torch.npu.device_count() > 0
    except Exception:  # a driver problem shows up here, not at import time
        return False


def cuda_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def available_devices() -> list[str]:
    found = []
    if npu_available():
        found.append("npu")
    if cuda_available():
        found.append("cuda")
    found.append("cpu")
    return found


@dataclass
class DeviceChoice:
    device: torch.device
    requested: str
    reason: str


def pick_device(requested: str = "auto") -> DeviceChoice:
    """Pick npu -> cuda -> cpu for ``"auto"``; honour an explicit request or fail clearly.

    An explicit ``"npu"`` on a machine without one is an error, never a silent CPU run.
    """
    value = str(requested).strip().lower()
    kind, _, index = value.partition(":")
    if kind not in DEVICE_CHOICES or (index and (kind == "auto" or not index.isdigit())):
        raise ValueError(
            f"device={requested!r} is not valid; choose one of {', '.join(DEVICE_CHOICES)} "
            "(optionally with an index, e.g. 'npu:1')."
        )
    found = available_devices()
    if kind == "auto":
        kind = found[0]
        if kind == "cpu":
            npu = import_torch_npu()
            why = "no NPU or CUDA device found"
            if npu.error and npu.error != "torch_npu is not installed":
                why += f" (torch_npu failed to load: {npu.error})"
            from . import AUTOLOAD_DISABLED_REASON

            if AUTOLOAD_DISABLED_REASON:
                why += f"; {AUTOLOAD_DISABLED_REASON}"
            reason = f"auto: {why}; running on the CPU"
        else:
            reason = f"auto: {kind} is available"
        return DeviceChoice(torch.device(kind), requested, reason)
    if kind not in found:
        detail = ""
        if kind == "npu":
            npu = import_torch_npu()
            detail = f" torch_npu: {npu.error or 'imported, but torch.npu.is_available() is False'}."
            if npu.hint:
                detail += " " + npu.hint
        raise RuntimeError(
            f"device={requested!r} was requested but this machine has no {kind} device; "
            f"devices found: {', '.join(found)}.{detail} Use device='auto' to fall back."
        )
    device = torch.device(f"{kind}:{index}" if index else kind)
    return DeviceChoice(device, requested, f"requested {value}")


def as_device(device: "torch.device | str | DeviceChoice") -> torch.device:
    if isinstance(device, DeviceChoice):
        return device.device
    return torch.device(device)


def model_device(model) -> torch.device:
    """The device a model's weights live on."""
    return next(model.parameters()).device


def device_module(device) -> Any:
    """``torch.npu`` / ``torch.cuda`` for accelerators, None for the CPU."""
    kind = as_device(device).type
    if kind == "cpu":
        return None
    return getattr(torch, kind)


def synchronize(device) -> None:
    """Wait for queued kernels; timings on NPU/CUDA are meaningless without it."""
    module = device_module(device)
    if module is not None:
        module.synchronize()


def _cpu_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _proc_status_bytes(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _return_freed_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``), so that the RSS at the start of
    a region is memory in use, and the region's allocations show up as growth instead of reusing
    pages an earlier, larger allocation left resident."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_cpu_high_water_mark() -> bool:
    """Reset ``VmHWM`` to the current RSS (``5`` into ``/proc/self/clear_refs``, Linux >= 4.0).

    False where the write is forbidden (some containers) or the mark did not move.
    """
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    hwm, rss = _proc_status_bytes("VmHWM"), _proc_status_bytes("VmRSS")
    # After a real reset the mark is the current RSS (allow for pages touched meanwhile).
    return hwm is not None and rss is not None and hwm <= rss + 64 * 2**20


class _RssSampler:
    """Where the high-water mark cannot be reset: the RSS sampled every ``interval`` s in a thread."""

    def __init__(self, interval: float = 0.002):
        import threading

        self.peak = _cpu_rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.peak = max(self.peak, _cpu_rss_bytes())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _cpu_rss_bytes())


class MemoryRegion:
    """Memory a region of code adds: its peak minus what was in use when it started.

    ``with MemoryRegion(device) as mem: ...`` then ``mem.growth_bytes`` (peak during the region
    minus in use at its start), ``mem.start_bytes``, ``mem.peak_bytes`` and ``mem.kind`` (how it was
    measured, for the figure's label). The peak is reset at the start of the region, never carried
    over from earlier work (loading, quantizing, compiling):

    * NPU / CUDA: ``empty_cache`` + ``reset_peak_memory_stats``, then ``max_memory_allocated``
      against ``memory_allocated`` at the start (tensor memory of the allocator).
    * CPU (Linux): freed heap pages are returned to the OS, the RSS high-water mark ``VmHWM`` is
      reset to the current RSS, and the growth is ``VmHWM`` after the region minus the RSS before;
      where the mark cannot be reset, the RSS is sampled every 2 ms in a thread instead.

    Taught in ``04_batching.ipynb`` (memory per batch size) and ``05_int8_quantization.ipynb``.
    """

    def __init__(self, device):
        self.device = as_device(device)
        self.module = device_module(self.device)
        self.start_bytes = self.peak_bytes = 0
        self.kind = ""
        self._sampler: Optional[_RssSampler] = None

    def __enter__(self) -> "MemoryRegion":
        if self.module is not None:
            synchronize(self.device)
            self.module.empty_cache()
            self.module.reset_peak_memory_stats()
            self.start_bytes = int(self.module.memory_allocated())
            self.kind = "max_memory_allocated during the region, reset at its start"
            return self
        _return_freed_heap()
        self.start_bytes = _cpu_rss_bytes()
        if _reset_cpu_high_water_mark():
            self.kind = "process RSS high-water mark (VmHWM), reset at the region's start"
        else:
            self._sampler = _RssSampler()
            self.kind = "process RSS sampled every 2 ms during the region (VmHWM not resettable here)"
        return self

    def __exit__(self, *exc) -> None:
        if self.module is not None:
            synchronize(self.device)
            self.peak_bytes = int(self.module.max_memory_allocated())
        elif self._sampler is not None:
            self.peak_bytes = self._sampler.stop()
        else:
            self.peak_bytes = max(_proc_status_bytes("VmHWM") or 0, _cpu_rss_bytes())

    @property
    def growth_bytes(self) -> int:
        return max(self.peak_bytes - self.start_bytes, 0)


def free_memory(device) -> None:
    """Release cached blocks after an OOM so the next point of a sweep can run."""
    import gc

    gc.collect()
    module = device_module(device)
    if module is not None:
        module.empty_cache()


def _oom_types() -> tuple:
    # torch.OutOfMemoryError is new in torch 2.5; torch 2.1 only has torch.cuda.OutOfMemoryError.
    found = [MemoryError]
    for owner, name in ((torch, "OutOfMemoryError"), (torch.cuda, "OutOfMemoryError")):
        cls = getattr(owner, name, None)
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA/NPU/CPU allocation failures (torch_npu raises RuntimeError 'NPU out of memory')."""
    if isinstance(exc, _oom_types()):
        return True
    text = str(exc).lower()
    return ("out of memory" in text or "oom" in re.findall(r"[a-z]+", text)
            or "failed to allocate memory" in text or "defaultcpuallocator: can't allocate" in text)


def working_dtype(device) -> tuple[torch.dtype, str]:
    """The dtype a chapter should use on this device, with the reason shown to readers."""
    kind = as_device(device).type
    if kind in ("npu", "cuda"):
        return torch.float16, f"float16: the guides' inference dtype and native on {kind}"
    bf16 = False
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        pass
    if bf16:
        return torch.bfloat16, (
            "bfloat16: this CPU has native bf16 instructions; float16 on CPU is emulated and slow"
        )
    return torch.float32, "float32: this CPU has no native bf16/fp16 arithmetic"


DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def parse_dtype(value, device=None, parameter: str = "dtype") -> torch.dtype:
    """Turn ``"auto"``/``"bf16"``/``torch.float16`` into a dtype the device supports, or raise."""
    if isinstance(value, torch.dtype):
        dtype = value
    else:
        text = str(value).strip().lower()
        if text == "auto":
            return working_dtype(device or "cpu")[0]
        if text not in DTYPES:
            raise ValueError(
                f"{parameter}={value!r} is not valid; choose one of auto, float32, float16, bfloat16."
            )
        dtype = DTYPES[text]
    if device is not None and dtype == torch.bfloat16:
        kind = as_device(device).type
        module = device_module(device)
        if module is not None and hasattr(module, "is_bf16_supported") and not module.is_bf16_supported():
            raise ValueError(
                f"{parameter}=bfloat16 is not supported on this {kind} device; use float16 or float32."
            )
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --- environment report --------------------------------------------------------------------

# Only variables that explain a run go into reports; tokens and credentials never do.
REPORTED_ENV_VARS = (
    "ASCEND_HOME_PATH", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES", "TORCH_DEVICE_BACKEND_AUTOLOAD", "OMP_NUM_THREADS",
    "HF_ENDPOINT", "HF_HUB_OFFLINE", "WORKBOOK_CACHE", "WORKBOOK_PROFILE",
)


def _without_credentials(value: str) -> str:
    """``https://user:token@mirror/`` -> ``https://***@mirror/``: a mirror URL may embed a token."""
    return re.sub(r"(?<=://)[^/@\s]+@", "***@", value)


def reported_environment() -> dict:
    """The allow-listed environment variables, with credentials inside URLs masked."""
    return {k: _without_credentials(os.environ[k]) for k in REPORTED_ENV_VARS if k in os.environ}


def cann_version() -> Optional[str]:
    """``torch.version.cann`` (set by torch_npu), else the toolkit's install.info, else None."""
    value = getattr(torch.version, "cann", None)
    if value and value != "not known":
        return str(value)
    roots = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"),
             "/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann"]
    for root in filter(None, roots):
        for info in sorted(Path(root).glob("*-linux/ascend_toolkit_install.info")):
            try:
                for line in info.read_text().splitlines():
                    if line.startswith("version="):
                        return line.split("=", 1)[1].strip()
            except OSError:
                continue
    return None


def npu_smi_info(timeout: float = 10.0) -> Optional[str]:
    tool = shutil.which("npu-smi")
    if tool is None:
        return None
    try:
        return subprocess.run([tool, "info"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"npu-smi info failed: {exc}"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(repo: Optional[Path] = None) -> Optional[str]:
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def device_properties(device) -> dict:
    device = as_device(device)
    if device.type == "cpu":
        return {"name": cpu_model(), "count": 1, "total_memory_bytes": os.sysconf("SC_PAGE_SIZE")
                * os.sysconf("SC_PHYS_PAGES"), "threads": torch.get_num_threads(),
                "logical_cpus": os.cpu_count()}
    module = device_module(device)
    index = device.index or 0
    props: dict = {"name": module.get_device_name(index), "count": module.device_count()}
    try:
        free, total = module.mem_get_info(index)
        props.update(total_memory_bytes=int(total), free_memory_bytes=int(free))
    except Exception:
        pass
    return props


def environment_report(device=None) -> dict:
    """Versions and hardware that produced a figure; stored in every results.json."""
    npu = import_torch_npu()
    device = as_device(device) if device is not None else pick_device("auto").device
    report = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_npu": getattr(npu.module, "__version__", None),
        "torch_npu_error": npu.error,
        "cann": cann_version(),
        "cuda": torch.version.cuda if cuda_available() else None,
        "device": str(device),
        "device_properties": device_properties(device),
        "cpu_model": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "workbook_commit": git_commit(),
        "env": reported_environment(),
    }
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        report["transformers"] = None
    smi = npu_smi_info() if device.type == "npu" else None
    if smi:
        report["npu_smi_info"] = smi
    return report


def base_version(version: str) -> tuple[int, int, int]:
    """'2.1.0.post10' / '2.13.0+cpu' -> (2, 1, 0)."""
    numbers = [int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple((numbers + [0, 0, 0])[:3])  # type: ignore[return-value]
