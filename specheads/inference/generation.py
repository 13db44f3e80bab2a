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
from specheads.inference.trees import family_of_kind, tree_families

# Keywords that resize a tree a drafter grows, given with its bare kind: each tree family says which it takes and
# the field of its tree each one sets (TreeFamily.overrides).
TREE_SIZE_KWARGS = ("tree_top_k", "depth", "total_tokens")


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: length, sampling, acceptance rule, tree, seeds.

    Attributes:
        max_new_tokens: tokens to generate at most (>= 1).
        temperature: 0 is greedy; otherwise sampled, with ``top_k`` (0 disables) and ``top_p`` (1.0 disables).
        acceptance: ``"auto"`` (greedy at temperature 0, else rejection sampling: both lossless), ``"greedy"``,
            ``"rejection"``, or a lossy rule: ``"typical"``, ``"threshold"``, ``"alpha"``.
        tree: a static tree (``"chain-K"``, a shipped tree name, a JSON file, a Medusa choice list), ``"auto"`` (the
            calibrated one) or a tree the drafter grows while decoding, by its method's names (EAGLE-2's
            ``dynamic`` / ``dynamic-K-D-N``, DDTree's ``ddtree`` / ``ddtree-N``: the tree families of the registry);
            None: the drafter's default.
        num_speculative_tokens: K of chain drafters (None: the drafter's default).
        eos_token_id: stop tokens (None: the model's and tokenizer's).
        seed: one integer for every row, or one per prompt of a list (None: unseeded).
        posterior_threshold, posterior_alpha: ``typical``'s epsilon and delta.
        acceptance_threshold: ``threshold``'s probability.
        alpha: ``alpha``'s ratio.
        tree_top_k, depth, total_tokens: the size of a grown tree named by its bare kind, each where its family
            takes it (EAGLE-2: all three; DDTree: ``total_tokens``, its node budget); None: the drafter's own.
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
        given = sorted(self.tree_overrides)
        if given:
            _check_tree_size(self.tree, given)

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
    def tree_overrides(self) -> dict[str, int]:
        """The size keywords set here (``{keyword: value}``, of :data:`TREE_SIZE_KWARGS`), which resize the grown tree
        that ``tree`` names (its family maps each to a field of its tree)."""
        return {keyword: getattr(self, keyword) for keyword in TREE_SIZE_KWARGS if getattr(self, keyword) is not None}


def _check_tree_size(tree: Any, given: list[str]) -> None:
    """Size keywords ``given`` need a bare kind of a tree family that takes each of them.

    Raises:
        ValueError: ``tree`` is no family's bare kind, or its family does not take one of ``given``.
    """
    family = family_of_kind(tree)
    if family is None:
        kinds = " or ".join(
            f"tree={kind!r} ({', '.join(other.overrides)})" for other in tree_families() for kind in other.kinds
        )
        raise ValueError(f"{given} set the size of a tree a drafter grows: pass {kinds}")
    wrong = sorted(set(given) - set(family.overrides))
    if wrong:
        raise ValueError(f"tree={tree!r} ({family.description}) takes only {list(family.overrides)}, not {wrong}")
