"""The one timing protocol every chapter uses (layer: measurement; taught in
``00_environment_check.ipynb``).

Protocol: warm-up calls are run first and never timed (a first call that compiles is reported
separately as ``first_call_s``); the device is synchronised before and after each timed sample;
sampling continues until both ``min_iters`` samples and ``min_seconds`` of samples exist; results
are median / p10 / p90 / stdev% with a noise flag. Speedups are ratios of medians of two timings
taken in the same run.

``torch.utils.benchmark.Timer`` would be the library choice, but it only synchronises CUDA; on an
NPU its numbers would measure kernel *launch* time. Hence this small, device-aware loop.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .backend import as_device, dtype_name, synchronize
from .prose import message
from .results import load_results, metric

NOISY_STDEV_PCT = 10.0


@dataclass
class Timing:
    """Per-call latency statistics in seconds; ``samples`` are per-call times."""

    name: str
    samples: list[float]
    inner_calls: int = 1
    first_call_s: Optional[float] = None
    device: str = "cpu"
    meta: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def percentile(self, q: float) -> float:
        """Linear interpolation between the closest ranks (numpy's default)."""
        return float(np.percentile(self.samples, q))

    @property
    def p10(self) -> float:
        return self.percentile(10)

    @property
    def p90(self) -> float:
        return self.percentile(90)

    @property
    def stdev_pct(self) -> float:
        return 100.0 * statistics.stdev(self.samples) / statistics.mean(self.samples) if len(self.samples) > 1 else 0.0

    @property
    def noisy(self) -> bool:
        return self.stdev_pct > NOISY_STDEV_PCT

    @property
    def median_ms(self) -> float:
        return self.median * 1e3

    def summary(self) -> dict:
        """Flat dict for tables and results.json (times in milliseconds)."""
        return {"name": self.name, "median_ms": self.median_ms, "p10_ms": self.p10 * 1e3,
                "p90_ms": self.p90 * 1e3, "stdev_pct": self.stdev_pct, "noisy": self.noisy,
                "iterations": len(self.samples), "inner_calls": self.inner_calls,
                "first_call_s": self.first_call_s, "device": self.device, **self.meta}

    def __repr__(self) -> str:
        flag = " NOISY" if self.noisy else ""
        return (f"Timing({self.name}: median {self.median * 1e3:.3f} ms, p10 {self.p10 * 1e3:.3f}, "
                f"p90 {self.p90 * 1e3:.3f}, stdev {self.stdev_pct:.1f}%, n={len(self.samples)}{flag})")


def timed_calls(fn: Callable[[], object], device, calls: int = 1) -> tuple:
    """``(last output, seconds)`` of ``calls`` calls of ``fn`` fenced by device synchronisation."""
    out = None
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn()
    synchronize(device)
    return out, time.perf_counter() - t0


def measure(fn: Callable[[], object], device="cpu", *, name: str = "", warmup: int = 3,
            min_iters: int = 10, min_seconds: float = 0.5, max_iters: int = 10_000,
            min_sample_seconds: float = 1e-3, **meta) -> Timing:
    """Time ``fn()`` with the workbook protocol and return per-call statistics.

    Calls shorter than ``min_sample_seconds`` are batched ``inner_calls`` at a time inside one
    synchronised sample, so that timer and sync overhead do not dominate microsecond kernels.
    ``meta`` (dtype, shape, code_path, ...) is kept with the timing so figures carry their context.
    """
    if min_iters < 1:
        raise ValueError(f"min_iters={min_iters} must be >= 1")
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    device = as_device(device)
    first = timed_calls(fn, device)[1]
    timed_calls(fn, device, max(warmup - 1, 0))  # the rest of the warm-up, untimed

    inner = 1
    if first < min_sample_seconds:
        # Estimate from a short probe (the first call may have included compilation).
        per_call = max(timed_calls(fn, device, 10)[1] / 10, 1e-9)
        inner = max(1, min(10_000, int(min_sample_seconds / per_call)))

    samples: list[float] = []
    spent = 0.0
    while len(samples) < max_iters and (len(samples) < min_iters or spent < min_seconds):
        elapsed = timed_calls(fn, device, inner)[1]
        spent += elapsed
        samples.append(elapsed / inner)
    meta = {k: (dtype_name(v) if isinstance(v, torch.dtype) else v) for k, v in meta.items()}
    return Timing(name or getattr(fn, "__name__", "fn"), samples, inner, first, str(device), meta)


@dataclass
class Speedup:
    """``baseline / candidate`` as a ratio of medians, with a p10/p90 spread."""

    baseline: str
    candidate: str
    ratio: float
    low: float
    high: float
    # the fewest samples of the two timings: what ``decide`` needs before it reads a direction
    # from the spread (``decide.direction(s.low, s.high, samples=s.samples)``)
    samples: int = 0

    def __repr__(self) -> str:
        return (f"{self.candidate} vs {self.baseline}: {self.ratio:.2f}x (spread {self.low:.2f}-{self.high:.2f}, "
                f"{self.samples} samples a side)")


def speedup(baseline: Timing, candidate: Timing) -> Speedup:
    """How many times faster ``candidate`` is than ``baseline`` (>1 means faster)."""
    return Speedup(baseline.name, candidate.name, baseline.median / candidate.median,
                   baseline.p10 / candidate.p90, baseline.p90 / candidate.p10,
                   min(len(baseline.samples), len(candidate.samples)))


def memory_bandwidth(device="cpu", size_mib: int = 256, dtype=torch.float32,
                     min_iters: int = 10, min_seconds: float = 1.0) -> dict:
    """Sustained read bandwidth (GB/s) of this device, from a full reduction over a large buffer.

    A ``sum`` reads every byte once and writes almost nothing, so bytes/time is the read bandwidth
    that bounds batch-1 decode (the roofline used from chapter 03 on). A copy is measured too
    (read + write counted).
    """
    if size_mib < 1:
        raise ValueError(f"size_mib={size_mib} must be >= 1")
    device = as_device(device)
    numel = size_mib * 1024 * 1024 // torch.tensor([], dtype=dtype).element_size()
    src = torch.rand(numel, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()
    read = measure(lambda: src.sum(), device, name="sum (read)", min_iters=min_iters,
                   min_seconds=min_seconds)
    copy = measure(lambda: dst.copy_(src), device, name="copy (read+write)", min_iters=min_iters,
                   min_seconds=min_seconds)
    del src, dst
    return {"read_gbps": nbytes / read.median / 1e9, "read_gbps_p10": nbytes / read.p90 / 1e9,
            "read_gbps_p90": nbytes / read.p10 / 1e9, "copy_gbps": 2 * nbytes / copy.median / 1e9,
            "buffer_mib": size_mib, "dtype": dtype_name(dtype), "device": str(device),
            "read_timing": read.summary(), "copy_timing": copy.summary(),
            "code_path": message("torch.sum over a contiguous buffer; copy_ into a second buffer")}


def reference_bandwidth(device, run_dir=None, size_mib: int = 128) -> tuple[float, str]:
    """Read bandwidth (GB/s) for rooflines: chapter 00's figure from this run, else measured now.

    The second value says where the number came from, so notebooks can print it beside the figure.
    """
    if run_dir:
        value = metric(load_results(run_dir, "00_environment_check"), "memory_bandwidth_gbps")
        if value:
            return float(value), message("measured in chapter 00 of this run")
    measured = memory_bandwidth(device, size_mib=size_mib, min_seconds=0.3)
    return measured["read_gbps"], message("measured now ({size} MiB torch.sum on {device})", size=size_mib,
                                          device=str(device))


# --- correctness: one tolerance rule for every check ----------------------------------------------

# ULPs allowed per kind of operation (see ``tolerance_for``): how many roundings of the working dtype
# stand between a correct kernel and the float32 reference.
TOLERANCE_ULPS = {
    "elementwise": 2,  # one or two roundings of each output (silu, then the multiply)
    "norm": 4,         # the normalised value and the weight multiply rounded, a float32 reduction inside
    "matmul": 8,       # one matmul: the output rounded, float32 accumulation over the reduction
    "ffn": 16,         # three matmuls with rounded intermediates (gate, up, silu * up, down)
    "model": 16,       # a whole forward against the same model in the same dtype (fused modules)
}
# Kinds whose error comes from a reduction: a sum of rounded terms can cancel to a small output,
# so the absolute part of the bound follows the output's largest value, not each element.
REDUCTION_KINDS = ("matmul", "ffn", "model")


def _eps(dtype: torch.dtype) -> float:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r} is not valid; give a floating torch dtype such as torch.float16")
    return torch.finfo(dtype).eps


def accumulation_rtol(op, reference: Optional[torch.Tensor], reduce_len: Optional[int] = None) -> float:
    """The relative error a float32 reduction over ``n`` terms may add whatever the working dtype:
    ``sqrt(n) * eps(float32)`` (rounding errors of a sum add like a random walk; two kernels that
    sum in another order, such as a compiled RMSNorm against the eager reference, differ by about
    that). ``n`` is ``reduce_len``, else the reference's last dimension (the normalised one for a
    norm; for a matmul the output width, a proxy of the same order as its inner dimension in a
    Llama layer); 0 for elementwise kinds, which reduce nothing. In 16-bit dtypes this is far below
    one ULP of the output; in float32 it is the larger term (chapter 01's compiled RMSNorm over
    2,048 values differed from the reference by 8 float32 ULPs)."""
    if op == "elementwise":
        return 0.0
    n = reduce_len or (reference.shape[-1] if reference is not None and reference.dim() else 1)
    return math.sqrt(max(int(n), 1)) * _eps(torch.float32)


def tolerance_for(dtype, op="norm", reference: Optional[torch.Tensor] = None,
                  reduce_len: Optional[int] = None) -> dict:
    """``torch.testing.assert_close`` keywords for an output computed in ``dtype`` (or a tensor:
    its dtype) compared with a float32 reference computed from the same inputs. The one rule:

    * ``rtol = k * eps(dtype)``: k units in the last place (ULPs) of each element;
    * ``atol = k * eps(dtype) * scale``, where ``scale`` is ``max |reference|`` for the reduction
      kinds (``REDUCTION_KINDS``: terms rounded in the working dtype can cancel, so the error
      follows the largest output) and the dtype's smallest normal number for elementwise and norm
      kinds (their error is relative to each element; the atol only covers values near zero);
    * ``k`` per kind of operation (``op``, a key of ``TOLERANCE_ULPS``: elementwise 2, norm 4,
      matmul 8, ffn 16, model 16) or given directly as an integer number of ULPs;
    * plus, for every kind but elementwise, ``accumulation_rtol``: ``sqrt(n) * eps(float32)`` for a
      float32 reduction over ``n`` terms (``reduce_len``, else the reference's last dimension),
      added to rtol and to the atol's factor; it matters only when the working dtype is float32.

    ``eps`` is 2**-10 for float16, 2**-7 for bfloat16 and 2**-23 for float32, so a bfloat16 norm may
    differ by 3 % and a float16 one by 0.4 %; a wrong kernel (a dropped eps, a weight off by more
    than a few ULPs, swapped or transposed weights) is off by far more. A reduction kind needs
    ``reference``.
    """
    dtype = dtype.dtype if isinstance(dtype, torch.Tensor) else dtype
    eps = _eps(dtype)
    if isinstance(op, bool) or not (isinstance(op, int) and op > 0 or isinstance(op, str) and op in TOLERANCE_ULPS):
        raise ValueError(f"op={op!r} is not valid; choose one of {', '.join(TOLERANCE_ULPS)} or a "
                         "positive integer number of ULPs")
    k = op if isinstance(op, int) else TOLERANCE_ULPS[op]
    if op in REDUCTION_KINDS or isinstance(op, int):
        if reference is None:
            raise ValueError(f"op={op!r} needs reference=: its atol follows the largest |reference|")
        scale = reference.detach().abs().max().float().item() if reference.numel() else 0.0
    else:
        scale = torch.finfo(dtype).tiny
    rtol = k * eps + accumulation_rtol(op, reference, reduce_len)
    return dict(rtol=rtol, atol=rtol * scale)


def working_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The least precise floating dtype among ``tensors``: the one a comparison's tolerance uses."""
    floats = [t.dtype for t in tensors if t.is_floating_point()]
    if not floats:
        raise ValueError("no floating tensor to take a tolerance from")
    return max(floats, key=_eps)


def assert_within(got: torch.Tensor, reference: torch.Tensor, op="norm", what: str = "output") -> None:
    """``assert_close`` of ``got`` against ``reference`` (both compared in float32) with
    ``tolerance_for`` the less precise of their dtypes; the error names ``what`` and the rule."""
    dtype = working_dtype(got, reference)
    tol = tolerance_for(dtype, op, reference)
    k = op if isinstance(op, int) else TOLERANCE_ULPS[op]
    try:
        torch.testing.assert_close(got.float(), reference.float(), **tol)
    except AssertionError as exc:
        raise AssertionError(f"{what} in {dtype_name(dtype)} is not within {k} ULPs ({op}: rtol "
                             f"{tol['rtol']:.3g}, atol {tol['atol']:.3g}) of its float32 reference: "
                             f"{exc}") from None


