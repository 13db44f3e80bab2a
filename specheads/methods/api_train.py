"""What a method needs to train: recipe errors, the step's typed context and result, the base's view of a batch
(its features, teacher and greedy tokens, for training and held-out evaluation alike), the shared losses, held-out
agreement, draft-vocabulary statistics.

One of the three phase modules of the method API (:mod:`specheads.methods.api` says which holds what). Each name is
documented where it is defined.
"""

from __future__ import annotations

from specheads.heads.vocab import draft_vocab_coverage, draft_vocab_size_for_coverage
from specheads.registry import Evaluation
from specheads.training.config import ConfigError
from specheads.training.evaluate import RANKS, agreement_summary
from specheads.training.features import BaseView
from specheads.training.losses import (
    TeacherLogits,
    distillation_loss,
    flat_rows,
    linear_cross_entropy,
    lm_loss,
    projected_top_k,
)
from specheads.training.step import StepContext, StepResult

__all__ = [
    "RANKS",
    "BaseView",
    "ConfigError",
    "Evaluation",
    "StepContext",
    "StepResult",
    "TeacherLogits",
    "agreement_summary",
    "distillation_loss",
    "draft_vocab_coverage",
    "draft_vocab_size_for_coverage",
    "flat_rows",
    "linear_cross_entropy",
    "lm_loss",
    "projected_top_k",
]
