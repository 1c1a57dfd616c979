"""Chapters 01 and 02's own studies (layer: chapter studies; taught in 01_operator_verification and
02_ffn_fusion): each implementation of RMSNorm and residual add + RMSNorm side by side and checked
before it is timed, the guide's RMSNorm figure against the bandwidth, the guide's FFN line, the FFN
variants, their precision and the fused modules on a loaded model. The kernels are in ``ops``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import backend, bench, claims, decide, ops, plots, progress, prose
from .params import check_choice
from .prose import N_, message

# The words of this chapter's tables (column names, categories in cells): ``prose.show`` translates
# them on the page through the runtime catalog; the recorded tables keep the English.
TABLE_WORDS = (
    N_("implementation"), N_("runs as"), N_("layout"), N_("contiguous"), N_("non-contiguous"),
    N_("% of bandwidth"), N_("matches"), N_("max_abs_diff"), N_("has_bias"), N_("ops_per_call"), N_("ops"),
    N_("slowdown"), N_("non-contiguous is"), N_("config defaults"), N_("speedup_vs_unfused"),
    N_("max_abs_diff_vs_unfused"), N_("comparison"), N_("output max |y|"), N_("guide threshold"),
    N_("max_abs_diff_vs_eager"), N_("speedup_vs_eager"), N_("speedup_vs_eager_low"),
    N_("speedup_vs_eager_high"), N_("elementwise_ms"), N_("unfused_ffn_ms"), N_("elementwise_share_pct"),
    N_("best_variant"), N_("best_clear"), N_("best_speedup"), N_("best_speedup_low"),
    N_("best_speedup_high"), N_("saved_pct_merged"), N_("saved_pct_fused_act"), N_("saved_pct_graph"),
    N_("weight MB"), N_("% of read bandwidth"), N_("matmul_calls"), N_("generated_kernels"),
    N_("unfused_ms"), N_("share_pct"), N_("low_pct"), N_("high_pct"), N_("unfused float16 vs float64"),
)


# --- chapters 01 and 02: each variant checked against its reference, then timed ---------------------

def check_and_time(variants: list, device, *, expected=None, measure: Optional[Callable] = None,
                   nbytes: Optional[float] = None, bandwidth_gbps: Optional[float] = None,
                   tolerance=None, baseline: Optional[str] = None, count: Optional[Callable] = None):
    """Run each variant once (its first call, compilation included, timed apart), check its output
    against ``expected`` (best a float32 reference from the same inputs; ``tolerance``: an
    operation kind or a number of ULPs for ``tolerance_for``, default ``"norm"``, or
    ``assert_close`` keywords, or a function of ``expected`` returning them), then time it with ``measure(fn, name)`` (default:
    ``measure`` with its defaults) and, with ``count(fn)`` (for example ``profiling.count_ops``),
    count its operators.

    ``variants`` is a list of ``(labels, fn)`` or ``(labels, fn, nbytes)`` with ``labels`` a dict
    such as ``{"impl": "torch", "layout": "contiguous"}`` (a variant's own ``nbytes`` overrides the
    common one). With ``baseline``, the first variant is the baseline and its labels' last value
    must be ``baseline``, which names the columns ``max_abs_diff_vs_<baseline>`` (largest difference
    from the baseline's output) and ``speedup_vs_<baseline>`` with its spread ``..._low`` / ``..._high``.
    Returns the rows (``timing_row``) and the timings keyed by the labels' values (the value itself
    for one label).
    """
    measure = measure or (lambda fn, name: bench.measure(fn, device, name=name))
    rows, timings, base = [], {}, None
    for labels, fn, *own_bytes in progress.steps(variants, lambda v: " ".join(map(str, v[0].values()))):
        key = tuple(labels.values())
        if baseline is not None and not rows and key[-1] != baseline:
            raise ValueError(f"baseline={baseline!r}: the first variant must be the baseline, got {key}")
        out, first = bench.timed_calls(fn, device)
        got = out if isinstance(out, (tuple, list)) else (out,)
        if expected is not None:
            for g, w in zip(got, expected if isinstance(expected, (tuple, list)) else (expected,)):
                # a wrong kernel fails the chapter, not just its figure
                if callable(tolerance) or isinstance(tolerance, dict):
                    tol = tolerance(w) if callable(tolerance) else tolerance
                    torch.testing.assert_close(g.float(), w.float(), **tol)
                else:
                    bench.assert_within(g, w, tolerance or "norm", what=" / ".join(map(str, key)))
        timing = timings[key if len(key) > 1 else key[0]] = measure(fn, " / ".join(map(str, key)))
        row = timing_row(timing, own_bytes[0] if own_bytes else nbytes, bandwidth_gbps, **labels)
        row["first_call_s"] = first
        if count is not None:
            counts = count(fn)
            row.update(ops_per_call=counts["ops"], ops=op_list(counts))
        if baseline is not None:
            base = base if rows else got
            row[f"max_abs_diff_vs_{baseline}"] = max((g.float() - b.float()).abs().max().item()
                                                     for g, b in zip(got, base))
            sp = bench.speedup(timings[next(iter(timings))], timing)
            row.update({f"speedup_vs_{baseline}": sp.ratio, f"speedup_vs_{baseline}_low": sp.low,
                        f"speedup_vs_{baseline}_high": sp.high})
        rows.append(row)
    return rows, timings


def ulp(value: float, dtype: torch.dtype = torch.float16) -> float:
    """The spacing of ``dtype`` numbers at ``value``: one unit in the last place (ulp).

    A precision threshold means little without it: in fp16 a difference of 9.77e-4 at an output
    of magnitude 1-2 is a single rounding step of the last bit.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype!r} is not valid; use a floating torch dtype such as torch.float16")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise ValueError(f"value={value!r} is not valid; give a finite number")
    x = torch.tensor(abs(float(value)), dtype=dtype)
    up = torch.nextafter(x, torch.tensor(float("inf"), dtype=dtype))
    return float(up.double() - x.double())


# --- chapter 02: the FFN variants ------------------------------------------------------------------

FFN_VARIANTS = ("unfused", "merged", "fused_act", "graph")


def _check_ffn(x, w_gate, w_up, w_down) -> None:
    """nn.Linear layout: w_gate / w_up are (I, H), w_down is (H, I)."""
    for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            raise ValueError(f"{name} must be a 2-D weight in nn.Linear layout (out, in)")
    hidden = x.shape[-1]
    if w_gate.shape != w_up.shape or w_gate.shape[1] != hidden:
        raise ValueError(f"w_gate and w_up must both be (intermediate, hidden) = (I, {hidden}) in nn.Linear "
                         f"(out, in) layout; got w_gate {tuple(w_gate.shape)}, w_up {tuple(w_up.shape)}")
    if w_down.shape != (hidden, w_gate.shape[0]):
        raise ValueError(f"w_down must be (hidden, intermediate) = ({hidden}, {w_gate.shape[0]}); "
                         f"got {tuple(w_down.shape)}")


def make_ffn(w_gate, w_up, w_down, variant: str, device=None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable ``f(x)`` for one FFN variant (see ``FFN_VARIANTS``), for timing and profiling.

    * ``unfused``  - gate, up, silu, mul, down as separate ops (the reference);
    * ``merged``   - gate and up weights concatenated: one matmul instead of two;
    * ``fused_act``- merged, plus one fused SwiGLU kernel (``npu_swiglu`` on NPU, a compiled
      silu*mul elsewhere);
    * ``graph``    - the unfused FFN under ``graph_mode`` (torchair / inductor).

    The first call checks the weights' nn.Linear (out, in) layout against x, so the guide's (in, out)
    weights fail with an error naming the weight instead of a matmul shape error.
    """
    check_choice("variant", variant, FFN_VARIANTS)
    device = device if device is not None else w_gate.device
    ffn = _ffn_variant(w_gate, w_up, w_down, variant, device)
    checked = []

    def checked_ffn(x):
        # The layout check needs x's hidden size; once is enough, since the weights are fixed, and it
        # stays out of the timed calls that follow.
        if not checked:
            _check_ffn(x, w_gate, w_up, w_down)
            checked.append(True)
        return ffn(x)
    return checked_ffn


def _ffn_variant(w_gate, w_up, w_down, variant: str, device) -> Callable[[torch.Tensor], torch.Tensor]:
    if variant == "unfused":
        return lambda x: ffn_reference(x, w_gate, w_up, w_down)
    if variant == "graph":
        compiled = ops.graph_mode(ffn_reference, device, dynamic=False)[0]
        return lambda x: compiled(x, w_gate, w_up, w_down)
    w_gate_up = ops.merge_gate_up(w_gate, w_up)
    if variant == "merged":
        return lambda x: ffn_merged(x, w_gate_up, w_down, impl="reference")
    # npu_swiglu where this torch_npu has it (not before torch_npu 2.1.0.post4), else the reference
    act = ops.resolve_impl("auto", device, "swiglu") if backend.device_kind(device) == "npu" else "compiled"
    return lambda x: ffn_merged(x, w_gate_up, w_down, impl=act)


# --- chapter 01: bytes moved, for GB/s figures --------------------------------------------------------------

def rms_norm_bytes(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Minimum traffic of one RMSNorm: read x and weight once, write y once."""
    return 2 * x.numel() * x.element_size() + weight.numel() * weight.element_size()


def add_rms_norm_bytes(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Minimum traffic of fused add + RMSNorm: read x and residual, write y and the new residual."""
    return 4 * x.numel() * x.element_size() + weight.numel() * weight.element_size()


def llama_rmsnorm_matches_formula(hidden: int = 64, eps: float = 1e-5) -> dict:
    """Does transformers' ``LlamaRMSNorm`` compute the guide's ``x / sqrt(mean(x^2) + eps) * w``, with
    no bias? Checked on a small float32 tensor with a random weight (chapter 01 records it)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(hidden, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(hidden, generator=g) + 0.5)
        x = torch.randn(3, hidden, generator=g)
        formula = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + eps) * norm.weight
        got = norm(x)
        diff = (got - formula).abs().max().item()
        close = torch.allclose(got, formula, **bench.tolerance_for(torch.float32, "norm", formula))
    has_bias = any("bias" in name for name, _ in norm.named_parameters())
    return {"matches": close and not has_bias, "max_abs_diff": diff, "has_bias": has_bias}


# --- chapter 01: the implementations side by side, each checked before it is timed --------------

def rms_norm_inputs(shape, device, dtype, seed: int = 0):
    """``(x, weight, x_non_contiguous)`` for an RMSNorm check: random x, a random weight near 1 (a
    kernel that ignores the weight fails the check; the guide's ``w = ones`` would hide that), and
    the same values with the hidden dim strided, which is what a transpose upstream leaves."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(device, dtype)
    return x, weight, x.mT.contiguous().mT


def rms_norm_variants(x, x_non_contiguous, weight, impls, eps: float = 1e-5) -> list:
    """``check_and_time`` variants: every ``impl`` on the contiguous and the strided input."""
    return [({"impl": impl, "layout": layout},
             (lambda inp=inp, impl=impl: ops.rms_norm(inp, weight, eps, impl=impl)))
            for impl in impls for layout, inp in (("contiguous", x), ("non-contiguous", x_non_contiguous))]


def add_rms_norm_variants(x, weight, impls, eps: float = 1e-5, seed: int = 1):
    """``(variants, expected)`` for residual add + RMSNorm on ``x``'s shape with a random residual;
    ``expected`` is the float32 reference (``float32_reference``)."""
    residual = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x.device, x.dtype)
    variants = [({"impl": impl}, (lambda impl=impl: ops.add_rms_norm(x, residual, weight, eps, impl=impl)))
                for impl in impls]
    return variants, ops.float32_reference(ops.add_rms_norm_reference, x, residual, weight, eps)


def edge_op_variants(table: torch.Tensor, lm_head: torch.Tensor, prompt_tokens: int, seed: int = 2) -> list:
    """The "odds and ends" of a step: one embedding row, a prompt's rows, and the logits GEMV, each
    with the bytes it must move (a lookup reads a row and writes it; the GEMV reads all of lm_head)."""
    g = torch.Generator().manual_seed(seed)
    vocab, hidden = table.shape
    one = torch.randint(0, vocab, (1, 1), generator=g).to(table.device)
    many = torch.randint(0, vocab, (1, prompt_tokens), generator=g).to(table.device)
    h = torch.randn(1, 1, hidden, generator=g).to(table.device, table.dtype)
    size = table.element_size()
    table_shape = f"{vocab}x{hidden}"
    return [({"op": message("embedding, 1 token"), "shape": message("ids 1x1, table {table}", table=table_shape)},
             lambda: F.embedding(one, table), 2 * hidden * size),
            ({"op": message("embedding, {tokens} tokens", tokens=prompt_tokens),
              "shape": message("ids 1x{tokens}, table {table}", tokens=prompt_tokens, table=table_shape)},
             lambda: F.embedding(many, table), 2 * prompt_tokens * hidden * size),
            ({"op": message("lm_head, 1 token"), "shape": f"1x{hidden} @ {vocab}x{hidden}^T"},
             lambda: F.linear(h, lm_head), vocab * hidden * size + vocab * size)]


def rmsnorm_guide_bounds(specs, claim_id: str = "C06") -> dict:
    """What the guide's RMSNorm time implies (its claim, not a measurement): the bandwidth its
    0.05-0.1 ms needs on its fp16 (1, 4096, 4096) tensor, and the fastest a 910B1 could be at the
    bandwidth in ``data/device_specs.csv`` (an unofficial figure there)."""
    table = claims.load_claims()
    low_ms, high_ms = claims.claimed_range(table[table["id"] == claim_id].iloc[0]["claimed_value"])
    nbytes = 2 * 4096 * 4096 * 2 + 4096 * 2  # fp16: read x, write y, read gamma
    npu = specs[specs["variant"].str.contains("910B1")].iloc[0]
    return {"guide_dtype": "float16", "guide_low_ms": low_ms, "guide_high_ms": high_ms,
            "guide_implied_gbps_low": nbytes / (high_ms / 1e3) / 1e9,
            "guide_implied_gbps_high": nbytes / (low_ms / 1e3) / 1e9,
            "npu_bandwidth_gbps": float(npu["bandwidth_gbps"]), "npu_spec_status": str(npu["status"]),
            "npu_floor_ms": nbytes / (float(npu["bandwidth_gbps"]) * 1e9) * 1e3}


# --- chapter 02: the guide's FFN line, the FFN variants side by side, the guide's precision claims --

GUIDE_FFN_SHAPE = "x 1x4096x4096, w 4096x14336"
GUIDE_RMS_SHAPE = (1, 4096, 4096)  # the guide's RMSNorm and add + RMSNorm input (steps 2 and 4)


def shape_label(shape, guide=GUIDE_RMS_SHAPE) -> str:
    """A case label that says whose shape was timed: ``guide's shape 1x4096x4096`` only when
    ``shape`` is the guide's, else ``run's shape 1x256x2048 (the guide's is 1x4096x4096)``, so a
    profile's smaller tensor is never labelled as the guide's."""
    dims = [int(d) for d in shape]
    size, theirs = "x".join(map(str, dims)), "x".join(map(str, guide))
    if dims == list(guide):
        return message("guide's shape {size}", size=size)
    return message("run's shape {size} (the guide's is {theirs})", size=size, theirs=theirs)


def guide_ffn_line() -> dict:
    """The guide's step-3 line ``F.linear(x, w_gate)`` with x (1, 4096, 4096) and its w_gate
    (4096, 14336), run on ``meta`` tensors (shapes are checked as on a device; nothing is allocated),
    beside the corrected (out, in) weight of Llama-2-7B's width, and the widths transformers' config
    defaults give (``LlamaConfig()`` is Llama-2-7B, ``MistralConfig()`` Mistral-7B)."""
    from transformers import LlamaConfig, MistralConfig

    llama, mistral = LlamaConfig(), MistralConfig()
    x = torch.empty(1, 4096, 4096, device="meta", dtype=torch.float16)
    try:
        F.linear(x, torch.empty(4096, 14336, device="meta", dtype=torch.float16))  # the guide's (in, out)
        error = None
    except RuntimeError as exc:
        error = f"{type(exc).__name__}: {exc}"
    fixed = torch.empty(llama.intermediate_size, llama.hidden_size, device="meta", dtype=torch.float16)
    sizes = [{"config defaults": "LlamaConfig() - Llama-2-7B", "hidden": llama.hidden_size,
              "intermediate": llama.intermediate_size},
             {"config defaults": "MistralConfig() - Mistral-7B", "hidden": mistral.hidden_size,
              "intermediate": mistral.intermediate_size}]
    return {"error": error, "runs": error is None, "llama2_7b_intermediate": llama.intermediate_size,
            "corrected_weight": "x".join(map(str, fixed.shape)),
            "corrected_output": "x".join(map(str, F.linear(x, fixed).shape)), "sizes": sizes}


def ffn_variant_names(device, compile_ops: bool) -> list:
    """The ``FFN_VARIANTS`` a run times: ``unfused`` and ``merged`` everywhere; ``fused_act`` where
    its fused SwiGLU needs no compiler (NPU: ``npu_swiglu``) or compiling is allowed; ``graph`` only
    with ``compile_ops``."""
    names = ["unfused", "merged"]
    if compile_ops or backend.device_kind(device) == "npu":
        names.append("fused_act")
    if compile_ops:
        names.append("graph")
    return names


def ffn_shapes(hidden: int, intermediate: int, model_info: dict) -> dict:
    """``{name: (H, I)}``: the large FFN of the parameters (Llama-2-7B's 4096 x 11008 by default)
    and the loaded model's own (``models.describe_model``)."""
    own = (model_info["hidden_size"], model_info["intermediate_size"])
    return {f"large H={hidden} I={intermediate}": (hidden, intermediate),
            f"{model_info['name']} H={own[0]} I={own[1]}": own}


def ffn_weights(hidden: int, intermediate: int, device, dtype, generator: torch.Generator) -> list:
    """Random ``[w_gate, w_up, w_down]`` in nn.Linear layout with standard deviation 1/sqrt(fan-in),
    so activations have the scale of a real layer."""
    return [(torch.randn(o, n, generator=generator) / n ** 0.5).to(device, dtype)
            for o, n in ((intermediate, hidden), (intermediate, hidden), (hidden, intermediate))]


def ffn_cases(shapes: dict, tokens, device, dtype, seed: int = 0) -> dict:
    """``{"<shape>, T=<t>": (x, weights)}`` for every FFN shape and token count (decode T=1 and the
    prefill), one set of weights per shape."""
    g = torch.Generator().manual_seed(seed)
    cases = {}
    for name, (hidden, intermediate) in shapes.items():
        weights = ffn_weights(hidden, intermediate, device, dtype, g)
        for t in tokens:
            cases[f"{name}, T={t}"] = (torch.randn(1, t, hidden, generator=g).to(device, dtype), weights)
    return cases


def ffn_variants(x: torch.Tensor, weights, names, device, case: str = "") -> list:
    """``check_time_count`` variants: ``make_ffn`` of every name on input ``x``."""
    fns = {name: make_ffn(*weights, name, device) for name in names}
    return [({"case": case, "variant": name}, (lambda f=f: f(x))) for name, f in fns.items()]


def elementwise_share_rows(cases: dict, timings: dict, names, measure: Callable) -> list:
    """How much fusion can buy in each FFN case: the elementwise part alone (``swiglu_reference`` on
    a (1, T, 2I) tensor, timed with ``measure(fn, name)``) as a share of the unfused FFN, the
    variant with the lowest median and its speedup with spread (``clear``: apart from every other
    variant beyond the p10-p90 noise, ``decide.rank``), and each variant's saving in % of the
    unfused median (negative when its median is above the unfused one)."""
    rows = []
    for case, (x, weights) in cases.items():
        gate_up = torch.randn(1, x.shape[1], 2 * weights[0].shape[0],
                              generator=torch.Generator().manual_seed(4)).to(x.device, x.dtype)
        act = measure(lambda: ops.swiglu_reference(gate_up), f"silu*mul / {case}")
        total = timings[case, "unfused"]
        found = decide.rank([(v, timings[case, v].median, timings[case, v].p10, timings[case, v].p90)
                             for v in names], higher_is_better=False,
                            samples=min(len(timings[case, v].samples) for v in names))
        best = bench.speedup(total, timings[case, found.best])
        rows.append({"case": case, "elementwise_ms": act.median_ms, "unfused_ffn_ms": total.median_ms,
                     "elementwise_share_pct": 100 * act.median / total.median,
                     "best_variant": found.best, "best_clear": found.clear, "best_speedup": best.ratio,
                     "best_speedup_low": best.low, "best_speedup_high": best.high,
                     **{f"saved_pct_{v}": 100 * (1 - timings[case, v].median / total.median)
                        for v in names if v != "unfused"}})
    return rows


def ffn_precision(weights, device, variant: str, seed: int = 3) -> tuple:
    """The guide's two precision claims at decode (T=1) in float16, the guide's dtype: ``(rows,
    facts)``. Against a float64 reference computed on the CPU (NPUs have no fp64 matmul): the unfused
    result, the ``variant`` one, and the ``variant`` one with every weight stored transposed (same
    values, column-major, so not contiguous). ``facts`` has each difference, the output's largest
    value, one float16 ulp there (``ulp``: an absolute threshold means little without it),
    and whether the down weight is still non-contiguous where ``F.linear`` reads it (gate and up are
    copied into one contiguous tensor by ``merge_gate_up``)."""
    g = torch.Generator().manual_seed(seed)
    w64 = [w.to("cpu", torch.float64) for w in weights]
    x64 = torch.randn(1, 1, w64[0].shape[1], generator=g, dtype=torch.float64)
    with torch.inference_mode():
        exact = ffn_reference(x64, *w64)
        w16 = [w.to(device, torch.float16) for w in w64]
        w16_nc = [w.t().contiguous().t() for w in w16]  # same values, column-major storage
        x16 = x64.to(device, torch.float16)
        unfused = make_ffn(*w16, "unfused", device)(x16).cpu()
        fused = make_ffn(*w16, variant, device)(x16).cpu()
        fused_nc = make_ffn(*w16_nc, variant, device)(x16).cpu()

    def diff(a, b):
        return (a.double() - b.double()).abs().max().item()

    out_max = exact.abs().max().item()
    facts = {"fused_vs_unfused": diff(fused, unfused), "unfused_vs_float64": diff(unfused, exact),
             "fused_vs_float64": diff(fused, exact), "noncontig_vs_contig": diff(fused_nc, fused),
             "output_max_abs": out_max, "ulp_at_output": ulp(out_max, torch.float16),
             "weight_contiguous_at_op": w16_nc[2].is_contiguous()}
    facts["fused_vs_unfused_ulps"] = facts["fused_vs_unfused"] / facts["ulp_at_output"]
    rows = [(message("{variant} vs unfused (the guide's comparison)", variant=variant), facts["fused_vs_unfused"],
             "< 1e-3"),
            ("unfused float16 vs float64", facts["unfused_vs_float64"], ""),
            (f"{variant} float16 vs float64", facts["fused_vs_float64"], ""),
            (message("{variant}, non-contiguous weights vs contiguous", variant=variant), facts["noncontig_vs_contig"],
             message("> {threshold} if misaligned", threshold="1e-2"))]
    return [{"comparison": c, "max_abs_diff": d, "output max |y|": out_max, "guide threshold": t}
            for c, d, t in rows], facts


def fused_model_check(model: nn.Module, tokens: int, measure: Callable, seed: int = 5) -> dict:
    """``apply_fused_modules`` on a loaded Llama, checked and timed: one prefill forward of
    ``tokens`` random ids before and after (``measure(fn, name)``), the logits compared within a few
    ulps of the dtype (``bench.tolerance_for(dtype, "model")``: both forwards in the working dtype,
    since the question is what fusing changed, and a float32 copy of a 7B model would not fit), the
    next-token argmax agreement, and what was replaced. The model keeps its fused modules."""
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed))
    ids = ids.to(next(model.parameters()).device)
    with torch.inference_mode():
        def forward():
            return model(input_ids=ids, use_cache=False)

        before = forward().logits
        t_before = measure(forward, "model forward, original modules")
        counts = ops.apply_fused_modules(model, impl="auto")
        after = forward().logits
        t_after = measure(forward, "model forward, fused modules")
    bench.assert_within(after, before, "model", what="logits with fused modules")
    return {"counts": counts, "before": t_before, "after": t_after,
            "max_abs_diff": (after.float() - before.float()).abs().max().item(),
            "logits_max_abs": before.abs().max().item(),
            "top1_agreement": (after.argmax(-1) == before.argmax(-1)).float().mean().item()}


def residual_norm_cases(prefill_tokens: int, hidden: int, model_hidden: int, device, dtype,
                        seed: int = 6) -> dict:
    """``{case: (x, residual, weight)}`` for residual add + RMSNorm: a prefill of the large FFN's
    width and one decode token of the loaded model's width."""
    g = torch.Generator().manual_seed(seed)
    cases = {}
    for label, (t, h) in {"prefill, large": (prefill_tokens, hidden),
                          "decode, model": (1, model_hidden)}.items():
        x, residual = (torch.randn(1, t, h, generator=g).to(device, dtype) for _ in range(2))
        weight = (1 + 0.1 * torch.randn(h, generator=g)).to(device, dtype)
        cases[f"{label} 1x{t}x{h}"] = (x, residual, weight)
    return cases


def residual_norm_variants(inputs, compiled: Callable, backend_name: str, case: str,
                           eps: float = 1e-5) -> list:
    """``check_time_count`` variants: ``add_rms_norm_reference`` eager, then the same function
    compiled (``ops.graph_mode(ops.add_rms_norm_reference, ...)``), labelled ``graph (<backend>)``."""
    return [({"case": case, "mode": "eager"}, lambda: ops.add_rms_norm_reference(*inputs, eps)),
            ({"case": case, "mode": f"graph ({backend_name})"}, lambda: compiled(*inputs, eps))]


def check_time_count(variants: list, device, *, expected, baseline: str, measure: Callable,
                     count: Optional[Callable] = None, tolerance=None):
    """``check_and_time`` against a baseline, for a block whose variants round differently
    (chapter 02's FFN: ``tolerance="ffn"``, ``count=profiling.count_ops``)."""
    return check_and_time(variants, device, expected=expected, measure=measure, tolerance=tolerance,
                          baseline=baseline, count=count)


# --- chapters 01 and 02: a timing as a table row --------------------------------------------------

def timing_row(t: bench.Timing, nbytes: Optional[float] = None, bandwidth_gbps: Optional[float] = None,
               **labels) -> dict:
    """One table row of a timing: its labels, median / p10 / p90 (ms), noise flag, first call, and
    the achieved GB/s (and share of ``bandwidth_gbps``) when the bytes it moves are given."""
    row = {**labels, "median_ms": t.median_ms, "p10_ms": t.p10 * 1e3, "p90_ms": t.p90 * 1e3,
           "noisy": t.noisy, "first_call_s": t.first_call_s}
    if nbytes:
        row["GB/s"] = nbytes / t.median / 1e9
        if bandwidth_gbps:
            row["% of bandwidth"] = 100 * row["GB/s"] / bandwidth_gbps
    return row


# --- chapter 02: the FFN's plain and merged forms -------------------------------------------------

def ffn_reference(x, w_gate, w_up, w_down) -> torch.Tensor:
    """Llama's FFN as three separate matmuls: down(silu(gate(x)) * up(x)); weights are (out, in)."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def ffn_merged(x, w_gate_up, w_down, impl: str = "reference") -> torch.Tensor:
    """One gate_up matmul, SwiGLU (``impl`` as in ``ops.swiglu``), then down."""
    return F.linear(ops.swiglu(F.linear(x, w_gate_up), impl=impl), w_down)


# --- chapters 01 and 02: the operators a call launched, as a list ---------------------------------

def op_list(counts: dict) -> str:
    """``aten::add x2, aten::mul x1`` - a short text for tables."""
    return ", ".join(f"{name} x{n}" for name, n in counts["by_op"].items())


# --- chapters 01 and 02: their charts -------------------------------------------------------------

def plot_timings(table, group: str, series: str, title: str, counts: str = "", figsize=(8, 3.2), lang: str = "en"):
    """Median ms per ``group`` (an implementation) and ``series`` (a layout, a case) on a log axis,
    since implementations can differ by orders of magnitude; ``counts`` labels each bar (ops/call)."""
    import matplotlib.pyplot as plt

    lang = plots.chart_language(lang)
    table = prose.show(table, lang).set_axis(table.columns, axis=1)  # its words in the chart's language
    pivot = table.pivot_table(index=group, columns=series, values="median_ms", sort=False)
    fig, ax = plt.subplots(figsize=figsize)
    pivot.plot.bar(ax=ax, rot=0)
    if counts:
        labels = table.pivot_table(index=group, columns=series, values=counts, sort=False)
        for bars, col in zip(ax.containers, pivot.columns):
            ax.bar_label(bars, [prose.tell(lang, "{n} ops", n=int(n)) if n == n else "" for n in labels[col]],
                         fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(prose.tell(lang, "median ms, log scale (lower is better)"))
    ax.set_xlabel(prose.translate_cell(group, lang))
    ax.legend(title=prose.translate_cell(series, lang), fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))  # never over a bar
    ax.set_title(prose.tr(title, lang), fontsize=10)
    fig.tight_layout()
    return fig


def plot_edge_ops(table, model_name: str, step_ms: float, figsize=(8, 3.2), lang: str = "en"):
    """Embedding and lm_head timings per model, beside the loaded model's measured decode step."""
    import matplotlib.pyplot as plt

    lang = plots.chart_language(lang)
    labels = [f"{m}\n{prose.translate_cell(o, lang)}" for m, o in zip(table["model"], table["op"])]
    own = [i for i, m in enumerate(table["model"]) if m == model_name]
    fig, ax = plt.subplots(figsize=figsize)
    ax.barh(range(len(labels)), table["median_ms"],
            color=["#69c" if i in own else "#9b9" for i in range(len(labels))])
    ax.set_yticks(range(len(labels)), labels)
    # The decode step was measured for the loaded model only, so its line spans that model's rows.
    ax.plot([step_ms] * 2, [min(own) - 0.45, max(own) + 0.45], color="#c63", ls="--",
            label=prose.tell(lang, "{model} decode step {ms:.1f} ms (measured)", model=model_name, ms=step_ms))
    ax.set_xscale("log")
    ax.set_xlabel(prose.tell(lang, "median ms (log scale)"))
    ax.legend(fontsize=8)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def plot_ffn_variants(table, title: str, figsize=(12, 3.2), lang: str = "en"):
    """Chapter 02: one panel per FFN case (shape and T), a bar per variant at its median ms on a log
    axis (variants can differ by orders of magnitude), each labelled with its operators per call."""
    import matplotlib.pyplot as plt

    lang = plots.chart_language(lang)
    cases = list(dict.fromkeys(table["case"]))
    fig, axes = plt.subplots(1, len(cases), figsize=figsize, squeeze=False)
    for ax, case in zip(axes[0], cases):
        sub = table[table["case"] == case]
        ax.bar(list(sub["variant"]), list(sub["median_ms"]), color="#69c")
        for k, (ms, n) in enumerate(zip(sub["median_ms"], sub["ops_per_call"])):
            ax.annotate(prose.tell(lang, "{n} ops", n=int(n)), (k, ms), ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        # headroom above the tallest bar keeps the op-count labels inside the panel
        ax.set_ylim(0.5 * sub["median_ms"].min(), 3 * sub["median_ms"].max())
        ax.set_title(case.replace(", T=", "\nT="), fontsize=8)
        ax.tick_params(labelsize=7, axis="x", rotation=30)
    axes[0][0].set_ylabel(prose.tell(lang, "median ms, log scale (lower is better)"))
    fig.suptitle(prose.tr(title, lang), fontsize=9)
    fig.tight_layout()
    return fig


# --- chapter 01's worked answers (solutions/01): the facts each answer's paragraph is said from ----
# The paragraphs are blocks of templates/01_operator_verification.answers.md.j2 (``prose.answer``).

def dtype_time_facts(timings: dict, small, large) -> dict:
    """Exercise 1: per implementation, the ``large`` dtype's RMSNorm time over the ``small`` one's
    (``timings[impl, dtype]``: ``bench.Timing``) with its spread and samples, and the same spread over
    the ratio of their element sizes (1 inside it: the time follows the bytes)."""
    nbytes = torch.tensor([], dtype=large).element_size() / torch.tensor([], dtype=small).element_size()
    rows = []
    for impl in dict.fromkeys(impl for impl, _ in timings):
        s = bench.speedup(timings[impl, large], timings[impl, small])  # t(large) / t(small)
        rows.append({"impl": impl, "ratio": s.ratio, "low": s.low, "high": s.high, "n_samples": s.samples,
                     "over_bytes": {"low": s.low / nbytes, "high": s.high / nbytes, "n_samples": s.samples}})
    return {"small": backend.dtype_name(small), "large": backend.dtype_name(large), "bytes_ratio": nbytes,
            "impls": rows}


def layout_facts(rows, guide_ratio: float = 3.0) -> dict:
    """Exercise 2: the implementation whose non-contiguous / contiguous ratio is the largest (rows with
    impl, slowdown, low, high, n_samples) and the implementations whose whole spread is at or above
    the guide's ``guide_ratio`` (``decide.met``, on each row's samples)."""
    rows = [dict(r) for r in rows]
    worst = max(rows, key=lambda r: r["slowdown"])
    reaching = [r["impl"] for r in rows
                if decide.met(r["low"], r["high"], guide_ratio, samples=r.get("n_samples")) == "met"]
    return {"worst": worst, "guide_ratio": guide_ratio, "reaching": reaching}


def cast_facts(counts: dict, half: str = "float16", full: str = "float32") -> dict:
    """Exercise 3: the ops the reference add + RMSNorm launches in a 16-bit dtype (``half``) and in
    ``full`` (``profiling.count_ops`` results by dtype name), and how many more the first launches."""
    return {"half": half, "full": full, "extra": counts[half]["ops"] - counts[full]["ops"],
            "dtypes": [{"dtype": name, "ops": c["ops"], "listed": op_list(c)} for name, c in counts.items()]}


# --- chapter 02's worked answers (solutions/02): the facts each answer's paragraph is said from ----
# The paragraphs are blocks of templates/02_ffn_fusion.answers.md.j2 (``prose.answer``).

def width_facts(wide: bench.Timing, narrow: bench.Timing, *, wide_bytes: float, narrow_bytes: float,
                wide_width: int, narrow_width: int, bandwidth_gbps: float, bandwidth_source) -> dict:
    """Exercise 1: the unfused FFN at two intermediate widths. The time ratio (wide over narrow) with
    its spread and samples, the same spread over the ratio of weight bytes (above 1: the time rose by
    more than the bytes), and whether the narrow width's weights were read above the reference
    bandwidth (from the caches)."""
    s = bench.speedup(wide, narrow)  # t(wide) / t(narrow)
    bytes_ratio = wide_bytes / narrow_bytes
    return {"ratio": {"value": s.ratio, "low": s.low, "high": s.high, "n_samples": s.samples},
            "over_bytes": {"low": s.low / bytes_ratio, "high": s.high / bytes_ratio, "n_samples": s.samples},
            "bytes_ratio": bytes_ratio, "wide": wide_width, "narrow": narrow_width, "gbps": bandwidth_gbps,
            "source": bandwidth_source, "cached": narrow_bytes / narrow.median / 1e9 > bandwidth_gbps}


def share_facts(rows) -> dict:
    """Exercise 3: the elementwise share of the unfused FFN in two dtypes (rows with dtype,
    share_pct, low_pct, high_pct, n_samples), each with its spread and samples."""
    first, second = (dict(r) for r in rows)
    return {"dtype": first["dtype"], "other": second["dtype"],
            **{key: {"value": r["share_pct"], "low": r["low_pct"], "high": r["high_pct"], "n_samples": int(r["n_samples"])}
               for key, r in (("first", first), ("second", second))}}
