"""What ``torch.profiler`` sees: launches per call, the top operators, kernel time by kind
(layer: measurement; taught in 01_operator_verification, 02_ffn_fusion and 03_end_to_end).

``01_operator_verification.ipynb`` and ``02_ffn_fusion.ipynb`` count launches (fusion's first
effect is fewer of them, so the chapters count them instead of guessing); ``03_end_to_end.ipynb``
shows where decode time goes (``kernel_time_by_kind`` splits a decode step into the weight-matmul
kernels that path really ran, attention, and everything else; the chapter's table of the top
operators of a step is ``end_to_end_study.top_ops``, built on ``profile_calls`` here). ``decode_step_split`` is the one profiled
(N - 1)-token difference that splits a decode step by the kind of its events: chapter 03's
``kernel_time_by_kind`` and chapter 06's ``ladder.decode_step_parts`` both use it.

What is counted, per call of ``fn``:

* every ``aten::`` / ``npu::`` op dispatched from Python or from a compiled graph (an op called
  inside another aten op, such as ``aten::mm`` inside ``aten::linear``, belongs to its caller);
* ops that launch nothing are left out: views, allocations, and ``to`` / ``contiguous`` /
  ``reshape`` when they return their input without copying;
* each inductor-generated kernel (``cpp_fused_*`` on CPU, ``triton_*`` on CUDA) as one op;
* on CUDA, the device kernels the profiler saw (``device_kernels``).

On an NPU the same host-side count applies (each dispatched op launches at least one kernel);
``torch_npu.profiler`` gives the kernel-level timeline when one is needed.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Optional

import torch

from .backend import as_device, synchronize

NO_KERNEL_OPS = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
    "aten::t", "aten::transpose", "aten::permute", "aten::as_strided", "aten::expand",
    "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::narrow", "aten::detach", "aten::alias",
    "aten::resolve_conj", "aten::resolve_neg", "aten::result_type", "aten::lift_fresh",
    "aten::numpy_T", "aten::unbind", "aten::_reshape_alias", "aten::view_as",
})
# These either return their input unchanged (no launch) or copy it (a launch).
PASS_THROUGH_OPS = frozenset({"aten::to", "aten::contiguous", "aten::reshape", "aten::type_as",
                              "aten::flatten", "aten::_to_copy"})
_COPY_OPS = ("aten::copy_", "aten::clone")


def _is_generated_kernel(name: str) -> bool:
    return "cpp_fused" in name or name.startswith("triton_")


def _copies(event) -> bool:
    return event.name in _COPY_OPS or any(_copies(child) for child in event.cpu_children)


def _counted(event) -> bool:
    name, parent = event.name, event.cpu_parent
    if not name.startswith(("aten::", "npu::")) or name in NO_KERNEL_OPS:
        return False
    if parent is not None and parent.name.startswith(("aten::", "npu::")):
        return False
    return name not in PASS_THROUGH_OPS or _copies(event)


@contextmanager
def _quiet_native_stderr():
    """The profiler's C++ side prints a start/stop line per profiling run to file descriptor 2, which
    notebooks would show; it carries no information, so it goes to /dev/null for that moment."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profile_calls(fn: Callable[[], object], device, device_kernels: bool = True):
    """torch.profiler over one call of ``fn``, fenced by synchronisation; CUDA kernels are
    recorded too where ``device_kernels`` and the device is CUDA."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device_kernels and device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    with _quiet_native_stderr(), profile(activities=activities) as prof:
        fn()
        synchronize(device)
    return prof


def count_ops(fn: Callable[[], object], device="cpu", *, warmup: int = 1) -> dict:
    """Profile one call of ``fn`` (after ``warmup`` calls, so compilation is excluded).

    Returns ``ops`` (launches per call), ``distinct_ops``, ``by_op`` (name -> count),
    ``device_kernels`` (CUDA only, else None) and ``profiler`` (what produced the count).
    """
    device = as_device(device)
    for _ in range(warmup):
        fn()
    prof = profile_calls(fn, device)
    counter: Counter = Counter()
    kernels = 0
    for event in prof.events():
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            kernels += 1
        elif _is_generated_kernel(event.name):
            counter["inductor kernel"] += 1
        elif _counted(event):
            counter[event.name] += 1
    cuda = device.type == "cuda"
    return {"ops": sum(counter.values()), "distinct_ops": len(counter), "by_op": dict(counter.most_common()),
            "device_kernels": kernels if cuda else None,
            "profiler": "torch.profiler, CPU activity" + (" + CUDA kernels" if cuda else "")}


# Kernels that multiply activations by weights, by the names torch.profiler gives them: ATen's
# (eager, or called from a compiled graph), oneDNN's prepacked linear (inductor freezing), inductor's
# C++ GEMM templates (``graph_N_gemm_...`` with ``cpp.enable_kernel_profile``), the int8 / int4
# weight-only kernels, quantize_dynamic's, and the NPU / CUDA matmul kernels.
# mkl::_mkl_linear: what a frozen inductor graph on a CPU calls for float32 linears with ATen GEMMs
MATMUL_KERNELS = ("aten::mm", "aten::addmm", "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm",
                  "aten::_weight_int4pack_mm_for_cpu", "mkldnn::_linear_pointwise", "mkl::_mkl_linear",
                  "quantized::linear", "npu::npu_weight_quant_batchmatmul", "npu::npu_quant_matmul")
MATMUL_NAME_PARTS = ("_gemm_", "gemm", "gemv", "cutlass", "xmma", "woq")
ATTENTION_NAME_PARTS = ("scaled_dot_product", "flash_attention", "fusion_attention", "attention_score")


def kernel_kind(name: str) -> str:
    """``weight matmul``, ``attention`` or ``other`` for one profiler event name."""
    lowered = name.lower()
    if any(part in lowered for part in ATTENTION_NAME_PARTS):
        return "attention"
    if name.startswith(MATMUL_KERNELS) or any(part in lowered for part in MATMUL_NAME_PARTS):
        return "weight matmul"
    return "other"


def time_by_part(fn: Callable[[], object], device, part_of: Callable[[str], Optional[str]] = kernel_kind, *,
                 device_kernels: bool = True) -> dict:
    """One profiled call of ``fn``: self time (ms) summed per ``part_of(event name)`` (an event whose
    part is None is left out), the names seen in each part with their calls (so a table can say
    which matmul kernels really ran), and the call's wall time (ms). Device kernel times on CUDA
    where ``device_kernels``, else self CPU times of each operator or generated kernel."""
    device = as_device(device)
    wall = {}

    def timed():
        start = time.perf_counter()
        fn()
        synchronize(device)
        wall["ms"] = (time.perf_counter() - start) * 1e3

    on_device = device_kernels and device.type == "cuda"
    totals: Counter = Counter()
    names: dict = {}
    for event in profile_calls(timed, device, device_kernels).key_averages():
        value = (getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0)) if on_device
                 else event.self_cpu_time_total)
        part = part_of(event.key) if value > 0 else None
        if part is None:
            continue
        totals[part] += value / 1e3
        names.setdefault(part, Counter())[event.key] += event.count
    return {"ms": dict(totals), "names": {part: dict(seen) for part, seen in names.items()}, "wall_ms": wall["ms"]}


def decode_step_split(run: Callable[[int], object], new_tokens: int, device="cpu", *,
                      part_of: Callable[[str], Optional[str]] = kernel_kind, repeats: int = 1,
                      device_kernels: bool = True, warm: bool = False,
                      reset: Optional[Callable[[], None]] = None) -> dict:
    """What one decode step spends in each part, from the same split as the decode timing.

    ``run(n)`` generates ``n`` tokens exactly as the timed measurement does (same cache, same
    compiled or eager forward); ``run(1)`` and ``run(new_tokens)`` are each profiled ``repeats``
    times, alternating (``time_by_part`` with ``part_of`` and ``device_kernels``), and the
    difference of the medians divided by ``new_tokens - 1`` is one decode step: ``ms`` per part,
    ``wall_ms`` of the profiled step, and ``names`` per part of the last ``run(new_tokens)``.
    ``warm`` makes each profiled run follow an untimed one of the same length (a new shape compiles
    there); ``reset()`` comes before every run (a static KV cache starts empty). Medians, because
    one profiled run of a busy machine can take longer than a longer one, and the difference of
    single runs can come out negative.
    """
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens!r} is not valid; it must be an integer >= 2")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is not valid; it must be an integer >= 1")

    def profiled(n_tokens: int) -> dict:
        if warm:
            if reset is not None:
                reset()
            run(n_tokens)
        if reset is not None:
            reset()
        return time_by_part(lambda: run(n_tokens), device, part_of, device_kernels=device_kernels)

    ones, fulls = [], []
    for _ in range(repeats):
        ones.append(profiled(1))
        fulls.append(profiled(new_tokens))
    parts = dict.fromkeys(part for r in ones + fulls for part in r["ms"])

    def step(value: Callable[[dict], float]) -> float:
        return (statistics.median(map(value, fulls)) - statistics.median(map(value, ones))) / (new_tokens - 1)

    return {"ms": {part: step(lambda r: r["ms"].get(part, 0.0)) for part in parts},
            "wall_ms": step(lambda r: r["wall_ms"]), "names": fulls[-1]["names"]}


def kernel_time_by_kind(run: Callable[[int], object], new_tokens: int, device="cpu", repeats: int = 3) -> dict:
    """Kernel time per decode token by kind, from the same split as the decode timing.

    ``run(n)`` generates ``n`` tokens exactly as the timed measurement does (same cache, same
    compiled or eager forward); it is profiled once with ``n = 1`` and once with ``new_tokens``, and
    the difference divided by ``new_tokens - 1`` is what one decode step spends in each kind:
    ``weight_matmul_ms``, ``attention_ms``, ``other_kernel_ms``. On a CPU these are self CPU times
    of each operator or generated kernel; on CUDA device kernel times. The NPU needs
    ``torch_npu.profiler``; there the result says so instead of a figure. Each of the two runs is
    profiled ``repeats`` times, alternating, and the median per kind is used: one profiled run of a
    busy machine can take longer than a longer one, and the difference of single runs can come out
    negative.
    """
    if getattr(device, "type", str(device).split(":")[0]) == "npu":
        return {"kernel_profile": "not measured: the NPU's kernel times need torch_npu.profiler"}
    device = as_device(device)
    split = decode_step_split(run, new_tokens, device, repeats=repeats)
    return {"weight_matmul_ms": split["ms"].get("weight matmul", 0.0),
            "attention_ms": split["ms"].get("attention", 0.0), "other_kernel_ms": split["ms"].get("other", 0.0),
            "matmul_kernels": ", ".join(sorted(split["names"].get("weight matmul", {}))),
            "kernel_profile": "torch.profiler self " + ("device" if device.type == "cuda" else "CPU")
                              + f" time, (generate {new_tokens} - generate 1) / {new_tokens - 1}, medians of {repeats}"}


