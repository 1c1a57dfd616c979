"""Strict stand-ins for ``torchair``, one per torch_npu line (the facts are in ``line_*.py``).

What each fake keeps from the real one of its line:

* ``CompilerConfig`` is an ``NpuBaseConfig``: its options are fixed when it is built, and setting an
  unknown one raises ``ValueError("CompilerConfig has no option mode, all options [...]")`` as
  ``NpuBaseConfig.__setattr__`` does (torchair ``configs/_option_base.py``); where the line's torchair
  wraps that method in ``pretty_error_msg`` the message gains more lines after the first. ``mode``
  exists only where the line's ``CompilerConfig.__init__`` creates it, as an ``OptionValue`` whose
  ``optional`` list is the line's and which rejects other values with that line's wording.
* ``get_npu_backend(*, compiler_config=None, custom_decompositions={})`` returns
  ``functools.partial(_npu_backend, compiler_config=..., decompositions=...)``; ``_npu_backend`` takes
  ``**kwargs`` (torch.compile's ``options``) only where the line's does, and validates them as
  ``_process_kwargs_options`` does. torchair 702161d7 (torch_npu 2.1.0) is older: its
  ``get_npu_backend(*, compiler_config=None, aot_config=None, custom_decompositions={})`` hands
  ``aot_config`` and ``custom_decompositions`` on under those names to an ``_npu_backend`` that has
  them as parameters.
* In GE mode (no ``mode`` option, or ``mode="max-autotune"``) every npu op in the graph needs a GE
  converter of that line; one without raises the line's error (``Unsupported torch op ... by ge``).
  GE mode also refuses a float32 ``scale`` for ``npu_quant_matmul`` with int8 / float16 output and no
  ``pertoken_scale`` (7.2.0 docs torch_npu-npu_quant_matmul.md 约束说明; 6.0.RC2 docs, hiascend
  Pytorch/60RC2 ptaoplist_000464: "输出int8/fp16且无pertoken情况下,必须先调用npu_trans_quant_param").
  aclgraph modes (``reduce-overhead``, ``npugraph_ex``) capture the ops as they run, so no converter
  is needed there.

The graph itself runs eagerly on the CPU (``gm.forward``): no GE compile is emulated, so a graph
that passes here is only known to have converters, not to compile or to be fast on an NPU.
Every backend call is logged in ``CALLS`` (``"torchair:<mode>"``) and its graph kept in ``GRAPHS``.
"""
from __future__ import annotations

import functools
import types
import warnings

import torch


def build(line, torch_npu=None) -> types.ModuleType:
    """A ``torchair`` module for ``line``; ``torch_npu`` (the fake of the same line) receives the
    backend calls in its ``CALLS`` log as well."""
    torchair = types.ModuleType("torchair")
    torchair.LINE = line
    torchair.CALLS = []
    torchair.GRAPHS = []

    class OptionValue:
        """configs/_option_base.py ``OptionValue``: a default and, optionally, a list of allowed values."""

        def __init__(self, default, optional=None):
            self._default = default
            self._optional = optional
            self._value = default

        @property
        def default(self):
            return self._default

        @property
        def optional(self):
            return self._optional

        @property
        def value(self):
            return None if self._value is None else str(self._value)

        @value.setter
        def value(self, v):
            if isinstance(self._optional, (tuple, list)) and v not in self._optional:
                style = line.OPTION_ERROR_STYLE
                if style == "str":
                    message = "'" + str(v) + "' not in optional list " + str(self._optional)
                elif style == "repr":
                    message = f"{repr(v)} not in optional list " + repr(self._optional)
                else:
                    message = (f"Value {repr(v)} (type: {type(v)}) not in optional list {repr(self._optional)}"
                               f" (type: {None if len(self._optional) == 0 else type(self._optional[0])}).")
                raise ValueError(message)
            self._value = v

    class NpuBaseConfig:
        """configs/_option_base.py ``NpuBaseConfig``: options are fixed in ``__init__``."""

        def __init__(self):
            self._fixed_attrs = []
            for k, v in self.__dict__.items():
                if isinstance(v, (OptionValue, NpuBaseConfig)):
                    self._fixed_attrs.append(k)

        def __setattr__(self, key, value):
            if hasattr(self, "_fixed_attrs"):
                if key not in self._fixed_attrs:
                    message = (self.__class__.__name__ + " has no option " + key + ", all options "
                               + str(self._fixed_attrs))
                    if line.WRAPS_CONFIG_ERRORS:
                        # pretty_error_msg joins str(e), the traceback and an error code
                        message += "\n(traceback)\n[ERROR] ... ERR03005 GRAPH internal error"
                    raise ValueError(message)
                if isinstance(getattr(self, key), OptionValue):
                    getattr(self, key).value = value
                    return
            object.__setattr__(self, key, value)

    class _SubConfig(NpuBaseConfig):
        """debug, ge_config, ...: their own options are not modelled (none is set by the workbook)."""

    class CompilerConfig(NpuBaseConfig):
        def __init__(self):
            for name in line.COMPILER_CONFIG_OPTIONS:
                object.__setattr__(self, name, _SubConfig())
            if line.MODES is not None:
                object.__setattr__(self, "mode", OptionValue("max-autotune", list(line.MODES)))
            super().__init__()

    def _mode_of(config) -> str:
        return config.mode.value if line.MODES is not None else "max-autotune"

    def _check_ge_graph(gm):
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            name = getattr(node.target, "_npu_op", None)
            if name is None:
                continue  # aten and Python ops: assumed to have converters (not checked)
            if name not in line.GE_CONVERTERS:
                raise RuntimeError(line.GE_ERROR.format(target=f"npu.{name}.default"))
            if name == "npu_quant_matmul":
                scale = node.args[2] if len(node.args) > 2 else node.kwargs.get("scale")
                meta = getattr(scale, "meta", {}).get("example_value")
                output_dtype = node.kwargs.get("output_dtype")
                if (meta is not None and meta.dtype == torch.float32 and node.kwargs.get("pertoken_scale") is None
                        and output_dtype in (None, torch.int8, torch.float16)):
                    raise RuntimeError("npu_quant_matmul in graph mode: a float32 scale is not supported for int8 "
                                       "or float16 output without pertoken_scale; convert it with "
                                       "npu_trans_quant_param first (the docs' rule; the real error text is not "
                                       "in the sources)")

    def _compile(gm, example_inputs, compiler_config):
        mode = _mode_of(compiler_config)
        if mode == "max-autotune":
            _check_ge_graph(gm)
        torchair.CALLS.append(f"torchair:{mode}")
        if torch_npu is not None:
            torch_npu.CALLS.append(f"torchair:{mode}")
        torchair.GRAPHS.append(gm)
        return gm.forward

    if line.GET_NPU_BACKEND_TAKES_AOT_CONFIG:
        # torchair 702161d7 (torch_npu 2.1.0): npu_fx_compiler.py:356-369 takes aot_config and
        # custom_decompositions (not decompositions) and reads compiler_config.experimental_config
        # without defaulting compiler_config (only get_npu_backend does).
        def _npu_backend(gm, example_inputs, compiler_config=None, aot_config=None, custom_decompositions={}):
            if compiler_config is None:
                raise AttributeError("'NoneType' object has no attribute 'experimental_config'")
            return _compile(gm, example_inputs, compiler_config)
    elif line.BACKEND_OPTIONS is None:
        def _npu_backend(gm, example_inputs, compiler_config=None, decompositions={}):
            return _compile(gm, example_inputs, compiler_config or CompilerConfig())
    else:
        def _npu_backend(gm, example_inputs, compiler_config=None, decompositions={}, **kwargs):
            compiler_config = compiler_config or CompilerConfig()
            for option in kwargs.get("options", {}) or {}:
                if option not in line.BACKEND_OPTIONS:
                    raise ValueError(f"Invalid option '{option}', allowed options: {sorted(line.BACKEND_OPTIONS)}")
            return _compile(gm, example_inputs, compiler_config)

    def _check_config_support(config):
        if line.REDUCE_OVERHEAD_DEPRECATED and _mode_of(config) == "reduce-overhead":
            warnings.warn("The \"reduce-overhead\" mode configuration will be deprecated. "
                          "Please use the \"npugraph_ex\" backend.", DeprecationWarning)

    if line.GET_NPU_BACKEND_TAKES_AOT_CONFIG:
        # 702161d7:python/torchair/npu_fx_compiler.py:371-376: the partial carries aot_config and
        # custom_decompositions under those names, and there is no _check_config_support
        def get_npu_backend(*, compiler_config=None, aot_config=None, custom_decompositions={}):
            compiler_config = compiler_config or CompilerConfig()
            return functools.partial(_npu_backend, compiler_config=compiler_config, aot_config=aot_config,
                                     custom_decompositions=custom_decompositions)
    else:
        def get_npu_backend(*, compiler_config=None, custom_decompositions={}):
            compiler_config = compiler_config or CompilerConfig()
            _check_config_support(compiler_config)
            return functools.partial(_npu_backend, compiler_config=compiler_config,
                                     decompositions=dict(custom_decompositions))

    torchair.CompilerConfig = CompilerConfig
    torchair.get_npu_backend = get_npu_backend
    torchair._npu_backend = _npu_backend
    return torchair
