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
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import torch

from .versions import installed_version

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
    except (ImportError, RuntimeError, OSError) as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "torch_npu":
            _NPU_IMPORT = NpuImport(error="torch_npu is not installed")
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
        return DeviceChoice(torch.device(found[0]), requested, f"auto: {found[0]} is available")
    if kind == "auto":
        from . import AUTOLOAD_DISABLED_REASON

        npu = import_torch_npu()
        why = "no NPU or CUDA device found"
        if npu.error and npu.error != "torch_npu is not installed":
            why += f" (torch_npu failed to load: {npu.error})"
        if AUTOLOAD_DISABLED_REASON:
            why += f"; {AUTOLOAD_DISABLED_REASON}"
        return DeviceChoice(torch.device("cpu"), requested, f"auto: {why}; running on the CPU")
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


def _file_field(path, name: str, separator: str = ":") -> Optional[str]:
    """The value of a text file's first ``name<separator> value`` line (``/proc`` files,
    CANN's install.info), or None."""
    try:
        with open(path) as fh:
            for line in fh:
                key, found, value = line.partition(separator)
                if found and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def _proc_status_bytes(field: str) -> Optional[int]:
    value = _file_field("/proc/self/status", field)  # "VmHWM:  123456 kB"
    return int(value.split()[0]) * 1024 if value else None


def _cpu_rss_bytes() -> int:
    return _proc_status_bytes("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
        _return_freed_heap()
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
    import gc

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


# --- the working dtype: fp16 on NPU/CUDA, measured on a CPU ---------------------------------

# The embedded SmolLM2-135M's widths (its config.json), used to time GEMVs when no model is named
# and none can be read without a download.
EMBEDDED_WIDTHS = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                   "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
                   "num_hidden_layers": 30}
CPU_CANDIDATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Weights allocated per dtype for the decode probe; a larger model is timed on a subset of its
# layers and the time scaled to all of them (every layer has the same shapes).
PROBE_BYTES = 768 * 2**20
PROBE_PREFILL_TOKENS = 128
RUN_DIR_ENV = "WORKBOOK_RUN_DIR"  # set by the runner for every chapter of a run
DTYPE_CHOICE_KEY = "dtype_choice"  # chapter 00's recorded figure
DTYPE_DECISIONS = ("16bit_faster", "float32_not_slower", "no_16bit_usable")
LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_shapes(config) -> dict:
    """``{kind: (out_features, in_features)}`` of one decoder layer of a Llama-style config, plus
    ``lm_head``, and ``layers``. ``config`` is a transformers config, a model or a dict of widths."""
    if hasattr(config, "config") and not isinstance(config, dict):
        config = config.config
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    try:
        hidden, inter = int(get("hidden_size")), int(get("intermediate_size"))
        heads = int(get("num_attention_heads"))
        kv = int(get("num_key_value_heads") or heads)
        head_dim = int(get("head_dim") or hidden // heads)
        vocab, layers = int(get("vocab_size")), int(get("num_hidden_layers"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"config {config!r} lacks a Llama-style width ({exc}); give hidden_size, "
                         "intermediate_size, num_attention_heads, vocab_size and num_hidden_layers") from exc
    return {"q_proj": (heads * head_dim, hidden), "k_proj": (kv * head_dim, hidden),
            "v_proj": (kv * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter),
            "lm_head": (vocab, hidden), "layers": layers}


def widths_of(model=None):
    """The widths to time for ``model`` without loading its weights: a config / model / dict as it
    is; ``tiny-random``'s config; a local folder's or the embedded cache's ``config.json``; a hub
    id's config only if it is in the local cache (no download just to pick a dtype); else the
    embedded model's widths. Returns ``(widths, source)``."""
    import json

    if model is not None and not isinstance(model, str):
        return model, "the model's config"
    from . import models

    name = (model or "").strip()
    if name == models.TINY_MODEL:
        return models.tiny_llama()[0].config, "tiny-random's config"
    folder = Path(name).expanduser() if name and name != models.EMBEDDED_MODEL else models.embedded_cache_path()
    try:
        return json.loads((folder / "config.json").read_text()), f"{folder.name}/config.json"
    except (OSError, ValueError):
        pass
    if "/" in name and not folder.exists():
        try:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(name, local_files_only=True), f"{name} (cached config)"
        except Exception:  # noqa: BLE001  (not cached: fall back, never download here)
            pass
    return dict(EMBEDDED_WIDTHS), "the embedded SmolLM2-135M's widths"


def dtype_problem(dtype: torch.dtype) -> Optional[str]:
    """None when a small linear + RMSNorm in ``dtype`` runs here and matches float32; else why not."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 256, generator=gen)
    w = torch.randn(128, 256, generator=gen) / 16
    try:
        y = torch.nn.functional.linear(x.to(dtype), w.to(dtype))
        y = y * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(dtype)
    except Exception as exc:  # noqa: BLE001  (an unimplemented kernel is an answer, not a crash)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    from .bench import assert_within

    # the float32 reference from the same rounded inputs; the tolerance is the workbook's one rule
    ref = torch.nn.functional.linear(x.to(dtype).float(), w.to(dtype).float())
    ref = ref * torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + 1e-5)
    try:
        assert_within(y, ref, "ffn", what="a linear + RMSNorm")  # NaN fails too
    except AssertionError as exc:
        return str(exc).splitlines()[0][:300]
    return None


class _GemvProbe:
    """The linears of one batch-1 decode step and of one prefill, at the model's shapes, in one
    dtype; samples from several calls of ``sample`` are pooled, so dtypes timed in turn share the
    machine's drift. ``row`` gives medians and p10/p90 in ms of the whole step.

    Decode: a (1, in) activation through every layer's weights of each kind, then the lm_head
    (timed on the layers that fit ``budget`` and scaled to all layers). Prefill: one layer's
    weights at (``prefill_tokens``, in) times the number of layers, plus the lm_head for the last
    token (generate keeps only its logits). One (layers', out, in) tensor per linear kind, filled
    (not lazily zero-mapped, which would read one shared page) so that a pass reads every byte;
    ``layers'`` fits ``budget`` bytes."""

    def __init__(self, shapes: dict, dtype: torch.dtype, prefill_tokens: int, budget: int):
        size = torch.tensor([], dtype=dtype).element_size()
        per_layer = sum(shapes[k][0] * shapes[k][1] for k in LAYER_LINEARS) * size
        head_o, head_i = shapes["lm_head"]
        head_rows = max(1, min(head_o, budget // 3 // (head_i * size)))
        fit = (budget - head_rows * head_i * size) // max(per_layer, 1)
        self.used = used = max(1, min(shapes["layers"], fit))
        self.weights = {k: torch.full((used, *shapes[k]), 0.01, dtype=dtype) for k in LAYER_LINEARS}
        self.head = torch.full((head_rows, head_i), 0.01, dtype=dtype)
        self.dtype, self.layers, self.prefill_tokens = dtype, shapes["layers"], prefill_tokens
        self.head_scale = head_o / head_rows
        self.x1 = {k: torch.full((1, w.shape[2]), 0.5, dtype=dtype) for k, w in self.weights.items()}
        self.xp = {k: torch.full((prefill_tokens, w.shape[2]), 0.5, dtype=dtype) for k, w in self.weights.items()}
        self.h1 = torch.full((1, head_i), 0.5, dtype=dtype)
        self.samples: dict = {"layers": [], "head": [], "prefill": []}
        self.nbytes = per_layer * self.layers + self.head.numel() * size * self.head_scale

    def sample(self, min_iters: int, min_seconds: float) -> None:
        from .bench import measure

        linear = torch.nn.functional.linear

        def decode_layers():
            for kind, w in self.weights.items():
                for i in range(self.used):
                    linear(self.x1[kind], w[i])

        def prefill_layer():
            for kind, w in self.weights.items():
                linear(self.xp[kind], w[0])

        parts = {"layers": decode_layers, "head": lambda: linear(self.h1, self.head),
                 "prefill": prefill_layer}
        with torch.inference_mode():
            for part, fn in parts.items():
                self.samples[part] += measure(fn, "cpu", name=part, warmup=1, min_iters=min_iters,
                                              min_seconds=min_seconds).samples

    def row(self) -> dict:
        from .bench import Timing

        t = {part: Timing(part, samples) for part, samples in self.samples.items()}

        def step(q: str, phase: str) -> float:
            layer = getattr(t["layers" if phase == "decode" else "prefill"], q)
            scale = self.layers / self.used if phase == "decode" else self.layers
            return 1e3 * (layer * scale + getattr(t["head"], q) * self.head_scale)

        decode_ms = step("median", "decode")
        return {"dtype": dtype_name(self.dtype), "decode_ms": decode_ms,
                "decode_p10_ms": step("p10", "decode"), "decode_p90_ms": step("p90", "decode"),
                "prefill_ms": step("median", "prefill"), "prefill_p10_ms": step("p10", "prefill"),
                "prefill_p90_ms": step("p90", "prefill"), "decode_weight_mb": self.nbytes / 1e6,
                "decode_gbps": self.nbytes / (decode_ms / 1e3) / 1e9, "timed_layers": self.used,
                "layers": self.layers, "prefill_tokens": self.prefill_tokens,
                "samples": len(self.samples["layers"])}


def faster_beyond_spread(candidate: dict, baseline: dict, phase: str = "decode") -> bool:
    """Whether ``candidate``'s whole p10-p90 spread of ``phase`` lies below ``baseline``'s."""
    return candidate[f"{phase}_p90_ms"] < baseline[f"{phase}_p10_ms"]


def pick_cpu_dtype(rows: list[dict]) -> tuple[str, str]:
    """The decision from ``measure_cpu_dtype``'s probe rows (a row with ``problem`` set is a dtype
    that does not run correctly here): ``(dtype name, decision)``.

    float32 unless a usable 16-bit dtype decodes faster beyond both spreads (16 bits cost
    precision, so they have to pay for it); bfloat16 before float16 (float32's range, so no
    overflow) unless float16 is faster beyond the spreads too. ``decision`` is one of
    ``DTYPE_DECISIONS``.
    """
    by = {r["dtype"]: r for r in rows}
    if "float32" not in by or by["float32"].get("problem"):
        raise ValueError("rows must include a usable float32 row (the baseline)")
    usable = [by[d] for d in ("bfloat16", "float16") if d in by and not by[d].get("problem")]
    if not usable:
        return "float32", "no_16bit_usable"
    best = usable[0]
    if len(usable) > 1 and faster_beyond_spread(usable[1], usable[0]):
        best = usable[1]
    if faster_beyond_spread(best, by["float32"]):
        return best["dtype"], "16bit_faster"
    return "float32", "float32_not_slower"


def faster_at_prefill(rows: list[dict], chosen: str) -> Optional[str]:
    """The usable dtype whose prefill beats the chosen one's beyond both spreads (the fastest such),
    or None: a decode-driven choice can lose at prefill, where arithmetic, not bytes, sets the time."""
    by = {r["dtype"]: r for r in rows if "prefill_ms" in r and not r.get("problem")}
    better = [r for d, r in by.items() if d != chosen and faster_beyond_spread(r, by[chosen], "prefill")]
    return min(better, key=lambda r: r["prefill_ms"])["dtype"] if better else None


def loses_at_prefill(rows: list[dict], chosen: str) -> bool:
    """Whether another usable dtype prefills faster than the chosen one beyond both spreads."""
    return faster_at_prefill(rows, chosen) is not None


def _reason(decision: str, rows: list[dict], chosen: str, prefill_slower: bool) -> str:
    by = {r["dtype"]: r for r in rows}
    f32 = by["float32"]
    if decision == "no_16bit_usable":
        why = "; ".join(f"{r['dtype']}: {r['problem']}" for r in rows if r.get("problem"))
        text = f"float32: no 16-bit dtype runs correctly here ({why})"
    elif decision == "16bit_faster":
        c = by[chosen]
        text = (f"{chosen}: the model's decode GEMVs took {c['decode_ms']:.1f} ms per step in {chosen} "
                f"against {f32['decode_ms']:.1f} ms in float32 on this CPU, spreads apart")
    else:
        alt = min((r for r in rows if r["dtype"] != "float32" and not r.get("problem")),
                  key=lambda r: r["decode_ms"])
        text = (f"float32: no 16-bit dtype decodes faster beyond the spread here ({alt['dtype']} "
                f"{alt['decode_ms']:.1f} ms vs float32 {f32['decode_ms']:.1f} ms per step)")
    other = faster_at_prefill(rows, chosen) if prefill_slower else None
    if other:
        c, o = by[chosen], by[other]
        text += (f"; at prefill ({c['prefill_tokens']} tokens) {chosen} is slower: {c['prefill_ms']:.0f} ms "
                 f"against {other}'s {o['prefill_ms']:.0f} ms")
    return text


@dataclass
class DtypeChoice:
    """The working dtype of a run, with the figures that decided it."""

    dtype: torch.dtype
    reason: str
    source: str  # "measured now", "recorded by chapter 00 of this run" or "fixed for <device>"
    rows: list = field(default_factory=list)
    decision: str = ""
    prefill_slower: bool = False
    shapes_source: str = ""
    cpu_capability: str = ""
    threads: int = 0

    def record(self) -> dict:
        """The context chapter 00 stores with the ``dtype_choice`` figure (later chapters read it)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dtype"}


def cpu_capability() -> str:
    """ATen's CPU kernel level here (``AVX512``, ``AVX2``, ...; ``ATEN_CPU_CAPABILITY`` lowers it)."""
    return str(torch.backends.cpu.get_cpu_capability())  # from torch 2.1, the support floor


_MEASURED: dict = {}


def measure_cpu_dtype(model=None, *, prefill_tokens: int = PROBE_PREFILL_TOKENS, budget: int = PROBE_BYTES,
                      rounds: int = 3, min_iters: int = 3, min_seconds: float = 0.05) -> DtypeChoice:
    """Time the model's decode and prefill linears in float32, bfloat16 and float16 (``rounds``
    alternating rounds, samples pooled per dtype); pick one with ``pick_cpu_dtype``."""
    widths, source = widths_of(model)
    shapes = linear_shapes(widths)
    problems = {d: None if d == torch.float32 else dtype_problem(d) for d in CPU_CANDIDATE_DTYPES}
    probes = {d: _GemvProbe(shapes, d, prefill_tokens, budget) for d, p in problems.items() if not p}
    for _ in range(rounds):  # dtypes in turn, samples pooled: a load change hits all of them alike
        for probe in probes.values():
            probe.sample(min_iters, min_seconds)
    rows = [{**probes[d].row(), "problem": None} if d in probes else {"dtype": dtype_name(d), "problem": p}
            for d, p in problems.items()]
    del probes
    chosen, decision = pick_cpu_dtype(rows)
    timed = [r for r in rows if "decode_ms" in r]
    slower = loses_at_prefill(timed, chosen)
    return DtypeChoice(DTYPES[chosen], _reason(decision, rows, chosen, slower), "measured now", rows,
                       decision, slower, source, cpu_capability(), torch.get_num_threads())


def recorded_dtype_choice(run_dir=None) -> Optional[DtypeChoice]:
    """Chapter 00's recorded choice in this run's folder (``run_dir``, else ``$WORKBOOK_RUN_DIR``),
    when it was made at this CPU kernel level and thread count; else None."""
    from .results import load_results

    folder = run_dir or os.environ.get(RUN_DIR_ENV)
    if not folder:
        return None
    metrics = (load_results(folder, "00_environment_check") or {}).get("metrics") or {}
    entry = metrics.get(DTYPE_CHOICE_KEY)
    if not entry or entry.get("value") not in DTYPES:
        return None
    if entry.get("cpu_capability") != cpu_capability() or entry.get("threads") != torch.get_num_threads():
        return None
    return DtypeChoice(DTYPES[entry["value"]], entry.get("reason", ""), "recorded by chapter 00 of this run",
                       entry.get("rows", []), entry.get("decision", ""), bool(entry.get("prefill_slower")),
                       entry.get("shapes_source", ""), entry["cpu_capability"], entry["threads"])


def choose_dtype(device, model=None, *, run_dir=None, reuse: bool = True) -> DtypeChoice:
    """The working dtype with its reason: fp16 on NPU/CUDA; on a CPU, chapter 00's recorded choice
    of this run when ``reuse`` (and it was made on this CPU), else measured now, once per process.

    Chapter 00 passes ``reuse=False``: it is the chapter that measures and records the choice.
    """
    kind = as_device(device).type
    if kind in ("npu", "cuda"):
        return DtypeChoice(torch.float16, f"float16: the guides' inference dtype and native on {kind}",
                           f"fixed for {kind}")
    if reuse:
        recorded = recorded_dtype_choice(run_dir)
        if recorded is not None:
            return recorded
    widths, _ = widths_of(model)
    key = (repr(linear_shapes(widths)), cpu_capability(), torch.get_num_threads())
    if key not in _MEASURED or not reuse:
        _MEASURED[key] = measure_cpu_dtype(model)
    return _MEASURED[key]


DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def parse_dtype(value, device=None, parameter: str = "dtype", *, model=None, run_dir=None) -> torch.dtype:
    """Turn ``"auto"``/``"bf16"``/``torch.float16`` into a dtype the device supports, or raise.

    ``"auto"`` is ``choose_dtype``: fp16 on NPU/CUDA; on a CPU chapter 00's choice of this run, or
    measured at ``model``'s shapes (the embedded model's when none is named).
    """
    if isinstance(value, torch.dtype):
        dtype = value
    else:
        text = str(value).strip().lower()
        if text == "auto":
            return choose_dtype(device or "cpu", model, run_dir=run_dir).dtype
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
            version = _file_field(info, "version", "=")
            if version:
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
    report["transformers"] = installed_version("transformers")
    smi = npu_smi_info() if device.type == "npu" else None
    if smi:
        report["npu_smi_info"] = smi
    return report


def environment_table(report: dict):
    """An ``environment_report`` as a two-column table (``fact``, ``value``), the way chapter 00
    shows it: a reader sees what is installed and what is missing without reading a dict. The
    memory row says whose memory it is (host RAM on a CPU, the device's own on an NPU / GPU)."""
    import pandas as pd

    props = report.get("device_properties") or {}
    on_cpu = str(report.get("device", "cpu")).startswith("cpu")
    memory = props.get("total_memory_bytes")
    rows = [("python", report.get("python")), ("torch", report.get("torch")),
            ("transformers", report.get("transformers")),
            ("torch_npu", report.get("torch_npu") or f"not loaded ({report.get('torch_npu_error')})"),
            ("CANN", report.get("cann") or "not found"), ("CUDA", report.get("cuda") or "not used"),
            ("device", report.get("device")), ("device name", props.get("name")),
            ("device count", props.get("count")),
            ("host RAM (GiB)" if on_cpu else "device memory (GiB)",
             round(memory / 2**30, 1) if memory else None),
            ("CPU", report.get("cpu_model")), ("torch threads", report.get("torch_threads")),
            ("workbook commit", report.get("workbook_commit"))]
    return pd.DataFrame(rows, columns=["fact", "value"]).astype({"value": str})


def dtype_probe_table(rows: list[dict], baseline: str = "float32"):
    """``choose_dtype``'s timed rows with each dtype's step time as a ratio of ``baseline``'s, for
    decode and for prefill, with the conservative spread of ``bench.speedup``: ``(candidate p10 /
    baseline p90, candidate p90 / baseline p10)``. That spread lies wholly below 1 exactly when
    ``faster_beyond_spread`` holds, so ``decide.time_ratio_direction`` on it says what the choice
    saw. A row with a ``problem`` (a dtype that does not run correctly here) keeps it and no times."""
    import pandas as pd

    columns = ["dtype", "decode_ms", "decode_p10_ms", "decode_p90_ms", "decode_gbps", "prefill_ms",
               "prefill_p10_ms", "prefill_p90_ms", "prefill_tokens", "problem"]
    table = pd.DataFrame(rows, columns=columns)  # a row without times (a problem) gets NaN ratios
    base = next((r for r in rows if r["dtype"] == baseline), None)
    if base is not None:
        for phase in ("decode", "prefill"):
            table[f"{phase}_time_ratio"] = table[f"{phase}_ms"] / base[f"{phase}_ms"]
            table[f"{phase}_ratio_low"] = table[f"{phase}_p10_ms"] / base[f"{phase}_p90_ms"]
            table[f"{phase}_ratio_high"] = table[f"{phase}_p90_ms"] / base[f"{phase}_p10_ms"]
    return table
