"""The NPU paths against every supported torch_npu line (strict fakes in tests/fakes/line_*.py).

Two parts. First, the fakes are checked to be as strict as their line: exactly its ops, its
versions, its torchair options, its GE converters, real defaults. Then each fault found by reading
the real sources has a test that drives the helpers the way a chapter does; each of those failed on
the code before per-op feature detection (run against it with the helpers unchanged):

* graph mode with ``npu_graph_mode=max-autotune`` set ``CompilerConfig.mode``, which torchair before
  7.0.0 does not have (torch_npu 2.1.0, 2.1.0.post6 and 2.1.0.post10 lines);
* ``reduce-overhead`` there failed with torchair's ``has no option mode`` instead of naming the
  torch_npu it needs, and ``npugraph_ex`` was not accepted at all;
* ``impl="auto"`` picked ops the line does not have (AttributeError instead of a fallback);
* a fused op without a GE converter in that torchair broke the whole GE graph;
* float32 reached the NPU INT8 ops, the W8A16 weight was a contiguous (K, N) copy instead of the
  documented transposed view, its scale was cast on every call, and static W8A8 passed a float32
  scale that GE graph mode refuses;
* options torchair 7.2.0's backend cannot take reached it;
* chapter 03 read ``max-autotune`` in torchair's settings as inductor's GEMM autotuning.

Tensors are CPU tensors standing for NPU ones; where a helper picks its path from the device, the
device is given as ``"npu"`` (or ``backend.device_kind`` is patched). A graph that passes the fake GE
backend is only known to have converters for its npu ops; it is not compiled by GE.
"""
from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch

from helpers import backend, environment_study, ge_support, ops, prose, quant, static_decode, versions

REPO = Path(__file__).resolve().parent.parent
ALL_OPS = ("npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_weight_quant_batchmatmul",
           "npu_dynamic_quant", "npu_trans_quant_param", "npu_quant_matmul")
# Ascend/pytorch@master:COMPATIBILITY.en.md, "TorchNPU installation package version" column of both
# tables (the torch 2.x rows).
COMPATIBILITY_TABLE = {
    "2.12.0", "2.11.0", "2.10.0.post4", "2.9.0.post6", "2.7.1.post8", "2.9.0.post2", "2.8.0.post4",
    "2.7.1.post4", "2.9.0", "2.8.0.post2", "2.7.1.post2", "2.6.0.post5", "2.8.0", "2.7.1", "2.6.0.post3",
    "2.1.0.post17", "2.6.0", "2.5.1.post1", "2.1.0.post13", "2.5.1", "2.4.0.post4", "2.3.1.post6",
    "2.1.0.post12", "2.4.0.post2", "2.3.1.post4", "2.1.0.post10", "2.4.0", "2.3.1.post2", "2.1.0.post8",
    "2.3.1", "2.2.0.post2", "2.1.0.post6", "2.2.0", "2.1.0.post4", "2.1.0", "2.0.1.post1", "2.1.0.rc1",
    "2.0.1", "2.0.1.rc1"}


def _has(fake, op):
    return op in fake.LINE.OPS


def _ge_line_lacks(fake):
    """npu ops the line has but its torchair cannot put into a GE graph."""
    return [op for op in fake.LINE.OPS if op not in fake.LINE.GE_CONVERTERS]


@pytest.fixture
def as_npu(monkeypatch):
    """Make the helpers treat CPU tensors as NPU tensors (their code path is chosen from the device)."""
    real_kind, real_device = backend.device_kind, backend.as_device

    def device_kind(d):
        return "npu" if real_kind(d) == "cpu" else real_kind(d)
    monkeypatch.setattr(backend, "device_kind", device_kind)
    monkeypatch.setattr(static_decode, "device_kind", device_kind)  # imported by name there

    def as_device(d):
        device = real_device(d) if str(d) != "npu" else None
        return _NpuDevice() if device is None or device.type == "cpu" else device
    monkeypatch.setattr(backend, "as_device", as_device)


class _NpuDevice:
    """What ``torch.device("npu")`` is once torch_npu has renamed the PrivateUse1 backend."""

    type = "npu"
    index = None


# --- the fakes are as strict as their line -------------------------------------------------------

def test_fake_has_exactly_the_ops_of_its_line(fake_torch_npu):
    for op in ALL_OPS:
        assert hasattr(fake_torch_npu, op) == _has(fake_torch_npu, op), op


def test_fake_version_is_a_release_of_the_compatibility_table(fake_torch_npu):
    assert fake_torch_npu.__version__ in COMPATIBILITY_TABLE
    assert versions.version_tuple(fake_torch_npu.__version__) == versions.version_tuple(fake_torch_npu.LINE.TORCH)


def test_fake_set_compile_mode_defaults_to_jit_compile_false(fake_torch_npu):
    fake_torch_npu.npu.set_compile_mode()
    assert fake_torch_npu.CALLS[-1] == "set_compile_mode(False)"


def test_fake_rejects_keywords_its_line_does_not_have(fake_torch_npu):
    if not _has(fake_torch_npu, "npu_dynamic_quant"):
        pytest.skip("this line has no npu_dynamic_quant")
    x = torch.randn(4, 8, dtype=torch.float16)
    if "group_index" in fake_torch_npu.LINE.OPS["npu_dynamic_quant"]:
        fake_torch_npu.npu_dynamic_quant(x, group_index=None)
    else:
        with pytest.raises(TypeError, match="unexpected keyword argument 'group_index'"):
            fake_torch_npu.npu_dynamic_quant(x, group_index=None)


def test_fake_int8_ops_reject_float32_and_default_to_int8_output(fake_torch_npu):
    if not _has(fake_torch_npu, "npu_quant_matmul"):
        pytest.skip("this line has no INT8 ops")
    w = torch.randint(-8, 8, (16, 8), dtype=torch.int8)
    with pytest.raises(RuntimeError, match="x must be float16 or bfloat16"):
        fake_torch_npu.npu_weight_quant_batchmatmul(torch.randn(2, 16), w, torch.ones(8))
    a = torch.randint(-8, 8, (2, 16), dtype=torch.int8)
    out = fake_torch_npu.npu_quant_matmul(a, w, torch.full((8,), 0.01))
    assert out.dtype == torch.int8  # output_dtype=None means int8, as op-plugin's kernel does
    with pytest.raises(RuntimeError, match="output_dtype torch.float32 is not supported"):
        fake_torch_npu.npu_quant_matmul(a, w, torch.full((8,), 0.01), output_dtype=torch.float32)
    if _has(fake_torch_npu, "npu_dynamic_quant"):
        with pytest.raises(RuntimeError, match="x must be float16 or bfloat16"):
            fake_torch_npu.npu_dynamic_quant(torch.randn(2, 16))


def test_fake_compiler_config_rejects_unknown_options(fake_torch_npu):
    config = fake_torch_npu.torchair.CompilerConfig()
    with pytest.raises(ValueError, match=r"^CompilerConfig has no option bogus, all options \["):
        config.bogus = 1
    if fake_torch_npu.LINE.MODES is None:
        with pytest.raises(ValueError, match="CompilerConfig has no option mode"):
            config.mode = "max-autotune"
    else:
        assert list(config.mode.optional) == list(fake_torch_npu.LINE.MODES)
        with pytest.raises(ValueError, match="not in optional list"):
            config.mode = "O3"


def test_fake_backend_has_the_signatures_of_its_line_s_torchair(fake_torch_npu):
    """get_npu_backend and _npu_backend with the parameters of the line's npu_fx_compiler.py; the
    partial get_npu_backend returns passes only parameters _npu_backend has."""
    import inspect

    torchair, line = fake_torch_npu.torchair, fake_torch_npu.LINE
    params = inspect.signature(torchair.get_npu_backend).parameters
    expected = (("compiler_config", "aot_config", "custom_decompositions") if line.GET_NPU_BACKEND_TAKES_AOT_CONFIG
                else ("compiler_config", "custom_decompositions"))
    assert tuple(params) == expected and all(p.kind is p.KEYWORD_ONLY for p in params.values())
    backend_fn = torchair.get_npu_backend()
    inner = inspect.signature(backend_fn.func).parameters
    assert set(backend_fn.keywords) <= set(inner)
    assert ("aot_config" in inner) == line.GET_NPU_BACKEND_TAKES_AOT_CONFIG
    assert any(p.kind is p.VAR_KEYWORD for p in inner.values()) == (line.BACKEND_OPTIONS is not None)


def test_fake_ge_backend_refuses_an_op_without_a_converter(fake_torch_npu):
    lacking = _ge_line_lacks(fake_torch_npu)
    if not lacking:
        pytest.skip("every npu op of this line has a GE converter")
    torchair = fake_torch_npu.torchair
    op = getattr(fake_torch_npu, lacking[0])
    gamma = torch.ones(8, dtype=torch.float16)
    fn = (lambda x: op(x, gamma)[0]) if lacking[0] == "npu_rms_norm" else (lambda x: op(x))
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=torchair.get_npu_backend(), dynamic=False, fullgraph=True)
    expected = fake_torch_npu.LINE.GE_ERROR.format(target=f"npu.{lacking[0]}.default")
    with pytest.raises(Exception, match=expected.replace(".", r"\.")):
        compiled(torch.randn(2, 8, dtype=torch.float16))
    torch._dynamo.reset()


# --- faults of the helpers, each failing on the code before feature detection -------------------

def _small_graph(x, w):
    return torch.relu(x @ w) + 1


def test_max_autotune_builds_the_default_ge_graph_on_every_line(fake_torch_npu):
    """Fault 1: ``config.mode = "max-autotune"`` raised ValueError on torchair without ``mode``."""
    torch._dynamo.reset()
    compiled, name = ops.graph_mode(_small_graph, "npu", mode="max-autotune", dynamic=False)
    x, w = torch.randn(3, 4), torch.randn(4, 4)
    torch.testing.assert_close(compiled(x, w), _small_graph(x, w))
    assert name == "torchair" and fake_torch_npu.torchair.CALLS == ["torchair:max-autotune"]
    torch._dynamo.reset()


def test_reduce_overhead_where_torchair_has_no_mode_names_the_torch_npu_it_needs(fake_torch_npu):
    """Fault 1b: aclgraph needs torchair 7.0.0; without it the error must say so, not 'has no option'."""
    torch._dynamo.reset()
    if fake_torch_npu.LINE.MODES is None:
        with pytest.raises(RuntimeError, match=r"reduce-overhead.*torch_npu 2\.1\.0\.post12") as err:
            ops.graph_mode(_small_graph, "npu", mode="reduce-overhead")
        assert fake_torch_npu.__version__ in str(err.value)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            compiled, _ = ops.graph_mode(_small_graph, "npu", mode="reduce-overhead")
            compiled(torch.randn(3, 4), torch.randn(4, 4))
        assert fake_torch_npu.torchair.CALLS == ["torchair:reduce-overhead"]
    torch._dynamo.reset()


def test_npugraph_ex_is_offered_where_torchair_has_it(fake_torch_npu):
    """Fault 1c: torchair 26.0.0's ``npugraph_ex`` mode was not an accepted ``npu_graph_mode``."""
    assert "npugraph_ex" in static_decode.NPU_MODES
    torch._dynamo.reset()
    modes = fake_torch_npu.LINE.MODES or ()
    if "npugraph_ex" in modes:
        compiled, _ = ops.graph_mode(_small_graph, "npu", mode="npugraph_ex")
        compiled(torch.randn(3, 4), torch.randn(4, 4))
        assert fake_torch_npu.torchair.CALLS == ["torchair:npugraph_ex"]
    else:
        with pytest.raises(RuntimeError, match=r"npugraph_ex.*2\.9\.0\.post2"):
            ops.graph_mode(_small_graph, "npu", mode="npugraph_ex")
    torch._dynamo.reset()


def test_compile_model_with_the_npu_profile_mode_builds_on_every_line(fake_torch_npu, tiny_model):
    """Fault 1 through chapters 03/06: ``profiles/npu.yaml`` asks for ``max-autotune``."""
    model = copy.deepcopy(tiny_model[0]).half()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits
        compiled = static_decode.compile_model(model, "npu", npu_mode="max-autotune")
        got = model(input_ids=ids, use_cache=False).logits
    static_decode.restore_eager(model)
    assert compiled.backend == "torchair" and "torchair:max-autotune" in fake_torch_npu.torchair.CALLS
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "swiglu"])
def test_auto_falls_back_where_the_line_lacks_the_fused_op(fake_torch_npu, as_npu, op):
    """Fault 2: ``impl="auto"`` on an NPU returned "npu" without checking that the op exists."""
    x, r = torch.randn(2, 3, 16, dtype=torch.float16), torch.randn(2, 3, 16, dtype=torch.float16)
    w = torch.rand(16, dtype=torch.float16) + 0.5
    npu_name = {"rms_norm": "npu_rms_norm", "add_rms_norm": "npu_add_rms_norm", "swiglu": "npu_swiglu"}[op]
    if op == "rms_norm":
        out, ref = ops.rms_norm(x, w, impl="auto"), ops.rms_norm_reference(x, w)
    elif op == "add_rms_norm":
        out, ref = ops.add_rms_norm(x, r, w, impl="auto")[0], ops.add_rms_norm_reference(x, r, w)[0]
    else:
        out, ref = ops.swiglu(x, impl="auto"), ops.swiglu_reference(x)
    torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    assert (npu_name in fake_torch_npu.CALLS) == _has(fake_torch_npu, npu_name)


def test_fused_ops_fall_back_inside_a_ge_graph_where_torchair_has_no_converter(fake_torch_npu, tiny_model, as_npu):
    """Fault 3: npu_swiglu (2.1.0.post6) and npu_rms_norm (2.1.0) have no GE converter in those
    torchairs, so the fused-operators rung followed by graph mode broke the graph."""
    model = copy.deepcopy(tiny_model[0]).half()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = model(input_ids=ids, use_cache=False).logits
        ops.apply_fused_modules(model, impl="auto")
        static_decode.compile_model(model, "npu")  # torchair's default: the GE graph
        got = model(input_ids=ids, use_cache=False).logits
    static_decode.restore_eager(model)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    assert fake_torch_npu.torchair.CALLS, "the graph never reached torchair"


def test_float32_never_reaches_an_npu_int8_op(fake_torch_npu, as_npu):
    """Fault 4a: W8A16 / W8A8 on NPU with float32 activations."""
    lin = torch.nn.Linear(32, 48, bias=False)
    for scheme in ("w8a16", "w8a8"):
        assert quant.resolve_impl("auto", "npu", torch.float32, scheme) != "npu"
        layer = quant.Int8Linear(lin, impl="auto", scheme=scheme)
        layer(torch.randn(2, 32))
        with pytest.raises(ValueError, match=r"dtype.*float16 or bfloat16"):
            quant.Int8Linear(lin, impl="npu", scheme=scheme)
    assert not any(op in fake_torch_npu.CALLS for op in ALL_OPS)


def test_auto_int8_falls_back_where_the_line_lacks_the_ops(fake_torch_npu, as_npu):
    """Fault 2 for INT8: torch_npu 2.1.0 has none of the INT8 ops."""
    lin = torch.nn.Linear(32, 48, bias=False).half()
    for scheme, needed in (("w8a16", "npu_weight_quant_batchmatmul"), ("w8a8", "npu_dynamic_quant")):
        layer = quant.Int8Linear(lin, impl="auto", scheme=scheme)
        assert (layer.impl == "npu") == _has(fake_torch_npu, needed)
        layer(torch.randn(2, 32, dtype=torch.float16))


def test_w8a16_weight_in_the_documented_layout_and_scale_cast_once(fake_torch_npu, as_npu):
    """Fault 4b: per-channel W8A16 weight as the transposed (N, K) tensor viewed .t(), and the
    scale cast to the activation dtype once, at quantization time, not per call."""
    if not _has(fake_torch_npu, "npu_weight_quant_batchmatmul"):
        pytest.skip("this line has no npu_weight_quant_batchmatmul")
    layer = quant.Int8Linear(torch.nn.Linear(32, 48, bias=False).half(), impl="npu")
    x = torch.randn(2, 32, dtype=torch.float16)
    layer(x)
    call = fake_torch_npu.LAST["npu_weight_quant_batchmatmul"]
    assert call["weight_layout"] == "transposed"
    buffers = list(layer.buffers())
    assert any(call["antiquant_scale"] is b for b in buffers), "the scale was converted during the call"
    assert call["antiquant_scale"].dtype == torch.float16


def test_static_w8a8_passes_a_scale_that_ge_graph_mode_accepts(fake_torch_npu, as_npu):
    """Fault 4c: a float32 scale without pertoken_scale is refused in graph mode for fp16 output."""
    if not _has(fake_torch_npu, "npu_quant_matmul"):
        pytest.skip("this line has no npu_quant_matmul")
    lin = torch.nn.Linear(32, 48, bias=False).half()
    layer = quant.Int8Linear(lin, impl="npu", scheme="w8a8", act_scale=4.0 / 127)
    emulated = quant.Int8Linear(lin.float(), impl="emulate", scheme="w8a8", act_scale=4.0 / 127)
    x = torch.randn(2, 32, dtype=torch.float16)
    torch._dynamo.reset()
    compiled, _ = ops.graph_mode(layer, "npu", dynamic=False, fullgraph=True)
    y = compiled(x)
    torch._dynamo.reset()
    assert "torchair:max-autotune" in fake_torch_npu.torchair.CALLS
    torch.testing.assert_close(y.float(), emulated(x.float()), atol=2e-2, rtol=2e-2)


def test_torchair_72_backend_never_gets_extra_options(fake_torch_npu):
    """Fault 5: torchair 7.2.0's ``_npu_backend`` has no ``**kwargs``: any option is a TypeError at the
    first call. The helpers must not hand it options (a clear error instead)."""
    torch._dynamo.reset()
    if fake_torch_npu.LINE.BACKEND_OPTIONS is None:
        with pytest.raises(ValueError, match="takes no options"):
            ops.graph_mode(_small_graph, "npu", options={"force_eager": True})
    else:
        compiled, _ = ops.graph_mode(_small_graph, "npu", options={"force_eager": True})
        compiled(torch.randn(3, 4), torch.randn(4, 4))
    # the one option the static path passes is guard_filter_fn, which torch.compile pops itself
    compiled, _ = ops.graph_mode(_small_graph, "npu", options=static_decode.module_guard_filter())
    compiled(torch.randn(3, 4), torch.randn(4, 4))
    torch._dynamo.reset()


def test_chapter_03_reads_autotuning_only_from_inductor_settings():
    """Fault 7: on torchair, ``mode=max-autotune`` is the whole graph to GE; the chapter's sentence
    about autotuned GEMM kernels matched that substring."""
    cells = json.loads((REPO / "notebooks" / "03_end_to_end.ipynb").read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "\"max-autotune\" in graph[\"graph_settings\"]" not in code
    for template in prose.TEMPLATES.glob("03_end_to_end*.md.j2"):
        assert "max-autotune" not in template.read_text(encoding="utf-8"), template.name


# --- what the helpers report about the line ------------------------------------------------------

def test_npu_line_report_names_the_line_and_what_it_lacks(fake_torch_npu):
    report = environment_study.npu_line_report(fake_torch_npu, fake_torch_npu.torchair, ge_probe_device="cpu")
    torch._dynamo.reset()
    assert report["torch_npu"] == fake_torch_npu.__version__
    rows = {r["feature"]: r for r in report["rows"]}
    for op in ("npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_weight_quant_batchmatmul",
               "npu_dynamic_quant", "npu_quant_matmul"):
        assert rows[f"torch_npu.{op}"]["present"] == _has(fake_torch_npu, op)
    modes = fake_torch_npu.LINE.MODES or ()
    for mode in static_decode.NPU_MODES:
        row = rows[f"torchair mode {mode}"]
        assert row["present"] == (mode in modes or (mode == "max-autotune" and not modes))
    for op in fake_torch_npu.LINE.OPS:
        if op in ("npu_rms_norm", "npu_add_rms_norm", "npu_swiglu"):
            assert rows[f"GE converter for torch_npu.{op}"]["present"] == (op in fake_torch_npu.LINE.GE_CONVERTERS)
    lacking = [r["feature"] for r in report["rows"] if not r["present"]]
    assert report["lacks"] == lacking
    assert all(r["without it"] for r in report["rows"] if not r["present"])
    unprobed = environment_study.npu_line_report(fake_torch_npu, fake_torch_npu.torchair)
    assert all(r["present"] is None for r in unprobed["rows"] if r["feature"].startswith("GE converter"))
    assert not any(f.startswith("GE converter") for f in unprobed["lacks"])


def test_npu_line_report_without_torch_npu():
    report = environment_study.npu_line_report(None)
    assert report["torch_npu"] is None and report["rows"] == [] and "not loaded" in report["line"]


def test_graph_settings_say_what_torchair_built(fake_torch_npu):
    plan = ops.npu_graph_plan("max-autotune")
    assert plan["graph"] == "GE"
    if fake_torch_npu.LINE.MODES is None:
        assert plan["mode_set"] is None and "no CompilerConfig.mode" in plan["reason"]
    else:
        assert plan["mode_set"] == "max-autotune"


def test_apply_fused_modules_says_which_implementation_ran_and_why(fake_torch_npu, tiny_model, as_npu):
    model = copy.deepcopy(tiny_model[0]).half()
    counts = ops.apply_fused_modules(model, impl="auto")
    assert counts["swiglu_impl"] == ("npu" if _has(fake_torch_npu, "npu_swiglu") else "reference")
    assert "npu_swiglu" in counts["swiglu_reason"]
    assert backend.import_torch_npu().module is fake_torch_npu


def test_quantize_model_says_which_kernel_ran_and_why(fake_torch_npu, tiny_model, as_npu):
    model = copy.deepcopy(tiny_model[0]).half()
    info = quant.quantize_model_int8(model, impl="auto")
    assert info["impl"] == ("npu" if _has(fake_torch_npu, "npu_weight_quant_batchmatmul") else "dequant")
    assert "npu_weight_quant_batchmatmul" in info["impl_reason"]


def test_w8a8_passes_output_dtype_and_a_scale_of_the_table(fake_torch_npu, as_npu):
    if not _has(fake_torch_npu, "npu_dynamic_quant"):
        pytest.skip("this line has no npu_dynamic_quant")
    for dtype in (torch.float16, torch.bfloat16):
        lin = torch.nn.Linear(32, 48, bias=False).to(dtype)
        layer = quant.Int8Linear(lin, impl="npu", scheme="w8a8")
        emulated = quant.Int8Linear(lin.float(), impl="emulate", scheme="w8a8")
        x = torch.randn(3, 32, dtype=dtype)
        y = layer(x)
        call = fake_torch_npu.LAST["npu_quant_matmul"]
        assert call["output_dtype"] == dtype and y.dtype == dtype
        # fp16 output with pertoken_scale takes a float32 scale; bf16 output a bf16 one (both in the table)
        assert call["scale"].dtype == (torch.float32 if dtype == torch.float16 else torch.bfloat16)
        torch.testing.assert_close(y.float(), emulated(x.float()), atol=3e-2, rtol=3e-2)


# --- the NPU INT8 kernels' K, N <= 65,535, and the INT8 ops inside a GE graph ---------------------

def _has_int8(fake):
    return _has(fake, "npu_weight_quant_batchmatmul")


def test_fake_int8_ops_reject_k_or_n_above_65535(fake_torch_npu):
    if not _has(fake_torch_npu, "npu_quant_matmul"):
        pytest.skip("this line has no INT8 ops")
    wide = torch.zeros(8, 65536, dtype=torch.int8)  # (K, N) with N one past the limit
    with pytest.raises(RuntimeError, match=r"N=65536 must be in \[1, 65535\]"):
        fake_torch_npu.npu_weight_quant_batchmatmul(torch.zeros(1, 8, dtype=torch.float16), wide,
                                                    torch.ones(65536, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="must not exceed 65535"):
        fake_torch_npu.npu_quant_matmul(torch.zeros(1, 8, dtype=torch.int8), wide, torch.ones(65536),
                                        output_dtype=torch.bfloat16)
    fake_torch_npu.npu_weight_quant_batchmatmul(torch.zeros(1, 8, dtype=torch.float16), wide[:, :65535],
                                                torch.ones(65535, dtype=torch.float16))


def test_an_npu_int8_linear_wider_than_the_kernel_takes_says_so(fake_torch_npu, as_npu):
    if not _has_int8(fake_torch_npu):
        pytest.skip("this line has no INT8 ops")
    assert quant.npu_shape_problem(4096, 128256) == "N=128256 > 65535, the limit of npu_weight_quant_batchmatmul"
    assert quant.npu_shape_problem(70000, 8, "w8a8") == "K=70000 > 65535, the limit of npu_quant_matmul"
    assert quant.npu_shape_problem(65535, 65535) is None
    wide = torch.nn.Linear(8, 65536, bias=False).half()
    with pytest.raises(ValueError, match=r"N=65536 > 65535.*keep it dense"):
        quant.Int8Linear(wide, impl="npu")
    assert "npu_weight_quant_batchmatmul" not in fake_torch_npu.CALLS


@pytest.fixture(scope="module")
def llama3_vocab_model():
    """A tiny float16 Llama with Llama-3's vocabulary of 128,256 tokens (the only large dim); built
    before any fake torch_npu is installed (importing transformers' model code looks for torch_npu)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).half().eval()
    return model.requires_grad_(False)


def test_a_128k_vocabulary_keeps_lm_head_dense_through_the_npu_int8_path(llama3_vocab_model, fake_torch_npu,
                                                                         as_npu):
    """Llama-3's lm_head (N=128,256) is wider than npu_weight_quant_batchmatmul takes: it stays dense,
    named with its reason; every other linear is INT8 and the forward runs."""
    model = copy.deepcopy(llama3_vocab_model)
    ids = torch.tensor([[1, 500, 70000, 128255]])
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
    names = quant.linear_names(model)
    info = quant.quantize_model_int8(model, impl="auto")
    if not _has_int8(fake_torch_npu):
        # the dequant kernel has no such limit: every linear, lm_head included, is INT8
        assert info["impl"] == "dequant" and info["kept_dense"] == [] and info["layers"] == len(names)
        return
    assert info["kept_dense"] == [("lm_head", "N=128256 > 65535, the limit of npu_weight_quant_batchmatmul")]
    assert info["impl"] == "npu" and info["layers"] == len(names) - 1
    assert quant.linear_names(model) == ["lm_head"]  # the one nn.Linear left
    assert all(isinstance(model.get_submodule(n), quant.Int8Linear) for n in names if n != "lm_head")
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits
    assert got.shape == (1, 4, 128256) and torch.isfinite(got).all()
    assert "npu_weight_quant_batchmatmul" in fake_torch_npu.CALLS
    torch.testing.assert_close(got.float(), ref.float(), atol=5e-2, rtol=5e-2)


def test_w8a8_keeps_a_wide_lm_head_dense_too(fake_torch_npu, as_npu):
    if not _has(fake_torch_npu, "npu_dynamic_quant"):
        pytest.skip("this line has no npu_dynamic_quant")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 65536)).half()
    info = quant.quantize_model_int8(model, impl="auto", scheme="w8a8")
    assert info["kept_dense"] == [("1", "N=65536 > 65535, the limit of npu_quant_matmul")] and info["layers"] == 1
    model(torch.randn(2, 16, dtype=torch.float16))


def test_helpers_call_get_npu_backend_only_with_arguments_every_line_takes(fake_torch_npu):
    """Every ``get_npu_backend(...)`` call in helpers/ passes only keywords this line's real
    get_npu_backend has, and what it returns hands its backend only parameters that backend has."""
    import ast
    import inspect

    takes = set(inspect.signature(fake_torch_npu.torchair.get_npu_backend).parameters)
    calls = []
    for path in (REPO / "helpers").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get_npu_backend":
                calls.append((path.name, node))
    assert calls, "no get_npu_backend call found in helpers/"
    for name, call in calls:
        assert not call.args, f"{name}: get_npu_backend takes keyword arguments only"
        assert {k.arg for k in call.keywords} <= takes, (name, takes)
    backend_fn = ops.npu_graph_backend()
    assert set(backend_fn.keywords) <= set(inspect.signature(backend_fn.func).parameters)
    assert ops.backend_takes_options(backend_fn) == (fake_torch_npu.LINE.BACKEND_OPTIONS is not None)


def test_the_ge_probe_covers_the_int8_ops_as_the_int8_linears_call_them(fake_torch_npu):
    if not _has_int8(fake_torch_npu):
        pytest.skip("this line has no INT8 ops")
    torchair = fake_torch_npu.torchair
    for name in ("npu_weight_quant_batchmatmul", "npu_dynamic_quant", "npu_quant_matmul"):
        for dtype in (torch.float16, torch.bfloat16):
            torch._dynamo.reset()
            fake_torch_npu.CALLS.clear()
            error = ge_support.ge_probe(name, torchair.get_npu_backend(), "cpu", dtype)
            assert error is None, (name, dtype, error)
            # the probe really put the op into a GE graph (the fake backend checked it)
            assert "torchair:max-autotune" in fake_torch_npu.CALLS and name in fake_torch_npu.CALLS
    with pytest.raises(ValueError, match="name='npu_bogus'"):
        ge_support.ge_probe("npu_bogus", torchair.get_npu_backend(), "cpu", torch.float16)
    torch._dynamo.reset()


@pytest.mark.parametrize("scheme,act_scale,op,now", [
    ("w8a16", None, "npu_weight_quant_batchmatmul", "dequant"),
    ("w8a8", None, "npu_dynamic_quant", "emulate"),
    ("w8a8", 4.0 / 127, "npu_quant_matmul", "emulate")])
def test_int8_linears_leave_a_ge_graph_where_torchair_has_no_converter(fake_torch_npu, as_npu, monkeypatch,
                                                                       scheme, act_scale, op, now):
    """A torchair without the INT8 op's GE converter (none of the known lines, so one is made by
    taking it away) must not break the graph: the INT8 linears fall back and say why."""
    needs = ge_support.GE_PROBE_OPS[op]
    if not all(_has(fake_torch_npu, o) for o in needs):
        pytest.skip("this line lacks the op")
    monkeypatch.setattr(fake_torch_npu.LINE, "GE_CONVERTERS", fake_torch_npu.LINE.GE_CONVERTERS - {op})
    lin = torch.nn.Linear(32, 48, bias=False).half()
    model = torch.nn.Sequential(quant.Int8Linear(lin, impl="npu", scheme=scheme, act_scale=act_scale))
    x = torch.randn(2, 32, dtype=torch.float16)
    torch._dynamo.reset()
    rows = ge_support.ge_fallbacks(model, fake_torch_npu.torchair.get_npu_backend())
    assert len(rows) == 1 and rows[0]["now"] == now and rows[0]["modules"] == 1
    assert "no GE converter" in rows[0]["reason"] and fake_torch_npu.__version__ in rows[0]["reason"]
    assert model[0].impl == now
    compiled, _ = ops.graph_mode(model, "npu", dynamic=False, fullgraph=True)
    y = compiled(x)
    torch._dynamo.reset()
    emulated = quant.Int8Linear(lin.float(), impl="emulate" if scheme == "w8a8" else "dequant", scheme=scheme,
                                act_scale=act_scale)
    torch.testing.assert_close(y.float(), emulated(x.float()), atol=3e-2, rtol=3e-2)


def test_npu_line_report_probes_the_int8_ops_in_a_ge_graph(fake_torch_npu):
    report = environment_study.npu_line_report(fake_torch_npu, fake_torch_npu.torchair, ge_probe_device="cpu")
    torch._dynamo.reset()
    rows = {r["feature"]: r for r in report["rows"]}
    for name, needs in ge_support.GE_PROBE_OPS.items():
        feature = f"GE converter for torch_npu.{name}"
        if not all(_has(fake_torch_npu, o) for o in needs):
            assert feature not in rows
            continue
        in_graph = [o for o in needs if o != "npu_trans_quant_param"]  # made outside the graph
        assert rows[feature]["present"] == all(o in fake_torch_npu.LINE.GE_CONVERTERS for o in in_graph), name
