"""What a decoder accepts as prompts: strings, token ids, tensors and conversations, encoded and checked.

One prompt is a string (tokenised raw, with the tokenizer's special tokens), token ids (a list, or a ``[T]`` /
``[1, T]`` tensor) or a conversation (a list of ``{"role", "content"}`` messages, rendered by the tokenizer's chat
template); a list of prompts (one kind) or a ``[B, T]`` tensor is a batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specheads.loading import vocab_size
from specheads.prompts import check_unicode, render_conversation

# One prompt of generate/stream: raw text, token ids, or a conversation of {"role", "content"} messages.
PromptInput = str | Sequence[int] | torch.Tensor | Sequence[Mapping[str, str]]


def encode_prompts(
    prompt: Any, tokenizer: PreTrainedTokenizerBase | None, model: PreTrainedModel
) -> tuple[list[torch.Tensor], bool]:
    """``([1, T] tensors], batched)``: a list of prompts or conversations, a ``[B, T]`` tensor, or one prompt
    (a string, token ids, a ``[T]`` / ``[1, T]`` tensor or one conversation)."""
    if isinstance(prompt, torch.Tensor) and prompt.dim() == 2 and prompt.shape[0] != 1:
        if prompt.shape[0] == 0:
            raise ValueError("the list of prompts is empty")
        return [encode_prompt(row, tokenizer, model) for row in prompt], True
    if is_conversation(prompt):
        return [encode_prompt(prompt, tokenizer, model)], False
    if isinstance(prompt, (list, tuple)) and (not prompt or not isinstance(prompt[0], int)):
        if not prompt:
            raise ValueError(
                "the list of prompts is empty (a conversation, too, needs at least one {'role', 'content'} message)"
            )
        kinds = {prompt_kind(p) for p in prompt} - {"empty"}
        if len(kinds) > 1:
            raise ValueError("the prompts mix types (strings, token-id lists, tensors, conversations); give one kind")
        encoded = []
        for index, item in enumerate(prompt):
            if kinds == {"conversation"} and prompt_kind(item) == "empty":
                raise ValueError(f"prompt {index}: the conversation is empty; give at least one message")
            listed = isinstance(item, (list, tuple)) and prompt_kind(item) == "token ids"
            if listed and not all(isinstance(t, int) for t in item):
                raise ValueError(f"prompt {index} is not a list of token ids")
            try:
                encoded.append(encode_prompt(item, tokenizer, model))
            except ValueError as error:
                raise ValueError(f"prompt {index}: {error}") from error
        return encoded, True
    return [encode_prompt(prompt, tokenizer, model)], False


def encode_prompt(
    prompt: PromptInput, tokenizer: PreTrainedTokenizerBase | None, model: PreTrainedModel
) -> torch.Tensor:
    """One prompt as ``[1, T]`` ids on the model's device.

    A string is tokenised raw, with the tokenizer's special tokens; a conversation goes through
    :func:`specheads.prompts.render_conversation` (the chat template with the generation prompt, tokenised
    without added special tokens: the template writes its own BOS).
    """
    device = model.device
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a string prompt needs a tokenizer; pass tokenizer= or give token ids")
        if not prompt:
            raise ValueError("the prompt is empty")
        check_unicode(prompt, "the prompt")
        ids = torch.tensor([tokenizer(prompt)["input_ids"]], dtype=torch.long)
    elif is_conversation(prompt):
        ids = torch.tensor([render_conversation(tokenizer, prompt)], dtype=torch.long)
    elif isinstance(prompt, torch.Tensor):
        ids = prompt.long()
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2:
            raise ValueError(f"a tensor prompt must be [T] or [B, T], got shape {tuple(prompt.shape)}")
    else:
        ids = torch.tensor([list(prompt)], dtype=torch.long)
    if ids.shape[1] == 0:
        raise ValueError("the prompt is empty")
    vocab = vocab_size(model)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ValueError(f"prompt token ids must lie in [0, {vocab}); got {int(ids.min())}..{int(ids.max())}")
    return ids.to(device)


def check_lengths(prompts: list[torch.Tensor], max_length: int | None, first_index: int = 0) -> None:
    """Refuse a prompt that leaves no position to generate in (``max_length``: the model's position limit)."""
    for index, ids in enumerate(prompts):
        if max_length is not None and ids.shape[1] >= max_length:
            where = f"prompt {first_index + index} has" if len(prompts) > 1 or first_index else "the prompt has"
            raise ValueError(
                f"{where} {ids.shape[1]} tokens; the model allows at most {max_length} positions, so nothing can "
                "be generated"
            )


def max_positions(model: PreTrainedModel) -> int | None:
    """The model's position limit (``max_position_embeddings`` or its older names), None when it has none."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def is_conversation(prompt: Any) -> bool:
    """A conversation: a non-empty list of messages (mappings), checked by ``check_messages`` when encoded."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], Mapping)


def prompt_kind(prompt: Any) -> str:
    """What one item of a list of prompts is: ``"string"``, ``"tensor"``, ``"conversation"``, ``"token ids"`` or
    ``"empty"`` (an empty list, which could be either of the last two)."""
    if isinstance(prompt, str):
        return "string"
    if isinstance(prompt, torch.Tensor):
        return "tensor"
    if isinstance(prompt, (list, tuple)) and not prompt:
        return "empty"
    return "conversation" if is_conversation(prompt) else "token ids"
