"""Quality of a changed model: perplexity on held-out text, top-1 agreement, logit differences.

Taught in ``05_int8_quantization.ipynb``. A quantized model can still answer "The capital of
France is Paris." while its next-token distribution is badly damaged; these numbers see that.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from . import backend

HELDOUT_TEXT = Path(__file__).resolve().parent.parent / "data" / "heldout_text.txt"


def load_heldout_text(path: "str | Path | None" = None) -> str:
    """The shipped held-out prose, without its header lines (those starting with ``#``)."""
    path = Path(path) if path else HELDOUT_TEXT
    if not path.exists():
        raise FileNotFoundError(f"held-out text {path} is missing; it ships in data/ with the workbook")
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")).strip()


def encode(tokenizer, text: str, max_tokens: Optional[int] = None) -> torch.Tensor:
    """Token ids (1, T) of ``text`` with the tokenizer's BOS when it adds one, cut to ``max_tokens``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text must be a non-empty string")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 2):
        raise ValueError(f"max_tokens={max_tokens!r} is not valid; it must be an integer >= 2 or None")
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    if max_tokens is not None:
        ids = ids[:, :max_tokens]
    if ids.shape[1] < 2:
        raise ValueError("text is too short: perplexity needs at least 2 tokens")
    return ids


def perplexity(model, tokenizer, text: str, max_tokens: Optional[int] = None,
               window: int = 1024) -> float:
    """Perplexity of ``model`` on ``text`` (first ``max_tokens`` tokens), windows of ``window``."""
    return evaluate(model, encode(tokenizer, text, max_tokens), window=window)["perplexity"]


def agreement(reference: torch.Tensor, candidate: torch.Tensor) -> dict:
    """Top-1 agreement (fraction of positions with the same argmax) and max / mean |logit diff|."""
    if reference.shape != candidate.shape:
        raise ValueError(f"logit shapes differ: reference {tuple(reference.shape)}, "
                         f"candidate {tuple(candidate.shape)}")
    diff = (reference.detach().float() - candidate.detach().float()).abs()
    return {
        "top1_agreement": float((reference.detach().argmax(-1) == candidate.detach().argmax(-1))
                                .float().mean()),
        "max_abs_logit_diff": float(diff.max()),
        "mean_abs_logit_diff": float(diff.mean()),
    }


@torch.inference_mode()
def evaluate(model, input_ids: torch.Tensor, reference_logits: Optional[torch.Tensor] = None,
             window: int = 1024, return_logits: bool = False) -> dict:
    """Perplexity on ``input_ids`` (one sequence) and, given reference logits, top-1 agreement and
    logit diffs.

    The float32 logits are computed in non-overlapping windows of ``window`` tokens (at most the
    model's ``max_position_embeddings``): each window starts a fresh context, which keeps memory
    bounded for long texts, so a target that starts a window is not scored.
    """
    window = min(window, getattr(model.config, "max_position_embeddings", None) or 2048)
    ids = input_ids.to(backend.model_device(model))
    chunks = []
    for start in range(0, ids.shape[1], window):
        out = model(input_ids=ids[:, start:start + window], use_cache=False)
        chunks.append(out.logits[0].float().cpu())
    logits = torch.cat(chunks)
    targets = input_ids[0].cpu()
    keep = torch.ones(targets.shape[0] - 1, dtype=torch.bool)
    keep[window - 1::window] = False
    nll = F.cross_entropy(logits[:-1][keep], targets[1:][keep], reduction="mean")
    out = {"perplexity": float(math.exp(nll.item())), "tokens": int(input_ids.shape[1])}
    if reference_logits is not None:
        out.update(agreement(reference_logits, logits))
    if return_logits:
        out["logits"] = logits
    return out
