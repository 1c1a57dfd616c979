"""One static-shape decode path for every graph-mode measurement (layer: model and kernels; taught
in 03_end_to_end and 06_optimization_ladder).

``03_end_to_end.ipynb`` shows why graph mode needs it; ``06_optimization_ladder.ipynb`` compiles
every graph rung through it.

A graph compiled with ``dynamic=False`` is valid for one set of input shapes. A plain ``generate``
uses a dynamic KV cache that grows by one position per token, so every decode step has new shapes:
dynamo builds one graph per KV length until it reaches ``recompile_limit`` and then, by default,
runs the frame eagerly without saying so. With ``dynamic`` left unset this rarely shows, because
dynamo then marks the changing dimension dynamic after the first recompile; on an NPU, where GE
graph mode wants static shapes and each graph of Llama-2-7B compiles for tens of seconds, it costs
minutes and leaves eager speed.

The path here keeps every shape fixed for a request:

* a ``StaticCache`` sized for the request (prompt + new tokens), built once, primed by one eager
  forward (the lazily allocated cache of transformers 5.x must not be a new shape for the graph)
  and reset before each ``generate`` (``static_generate_kwargs``);
* ``model.forward`` compiled with ``dynamic=False`` and ``fullgraph=True`` on every backend
  (torchair on NPU with ``npu_mode`` only where that torchair offers it, see ``ops.npu_graph_plan``;
  inductor on CPU/CUDA), wrapped in ``CompiledForward``, which counts the graphs dynamo builds and
  turns reaching the recompile limit into ``GraphRecompileError`` instead of a silent eager run.

A prefill shape and a decode shape give two graphs per (batch, prompt length, cache length).
On a CPU the weights become constants of the graph (inductor's ``freezing``), so inductor can offer
its own C++ GEMM kernels for int8 / int4 weights (``decode_inductor_config``). (On an NPU, torchair's
``max-autotune`` mode hands the whole graph to the graph engine instead.) Dynamo's per-call guards on
module attributes are skipped where this torch can (``module_guard_filter``): a compiled forward
therefore never notices a changed model, and ``compile_model`` must run again after any change (the
ladder of chapter 06 does: restore the eager forward, change the model, compile).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import time
import types
import warnings
import weakref
from contextlib import nullcontext
from typing import Any, Callable, Optional

import torch

from . import versions
from .backend import device_kind
from .ge_support import ge_fallbacks
from .ops import graph_mode, npu_graph_backend, npu_graph_plan
from .params import check_positive_int


DEFAULT_RECOMPILE_LIMIT = 8
# torchair's modes (ops.NPU_GRAPH_MODES): GE graph, aclgraph, and aclgraph's successor npugraph_ex
NPU_MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")
# Set while a whole-model graph is built on a CPU. Passed as torch.compile(options=...) they did not
# take effect for freezing in torch 2.13, so CompiledForward patches inductor's config around each call.
# cpp.enable_kernel_profile names each generated kernel in torch.profiler (a GEMM template shows as
# graph_N_gemm_..._kernel), so chapter 03 can say which matmul kernels a compiled step ran.
# cpp.enable_concat_linear concatenates the linears that read the same activation (q, k and v; gate and
# up) into one GEMM of frozen weights, int4 ones included: 4 weight matmuls per layer instead of 7
# (measured on the embedded model, INT4 weights, bfloat16, 2 threads: 9.8 -> 8.9 ms per decode step).
CPU_DECODE_INDUCTOR = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                       "cpp.enable_kernel_profile": True, "cpp.enable_concat_linear": True}
# Autotuning prints a table per matmul shape to stderr; in an executed notebook that is pages of
# noise, and the choice it made is already named in the code path (describe()).
QUIET_AUTOTUNE = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


class GraphRecompileError(RuntimeError):
    """Dynamo reached its recompile limit: the shapes changed on (almost) every call."""


# --- torch / transformers differences, each behind one small function ---------------------------

def strict_recompile_options(limit: int = DEFAULT_RECOMPILE_LIMIT) -> dict:
    """dynamo config values that make the recompile limit an error rather than an eager fallback."""
    import torch._dynamo.config as config

    check_positive_int("recompile_limit", limit)
    options = {}
    # Each setting under the first of its names that this torch knows (they changed in torch 2.6).
    for names, value in ((("recompile_limit", "cache_size_limit"), limit),
                         (("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"), True)):
        known = [name for name in names if hasattr(config, name)]
        if known:
            options[known[0]] = value
    return options


def has_quantized_linears(model) -> bool:
    """Whether ``model`` holds int8 / int4 linears (modules with a ``qweight``, as helpers.quant's)."""
    return any(hasattr(m, "qweight") for m in model.modules()) if hasattr(model, "modules") else False


def decode_inductor_config(device, backend: str, quantized: bool = True) -> dict:
    """``CPU_DECODE_INDUCTOR`` for inductor on a CPU (the settings this torch knows), else ``{}``.

    Without quantized weights (``quantized=False``) max-autotune is left out: measured here on the
    ladder's float32 graph, ATen's BLAS GEMVs were faster than the autotuned choice (33.5 against
    30.7 tok/s) and autotuning cost about 45 s of compile time; for int8 / int4 weights inductor's
    C++ GEMM template is what fuses the dequantization into the matmul (measured on the embedded
    model with fused operators, bfloat16, 2 threads, AVX-512 BF16, 378 decode steps each, the two
    graphs alternated: INT8 8.1 ms per step [8.0-8.3] with max-autotune against 14.1 [13.7-15.4] with
    ATen's int8 kernel; INT4 8.0 [7.7-8.2] against 9.4 [9.3-9.7]). ``CompiledForward`` keeps it to
    batch-1 decode steps: at batch 8 (INT4 layers, INT8 lm_head, 186 steps each, alternated) the
    autotuned graph ran 29.9 ms per step [29.3-32.4] against ATen's 29.6 [28.5-33.8], for 78 s of
    compile against 42.
    """
    if backend != "inductor" or device_kind(device) != "cpu":
        return {}
    import torch._inductor.config as config

    def known(name: str) -> bool:  # dotted names are sub-configs (cpp.enable_kernel_profile)
        owner = config
        for part in name.split("."):
            if not hasattr(owner, part):
                return False
            owner = getattr(owner, part)
        return True

    return {k: v for k, v in CPU_DECODE_INDUCTOR.items()
            if known(k) and (quantized or not k.startswith("max_autotune"))}


def module_guard_filter() -> dict:
    """``torch.compile`` options that skip guards on module attributes, where this torch has them.

    Checking those guards costs about a millisecond per decode step of a 30-layer model on a CPU,
    a few percent of the step; ``compile_model`` after every change to the model keeps it correct.
    """
    skip = getattr(getattr(torch, "compiler", None), "skip_guard_on_all_nn_modules_unsafe", None)
    return {"guard_filter_fn": skip} if skip is not None else {}


def graphs_built() -> int:
    """Graphs dynamo has built in this process (its own counter, so any backend is counted)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _errors(module: str, *names: str) -> tuple:
    """The exception classes among ``names`` that this torch's ``module`` has (names changed)."""
    import importlib

    found = importlib.import_module(module)
    return tuple(getattr(found, n) for n in names if hasattr(found, n))


def make_static_cache(model, batch_size: int, max_cache_len: int, device=None, dtype=None):
    """A ``transformers.StaticCache`` for ``batch_size`` sequences of up to ``max_cache_len`` tokens.

    The constructor differs between transformers lines (5.x: ``config, max_cache_len``; 4.x also
    takes ``max_batch_size``, ``device`` and ``dtype``); the parameters it declares are passed.
    """
    from transformers import StaticCache

    check_positive_int("batch_size", batch_size)
    check_positive_int("max_cache_len", max_cache_len)
    params = inspect.signature(StaticCache.__init__).parameters
    first = next(model.parameters())
    kwargs: dict = {"config": model.config, "max_cache_len": max_cache_len}
    optional = {"max_batch_size": batch_size, "batch_size": batch_size,
                "device": device if device is not None else first.device,
                "dtype": dtype if dtype is not None else first.dtype}
    kwargs.update({k: v for k, v in optional.items() if k in params})
    return StaticCache(**kwargs)


def eager_forward(model) -> Callable:
    """``model.forward`` as written, even when ``CompiledForward`` has replaced it."""
    forward = model.forward
    return forward.eager if isinstance(forward, CompiledForward) else forward


@torch.no_grad()  # not inference_mode: the cache must stay resettable outside it
def prime_cache(model, cache, inputs: dict) -> None:
    """One eager forward through ``cache``, then a reset: transformers 5.x allocates a static
    cache on first use, and a graph traced before and after that allocation would be two graphs."""
    ids = inputs["input_ids"][:, :1]
    eager_forward(model)(input_ids=ids, use_cache=True, **{versions.cache_argument(model): cache})
    cache.reset()


def static_generate_kwargs(model, inputs: dict, max_new_tokens: int) -> tuple[Any, dict]:
    """``(cache, kwargs)`` for ``generate`` on the static path; call ``cache.reset()`` before each use.

    The cache is sized for the request (prompt + ``max_new_tokens``), so a 1-token and an N-token
    generate of the same request share the same shapes, and primed (see ``prime_cache``).
    """
    batch, prompt_len = inputs["input_ids"].shape
    cache = make_static_cache(model, int(batch), int(prompt_len) + int(max_new_tokens))
    prime_cache(model, cache, inputs)
    # disable_compile keeps generate from compiling on its own with a static cache (it does so on
    # CUDA), so an eager measurement stays eager and a graph measurement compiles only what we compiled.
    return cache, {versions.cache_argument(model): cache, "disable_compile": True}


# --- the compiled forward ------------------------------------------------------------------------

def _cache_tensors(obj, depth: int = 2):
    """The tensors a KV cache object holds: its attributes, lists of them, and its layers' (depth 2)."""
    values = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    for value in values:
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, torch.Tensor):
                yield item
            elif depth > 1 and hasattr(item, "__dict__") and not isinstance(item, (torch.nn.Module, type)):
                yield from _cache_tensors(item, depth - 1)


def release_static_addresses(cache) -> int:
    """Drop transformers' ``mark_static_address`` from a cache's tensors; returns how many.

    transformers marks a static cache's tensors as static addresses (so CUDA graphs need no copy);
    dynamo then lifts them like parameters, and inductor's ``freezing`` folds them into the graph
    as constants: a second cache object of the same size would be ignored and the run crashes.
    Unmarked, they are ordinary inputs that the graph updates in place.
    """
    released = 0
    for tensor in _cache_tensors(cache):
        if hasattr(tensor, "_dynamo_static_input_type"):
            del tensor._dynamo_static_input_type
            released += 1
    return released


def _forward_frame(forward, args, kwargs):
    return forward(*args, **kwargs)


_FRAMES = itertools.count()


def _own_frame() -> Callable:
    """``_forward_frame`` with a code object of its own (dynamo's graph cache is per code object)."""
    code = _forward_frame.__code__.replace(co_name=f"forward_frame_{next(_FRAMES)}")
    return types.FunctionType(code, _forward_frame.__globals__, code.co_name)


def _token_shape(args, kwargs) -> Optional[tuple]:
    """``(sequences, positions)`` of a forward call's ``input_ids`` (or ``inputs_embeds``), None when it
    has neither; a decode step has one position per sequence."""
    tokens = kwargs.get("input_ids")
    if tokens is None and args and isinstance(args[0], torch.Tensor):
        tokens = args[0]
    if tokens is None:
        tokens = kwargs.get("inputs_embeds")
    return tuple(tokens.shape[:2]) if isinstance(tokens, torch.Tensor) and tokens.dim() >= 2 else None


class CompiledForward:
    """``model.forward`` compiled with ``dynamic=False``; counts graphs and fails loudly.

    ``graphs`` is the number of graphs dynamo built while this wrapper ran (warm-up and timed runs
    alike); ``compile_s`` accumulates the wall time of the calls that built one. Reaching the
    recompile limit raises ``GraphRecompileError`` naming the cause.
    """

    def __init__(self, model, device, *, backend_override=None, npu_mode: Optional[str] = None,
                 recompile_limit: int = DEFAULT_RECOMPILE_LIMIT, inductor_config: Optional[dict] = None,
                 skip_module_guards: bool = True, autotune_prefill: bool = False, compile_prefill: bool = True):
        if npu_mode is not None and npu_mode not in NPU_MODES:
            raise ValueError(f"npu_mode={npu_mode!r} is not valid; choose one of "
                             f"{', '.join(map(repr, NPU_MODES))} or None for torchair's default")
        self.options = strict_recompile_options(recompile_limit)
        self.recompile_limit = recompile_limit
        self.eager = model.forward
        # dynamo keeps its graphs per code object, and every Llama's forward is the same code: with the
        # module guards skipped and the weights frozen into the graph, a second model of the same class
        # would run the first one's graph (its weights) without a word. A frame of its own per compiled
        # forward keeps each model's graphs apart, so no reset is needed and no earlier graph is lost.
        frame = _own_frame()
        extra = {"mode": npu_mode} if npu_mode is not None and device_kind(device) == "npu" else {}
        self.npu_plan, self.ge_fallbacks = self._npu_settings(model, device, npu_mode, backend_override)
        if self.npu_plan is not None:
            extra["npu_plan"] = self.npu_plan
        guards = module_guard_filter() if skip_module_guards else {}

        def build():  # a new options dict each time: torch.compile pops guard_filter_fn out of it
            options = {"options": dict(guards)} if guards else {}
            return graph_mode(frame, device, dynamic=False, fullgraph=True,
                              compiler_backend=backend_override, **extra, **options)

        self.compiled, self.backend = build()
        self.inductor_config = (decode_inductor_config(device, self.backend, has_quantized_linears(model))
                                if inductor_config is None else dict(inductor_config))
        # The prefill graph runs once per request: autotuning its GEMM shapes too would about double
        # the compile time for a few milliseconds of first-token latency.
        self.autotune_prefill = autotune_prefill
        # compile_prefill=False: a prefill (more than one token per sequence) runs the eager forward, so
        # only the decode step is compiled; on a CPU each graph costs tens of seconds, and the prefill
        # runs once per request
        self.compile_prefill = compile_prefill
        self._compiled_shapes: set = set()  # call shapes whose graph exists: called without the patches
        self._released = weakref.WeakSet()
        self._rebuild = lambda: build()[0]
        self.autotune_fallback = ""  # why max-autotune was dropped, when it was
        self.module_guards_skipped = bool(guards)
        self.npu_mode = npu_mode
        self.graphs = 0
        self.compile_s = 0.0
        functools.update_wrapper(self, self.eager)

    @staticmethod
    def _npu_settings(model, device, npu_mode, backend_override):
        """``(plan, fallbacks)`` on an NPU with torchair: what this torchair builds for ``npu_mode``
        (``ops.npu_graph_plan``) and, for a GE graph, the npu ops (fused, INT8) that fell back for want of a GE
        converter (``ge_support.ge_fallbacks``). ``(None, [])`` elsewhere."""
        if backend_override is not None or device_kind(device) != "npu":
            return None, []
        plan = npu_graph_plan(npu_mode)
        fallbacks = ge_fallbacks(model, npu_graph_backend(plan=plan)) if plan["graph"] == "GE" else []
        return plan, fallbacks

    def describe(self) -> str:
        """The compile settings in words, for the code path beside each figure."""
        parts = [self.backend, "dynamic=False"]
        if self.npu_plan is not None and self.backend == "torchair":
            plan = self.npu_plan
            parts.append(f"mode={plan['mode_set']}" if plan["mode_set"] else
                         f"{plan['graph']} graph (torchair default, no mode option set)")
            parts.extend(f"{row['op']} -> {row['now']} (no GE converter)" for row in self.ge_fallbacks)
        elif self.npu_mode and self.backend == "torchair":  # torchair's mode; other backends ignore it
            parts.append(f"mode={self.npu_mode}")
        if self.inductor_config.get("freezing"):
            parts.append("freezing")
        if self.inductor_config.get("max_autotune"):
            parts.append(f"max-autotune GEMM ({self.inductor_config.get('max_autotune_gemm_backends', 'ATEN')})"
                         + ("" if self.autotune_prefill else " for batch-1 decode steps"))
        elif self.inductor_config.get("freezing") and not self.autotune_fallback:
            parts.append("ATen GEMMs (no quantized weights: no max-autotune)")
        if self.inductor_config.get("cpp.enable_concat_linear"):
            parts.append("linears sharing an input concatenated")
        if not self.compile_prefill:
            parts.append("prefill eager")
        if self.module_guards_skipped:
            parts.append("module guards skipped")
        if self.autotune_fallback:
            parts.append(self.autotune_fallback)
        return ", ".join(parts)

    def _inductor_patch(self, args, kwargs):
        settings = self.inductor_config
        if not settings:
            return nullcontext()
        if not self.autotune_prefill and _token_shape(args, kwargs) != (1, 1):  # only batch-1 decode steps
            settings = {k: v for k, v in settings.items() if not k.startswith("max_autotune")}
        import torch._inductor.config as config

        quiet = {k: v for k, v in QUIET_AUTOTUNE.items() if hasattr(config, k)}
        return config.patch(**settings, **quiet)

    def _call_compiled(self, args, kwargs):
        with torch._dynamo.config.patch(**self.options), self._inductor_patch(args, kwargs), \
                warnings.catch_warnings():
            # inductor's autotuner still calls Tensor.storage(); the warning is torch's, not the reader's
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
            return self.compiled(self.eager, args, kwargs)

    def _shape_key(self, args, kwargs) -> tuple:
        return tuple((k, tuple(v.shape)) for k, v in kwargs.items() if isinstance(v, torch.Tensor)) + \
            tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))

    def __call__(self, *args, **kwargs):
        shape = _token_shape(args, kwargs)
        if not self.compile_prefill and (shape is None or shape[1] != 1):  # not a decode step
            return self.eager(*args, **kwargs)
        key = self._shape_key(args, kwargs)
        if key in self._compiled_shapes and _STANCE is not None:
            # The graph of this shape exists: call it with nothing around it (the settings only
            # matter while a graph is built). A recompile here would be a bug; the stance makes it
            # an error, and the call then goes the slow way below, which counts and reports it.
            try:
                with _STANCE("fail_on_recompile"):
                    return self.compiled(self.eager, args, kwargs)
            except RuntimeError as exc:  # dynamo raises a plain RuntimeError for the stance
                if "Detected recompile" not in str(exc) and not isinstance(exc, _errors("torch._dynamo.exc",
                                                                                         "RecompileError")):
                    raise
                self._compiled_shapes.discard(key)  # e.g. a dynamic cache that grew: build it the slow way
        out = self._call_slow(args, kwargs)
        self._compiled_shapes.add(key)
        return out

    def _call_slow(self, args, kwargs):
        if self.inductor_config.get("freezing"):
            for value in kwargs.values():
                if hasattr(value, "get_seq_length") and value not in self._released:
                    release_static_addresses(value)
                    self._released.add(value)  # a cache is checked once, not every step
        before = graphs_built()
        start = time.perf_counter()
        try:
            try:
                out = self._call_compiled(args, kwargs)
            except _cpp_compile_errors() as exc:
                if not self.inductor_config.get("max_autotune"):
                    raise
                # A C++ GEMM template that does not compile for this CPU (seen with ATEN_CPU_CAPABILITY
                # set below the hardware's level) would lose the whole graph: build it with ATen's
                # kernels instead, and say so in describe().
                self.inductor_config = {k: v for k, v in self.inductor_config.items()
                                        if not k.startswith("max_autotune")}
                self.autotune_fallback = (f"max-autotune dropped: its C++ GEMM failed to compile here "
                                          f"({_first_line(exc)})")
                torch._dynamo.reset()
                self.compiled = self._rebuild()
                out = self._call_compiled(args, kwargs)
        except _errors("torch._dynamo.exc", "FailOnRecompileLimitHit", "FailOnCacheLimitHit") as exc:
            self.graphs += graphs_built() - before
            raise GraphRecompileError(
                f"graph mode reached dynamo's recompile limit ({self.recompile_limit}) after {self.graphs} "
                "graphs of model.forward: the input shapes change on every call (a dynamic KV cache grows "
                "by one position per token). Use the static cache path (helpers.static_decode, "
                "static_cache=True in measure_generation); the run stopped instead of going on eagerly."
            ) from exc
        built = graphs_built() - before
        if built:
            self.graphs += built
            self.compile_s += time.perf_counter() - start
        return out


# torch.compiler.set_stance (torch 2.6 and newer): without it every call takes the slow path
_STANCE = getattr(getattr(torch, "compiler", None), "set_stance", None)


def _cpp_compile_errors() -> tuple:
    """The errors a failed inductor C++ compile reaches the caller as (dynamo wraps the backend's)."""
    return _errors("torch._dynamo.exc", "BackendCompilerFailed") + _errors("torch._inductor.exc", "CppCompileError")


def _first_line(exc: BaseException) -> str:
    inner = getattr(exc, "inner_exception", None) or exc.__cause__ or exc
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0][:120] if text else ''}"


def compile_model(model, device, **options) -> CompiledForward:
    """Replace ``model.forward`` by a ``CompiledForward`` (options as its constructor's) and return it."""
    restore_eager(model)
    compiled = CompiledForward(model, device, **options)
    model.forward = compiled
    return compiled


def restore_eager(model) -> None:
    """Undo ``compile_model`` (e.g. before quantizing, so the new modules are compiled once)."""
    if isinstance(model.forward, CompiledForward):
        model.forward = model.forward.eager


def compiled_forward_of(model) -> Optional[CompiledForward]:
    forward = getattr(model, "forward", None)
    return forward if isinstance(forward, CompiledForward) else None


def graph_fields(compiled: Optional[CompiledForward], before: tuple = (0, 0.0)) -> dict:
    """The fields every graph measurement records next to its figures; ``before`` is
    ``(compiled.graphs, compiled.compile_s)`` taken when the measurement started."""
    if compiled is None:
        return {}
    fields = {"compiled_graphs": int(compiled.graphs - before[0]), "compile_s": float(compiled.compile_s - before[1]),
              "graph_backend": compiled.backend, "npu_mode": compiled.npu_mode, "graph_settings": compiled.describe()}
    if compiled.npu_plan is not None:  # what this torchair built for npu_mode, and why
        fields["npu_graph"] = {k: compiled.npu_plan[k] for k in ("requested", "mode_set", "graph", "reason", "torch_npu")}
        fields["ge_fallbacks"] = list(compiled.ge_fallbacks)
    return fields
