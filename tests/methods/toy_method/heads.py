"""The toy heads: one residual layer applied ``depth`` times to the base's last hidden state, read out by the
base's own lm_head."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from specheads.methods.api_decode import DraftHeads, base_model_info, vocab_size


@dataclass
class ToyConfig:
    """What a toy checkpoint's ``config.json`` records."""

    hidden_size: int
    vocab_size: int
    depth: int = 3
    base_model: dict[str, Any] = field(default_factory=dict)
    head_type: str = "toy"


class ToyHeads(DraftHeads):
    """``forward(hidden [..., H]) -> [D, ..., H]``: the chain's states; :meth:`logits` reads them out."""

    config_class = ToyConfig
    family = "toy"
    bound_as = "these toy heads"
    hidden_state_layers: tuple[int, ...] = (-1,)  # the base's final state, which its lm_head reads

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.layer = torch.nn.Linear(config.hidden_size, config.hidden_size)

    @classmethod
    def from_base(cls, base_model: torch.nn.Module, depth: int = 3) -> ToyHeads:
        """Heads sized for ``base_model``, starting as the identity (every depth drafts the base's next token)."""
        hidden = int(base_model.get_output_embeddings().weight.shape[1])
        heads = cls(ToyConfig(hidden, vocab_size(base_model), depth, base_model_info(base_model)))
        torch.nn.init.zeros_(heads.layer.weight)
        torch.nn.init.zeros_(heads.layer.bias)
        heads.attach_base(base_model)
        return heads

    def forward(self, hidden: torch.Tensor, depth: int | None = None) -> torch.Tensor:
        """``[D, ..., H]`` the chain's states from ``hidden [..., H]`` (``depth``: D, default the config's)."""
        states = []
        state = hidden.to(self.layer.weight.dtype)
        for _ in range(self.config.depth if depth is None else depth):
            state = state + F.silu(self.layer(state))
            states.append(state)
        return torch.stack(states)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` the base's lm_head on the chain's states."""
        lm_head = self.base_model_of().get_output_embeddings()
        return lm_head(states.to(lm_head.weight.dtype))
