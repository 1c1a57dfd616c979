"""scripts/make_wide_llama.py: one GGUF that transformers (through load_model) and llama.cpp both read.

Built at small widths (hidden 64, 2 layers) so the test takes seconds; the script's defaults are
Llama-2-7B's widths, checked here from the arguments it would use, not by writing 1.6 GB.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import dtype_choice, ladder, model_files, models, serving
from helpers.model_files import ModelLoadError, local_gguf, locate_embedded_gguf

REPO = Path(__file__).resolve().parent.parent
SMALL = dict(hidden=64, intermediate=160, heads=4, kv_heads=2)


def _load_script():
    spec = importlib.util.spec_from_file_location("make_wide_llama", REPO / "scripts" / "make_wide_llama.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_wide_llama"] = module
    spec.loader.exec_module(module)
    return module


wide = _load_script()


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wide")
    return wide.build(folder / "small.F16.gguf", layers=2, seed=0, **SMALL)


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory):
    """One model cache for this file's tests: the file is converted once, then read from there."""
    return tmp_path_factory.mktemp("wide-cache")


def test_same_arguments_write_the_same_bytes_and_another_seed_does_not(small_gguf, tmp_path):
    again = wide.build(tmp_path / "again.F16.gguf", layers=2, seed=0, **SMALL)
    other = wide.build(tmp_path / "other.F16.gguf", layers=2, seed=1, **SMALL)
    assert again.read_bytes() == small_gguf.read_bytes()
    assert other.read_bytes() != small_gguf.read_bytes()
    assert not list(tmp_path.glob("*.partial"))


def test_load_model_reads_the_file_and_its_folder_with_the_embedded_tokenizer(small_gguf, small_cache, monkeypatch):
    lm, tok = models.load_model(str(small_gguf), dtype="float32", device="cpu", cache_dir=small_cache)
    cfg = lm.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (64, 160, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
    assert not cfg.tie_word_embeddings and lm.lm_head.weight.data_ptr() != lm.model.embed_tokens.weight.data_ptr()
    # the tokenizer is the embedded SmolLM2's: same ids, and decode gives the text back
    from transformers import AutoTokenizer  # the tokenizer alone: the embedded weights are not needed here

    embedded_tok = AutoTokenizer.from_pretrained(model_files.ensure_embedded_cache(), local_files_only=True)
    text = "Decode reads every weight once per token. 你好!"
    ids = tok(text)["input_ids"]
    assert ids == embedded_tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert cfg.vocab_size == len(embedded_tok)
    # the folder that holds only this file loads the same weights (from the same converted copy)
    lm2, _ = models.load_model(str(small_gguf.parent), dtype="float32", device="cpu", cache_dir=small_cache)
    assert torch.equal(lm2.model.layers[1].mlp.down_proj.weight, lm.model.layers[1].mlp.down_proj.weight)
    # and chapter 07's vLLM is given that converted folder (a server loads folders, not GGUF files)
    monkeypatch.setenv("WORKBOOK_CACHE", str(small_cache))
    folder, local = serving.model_for_server(str(small_gguf))
    assert local and (Path(folder) / "config.json").exists()
    assert Path(folder) == model_files.gguf_cache_path(small_gguf, small_cache)


@pytest.mark.slow  # about 65 s: writes, converts and loads a Q8_0 and a Q4_0 file
def test_quantized_files_load_and_stay_close_to_the_float16_weights(small_gguf, tmp_path):
    dense, _ = models.load_model(str(small_gguf), dtype="float32", device="cpu", cache_dir=tmp_path)
    for kind, tolerance in (("Q8_0", 0.01), ("Q4_0", 0.2)):
        path = wide.build(tmp_path / f"small.{kind}.gguf", layers=2, seed=0, kind=kind, **SMALL)
        lm, _ = models.load_model(str(path), dtype="float32", device="cpu", cache_dir=tmp_path)
        a, b = lm.model.layers[0].mlp.up_proj.weight, dense.model.layers[0].mlp.up_proj.weight
        rel = float((a - b).norm() / b.norm())
        assert 0 < rel < tolerance, (kind, rel)


def test_llama_cpp_computes_the_same_logits_from_the_same_file(small_gguf, small_cache):
    llama_cpp = pytest.importorskip("llama_cpp")
    lm, tok = models.load_model(str(small_gguf), dtype="float32", device="cpu", cache_dir=small_cache)
    ids = tok("The bytes decide decode")["input_ids"]
    with torch.no_grad():
        ref = lm(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(model_path=str(small_gguf), n_ctx=64, logits_all=True, verbose=False)
    llm.eval(ids)
    out = np.asarray(llm.scores[:len(ids)])
    # a wrong rotary permutation of attn_q/attn_k would change every position after the first
    assert (out.argmax(-1) == ref.argmax(-1)).all()
    assert np.abs(out - ref).max() < 1e-2 * np.abs(ref).max()


def test_the_runner_path_reaches_dtype_auto_and_llama_cpp(small_gguf, small_cache, monkeypatch):
    monkeypatch.setenv("WORKBOOK_CACHE", str(small_cache))
    widths, source = dtype_choice.widths_of(str(small_gguf))
    assert widths["hidden_size"] == 64 and source.endswith("config.json")
    seen = {}
    monkeypatch.setattr(ladder.llamacpp, "measure", lambda gguf, *a, **k: seen.setdefault("gguf", gguf) and {"status": "ok"})
    ladder.llamacpp_reference(True, "cpu", str(small_gguf), [1, 2], 4, 1)
    assert seen["gguf"] == small_gguf.resolve()
    skipped = ladder.llamacpp_reference(True, "cpu", "tiny-random", [1, 2], 4, 1)
    assert skipped["status"] == "skipped" and "GGUF" in skipped["reason"]


def test_local_gguf_refuses_a_folder_with_two_files_naming_them(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="a.gguf, b.gguf"):
        local_gguf(tmp_path)
    assert local_gguf(tmp_path / "a.gguf") == (tmp_path / "a.gguf").resolve()
    assert local_gguf(tmp_path / "missing") is None


@pytest.mark.parametrize("kwargs, words", [
    (dict(layers=0), "--layers 0"),
    (dict(kind="Q5_K"), "--type 'Q5_K': choose one of F16, Q8_0, Q4_0"),
    (dict(kind="Q8_0", hidden=48, heads=4, kv_heads=2, intermediate=100), "multiples of 32"),
    (dict(hidden=64, heads=5, kv_heads=5), "--heads 5"),
])
def test_bad_arguments_name_the_parameter_and_the_valid_values(kwargs, words, tmp_path):
    with pytest.raises(SystemExit, match=words.replace("(", r"\(")):
        wide.build(tmp_path / "x.gguf", **{**dict(layers=2), **kwargs})


def test_defaults_are_llama_2_7b_widths_and_the_issue_s_parameter_count():
    assert (wide.LLAMA2_7B["hidden_size"], wide.LLAMA2_7B["intermediate_size"]) == (4096, 11008)
    fields = wide.tokenizer_fields(locate_embedded_gguf())
    vocab = len(next(value for key, value, *_ in fields if key == "tokenizer.ggml.tokens"))
    assert vocab == 49152
    assert round(wide.parameter_count(2, vocab) / 1e6) == 807  # 2 layers: 807 M parameters, 1.6 GB in F16
