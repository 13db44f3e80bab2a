"""GenerationConfig: every keyword of ``SpecDecoder.generate`` / ``stream`` in one frozen, validated dataclass.

The decoder, the CLI and distillation build one of these instead of passing loose keyword dictionaries: an unknown
keyword or a bad value is refused here, before any model runs, with the same message wherever it came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specheads.inference.acceptance import AcceptanceOptions, resolve_rule
from specheads.inference.sampling import SamplingParams

# Keywords that shape an EAGLE-2 dynamic tree (``tree="dynamic"``), and the DynamicTree field each one sets.
DYNAMIC_TREE_KWARGS = {"tree_top_k": "top_k", "depth": "depth", "total_tokens": "total_tokens"}


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: length, sampling, acceptance rule, tree, seeds.

    Attributes:
        max_new_tokens: tokens to generate at most (>= 1).
        temperature: 0 is greedy; otherwise sampled, with ``top_k`` (0 disables) and ``top_p`` (1.0 disables).
        acceptance: ``"auto"`` (greedy at temperature 0, else rejection sampling: both lossless), ``"greedy"``,
            ``"rejection"``, or a lossy rule: ``"typical"``, ``"threshold"``, ``"alpha"``.
        tree: a static tree (``"chain-K"``, a shipped tree name, a JSON file, a Medusa choice list), ``"auto"`` (the
            calibrated one) or ``"dynamic"`` / ``"dynamic-K-D-N"`` (EAGLE-2); None: the drafter's default.
        num_speculative_tokens: K of chain drafters (None: the drafter's default).
        eos_token_id: stop tokens (None: the model's and tokenizer's).
        seed: one integer for every row, or one per prompt of a list (None: unseeded).
        posterior_threshold, posterior_alpha: ``typical``'s epsilon and delta.
        acceptance_threshold: ``threshold``'s probability.
        alpha: ``alpha``'s ratio.
        tree_top_k, depth, total_tokens: a dynamic tree's parameters (with ``tree="dynamic"``; None: calibrated).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    acceptance: str = "auto"
    tree: Any = None
    num_speculative_tokens: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    seed: int | list[int] | None = None
    posterior_threshold: float = AcceptanceOptions.posterior_threshold
    posterior_alpha: float = AcceptanceOptions.posterior_alpha
    acceptance_threshold: float = AcceptanceOptions.acceptance_threshold
    alpha: float = AcceptanceOptions.alpha
    tree_top_k: int | None = None
    depth: int | None = None
    total_tokens: int | None = None

    def __post_init__(self) -> None:
        seeds = self.seed if isinstance(self.seed, (list, tuple)) else [self.seed]
        if any(s is not None and (isinstance(s, bool) or not isinstance(s, int)) for s in seeds):
            raise ValueError(f"seed must be an integer (or a list of one per prompt), got {self.seed!r}")
        tokens = self.max_new_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {tokens!r}")
        resolve_rule(self.acceptance, self.sampling)  # also checks the sampling settings
        for name in vars(AcceptanceOptions()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        given = sorted(k for k in DYNAMIC_TREE_KWARGS if getattr(self, k) is not None)
        if self.tree == "ddtree" and given and given != ["total_tokens"]:
            raise ValueError(f"a DDTree takes only total_tokens (its node budget), not {given}")
        if given and self.tree not in ("dynamic", "ddtree"):
            raise ValueError(f"{given} set a dynamic tree: pass tree='dynamic' (or tree='ddtree' with total_tokens)")

    @classmethod
    def known(cls) -> list[str]:
        """The keyword names :meth:`from_kwargs` takes."""
        return sorted(field.name for field in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, base: GenerationConfig | None = None, **kwargs: Any) -> GenerationConfig:
        """``base`` (default: the defaults) with ``kwargs`` on top.

        Raises:
            TypeError: a keyword that is not a field.
            ValueError: a bad value (see :meth:`__post_init__`).
        """
        unknown = sorted(set(kwargs) - set(cls.known()))
        if unknown:
            known = [k for k in cls.known() if k != "max_new_tokens"]
            raise TypeError(f"generate() got unknown arguments {unknown}; known: {known}")
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    @property
    def rule(self) -> str:
        """The acceptance rule, ``"auto"`` resolved."""
        return resolve_rule(self.acceptance, self.sampling)

    @property
    def options(self) -> AcceptanceOptions:
        return AcceptanceOptions(**{name: float(getattr(self, name)) for name in vars(AcceptanceOptions())})

    @property
    def dynamic_overrides(self) -> dict[str, int]:
        """The dynamic tree's parameters set here, by DynamicTree field."""
        return {field: getattr(self, k) for k, field in DYNAMIC_TREE_KWARGS.items() if getattr(self, k) is not None}
