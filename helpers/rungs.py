"""Chapter 06's rungs as plain data: a name, the one change it adds, one function each
(layer: chapter studies; taught in 06_optimization_ladder).

The ladder is cumulative: a ``Climb`` holds what the
rungs so far have changed (the model, the cache kind, the greedy loop, graph mode), and each rung
function takes the climb, makes its one change and returns the ``ladder.Variant`` to measure, or
raises ``round_robin.RungSkipped`` saying why the rung does not apply here. ``rungs(climb)`` turns
``RUNGS`` into the ``round_robin.Rung`` list that ``round_robin.run_ladder`` measures; what a rung found out on
the way (the fused modules it really ran, the INT8 kernels it timed, the INT4 rung's agreement) stays
on the climb for the chapter to record.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

from . import ladder, models, ops, quant, static_decode
from .backend import as_device, dtype_name
from .prose import Message, N_, message
from .round_robin import Rung, RungSkipped


@dataclass
class Climb:
    """The chapter's switches and what the rungs climbed so far have changed."""

    model_name: str
    tokenizer: Any
    device: Any
    dtype: Any
    prompt: str
    batch_size: int = 8
    graph_mode: bool = False
    npu_graph_mode: str = "max-autotune"
    int8: bool = True
    int4: bool = True
    load: Optional[Callable[[], Any]] = None  # a fresh model in the working dtype (INT4 starts from it)
    model: Any = None
    static: bool = False
    loop: bool = False
    graph: bool = False
    options: list = field(default_factory=list)
    fusion: Optional[dict] = None
    int8_kernels: Optional[dict] = None
    int8_info: Optional[dict] = None
    int4_info: Optional[dict] = None
    int4_kernels: Optional[dict] = None  # the INT4 kernel timed per activation dtype (quant.time_int4_activations)
    int4_quality: Optional[dict] = None

    def __post_init__(self):
        if self.load is None:
            self.load = lambda: models.load_model(self.model_name, dtype=self.dtype, device=self.device)[0]
        if self.model is None:
            self.model = self.load()

    weights: Optional[str] = None  # the label of a quantized rung's weights (None: the working dtype)

    def variant(self, prompts=None) -> ladder.Variant:
        return ladder.Variant(self.model, prompts, static_cache=self.static, greedy_loop=self.loop,
                              weights=self.weights)

    def eager_copy(self):
        """A copy of the current model with its eager forward, for a rung that changes the model:
        the earlier rungs keep theirs, so the ladder can time them all again, interleaved."""
        compiled = static_decode.compiled_forward_of(self.model)
        if compiled is not None:  # copy the eager module, not the compiled graphs
            static_decode.restore_eager(self.model)
        try:
            return copy.deepcopy(self.model)
        finally:
            if compiled is not None:
                self.model.forward = compiled

    def compile(self) -> None:
        # On a CPU only the decode step is compiled (each graph costs tens of seconds there; the
        # prefill runs once per request): the TTFT of a graph rung is its eager prefill's
        static_decode.compile_model(self.model, self.device, npu_mode=self.npu_graph_mode,
                                    compile_prefill=as_device(self.device).type != "cpu")


def native_eager(c: Climb):
    return c.variant()


def runtime_options(c: Climb):
    c.options = ladder.apply_runtime_options(c.device)  # raises RungSkipped off an NPU
    return c.variant()


def static_cache(c: Climb):
    c.static = True
    return c.variant()


def greedy_loop(c: Climb):
    c.loop = True  # the same forward and cache; generate's per-token Python is gone
    return c.variant()


def fused_operators(c: Climb):
    c.model = c.eager_copy()
    c.fusion = ops.apply_fused_modules(c.model)
    return c.variant()


def graph_mode(c: Climb):
    if not c.graph_mode:
        raise RungSkipped(message("graph_mode is off in this profile; each compile costs minutes on a CPU"))
    c.model = c.eager_copy()
    c.compile()
    c.graph = True
    return c.variant()


def int8_weights(c: Climb):
    if not c.int8:
        raise RungSkipped(message("int8 is off in this profile"))
    model = c.eager_copy()  # quantize an eager copy, then compile it once more
    # on a CPU the int8 kernel is timed at this model's shapes, then kept; never slower than dense
    if as_device(c.device).type == "cpu":
        c.int8_kernels = quant.choose_cpu_w8a16_kernel(model)
        if not c.int8_kernels["decision"]["beats_dense"]:
            raise RungSkipped(ladder.int8_skip_reason(c.int8_kernels["rows"]))
    c.int8_info = quant.quantize_model_int8(model, impl="auto")
    c.model = model
    c.weights = message("int8 weights ({impl}), {activations} activations", impl=c.int8_info["impl"],
                        activations=c.int8_info.get("activations") or dtype_name(c.dtype))
    if c.graph:
        c.compile()
    return c.variant()


def int4_weights(c: Climb):
    if not c.int4:
        raise RungSkipped(message("int4 is off in this profile"))
    if problem := quant.int4_problem(c.device):
        raise RungSkipped(problem)
    fresh = c.load()  # from the unquantized weights, not from INT8's, with the earlier changes
    if c.fusion:
        ops.apply_fused_modules(fresh)
    before = copy.deepcopy(fresh)
    # the layers' linears in INT4 groups of 32 (the grid of the GGUF's Q4_1); lm_head in the bits of
    # the GGUF's own output matrix, so both sides read about the same bytes: INT4 where llama.cpp reads
    # it in 4 bits (a Q4_0 file of make_wide_llama.py), else INT8 (the embedded model's Q8_0).
    # The kernel's activations: the 16-bit dtype it was timed fastest with at this model's shapes.
    gguf = ladder.model_gguf(c.model_name)
    head_int4 = gguf is not None and ladder.output_format(gguf).startswith("Q4")
    skip = [] if head_int4 else ["lm_head"]
    c.int4_kernels = quant.time_int4_activations(fresh, skip=skip)
    # The whole rung computes in that dtype, not only the INT4 matmuls: casts at every linear cost
    # more than they save, and a compiled float16 graph is slow on a CPU without float16 arithmetic
    # (measured on the embedded model, AVX-512 BF16, 2 threads: 22.0 ms per decode step in float16
    # with bfloat16 casts at the linears, 7.7 ms with the model in bfloat16)
    fresh.to(c.int4_kernels["act_dtype"])
    c.int4_info = quant.quantize_model_int4(fresh, skip=skip, act_dtype=c.int4_kernels["act_dtype"])
    c.int4_info["lm_head"] = (c.int4_info["impl"] if head_int4 else
                              quant.quantize_model_int8(fresh, impl="auto")["impl"])
    c.int4_quality = ladder.weight_format_check(before, fresh, c.tokenizer)
    del before
    c.model = fresh
    c.weights = message("int4 g32 weights, {activations} activations", activations=c.int4_info["activations"])
    if c.graph:
        c.compile()
    return c.variant()


def batched(c: Climb):
    if c.graph:
        c.model = c.eager_copy()  # the batch-1 rung keeps its graphs for the rounds
        c.compile()  # a fresh count: the batch shapes get their own two graphs
    return c.variant([c.prompt] * c.batch_size)


# name, the one change it adds ({dtype}, {batch}, {graph} filled from the climb), the function
# (the names and changes are catalog words: a Chinese page shows them translated, the records keep them)
RUNGS = [
    (N_("native eager"), N_("transformers generate, eager, {dtype}, dynamic KV cache"), native_eager),
    (N_("+ runtime options"), N_("set_compile_mode(jit_compile=False), allow_internal_format (NPU only)"),
     runtime_options),
    (N_("+ static cache"), N_("StaticCache sized for the request, eager"), static_cache),
    (N_("+ greedy loop"), N_("hand-written greedy loop over forward + static cache instead of generate"),
     greedy_loop),
    (N_("+ fused operators"), N_("apply_fused_modules, implementation named below"), fused_operators),
    (N_("+ graph mode"), N_("torch.compile of forward, dynamic=False: torchair on NPU (max-autotune: whole graph "
     "to GE), inductor elsewhere (CPU: the decode step only, freezing, the linears sharing an input "
     "concatenated; inductor's GEMM autotuning for batch-1 steps once weights are quantized)"), graph_mode),
    (N_("+ INT8"), N_("weight-only INT8 linears W8A16, quantized then {graph}"), int8_weights),
    (N_("+ INT4 g32"), N_("weight-only INT4 replacing INT8 in the layers, groups of 32 with a scale and zero each "
     "(the grid of the GGUF's Q4_1), lm_head in INT4 where the GGUF's is 4-bit, else INT8 (Q8_0 in the GGUF): "
     "about the bytes llama.cpp reads; the model "
     "in the 16-bit dtype the INT4 kernel is timed fastest with, {graph}"), int4_weights),
    (N_("+ batch {batch}"), N_("the previous rung serving {batch} users at once"), batched),
]


def rungs(climb: Climb, order=RUNGS) -> list[Rung]:
    """``order`` (default ``RUNGS``) as the ``round_robin.Rung`` list of this climb; each rung's id is its
    function's name (``native_eager``, ``graph_mode``, ``int8_weights`` ...)."""
    words = {"dtype": dtype_name(climb.dtype), "batch": climb.batch_size,
             "graph": message("forward compiled, dynamic=False, static cache") if climb.graph_mode else "eager"}
    return [Rung(Message(name, words), Message(text, words), partial(fn, climb), id=fn.__name__)
            for name, text, fn in order]


def fusion_description(fusion: Optional[dict]) -> Optional[str]:
    """What the fused-operators rung really ran on this device (None when it did not run)."""
    if not fusion:
        return None
    return message("RMSNorm {impl}, SwiGLU {swiglu}, gate and up merged into one matmul ({norms} norms, {mlps} "
                   "MLPs replaced)", impl=fusion["impl"], swiglu=fusion["swiglu_impl"], norms=fusion["rmsnorm"],
                   mlps=fusion["mlp"])


def weight_formats(c: Climb) -> list[dict]:
    """One row per weight format a rung produced: bytes before and after, layers, kernel, and the
    linears the kernel could not take, kept dense with the reason (``kept_dense``, None if none: on an
    NPU a vocabulary above 65,535 keeps lm_head dense, ``quant.npu_shape_problem``)."""
    keys = ("bytes_before", "bytes_after", "layers", "impl", "lm_head")
    return [{"format": name, **{k: info.get(k) for k in keys},
             "kept_dense": "; ".join(f"{layer} ({why})" for layer, why in info.get("kept_dense") or ()) or None}
            for name, info in (("INT8", c.int8_info), ("INT4 g32", c.int4_info)) if info]
