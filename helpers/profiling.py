"""How many operators (kernels) one call launches: fused vs unfused, from ``torch.profiler``.

Taught in ``01_operator_verification.ipynb`` and ``02_ffn_fusion.ipynb``. Fusion's first effect
is fewer launches, so the chapters count them instead of guessing.

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
import sys
from collections import Counter
from contextlib import contextmanager
from typing import Callable

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
    if event.name in _COPY_OPS:
        return True
    return any(_copies(child) for child in event.cpu_children)


def _counted(event) -> bool:
    name = event.name
    if not name.startswith(("aten::", "npu::")):
        return False
    parent = event.cpu_parent
    if parent is not None and parent.name.startswith(("aten::", "npu::")):
        return False
    if name in NO_KERNEL_OPS:
        return False
    if name in PASS_THROUGH_OPS:
        return _copies(event)
    return True


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


def count_ops(fn: Callable[[], object], device="cpu", *, warmup: int = 1) -> dict:
    """Profile one call of ``fn`` (after ``warmup`` calls, so compilation is excluded).

    Returns ``ops`` (launches per call), ``distinct_ops``, ``by_op`` (name -> count),
    ``device_kernels`` (CUDA only, else None) and ``profiler`` (what produced the count).
    """
    from torch.profiler import ProfilerActivity, profile

    device = as_device(device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with _quiet_native_stderr(), profile(activities=activities) as prof:
        fn()
        synchronize(device)
    counter: Counter = Counter()
    kernels = 0
    for event in prof.events():
        if getattr(event, "device_type", None) == torch.autograd.DeviceType.CUDA:
            kernels += 1
            continue
        if _is_generated_kernel(event.name):
            counter["inductor kernel"] += 1
        elif _counted(event):
            counter[event.name] += 1
    return {
        "ops": sum(counter.values()),
        "distinct_ops": len(counter),
        "by_op": dict(counter.most_common()),
        "device_kernels": kernels if device.type == "cuda" else None,
        "profiler": "torch.profiler, CPU activity" + (" + CUDA kernels" if device.type == "cuda" else ""),
    }


def op_list(counts: dict) -> str:
    """``aten::add x2, aten::mul x1`` - a short text for tables."""
    return ", ".join(f"{name} x{n}" for name, n in counts["by_op"].items())
