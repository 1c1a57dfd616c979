"""Chapter 06's rungs: plain data, cumulative, each skipping cleanly where it does not apply."""
import pytest
import torch

from helpers import ladder, ops, quant, round_robin, rungs, static_decode


@pytest.fixture
def climb(monkeypatch):
    calls = []
    monkeypatch.setattr(static_decode, "compile_model", lambda *a, **k: calls.append("compile"))
    monkeypatch.setattr(static_decode, "restore_eager", lambda *a, **k: calls.append("restore"))
    monkeypatch.setattr(ops, "apply_fused_modules", lambda m: {"impl": "reference", "swiglu_impl": "reference",
                                                                "rmsnorm": 3, "mlp": 2})
    monkeypatch.setattr(quant, "quantize_model_int8", lambda m, impl: {"impl": "int8pack", "layers": 7,
                                                                       "bytes_before": 10, "bytes_after": 5})
    c = rungs.Climb("tiny", None, "cpu", "float32", "hello", batch_size=4, load=lambda: object())
    c.calls = calls
    return c


def _by_name(c):
    return {r.name: r for r in rungs.rungs(c)}


def test_rungs_are_data_with_the_run_s_words(climb):
    names = [r.name for r in rungs.rungs(climb)]
    assert names[0] == "native eager" and names[-1] == "+ batch 4" and len(set(names)) == len(names)
    # what pages and answers match: the ids, the same whatever the batch or the language
    assert [r.id for r in rungs.rungs(climb)] == ["native_eager", "runtime_options", "static_cache", "greedy_loop",
                                                  "fused_operators", "graph_mode", "int8_weights", "int4_weights",
                                                  "batched"]
    text = {r.name: r.description for r in rungs.rungs(climb)}
    assert "float32" in text["native eager"] and "eager" in text["+ INT8"]
    assert "bfloat16" not in text["+ INT4 g32"]  # the activations' dtype is the run's


def test_the_climb_is_cumulative_and_graph_mode_off_skips_cleanly(climb):
    r = _by_name(climb)
    assert not r["native eager"].prepare().static_cache
    assert r["+ static cache"].prepare().static_cache and not climb.loop
    v = r["+ greedy loop"].prepare()
    assert v.static_cache and v.greedy_loop
    r["+ fused operators"].prepare()
    assert rungs.fusion_description(climb.fusion).startswith("RMSNorm reference, SwiGLU reference")
    with pytest.raises(round_robin.RungSkipped, match="graph_mode is off"):
        r["+ graph mode"].prepare()
    with pytest.raises(round_robin.RungSkipped):  # the NPU switches live in torch_npu
        r["+ runtime options"].prepare()
    assert r["+ batch 4"].prepare().prompts == ["hello"] * 4 and "compile" not in climb.calls


def test_int8_is_skipped_when_off_or_slower_and_recompiles_in_graph_mode(climb, monkeypatch):
    climb.int8 = False
    with pytest.raises(round_robin.RungSkipped, match="int8 is off"):
        _by_name(climb)["+ INT8"].prepare()
    climb.int8 = True
    rows = [{"kernel": "dense float32", "decode_ms": 9.0, "decode_p10_ms": 8.9, "decode_p90_ms": 9.1},
            {"kernel": "int8pack", "decode_ms": 12.0, "decode_p10_ms": 11.9, "decode_p90_ms": 12.1}]
    monkeypatch.setattr(quant, "choose_cpu_w8a16_kernel",
                        lambda m: {"rows": rows, "decision": {"loses_to_dense": True, "beats_dense": False}})
    monkeypatch.setattr(ladder, "int8_skip_reason", lambda rows: "dense was faster")
    with pytest.raises(round_robin.RungSkipped, match="dense was faster"):
        _by_name(climb)["+ INT8"].prepare()
    # a tie is skipped too: the INT8 rung runs only where its kernel is faster beyond the spread
    monkeypatch.setattr(quant, "choose_cpu_w8a16_kernel",
                        lambda m: {"rows": rows, "decision": {"loses_to_dense": False, "beats_dense": False}})
    with pytest.raises(round_robin.RungSkipped, match="dense was faster"):
        _by_name(climb)["+ INT8"].prepare()
    monkeypatch.setattr(quant, "choose_cpu_w8a16_kernel",
                        lambda m: {"rows": rows, "decision": {"loses_to_dense": False, "beats_dense": True}})
    climb.graph_mode = True
    climb.calls.clear()
    r = _by_name(climb)
    graph = r["+ graph mode"].prepare().model
    int8 = r["+ INT8"].prepare()
    assert climb.calls == ["compile", "compile"]  # quantized a copy, then compiled it once more
    assert int8.model is not graph  # the graph rung keeps its model for the interleaved rounds
    assert int8.weights.startswith("int8 weights (int8pack)")
    assert rungs.weight_formats(climb) == [{"format": "INT8", "bytes_before": 10, "bytes_after": 5, "layers": 7,
                                            "impl": "int8pack", "lm_head": None, "kept_dense": None}]
    climb.int8_info["kept_dense"] = [("lm_head", "N=128256 > 65535, the limit of npu_weight_quant_batchmatmul")]
    assert rungs.weight_formats(climb)[0]["kept_dense"] == \
        "lm_head (N=128256 > 65535, the limit of npu_weight_quant_batchmatmul)"


@pytest.mark.parametrize("head_format, head_bits", [
    ("Q4_0", 4), pytest.param("Q8_0", 8, marks=pytest.mark.slow)])  # Q8_0: the embedded model's, run by chapter 06
def test_the_int4_rung_reads_lm_head_in_the_bits_of_the_gguf_s_output_matrix(head_format, head_bits, monkeypatch):
    # llama.cpp reads a Q4_0 file's output matrix in 4 bits: the rung's lm_head is INT4 then, else INT8
    from conftest import small_model_path

    from helpers import models

    if quant.int4_problem("cpu"):
        pytest.skip(quant.int4_problem("cpu"))
    path = str(small_model_path())
    assert ladder.output_format(ladder.model_gguf(path)) == "F16"  # read from the file itself
    monkeypatch.setattr(ladder, "output_format", lambda gguf: head_format)
    # the kernel timing and the agreement check run in chapter 06 itself; here only what is quantized
    monkeypatch.setattr(quant, "time_int4_activations", lambda m, skip: {"act_dtype": torch.bfloat16, "rows": []})
    monkeypatch.setattr(ladder, "weight_format_check", lambda before, after, tok: {})
    lm, tokenizer = models.load_model(path, dtype="float32", device="cpu")
    c = rungs.Climb(path, tokenizer, "cpu", lm.dtype, "hello", model=lm)
    variant = _by_name(c)["+ INT4 g32"].prepare()
    assert isinstance(variant.model.lm_head, quant.Int4Linear) == (head_bits == 4)
    assert isinstance(variant.model.model.layers[0].mlp.up_proj, quant.Int4Linear)
    assert (c.int4_info["lm_head"] == c.int4_info["impl"]) == (head_bits == 4)  # what the page names


def test_the_output_matrix_format_of_the_embedded_gguf_is_its_tied_q8_0_embedding():
    from helpers.model_files import EMBEDDED_MODEL

    assert ladder.output_format(ladder.model_gguf(EMBEDDED_MODEL)) == "Q8_0"


def test_int4_off_or_unsupported_says_why(climb, monkeypatch):
    climb.int4 = False
    with pytest.raises(round_robin.RungSkipped, match="int4 is off"):
        _by_name(climb)["+ INT4 g32"].prepare()
    climb.int4 = True
    monkeypatch.setattr(quant, "int4_problem", lambda device: "no INT4 kernel on this device")
    with pytest.raises(round_robin.RungSkipped, match="no INT4 kernel"):
        _by_name(climb)["+ INT4 g32"].prepare()
