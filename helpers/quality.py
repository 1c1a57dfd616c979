"""Quality of a changed model: perplexity on held-out text, top-1 agreement, logit differences.

Layer: measurement. Taught in ``05_int8_quantization.ipynb``. A quantized model can still answer "The capital of
France is Paris." while its next-token distribution is badly damaged; these numbers see that.

Every figure is computed in float32 from the model's logits, and none of them can be NaN or
infinite: a forward that overflowed (float16 stops at 65504) would otherwise record perplexity nan
and a top-1 agreement of 0, which reads like a damaged model rather than a broken run. Non-finite
logits or figures raise ``NonFiniteQuality`` naming the figure, the model and the reason.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from . import backend

HELDOUT_TEXT = Path(__file__).resolve().parent.parent / "data" / "heldout_text.txt"


class NonFiniteQuality(ValueError):
    """A quality figure (or the logits it comes from) is NaN or infinite; the message says which."""


def _dtype_of(model) -> Optional[torch.dtype]:
    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return None if param is None else param.dtype


def check_finite_logits(logits: torch.Tensor, what: str, dtype: Optional[torch.dtype] = None) -> None:
    """Raise ``NonFiniteQuality`` when ``logits`` hold NaN or inf: how many, and the likely reason
    (an overflow of a 16-bit forward, ``dtype`` being the model's)."""
    nan, inf = int(torch.isnan(logits).sum()), int(torch.isinf(logits).sum())
    if not nan and not inf:
        return
    counts = " and ".join(f"{n} {kind} values" for n, kind in ((inf, "inf"), (nan, "NaN")) if n)
    name = backend.dtype_name(dtype) if dtype is not None else "the model's dtype"
    if dtype is torch.float16:
        why = ("the float16 forward overflowed (float16's largest value is 65504; an intermediate such "
               "as an unscaled int8 product or a large activation went past it)")
    else:
        why = f"the {name} forward produced non-finite values (an overflow, a division by zero or NaN weights)"
    raise NonFiniteQuality(f"{what}: logits contain {counts} of {logits.numel()}: {why}; no figure is "
                           "recorded from them")


def _finite(value: float, figure: str, what: str) -> float:
    if not math.isfinite(value):
        raise NonFiniteQuality(f"{what}: {figure} is {value} although its logits are finite")
    return value


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


def agreement(reference: torch.Tensor, candidate: torch.Tensor, label: str = "candidate") -> dict:
    """Top-1 agreement (fraction of positions with the same argmax) and max / mean |logit diff|, in
    float32; NaN or inf in either set of logits raises ``NonFiniteQuality``."""
    if reference.shape != candidate.shape:
        raise ValueError(f"logit shapes differ: reference {tuple(reference.shape)}, "
                         f"candidate {tuple(candidate.shape)}")
    reference, candidate = reference.detach().float(), candidate.detach().float()
    check_finite_logits(reference, "top-1 agreement and logit differences of the reference")
    check_finite_logits(candidate, f"top-1 agreement and logit differences of {label}")
    diff = (reference - candidate).abs()
    what = f"logit differences of {label}"
    return {
        "top1_agreement": float((reference.argmax(-1) == candidate.argmax(-1)).float().mean()),
        "max_abs_logit_diff": _finite(float(diff.max()), "max |logit diff|", what),
        "mean_abs_logit_diff": _finite(float(diff.mean()), "mean |logit diff|", what),
    }


@torch.inference_mode()
def evaluate(model, input_ids: torch.Tensor, reference_logits: Optional[torch.Tensor] = None,
             window: int = 1024, return_logits: bool = False, label: Optional[str] = None) -> dict:
    """Perplexity on ``input_ids`` (one sequence) and, given reference logits, top-1 agreement and
    logit diffs. ``label`` names the model or variant in the error raised for NaN or inf logits.

    The float32 logits are computed in non-overlapping windows of ``window`` tokens (at most the
    model's ``max_position_embeddings``): each window starts a fresh context, which keeps memory
    bounded for long texts, so a target that starts a window is not scored.
    """
    window = min(window, getattr(model.config, "max_position_embeddings", None) or 2048)
    ids = input_ids.to(backend.model_device(model))
    logits = torch.cat([model(input_ids=ids[:, start:start + window], use_cache=False).logits[0].float().cpu()
                        for start in range(0, ids.shape[1], window)])
    label = label or type(model).__name__
    check_finite_logits(logits, f"perplexity of {label}", _dtype_of(model))
    targets = input_ids[0].cpu()
    keep = torch.ones(targets.shape[0] - 1, dtype=torch.bool)
    keep[window - 1::window] = False
    nll = F.cross_entropy(logits[:-1][keep], targets[1:][keep], reduction="mean").item()
    ppl = _finite(math.exp(nll) if nll < 709 else math.inf, "perplexity", label)  # exp(709) ~ float max
    out = {"perplexity": ppl, "tokens": int(input_ids.shape[1])}
    if reference_logits is not None:
        out.update(agreement(reference_logits, logits, label))
    if return_logits:
        out["logits"] = logits
    return out
