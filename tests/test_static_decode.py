"""The static-shape graph decode path: graphs counted, the recompile limit an error, shapes fixed.

A counting backend that runs the traced graph eagerly keeps these tests cheap and exact: it sees
every graph dynamo hands to a backend, which is what an NPU would compile with torchair.
"""
import inspect
import sys
import types

import pytest
import torch

from helpers import decode_loop, generation, ops, quant, static_decode, versions
from helpers.model_files import tiny_llama

PROMPT = "the static cache keeps shapes fixed"


class CountingEager:
    """A torch.compile backend that counts the graphs it receives and runs them eagerly."""

    __name__ = "counting-eager"

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.fixture
def model():
    # A fresh model per test: these tests replace model.forward.
    return tiny_llama(seed=1)


def _inputs(tok, prompts=(PROMPT,)):
    return tok(list(prompts), return_tensors="pt", padding=True)


@torch.inference_mode()
def _generate(m, tok, inputs, n, **kw):
    return m.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      pad_token_id=tok.pad_token_id, **kw)


def test_static_path_builds_two_graphs_for_many_steps_and_many_requests(model):
    m, tok = model
    inputs = _inputs(tok)
    reference = _generate(m, tok, inputs, 12)
    counter = CountingEager()
    compiled = static_decode.compile_model(m, "cpu", backend_override=counter)
    cache, kwargs = static_decode.static_generate_kwargs(m, inputs, 12)
    outputs = []
    for n in (12, 1, 12, 12):  # a 1-token request of the same size shares the same shapes
        cache.reset()
        outputs.append(_generate(m, tok, inputs, n, **kwargs))
    assert counter.graphs == 2  # one prefill graph, one decode graph, no recompiles
    assert compiled.graphs == counter.graphs  # dynamo's own counter agrees with the backend
    assert compiled.compile_s > 0
    assert torch.equal(outputs[0], reference) and torch.equal(outputs[-1], reference)


def test_dynamic_cache_with_static_shapes_hits_the_limit_and_raises(model):
    """The failure mode chapter 03 teaches: one graph per KV length, then an error, never eager."""
    m, tok = model
    counter = CountingEager()
    static_decode.compile_model(m, "cpu", backend_override=counter, recompile_limit=3)
    with pytest.raises(static_decode.GraphRecompileError, match="recompile limit \\(3\\)"):
        _generate(m, tok, _inputs(tok), 8)
    assert counter.graphs == 3  # prefill, then one decode graph per cache length until the limit


def test_measure_generation_records_graphs_and_compile_time(model):
    m, tok = model
    eager = generation.measure_generation(m, tok, [PROMPT], 6, repeats=2, static_cache=True)
    assert "compiled_graphs" not in eager and eager["static_cache"]
    static_decode.compile_model(m, "cpu", backend_override=CountingEager())
    graph = generation.measure_generation(m, tok, [PROMPT], 6, repeats=2, static_cache=True)
    assert graph["compiled_graphs"] == 2 and graph["compile_s"] > 0
    assert graph["graph_backend"] == "counting-eager"
    assert "static KV cache" in graph["code_path"] and "dynamic=False" in graph["code_path"]
    again = generation.measure_generation(m, tok, [PROMPT], 6, repeats=1, static_cache=True)
    assert again["compiled_graphs"] == 0 and again["compile_s"] == 0  # each measurement counts its own


def test_batched_static_path_matches_eager_greedy(model):
    m, tok = model
    prompts = [PROMPT, "hi"]
    expected = generation.greedy_new_tokens(m, tok, prompts, 5)
    static_decode.compile_model(m, "cpu", backend_override=CountingEager())
    inputs = generation.prompt_inputs(m, tok, prompts, None, False)
    cache, kwargs = static_decode.static_generate_kwargs(m, inputs, 5)
    out = _generate(m, tok, inputs, 5, **kwargs)
    assert out[:, inputs["input_ids"].shape[1]:].tolist() == expected


def test_fused_and_int8_models_compile_as_one_graph_per_shape():
    """The ladder's INT8 rung keeps graph mode: quantize, then compile once (fullgraph=True)."""
    m, tok = tiny_llama(seed=2, dtype=torch.bfloat16)
    ops.apply_fused_modules(m)
    quant.quantize_model_int8(m)
    counter = CountingEager()
    static_decode.compile_model(m, "cpu", backend_override=counter)
    r = generation.measure_generation(m, tok, [PROMPT], 4, repeats=1, static_cache=True)
    assert counter.graphs == r["compiled_graphs"] == 2


def test_restore_eager_and_recompile_resets_the_count(model):
    m, tok = model
    first = static_decode.compile_model(m, "cpu", backend_override=CountingEager())
    assert static_decode.compiled_forward_of(m) is first
    static_decode.restore_eager(m)
    assert static_decode.compiled_forward_of(m) is None
    assert static_decode.eager_forward(m) == first.eager


def test_strict_options_use_names_this_torch_knows():
    import torch._dynamo.config as config

    options = static_decode.strict_recompile_options(5)
    assert options and all(hasattr(config, name) for name in options)
    assert 5 in options.values() and True in options.values()
    with pytest.raises(ValueError, match="recompile_limit"):
        static_decode.strict_recompile_options(0)


def test_make_static_cache_passes_only_declared_parameters(model, monkeypatch):
    """transformers 4.x's constructor also takes max_batch_size, device and dtype."""
    m, _ = model
    seen = {}

    class LegacyStaticCache:
        def __init__(self, config, max_batch_size, max_cache_len, device=None, dtype=None):
            seen.update(max_batch_size=max_batch_size, max_cache_len=max_cache_len, dtype=dtype)

    fake = types.SimpleNamespace(StaticCache=LegacyStaticCache)
    monkeypatch.setitem(sys.modules, "transformers", fake)
    static_decode.make_static_cache(m, 3, 40)
    assert seen == {"max_batch_size": 3, "max_cache_len": 40, "dtype": torch.float32}
    with pytest.raises(ValueError, match="max_cache_len"):
        static_decode.make_static_cache(m, 1, 0)


def test_npu_mode_goes_to_torchair_and_bad_modes_fail(model, monkeypatch, fake_torch_npu):
    """On every torch_npu line: torchair's mode goes to its CompilerConfig where that config has the
    mode, never to torch.compile; the settings name what was built. Nothing is compiled here."""
    m, _ = model
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    modes = fake_torch_npu.LINE.MODES
    for mode in static_decode.NPU_MODES:
        if modes is None and mode != "max-autotune" or modes is not None and mode not in modes:
            with pytest.raises(RuntimeError, match=f"npu_graph_mode='{mode}'"):
                static_decode.compile_model(m, "npu", npu_mode=mode)
            continue
        compiled = static_decode.compile_model(m, "npu", npu_mode=mode)
        assert compiled.backend == "torchair" and "mode" not in calls[-1]
        assert calls[-1]["dynamic"] is False and calls[-1]["fullgraph"] is True
        assert calls[-1]["backend"].keywords["compiler_config"] is compiled.npu_plan["config"]
        settings = compiled.describe()
        assert (f"mode={mode}" in settings) if modes else ("GE graph (torchair default" in settings)
        fields = static_decode.graph_fields(compiled)
        assert fields["npu_graph"]["torch_npu"] == fake_torch_npu.__version__
    static_decode.restore_eager(m)
    with pytest.raises(ValueError, match="npu_mode"):
        static_decode.compile_model(m, "npu", npu_mode="O3")


def test_cache_argument_follows_the_class_forward_even_when_compiled(model):
    m, _ = model
    name = versions.cache_argument(m)
    assert name in inspect.signature(type(m).forward).parameters
    m.forward = lambda *args, **kwargs: None  # what a compiled wrapper hides
    try:
        assert versions.cache_argument(m) == name
    finally:
        del m.forward


def test_cpu_inductor_settings_are_chosen_for_cpu_inductor_only(model):
    full = static_decode.CPU_DECODE_INDUCTOR
    assert static_decode.decode_inductor_config("cpu", "inductor") == full
    assert static_decode.decode_inductor_config("cuda", "inductor") == {}
    assert static_decode.decode_inductor_config("cpu", "counting-eager") == {}
    dense = static_decode.decode_inductor_config("cpu", "inductor", quantized=False)
    assert dense == {k: v for k, v in full.items() if not k.startswith("max_autotune")} and dense["freezing"]
    m, _ = model
    compiled = static_decode.compile_model(m, "cpu")  # builds nothing until called
    assert compiled.backend == "inductor" and compiled.inductor_config == dense  # dense weights: ATen GEMMs
    assert "freezing" in compiled.describe() and "no max-autotune" in compiled.describe()
    quant.quantize_model_int8(m, impl="dequant")
    compiled = static_decode.compile_model(m, "cpu")
    assert static_decode.has_quantized_linears(m) and compiled.inductor_config == full
    assert "max-autotune GEMM (CPP,ATEN) for batch-1 decode steps" in compiled.describe()


class ConfigRecorder(CountingEager):
    """Counts graphs and notes inductor's freezing setting at the moment each graph is built."""

    def __init__(self):
        super().__init__()
        self.freezing = []

    def __call__(self, gm, example_inputs):
        import torch._inductor.config as config

        self.freezing.append(config.freezing)
        return super().__call__(gm, example_inputs)


def test_inductor_settings_hold_while_graphs_are_built_and_are_undone_after(model):
    import torch._inductor.config as config

    m, tok = model
    before = config.freezing
    recorder = ConfigRecorder()
    static_decode.compile_model(m, "cpu", backend_override=recorder, inductor_config={"freezing": not before})
    cache, kwargs = static_decode.static_generate_kwargs(m, _inputs(tok), 3)
    _generate(m, tok, _inputs(tok), 3, **kwargs)
    assert recorder.freezing == [not before, not before]
    assert config.freezing == before


@pytest.mark.parametrize("skip", [True, False])
def test_module_guards_skipped_only_when_asked(model, skip):
    """A changed module attribute rebuilds the graph only while dynamo still guards modules."""
    if not static_decode.module_guard_filter():
        pytest.skip("this torch has no guard_filter_fn")
    m, tok = model
    counter = CountingEager()
    compiled = static_decode.compile_model(m, "cpu", backend_override=counter, skip_module_guards=skip)
    ids = _inputs(tok)["input_ids"]
    with torch.no_grad():
        m(input_ids=ids)
        m.model.norm.variance_epsilon *= 2  # what the compiled forward may stop noticing
        m(input_ids=ids)
    assert compiled.module_guards_skipped is skip
    assert counter.graphs == (1 if skip else 2)


@pytest.mark.slow  # about 70 s on 2 cores: max-autotune compiles inductor's C++ GEMM candidates with a cold cache
def test_cpu_graph_with_freezing_and_autotune_generates_the_eager_tokens(capfd, monkeypatch, tmp_path):
    """The real CPU path (inductor, freezing, max-autotune GEMM) on a tiny bf16 Llama, INT8 included.

    A second cache object of the same size must reuse the graphs: with transformers' static-address
    marks left on, freezing folds the first cache into the graph and the second run crashes.
    Autotuning's per-shape tables stay out of the output (an executed notebook would carry pages of them).
    """
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # a cache hit would skip autotuning
    m, tok = tiny_llama(seed=3, dtype=torch.bfloat16)
    inputs = _inputs(tok)
    quant.quantize_model_int8(m)
    eager = _generate(m, tok, inputs, 6)
    compiled = static_decode.compile_model(m, "cpu")
    for _ in range(2):
        cache, kwargs = static_decode.static_generate_kwargs(m, inputs, 6)
        graph = _generate(m, tok, inputs, 6, **kwargs)
        assert torch.equal(graph, eager)
    assert compiled.graphs == 2
    printed = capfd.readouterr()
    assert "AUTOTUNE" not in printed.err + printed.out
    assert "Autotune Choices Stats" not in printed.err + printed.out
    assert "TypedStorage" not in printed.err + printed.out


def test_release_static_addresses_unmarks_every_cache_tensor(model):
    m, tok = model
    cache, _ = static_decode.static_generate_kwargs(m, _inputs(tok), 4)
    tensors = list(static_decode._cache_tensors(cache))
    assert len(tensors) >= 2 * m.config.num_hidden_layers  # keys and values of every layer
    marked = sum(hasattr(t, "_dynamo_static_input_type") for t in tensors)
    assert marked > 0  # transformers marks them for CUDA graphs
    assert static_decode.release_static_addresses(cache) == marked
    assert not any(hasattr(t, "_dynamo_static_input_type") for t in tensors)


def test_autotuning_is_kept_to_batch1_decode_steps_unless_asked(model):
    """The prefill graph is built without max_autotune (it runs once per request), and so is a
    batch's decode step (measured no faster with it); a batch-1 decode step with it."""
    import torch._inductor.config as config

    m, tok = model

    class AutotuneRecorder(CountingEager):
        seen: list = []

        def __call__(self, gm, example_inputs):
            self.seen.append(config.max_autotune)
            return super().__call__(gm, example_inputs)

    for prefill, expected in ((False, [False, True]), (True, [True, True])):
        recorder = AutotuneRecorder()
        recorder.seen = []
        static_decode.compile_model(m, "cpu", backend_override=recorder, autotune_prefill=prefill,
                                    inductor_config={"max_autotune": True})
        cache, kwargs = static_decode.static_generate_kwargs(m, _inputs(tok), 3)
        _generate(m, tok, _inputs(tok), 3, **kwargs)
        assert recorder.seen == expected
        static_decode.restore_eager(m)
    recorder = AutotuneRecorder()
    recorder.seen = []
    static_decode.compile_model(m, "cpu", backend_override=recorder, inductor_config={"max_autotune": True})
    batch = _inputs(tok, ("a", PROMPT))
    cache, kwargs = static_decode.static_generate_kwargs(m, batch, 3)
    _generate(m, tok, batch, 3, **kwargs)
    assert recorder.seen == [False, False]
    static_decode.restore_eager(m)


# --- the hand-written greedy loop ---------------------------------------------------------------

@pytest.mark.parametrize("prompts", [(PROMPT,), ("a", PROMPT)])  # the second is left-padded
def test_greedy_loop_gives_generates_tokens_with_two_graphs(model, prompts):
    m, tok = model
    inputs = _inputs(tok, prompts)
    reference = _generate(m, tok, inputs, 10)
    counter = CountingEager()
    compiled = static_decode.compile_model(m, "cpu", backend_override=counter)
    cache, kwargs = static_decode.static_generate_kwargs(m, inputs, 10)
    loop = decode_loop.use_greedy_loop(m)
    assert decode_loop.greedy_loop_of(m) is loop
    for n in (10, 1, 10):
        cache.reset()
        out = _generate(m, tok, inputs, n, **kwargs)
        assert torch.equal(out, reference[:, :inputs["input_ids"].shape[1] + n])
    assert counter.graphs == compiled.graphs == 2
    decode_loop.restore_generate(m)
    assert decode_loop.greedy_loop_of(m) is None and not isinstance(m.generate, decode_loop.GreedyLoop)


def test_measure_generation_times_the_loop_with_the_same_protocol(model):
    m, tok = model
    decode_loop.use_greedy_loop(m)
    out = generation.measure_generation(m, tok, [PROMPT], 6, "cpu", repeats=2, static_cache=True)
    assert out["new_tokens"] == 6 and out["decode_ms_per_token"] > 0 and out["static_cache"]


def test_greedy_loop_refuses_what_it_does_not_do(model):
    m, tok = model
    inputs = _inputs(tok)
    loop = decode_loop.use_greedy_loop(m)
    with pytest.raises(ValueError, match="StaticCache"):
        loop(**inputs, max_new_tokens=4)
    cache, kwargs = static_decode.static_generate_kwargs(m, inputs, 4)
    with pytest.raises(ValueError, match="do_sample"):
        loop(**inputs, max_new_tokens=4, do_sample=True, **kwargs)
    with pytest.raises(ValueError, match="min_new_tokens"):
        loop(**inputs, max_new_tokens=4, min_new_tokens=2, **kwargs)
    with pytest.raises(ValueError, match="does not fit the cache"):
        loop(**inputs, max_new_tokens=40, **kwargs)
    with pytest.raises(ValueError, match="temperature"):
        loop(**inputs, max_new_tokens=4, temperature=0.5, **kwargs)


def test_a_cpp_gemm_that_does_not_compile_falls_back_to_aten_and_says_so(model):
    from torch._inductor.exc import CppCompileError

    class FailsWhileAutotuning:
        __name__ = "fails-while-autotuning"

        def __call__(self, gm, example_inputs):
            import torch._inductor.config as config

            if config.max_autotune:
                raise CppCompileError(["g++"], "error: no matching function for call to 'cvtbf16_fp32'")
            return gm.forward

    m, tok = model
    inputs = _inputs(tok)
    reference = _generate(m, tok, inputs, 6)
    compiled = static_decode.compile_model(m, "cpu", backend_override=FailsWhileAutotuning(),
                                           inductor_config={"max_autotune": True})
    cache, kwargs = static_decode.static_generate_kwargs(m, inputs, 6)
    assert torch.equal(_generate(m, tok, inputs, 6, **kwargs), reference)
    assert "max-autotune dropped" in compiled.describe() and "CppCompileError" in compiled.autotune_fallback
    assert not compiled.inductor_config.get("max_autotune")


def test_other_compile_failures_are_not_hidden(model):
    class Broken:
        __name__ = "broken"

        def __call__(self, gm, example_inputs):
            raise RuntimeError("lowering failed")

    m, tok = model
    static_decode.compile_model(m, "cpu", backend_override=Broken(), inductor_config={})
    cache, kwargs = static_decode.static_generate_kwargs(m, _inputs(tok), 4)
    with pytest.raises(Exception, match="lowering failed"):
        _generate(m, tok, _inputs(tok), 4, **kwargs)


def test_two_models_of_one_class_each_run_their_own_frozen_graph():
    """Every Llama's forward is one code object, and dynamo keeps graphs per code object. With the
    module guards skipped and inductor's freezing folding the weights into the graph, the second of two
    compiled models once ran the first one's graph, its weights included (chapter 06's INT8 and INT4
    rungs ran the dense rung's graph: the same step time, no graph built). Each compiled forward has a
    frame of its own now, and compiling one model leaves another's graph in place."""
    from helpers import model_files

    first, _ = model_files.tiny_llama(seed=0, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
    second, _ = model_files.tiny_llama(seed=1, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        expected = first(ids).logits, second(ids).logits
    compiled = [static_decode.compile_model(m, "cpu", inductor_config={"freezing": True}) for m in (first, second)]
    with torch.inference_mode():
        got = first(input_ids=ids).logits, second(input_ids=ids).logits, first(input_ids=ids).logits
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[1], expected[1])  # its own weights, not the first model's
    torch.testing.assert_close(got[2], expected[0])
    assert [c.graphs for c in compiled] == [1, 1]  # one each, and the first one's kept (no reset)
