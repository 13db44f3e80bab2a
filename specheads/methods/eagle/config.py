"""The recipe section of EAGLE heads."""

from __future__ import annotations

from dataclasses import dataclass

from specheads.methods.api import (
    ConfigError,
)


@dataclass
class EagleHeadsConfig:
    """The ``heads`` section of an EAGLE recipe (``type: eagle``).

    ``layer_ids`` are indices into the base's ``hidden_states`` (EAGLE-3 only; default low/middle/high
    ``(2, L // 2, L - 3)``). ``targets``: ``self`` trains on the base's own next-token distribution from the same
    forward (self-distillation, free); ``corpus`` on the data's tokens.

    ``draft_vocab_size`` (EAGLE-3) is a number of ids or ``{coverage: F}``: the smallest draft vocabulary whose ids,
    the most frequent target tokens of the training data, cover at least the share F of them (the size chosen and
    the share covered are printed when training starts). ``fc_norm`` and ``norm_output`` are EAGLE 3.1's norms, and
    ``norm_before_fc`` the one fused-feature norm llama.cpp's EAGLE-3 graph also runs (see
    :mod:`specheads.methods.eagle.heads`).
    """

    type: str = "eagle"
    version: int = 3
    layer_ids: list[int] | None = None
    # EAGLE-3: the most frequent tokens of the training data, as a count or {coverage: F} (None: all)
    draft_vocab_size: int | dict[str, float] | None = None
    fc_bias: bool | None = None  # default: True for EAGLE-1 (EAGLE repo, SGLang), False for EAGLE-3; vLLM: false
    norm_before_residual: bool = False
    fc_norm: bool = False  # EAGLE 3.1: an RMSNorm on each fused feature layer before fc
    norm_output: bool = False  # EAGLE 3.1: the next draft step reads the normed output (what the lm_head reads)
    norm_before_fc: bool = False  # one RMSNorm over the concatenated features before fc: the norm llama.cpp runs
    # The draft layer's MLP width (None: the base's intermediate size); narrower makes a draft level cheaper
    intermediate_size: int | None = None
    targets: str = "self"  # self | corpus
    ttt_steps: int = 7  # EAGLE-3 training-time test: the draft unrolled on its own outputs this many steps
    ttt_decay: float = 0.8  # step i's cross-entropy weighs decay^i
    feature_loss_weight: float = 1.0  # EAGLE-1: SmoothL1 on the predicted feature
    ce_loss_weight: float = 0.1  # EAGLE-1: cross-entropy through the frozen lm_head
    feature_noise: float = 0.2  # EAGLE-1: uniform noise of this width on the input features
    # EAGLE-3, self targets: add this much of TV(base, draft) = 1 - the draft's acceptance rate to every step's loss
    tv_loss_weight: float = 0.0

    def validate(self) -> None:
        if self.version not in (1, 3):
            raise ConfigError(f"heads.version is {self.version!r}; EAGLE versions are 1 and 3")
        if self.targets not in ("self", "corpus"):
            raise ConfigError(f"heads.targets is {self.targets!r}; choose one of ['corpus', 'self']")
        if self.version == 1 and (self.layer_ids is not None or self.draft_vocab_size is not None):
            raise ConfigError("heads.layer_ids and heads.draft_vocab_size are EAGLE-3 settings (heads.version=3)")
        self._validate_draft_vocab()
        if self.version == 1 and (self.fc_norm or self.norm_output or self.norm_before_fc):
            raise ConfigError(
                "heads.fc_norm, heads.norm_output and heads.norm_before_fc are EAGLE-3 settings (heads.version=3)"
            )
        if self.fc_norm and self.norm_before_fc:
            raise ConfigError(
                "heads.fc_norm (a norm per fused layer) and heads.norm_before_fc (one norm over all of them) exclude "
                "each other; llama.cpp runs norm_before_fc only"
            )
        if self.layer_ids is not None and len(self.layer_ids) != 3:
            raise ConfigError(f"heads.layer_ids names 3 base layers (low, middle, high), got {self.layer_ids}")
        if self.ttt_steps < 1:
            raise ConfigError(f"heads.ttt_steps must be >= 1, got {self.ttt_steps}")
        if self.tv_loss_weight < 0 or (self.tv_loss_weight and (self.version != 3 or self.targets != "self")):
            raise ConfigError(
                f"heads.tv_loss_weight is {self.tv_loss_weight}: it must be >= 0, and it needs version 3 with self "
                "targets (the base's distribution)"
            )
        size = self.intermediate_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError(f"heads.intermediate_size must be an integer >= 1 (None: the base's), got {size!r}")
        if self.feature_noise < 0:
            raise ConfigError(f"heads.feature_noise must be >= 0, got {self.feature_noise}")

    def _validate_draft_vocab(self) -> None:
        size = self.draft_vocab_size
        if isinstance(size, dict):
            coverage = size.get("coverage")
            if set(size) != {"coverage"} or isinstance(coverage, bool) or not isinstance(coverage, (int, float)):
                raise ConfigError(
                    f"heads.draft_vocab_size is {size!r}; give a number of ids or {{coverage: F}} with 0 < F <= 1"
                )
            if not 0 < coverage <= 1:
                raise ConfigError(f"heads.draft_vocab_size.coverage must be in (0, 1], got {coverage}")
        elif size is not None and (isinstance(size, bool) or not isinstance(size, int)):
            raise ConfigError(f"heads.draft_vocab_size must be an integer >= 1 or {{coverage: F}}, got {size!r}")
        elif size is not None and size < 1:
            raise ConfigError(f"heads.draft_vocab_size must be >= 1, got {size}")

    @property
    def draft_vocab_ids(self) -> int | None:
        """The draft vocabulary's size when it is given as a number of ids (None: the base's, or a coverage)."""
        return self.draft_vocab_size if isinstance(self.draft_vocab_size, int) else None

    @property
    def draft_vocab_coverage(self) -> float | None:
        """The share of training targets the draft vocabulary must cover, when it is given as a coverage."""
        return float(self.draft_vocab_size["coverage"]) if isinstance(self.draft_vocab_size, dict) else None
