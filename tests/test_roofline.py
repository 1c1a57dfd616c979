"""Roofline arithmetic against hand-computed values, and the specs table's sourcing rules."""
import pytest

from helpers import batching_study, end_to_end_study, roofline


def test_llama2_7b_parameters_match_the_published_count():
    # 6,738,415,616 parameters is the count of meta-llama/Llama-2-7b-hf's safetensors.
    assert roofline.llama_parameter_count(**roofline.LLAMA2_7B_CONFIG) == 6_738_415_616
    assert roofline.llama2_weight_bytes("float16") == 2 * 6_738_415_616
    assert roofline.llama2_weight_bytes("int8") == 6_738_415_616


def test_parameter_formula_matches_a_real_model(tiny_model):
    model, _ = tiny_model
    cfg = model.config
    counted = roofline.llama_parameter_count(
        cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers,
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.tie_word_embeddings)
    assert counted == sum(p.numel() for p in model.parameters())


def test_ceiling_on_1_6_tbps_is_about_118_tokens_per_second():
    ceiling = roofline.decode_ceiling_tok_s(1600, roofline.llama2_weight_bytes("float16"))
    # 1.6e12 / 13.4768e9 = 118.72
    assert ceiling == pytest.approx(118.72, abs=0.01)


def test_required_bandwidth_for_the_guides_batch1_claim():
    weights = roofline.llama2_weight_bytes("float16")
    assert end_to_end_study.required_bandwidth_gbps(2500, weights) == pytest.approx(33_692, rel=1e-3)
    assert end_to_end_study.required_bandwidth_gbps(3500, weights) == pytest.approx(47_169, rel=1e-3)
    # round trip
    bw = end_to_end_study.required_bandwidth_gbps(16.5, weights)
    assert roofline.decode_ceiling_tok_s(bw, weights) == pytest.approx(16.5)


def test_prefill_floor_and_verdicts():
    # 512 tokens x 2 x 6.738e9 FLOP at 300 TFLOPS = 23.0 ms
    assert end_to_end_study.prefill_floor_ms(512, 6_738_415_616, 300) == pytest.approx(23.0, abs=0.05)
    assert end_to_end_study.claim_verdict(2500, 118.7) == "impossible"
    assert end_to_end_study.claim_verdict(16.5, 118.7) == "plausible"


@pytest.mark.parametrize("fn,args,name", [
    (roofline.decode_ceiling_tok_s, (0, 1e9), "bandwidth_gbps"),
    (roofline.decode_ceiling_tok_s, (100, -1), "weight_bytes"),
    (end_to_end_study.required_bandwidth_gbps, ("fast", 1e9), "tokens_per_s"),
    (roofline.llama2_weight_bytes, ("fp8",), "dtype"),
    (roofline.llama2_weight_bytes, ("float16", "8b"), "size"),
])
def test_bad_input_names_the_parameter(fn, args, name):
    with pytest.raises(ValueError, match=name):
        fn(*args)


def test_specs_table_has_sources_and_no_typed_cpu_row():
    specs = roofline.load_specs()
    assert set(specs["status"]) <= {"official", "unofficial"}
    assert specs["source"].str.len().min() > 10
    assert not specs["device"].str.lower().str.contains("cpu").any()
    # Huawei publishes no per-chip 910B bandwidth: those rows must stay unofficial.
    assert (specs.loc[specs["device"].str.contains("910B"), "status"] == "unofficial").all()


def test_a_bad_specs_cell_is_named_by_file_row_and_column(tmp_path):
    path = tmp_path / "specs.csv"
    header = "device,variant,memory_gb,bandwidth_gbps,fp16_dense_tflops,status,source,note\n"
    path.write_text(header + "X,X1,1,100,,official,a datasheet,\nY,Y1,1,lots,,guess,,\n")
    with pytest.raises(ValueError) as err:
        roofline.load_specs(path)
    message = str(err.value)
    assert message.startswith(str(path))
    for problem in ("row 2 (Y1), column source: empty", "row 2 (Y1), column status: 'guess'",
                    "row 2 (Y1), column bandwidth_gbps: 'lots' is not a number"):
        assert problem in message, problem
    assert "row 1" not in message  # the good row is not blamed
    path.write_text(header + "X,X1,1,100,,official,a datasheet,\n")
    assert roofline.load_specs(path)["fp16_dense_tflops"].isna().all()  # an empty optional figure is missing
    path.write_text("device,hbm_bandwidth_gbps,source\nX,100,s\n")  # another table's column names
    with pytest.raises(ValueError, match=r"missing columns \['variant', 'memory_gb', 'bandwidth_gbps'"):
        roofline.load_specs(path)


def test_kv_cache_bytes_of_llama2_7b_by_hand():
    # 2 (K, V) x 32 layers x 32 heads x 128 head_dim x 2 bytes = 512 KiB per token in fp16
    assert roofline.kv_cache_bytes_per_token(roofline.LLAMA2_7B_CONFIG) == 524288
    assert roofline.kv_cache_bytes(roofline.LLAMA2_7B_CONFIG, 4, 1000) == 4 * 1000 * 524288
    assert roofline.kv_cache_bytes(roofline.LLAMA2_7B_CONFIG, 1, 10, "float32") == 10 * 2 * 524288


def test_kv_cache_uses_grouped_query_heads_and_transformers_configs():
    from transformers import LlamaConfig

    gqa = LlamaConfig(hidden_size=8192, num_attention_heads=64, num_key_value_heads=8, num_hidden_layers=80)
    assert roofline.kv_cache_bytes_per_token(gqa) == 2 * 80 * 8 * 128 * 2
    assert roofline.kv_cache_bytes_per_token(LlamaConfig()) == 524288  # the defaults are Llama-2-7B


def test_kv_growth_and_its_inverse_agree():
    w = roofline.llama2_weight_bytes()
    cfg = roofline.LLAMA2_7B_CONFIG
    growth = batching_study.kv_memory_growth_pct(cfg, 4, 2048, w)
    assert growth == pytest.approx(100 * 3 * 2048 * 524288 / (w + 2048 * 524288))
    assert batching_study.context_for_kv_growth(cfg, 4, growth, w) == pytest.approx(2048)
    assert batching_study.kv_memory_growth_pct(cfg, 1, 2048, w) == 0
    assert batching_study.context_for_kv_growth(cfg, 2, 150, w) == float("inf")  # 2 sequences never add 150 %


@pytest.mark.parametrize("call", [
    lambda: roofline.kv_cache_bytes_per_token({"hidden_size": 4096}),
    lambda: roofline.kv_cache_bytes_per_token(roofline.LLAMA2_7B_CONFIG, "fp8"),
    lambda: roofline.kv_cache_bytes(roofline.LLAMA2_7B_CONFIG, -1, 10),
    lambda: roofline.kv_cache_bytes(roofline.LLAMA2_7B_CONFIG, 2, 1.5),
    lambda: batching_study.context_for_kv_growth(roofline.LLAMA2_7B_CONFIG, 1, 15, 1e9),
    lambda: batching_study.kv_memory_growth_pct(roofline.LLAMA2_7B_CONFIG, 4, 100, 0),
])
def test_kv_functions_name_the_bad_parameter(call):
    with pytest.raises(ValueError, match="config|dtype|batch_size|context_len|weight_bytes"):
        call()
