"""Medusa heads (Cai et al. 2024, arXiv 2401.10774) on top of a frozen base model.

Head k (0-based) reads the base's last hidden state at position t (the one its lm_head reads) and predicts token
t + 2 + k: one token further than the base itself. Each head is ``num_layers`` residual SiLU blocks, zero-initialised
so that every head starts as the identity, followed by a vocabulary projection that is either the head's own copy of
the base's lm_head (Medusa-1) or the base's lm_head itself (``share_lm_head=True``, Medusa "version 2").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from specheads.methods.api_decode import (
    Calibration,
    DraftHeads,
    Readout,
    base_model_info,
)


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)`` with W and b zero-initialised, so the block starts as the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size, bias=True)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.act(self.linear(hidden))


@dataclass
class MedusaConfig:
    """Hyper-parameters of a set of Medusa heads and the base they belong to."""

    num_heads: int = 4
    num_layers: int = 1
    hidden_size: int = 0
    vocab_size: int = 0
    share_lm_head: bool = False
    base_model: dict[str, Any] = field(default_factory=dict)
    head_type: str = "medusa"

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Medusa {name} must be an integer >= 1, got {value!r}")


class MedusaHeads(DraftHeads):
    """K Medusa heads.

    Args:
        config: the heads' hyper-parameters.
        base_lm_head: the base's output projection, required when ``config.share_lm_head`` (not saved with the heads).
    """

    config_class = MedusaConfig
    family = "Medusa"  # how messages name these heads
    bound_as = "these Medusa heads"

    def __init__(self, config: MedusaConfig, base_lm_head: nn.Linear | None = None) -> None:
        super().__init__()
        self.config = config
        self.calibration: Calibration | None = None  # set by load_heads when a tree.json is present
        hidden, vocab = config.hidden_size, config.vocab_size
        # One ModuleList per head with distinct blocks (never `[ResBlock(h)] * L`, which repeats one module).
        self.blocks = nn.ModuleList(
            nn.ModuleList(ResBlock(hidden) for _ in range(config.num_layers)) for _ in range(config.num_heads)
        )
        if config.share_lm_head:
            self.lm_heads = None
            self._base_lm_head = [base_lm_head]  # a list keeps the frozen base weights out of this module's state
        else:
            self.lm_heads = nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(config.num_heads))
            self._base_lm_head = [None]

    @classmethod
    def from_base(
        cls, base_model: PreTrainedModel, num_heads: int = 4, num_layers: int = 1, share_lm_head: bool = False
    ) -> MedusaHeads:
        """Heads sized for ``base_model``; Medusa-1 heads start from copies of its lm_head."""
        lm_head = base_model.get_output_embeddings()
        config = MedusaConfig(
            num_heads=num_heads,
            num_layers=num_layers,
            hidden_size=lm_head.weight.shape[1],
            vocab_size=lm_head.weight.shape[0],
            share_lm_head=share_lm_head,
            base_model=base_model_info(base_model),
        )
        heads = cls(config, base_lm_head=lm_head if share_lm_head else None)
        if not share_lm_head:
            with torch.no_grad():
                for head in heads.lm_heads:
                    head.weight.copy_(lm_head.weight)
        return heads.to(device=lm_head.weight.device, dtype=lm_head.weight.dtype)

    def bind_base(self, base_model: PreTrainedModel) -> None:
        """Use this base's lm_head (shared-lm_head heads) without checking the fingerprint (e.g. a merged LoRA)."""
        if self.config.share_lm_head:
            self._base_lm_head = [base_model.get_output_embeddings()]

    def forward(
        self, hidden_states: torch.Tensor, num_heads: int | None = None, readout: Readout | None = None
    ) -> torch.Tensor | list[Any]:
        """Logits of the first ``num_heads`` heads (all by default).

        Args:
            hidden_states: ``[..., H]`` the base's last hidden states (post final norm).
            num_heads: compute only heads 0..num_heads-1 (a shallow tree needs no more; each head's vocabulary
                projection is as large as the base's lm_head, so unused heads are not free at decode time).
            readout: instead of logits, return ``[readout(k, states_k, weight_k, bias_k) for each head k]``, where
                ``F.linear(states_k, weight_k, bias_k)`` would be head k's logits: a loss can then project a chunk
                of positions at a time (:func:`specheads.training.losses.linear_cross_entropy`) and no ``[..., V]``
                tensor is built. Called inside ``forward``, so that wrappers (DDP, FSDP) see every parameter used.

        Returns:
            ``[num_heads, ..., V]``: head k's logits for the token k + 2 positions ahead (a list of what ``readout``
            returned, when given).
        """
        outputs = []
        for index, blocks in enumerate(self.blocks[:num_heads]):
            hidden = hidden_states
            for block in blocks:
                hidden = block(hidden)
            if readout is None:
                outputs.append(self._project(index, hidden))
            else:
                outputs.append(readout(index, hidden, *self.projection(index)))
        return outputs if readout is not None else torch.stack(outputs, dim=0)

    def projection(self, index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight [V, H], bias [V] or None)`` of head ``index``'s vocabulary projection (shared: the base's)."""
        lm_head = self._lm_head(index)
        return lm_head.weight, lm_head.bias

    def _project(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        return self._lm_head(index)(hidden)

    def _lm_head(self, index: int) -> nn.Module:
        if self.lm_heads is not None:
            return self.lm_heads[index]
        lm_head = self._base_lm_head[0]
        if lm_head is None:
            raise RuntimeError("shared-lm_head Medusa heads need attach_base(base_model) before use")
        return lm_head
