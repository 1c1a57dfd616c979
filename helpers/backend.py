"""Picking and using the device (layer: the device; taught in 00_environment_check).

Device selection, synchronisation, memory growth of a region and the environment report. Every other
chapter calls ``pick_device``, ``synchronize`` and the memory helpers from here so that NPU, CUDA
and CPU share one code path. The dtype names are here too (``named_dtype``, ``dtype_name``);
``dtype=auto``, a measurement, is ``dtype_choice``'s.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from .prose import message
from .results import LOAD_PER_CORE_WARNING  # the one load threshold every page warns at
from .versions import installed_version, npu_op_missing

DEVICE_CHOICES = ("auto", "npu", "cuda", "cpu")

# torch_npu registers a ``torch.backends`` entry point; on a machine with the wheel but without
# CANN, even ``import torch`` fails unless TORCH_DEVICE_BACKEND_AUTOLOAD=0. The message users see
# names it (defined in the package so that ``import helpers`` can use it before torch loads).
from . import REPO, TORCH_NPU_AUTOLOAD_HINT as AUTOLOAD_HINT  # noqa: E402


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
    except (ImportError, RuntimeError, OSError) as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "torch_npu":
            _NPU_IMPORT = NpuImport(error=message("torch_npu is not installed"))
        else:
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
    """The device kinds here, in ``device=auto``'s order of preference."""
    accelerators = (("npu", npu_available), ("cuda", cuda_available))
    return [kind for kind, present in accelerators if present()] + ["cpu"]


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
    if kind == "auto" and found[0] != "cpu":
        return DeviceChoice(torch.device(found[0]), requested,
                            message("auto: {device} is available", device=found[0]))
    if kind == "auto":
        from . import AUTOLOAD_DISABLED_REASON

        npu = import_torch_npu()
        why = message("no NPU or CUDA device found")
        if npu.error and npu.error != "torch_npu is not installed":
            why = message("no NPU or CUDA device found (torch_npu failed to load: {error})", error=npu.error)
        if AUTOLOAD_DISABLED_REASON:
            why = message("{why}; {autoload}", why=why, autoload=AUTOLOAD_DISABLED_REASON)
        return DeviceChoice(torch.device("cpu"), requested, message("auto: {why}; running on the CPU", why=why))
    if kind not in found:
        detail = ""
        if kind == "npu":
            npu = import_torch_npu()
            detail = message(" torch_npu: {error}.", error=npu.error or message(
                "imported, but torch.npu.is_available() is False"))
            if npu.hint:
                detail = message("{detail} {hint}", detail=detail, hint=npu.hint)
        # the message is the catalog's: a worked answer shows it in its edition's language
        raise RuntimeError(message(
            "device={requested!r} was requested but this machine has no {kind} device; devices found: "
            "{found}.{detail} Use device='auto' to fall back.", requested=requested, kind=kind,
            found=", ".join(found), detail=detail))
    device = torch.device(f"{kind}:{index}" if index else kind)
    return DeviceChoice(device, requested, message("requested {device}", device=value))


def as_device(device: "torch.device | str | DeviceChoice") -> torch.device:
    return device.device if isinstance(device, DeviceChoice) else torch.device(device)


def device_kind(device) -> str:
    """``"npu"`` / ``"cuda"`` / ``"cpu"`` from a tensor, device or string (``torch.device("npu")``
    only parses once torch_npu is imported, so strings are read as text)."""
    if isinstance(device, (torch.Tensor, DeviceChoice)):
        return device.device.type
    if isinstance(device, torch.device):
        return device.type
    return str(device).split(":")[0].strip().lower()


def torch_npu_module():
    """The imported torch_npu module, or a clear error for a caller that asked for the npu path."""
    found = import_torch_npu()
    if not found.ok:
        raise RuntimeError(f"impl='npu' needs torch_npu, which could not be imported: {found.error}. "
                           f"{found.hint or ''} Use impl='auto' to pick an implementation for this device.")
    return found.module


def npu_op(name: str):
    """``torch_npu.<name>``, or a clear error naming this torch_npu and the line that has the op."""
    fn = getattr(torch_npu_module(), name, None)
    if fn is None:
        raise RuntimeError(f"impl='npu' needs torch_npu.{name}, but "
                           f"{npu_op_missing(name, import_torch_npu().module)}. "
                           "Use impl='auto' to fall back to an implementation this line has.")
    return fn


def model_device(model) -> torch.device:
    """The device a model's weights live on."""
    return next(model.parameters()).device


def npu_unseen(device) -> Optional[str]:
    """Where this venv was made for an NPU (torch_npu is installed) and the chapter still runs on
    another device, why, in one sentence a chapter shows first; else None. The usual cause is a
    JupyterLab or shell without CANN's environment (``set_env.sh`` not sourced, e.g. after an
    instance restart): every figure would then be the CPU's, with no word of why."""
    import importlib.util

    if as_device(device).type == "npu" or importlib.util.find_spec("torch_npu") is None:
        return None
    npu = import_torch_npu()
    why = npu.error or message("torch_npu imports, but torch.npu.is_available() is False")
    return message("this venv was made for an NPU (torch_npu is installed) but this kernel sees no NPU ({why}); "
                   "every figure below is the {device}'s. Load CANN's environment where the kernel starts: in a "
                   "terminal, `source /usr/local/Ascend/ascend-toolkit/set_env.sh`, then run `make kernel` again "
                   "(the kernel then sources it at every start) and restart this kernel", why=why,
                   device=as_device(device).type.upper())


def thread_share() -> Optional[str]:
    """A note when ``OMP_NUM_THREADS`` limits torch to fewer threads than the cores this process may
    use (a class's fair share from ``workshop.env``, or a user's own limit); else None."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = os.environ.get("OMP_NUM_THREADS", "")
    if not limit.isdigit() or int(limit) >= cores:
        return None
    return message("this kernel computes on {threads} of the {cores} cores (OMP_NUM_THREADS={limit}{why}); "
                   "every CPU figure below is for that many threads", threads=torch.get_num_threads(),
                   cores=cores, limit=limit,
                   why=message(", the class's share from workshop.env") if os.environ.get("WORKBOOK_CLASS_DIR") else "")


def cpu_contention(device) -> Optional[str]:
    """A warning when CPU timings are unreliable because the cores are oversubscribed, else None.

    With more runnable processes than cores, torch's OpenMP threads wait for each other at every
    barrier and a decode step can be tens of times slower; one thread per free core avoids that.
    """
    if as_device(device).type != "cpu" or not hasattr(os, "getloadavg"):
        return None
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    if load <= cores * LOAD_PER_CORE_WARNING:
        return None
    return (f"CPU load average {load:.1f} on {cores} cores with {torch.get_num_threads()} torch threads: "
            "timings are inflated by other processes; run alone or set OMP_NUM_THREADS to the free cores")


def device_module(device) -> Any:
    """``torch.npu`` / ``torch.cuda`` for accelerators, None for the CPU."""
    kind = as_device(device).type
    return None if kind == "cpu" else getattr(torch, kind)


def synchronize(device) -> None:
    """Wait for queued kernels; timings on NPU/CUDA are meaningless without it."""
    module = device_module(device)
    if module is not None:
        module.synchronize()


def _file_field(path, name: str, separator: str = ":") -> Optional[str]:
    """The value of a text file's first ``name<separator> value`` line (``/proc`` files,
    CANN's install.info), or None."""
    with contextlib.suppress(OSError), open(path) as fh:
        for line in fh:
            key, found, value = line.partition(separator)
            if found and key.strip() == name:
                return value.strip()
    return None


def _proc_status_bytes(field: str) -> Optional[int]:
    value = _file_field("/proc/self/status", field)  # "VmHWM:  123456 kB"
    return int(value.split()[0]) * 1024 if value else None


def _cpu_rss_bytes() -> int:
    return _proc_status_bytes("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def return_freed_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``), so that the RSS at the start of
    a region is memory in use, and the region's allocations show up as growth instead of reusing
    pages an earlier, larger allocation left resident."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


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
        self._sampler: Optional[threading.Thread] = None

    def _sample_rss(self) -> None:
        """Where the high-water mark cannot be reset: the RSS sampled every 2 ms in a thread."""
        while not self._stop.wait(0.002):
            self.peak_bytes = max(self.peak_bytes, _cpu_rss_bytes())

    def __enter__(self) -> "MemoryRegion":
        if self.module is not None:
            synchronize(self.device)
            self.module.empty_cache()
            self.module.reset_peak_memory_stats()
            self.start_bytes = int(self.module.memory_allocated())
            self.kind = "max_memory_allocated during the region, reset at its start"
            return self
        return_freed_heap()
        self.start_bytes = self.peak_bytes = _cpu_rss_bytes()
        if _reset_cpu_high_water_mark():
            self.kind = "process RSS high-water mark (VmHWM), reset at the region's start"
        else:
            self._stop = threading.Event()
            self._sampler = threading.Thread(target=self._sample_rss, daemon=True)
            self._sampler.start()
            self.kind = "process RSS sampled every 2 ms during the region (VmHWM not resettable here)"
        return self

    def __exit__(self, *exc) -> None:
        if self.module is not None:
            synchronize(self.device)
            self.peak_bytes = int(self.module.max_memory_allocated())
        elif self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self.peak_bytes = max(self.peak_bytes, _cpu_rss_bytes())
        else:
            self.peak_bytes = max(_proc_status_bytes("VmHWM") or 0, _cpu_rss_bytes())

    @property
    def growth_bytes(self) -> int:
        return max(self.peak_bytes - self.start_bytes, 0)


def free_memory(device) -> None:
    """Release cached blocks after an OOM so the next point of a sweep can run."""
    gc.collect()
    module = device_module(device)
    if module is not None:
        module.empty_cache()


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA/NPU/CPU allocation failures (torch_npu raises RuntimeError 'NPU out of memory')."""
    # torch.OutOfMemoryError (new in torch 2.5) is torch.cuda.OutOfMemoryError, which torch 2.1 has.
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return ("out of memory" in text or "oom" in re.findall(r"[a-z]+", text)
            or "failed to allocate memory" in text or "defaultcpuallocator: can't allocate" in text)


# --- the working dtype's names and the CPU kernel level -------------------------------------

def cpu_capability() -> str:
    """ATen's CPU kernel level here (``AVX512``, ``AVX2``, ...; ``ATEN_CPU_CAPABILITY`` lowers it)."""
    return str(torch.backends.cpu.get_cpu_capability())  # from torch 2.1, the support floor


DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def named_dtype(value, device=None, parameter: str = "dtype") -> torch.dtype:
    """Turn ``"bf16"``/``torch.float16`` into a dtype the device supports, or raise.

    ``"auto"`` is a measurement on a CPU (the model's forward timed per dtype), which needs the
    layers above the device: ``dtype_choice.parse_dtype`` takes it and hands the names to this one.
    """
    if isinstance(value, torch.dtype):
        dtype = value
    else:
        text = str(value).strip().lower()
        if text == "auto":
            raise ValueError(f"{parameter}='auto' is chosen by helpers.dtype_choice (parse_dtype / "
                             "choose_dtype; a chapter's ch.dtype); pass the dtype it chose, or one of "
                             "float32, float16, bfloat16.")
        if text not in DTYPES:
            raise ValueError(
                f"{parameter}={value!r} is not valid; choose one of auto, float32, float16, bfloat16."
            )
        dtype = DTYPES[text]
    module = device_module(device) if device is not None and dtype == torch.bfloat16 else None
    if module is not None and not getattr(module, "is_bf16_supported", lambda: True)():
        raise ValueError(f"{parameter}=bfloat16 is not supported on this {as_device(device).type} "
                         "device; use float16 or float32.")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --- environment report --------------------------------------------------------------------

# Only variables that explain a run go into reports; tokens and credentials never do.
REPORTED_ENV_VARS = (
    "ASCEND_HOME_PATH", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES", "TORCH_DEVICE_BACKEND_AUTOLOAD", "OMP_NUM_THREADS",
    "HF_ENDPOINT", "HF_HUB_OFFLINE", "WORKBOOK_CACHE", "WORKBOOK_PROFILE",
    # lower the CPU kernel level (an AVX2-only CPU approximated on a newer one); dtype=auto depends on it
    "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
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
            if version := _file_field(info, "version", "="):
                return version
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
    return _file_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def git_commit(repo: Optional[Path] = None) -> Optional[str]:
    repo = repo or REPO
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
    with contextlib.suppress(Exception):
        free, total = module.mem_get_info(index)
        props.update(total_memory_bytes=int(total), free_memory_bytes=int(free))
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
    report["transformers"] = installed_version("transformers")
    smi = npu_smi_info() if device.type == "npu" else None
    if smi:
        report["npu_smi_info"] = smi
    return report
