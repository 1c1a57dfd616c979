"""The helpers run on both pinned transformers lines (4.57.x legacy, 5.x current).

These tests run in whichever venv runs pytest: `make test` (current set) and `make test-legacy`
(legacy set) together cover both lines.
"""
from __future__ import annotations

import re
import types
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from helpers import versions

REPO = Path(__file__).resolve().parent.parent
CORE = ("transformers", "tokenizers", "huggingface_hub", "accelerate", "numpy", "pandas", "matplotlib")


def _pins(path):
    pins = {}
    for line in (REPO / path).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s#]+)", line)
        if match:
            pins[match.group(1).lower().replace("-", "_")] = match.group(2)
    return pins


def test_this_venv_holds_one_pinned_set():
    """The core packages all come from requirements-common.txt or all from requirements-legacy.txt."""
    line = versions.transformers_line()
    pins = _pins("requirements-common.txt" if line == "5.x" else "requirements-legacy.txt")
    installed = {name: version(name) for name in CORE}
    assert {name: pins[name] for name in CORE} == installed


def test_transformers_line_names_the_major(monkeypatch):
    assert versions.transformers_line("4.57.6") == "4.x"
    assert versions.transformers_line("5.24.0.dev0") == "5.x"
    import transformers

    for installed, line in (("4.57.6", "4.x"), ("5.24.0", "5.x")):  # without an argument: the installed one
        monkeypatch.setattr(transformers, "__version__", installed)
        assert versions.transformers_line() == line


def test_both_lines_pass_the_floor_and_older_ones_fail():
    versions.check_transformers_floor("4.57.6")
    versions.check_transformers_floor("5.24.0")
    assert versions.check_transformers("4.57.6") is None and versions.check_transformers("5.24.0") is None
    with pytest.raises(ImportError, match=r"transformers >= 4\.56\.0.*requirements-legacy\.txt"):
        versions.check_transformers_floor("4.55.4")
    assert "outside the tested range" in versions.check_transformers("6.0.0")


def test_cache_argument_follows_the_signature():
    def renamed(input_ids=None, cache=None):
        return None

    def classic(input_ids=None, past_key_values=None):
        return None

    assert versions.cache_argument(types.SimpleNamespace(forward=renamed)) == "cache"
    assert versions.cache_argument(types.SimpleNamespace(forward=classic)) == "past_key_values"
    assert versions.cache_argument(types.SimpleNamespace(forward=len)) in ("cache", "past_key_values")


def test_a_cached_decode_step_works_on_this_transformers(tiny_model):
    """Prefill into a DynamicCache from the config, then one decode step through the detected keyword."""
    model, tokenizer = tiny_model
    ids = tokenizer("hello there", return_tensors="pt")["input_ids"]
    keyword = versions.cache_argument(model)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, **{keyword: cache})
        returned = versions.cache_of(out)
        assert returned is cache and cache.get_seq_length() == ids.shape[1]
        step = model(input_ids=out.logits[:, -1:].argmax(-1), use_cache=True, **{keyword: returned})
        assert versions.cache_of(step).get_seq_length() == ids.shape[1] + 1
        # the same step without a cache gives the same next-token logits
        full = model(input_ids=torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1))
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], rtol=1e-4, atol=1e-4)


def test_cache_of_reads_either_name():
    cache = object()
    assert versions.cache_of({"past_key_values": cache}) is cache
    assert versions.cache_of({"cache": cache, "past_key_values": None}) is cache
    assert versions.cache_of({"logits": 1}) is None


class _Quantizer:
    def __init__(self):
        self.called = False

    def remove_quantization_config(self, model):
        self.called = True
        del model.hf_quantizer
        del model.config.quantization_config


def test_drop_quantization_config_with_and_without_a_quantizer():
    quantizer = _Quantizer()
    with_quantizer = types.SimpleNamespace(hf_quantizer=quantizer,
                                           config=types.SimpleNamespace(quantization_config={"q": 1}))
    versions.drop_quantization_config(with_quantizer)
    assert quantizer.called and not hasattr(with_quantizer.config, "quantization_config")
    leftover = types.SimpleNamespace(config=types.SimpleNamespace(quantization_config={"q": 1},
                                                                  _pre_quantization_dtype=torch.float32))
    versions.drop_quantization_config(leftover)
    assert not hasattr(leftover.config, "quantization_config")
    assert not hasattr(leftover.config, "_pre_quantization_dtype")
    versions.drop_quantization_config(types.SimpleNamespace(config=types.SimpleNamespace()))  # nothing to do


def test_each_transformers_line_converts_into_its_own_cache_folder(tmp_path):
    assert versions.converted_model_folder("smollm2-135m", "5.24.0") == "smollm2-135m"
    assert versions.converted_model_folder("smollm2-135m", "4.57.6") == "smollm2-135m-transformers4"
    from helpers.model_files import embedded_cache_dir

    folder = embedded_cache_dir(tmp_path)
    assert folder.parent == tmp_path / "models"
    assert folder.name == versions.converted_model_folder("smollm2-135m")
