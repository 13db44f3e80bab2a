"""How a next-token distribution is formed from logits: one function, used for the base and every drafter alike.

The order matches transformers' logits warpers (temperature, then top-k, then top-p), so that speculative sampling
reproduces ``model.generate(do_sample=True, temperature=..., top_k=..., top_p=...)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings. ``temperature == 0`` means greedy decoding.

    Attributes:
        temperature: >= 0; 0 selects the argmax.
        top_k: keep the k most likely tokens (0 disables).
        top_p: keep the smallest set of tokens whose probability reaches top_p (1.0 disables).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        temperature = self.temperature
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature)
            or temperature < 0
        ):
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to ``logits [..., V]``; removed tokens get ``-inf``.

    At temperature 0 the logits are returned unscaled (callers take the argmax).
    """
    if params.greedy:
        return logits
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= 1 - params.top_p
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, sorted_index, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The sampling distribution ``[..., V]`` for ``logits [..., V]``; one-hot on the argmax at temperature 0."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(torch.float32)
    return warp_logits(logits, params).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of ``probs [..., V]``; returns ``[...]`` long."""
    flat = probs.reshape(-1, probs.shape[-1])
    drawn = torch.multinomial(flat, 1, generator=generator)
    return drawn.reshape(probs.shape[:-1])
