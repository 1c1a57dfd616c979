"""The decode loop of chapter 06's static rungs: greedy decoding by hand over ``model.forward`` and a
``StaticCache`` (layer: chapter studies; taught in 06_optimization_ladder, which prints it).

``generate`` runs, for every new token, logits processors, stopping criteria, the update of its
keyword arguments and ``prepare_inputs_for_generation``: a few milliseconds of Python per token,
which a 135M-parameter model on a CPU notices. ``GreedyLoop.__call__`` is the whole loop: one
forward over the prompt (the prefill), then one forward, one argmax and the next position per token.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch

from . import versions


def use_greedy_loop(model) -> GreedyLoop:
    """Replace ``model.generate`` by a ``GreedyLoop`` (undo with ``restore_generate``)."""
    restore_generate(model)
    loop = GreedyLoop(model)
    model.generate = loop
    return loop


def greedy_loop_of(model) -> Optional[GreedyLoop]:
    found = getattr(model, "generate", None)
    return found if isinstance(found, GreedyLoop) else None


def restore_generate(model) -> None:
    if isinstance(getattr(model, "generate", None), GreedyLoop):
        del model.generate  # the instance attribute: the class's generate shows again


class GreedyLoop:
    """``model.generate`` replaced by a greedy loop over ``model.forward`` and a ``StaticCache``.

    ``generate`` runs, for every new token, logits processors, stopping criteria, the update of its
    keyword arguments and ``prepare_inputs_for_generation``: a few milliseconds of Python per token,
    which a 135M-parameter model on a CPU notices. This loop does only what greedy decoding with a
    static cache needs (one forward, an argmax, the next position) and takes the same arguments,
    so ``helpers.generation.measure_generation`` times it with the same protocol as ``generate``.
    It always produces ``max_new_tokens`` tokens (the workbook's protocol sets ``min_new_tokens``
    equal to it) and needs the static cache of ``static_generate_kwargs`` (one prefill shape, one
    decode shape: two graphs per request size, as with ``generate``).
    """

    def __init__(self, model):
        self.model = model
        self.cache_argument = versions.cache_argument(model)
        params = inspect.signature(type(model).forward).parameters
        self.keep_last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    def __call__(self, input_ids, attention_mask=None, *, max_new_tokens: int, min_new_tokens=None,
                 do_sample: bool = False, pad_token_id=None, **kwargs):
        from transformers import StaticCache

        if do_sample:
            raise ValueError("do_sample=True is not valid for GreedyLoop; it decodes greedily")
        if min_new_tokens not in (None, max_new_tokens):
            raise ValueError(f"min_new_tokens={min_new_tokens!r}: GreedyLoop always produces "
                             f"max_new_tokens={max_new_tokens} tokens")
        cache = kwargs.pop(self.cache_argument, None)
        kwargs.pop("disable_compile", None)
        # Stopping criteria are called after every new token, as generate calls them, so that
        # measure_generation's per-token clock (generation.StepStamps) stamps this loop's steps too; the
        # loop never stops early (the protocol always makes max_new_tokens tokens).
        criteria = list(kwargs.pop("stopping_criteria", None) or [])
        if kwargs:
            raise ValueError(f"GreedyLoop does not take {sorted(kwargs)}; it runs greedy decoding only")
        if not isinstance(cache, StaticCache):
            raise ValueError("GreedyLoop needs a StaticCache: pass static_generate_kwargs(...) "
                             "(measure_generation(static_cache=True))")
        batch, prompt = input_ids.shape
        length = cache_length(cache)
        if prompt + max_new_tokens > length:
            raise ValueError(f"max_new_tokens={max_new_tokens} does not fit the cache ({length} positions "
                             f"for a {prompt}-token prompt)")
        mask = positions = None
        if attention_mask is not None and not bool(attention_mask.all()):
            # Left padding: a mask of the cache's full length keeps one shape for every step.
            mask = attention_mask.new_ones(batch, length)
            mask[:, :prompt] = attention_mask
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        common = {"use_cache": True, self.cache_argument: cache, **self.keep_last_logits}
        # The first step is the prefill of the whole prompt, every later one a decode step of one token.
        token, position, cache_position = input_ids, positions, torch.arange(prompt, device=input_ids.device)
        tokens = []
        for step in range(max_new_tokens):
            out = self.model.forward(input_ids=token, attention_mask=mask, position_ids=position,
                                     cache_position=cache_position, **common)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token)
            for criterion in criteria:
                criterion(token)
            cache_position = torch.tensor([prompt + step], device=input_ids.device)
            position = None if positions is None else positions[:, -1:] + 1 + step
        return torch.cat([input_ids, *tokens], dim=1)


def cache_length(cache) -> int:
    """The number of positions a ``StaticCache`` holds (the method's name differs between lines)."""
    for name in ("get_max_length", "get_max_cache_shape"):
        method = getattr(cache, name, None)
        if callable(method):
            value = method()
            if isinstance(value, int) and value > 0:
                return value
    layers = getattr(cache, "layers", None) or [cache]
    value = getattr(layers[0], "max_cache_len", None)
    if isinstance(value, int) and value > 0:
        return value
    raise ValueError(f"cannot tell how many positions {type(cache).__name__} holds")
