"""EAGLE 3.1 heads rewritten into llama.cpp's EAGLE-3 graph: a measured approximation of the draft.

llama.cpp's graph (``src/models/eagle3.cpp``) has one RMSNorm over the concatenated ``3h`` features before ``fc``
(``norm_before_fc``) and hands the decoder's un-normed output to the next draft step; it can norm the layer's
residual (``norm_before_residual``). EAGLE 3.1's heads norm each fused layer on its own (``fc_norm``) and hand the
*normed* output to the next step (``norm_output``). Neither has an exact equivalent, so :func:`fold_for_llamacpp`
builds the nearest head llama.cpp runs, from statistics of the base's own features on some calibration tokens:

1. ``fc_norm`` becomes ``input_norm``: block ``k``'s weight times the median over the tokens of
   ``rms(all blocks) / rms(block k)``. Exact where that ratio is the same for every token; on Qwen2.5-Coder-1.5B
   (layers 2, 14, 25) it spreads by about 20%, 10% and 2% between its 10th and 90th percentiles, and the first draft
   step's held-out agreement moves by 0.001.
2. ``norm_output`` becomes ``norm_before_residual``. EAGLE 3.1's layer adds its update to the raw ``fc`` output at
   the first step (rms ``kappa``, the median over the tokens) and to ``norm(output)`` (rms about 1) at later steps;
   a normed residual ``hidden_norm(g)`` has one weight for both. It is scaled by ``kappa``, which keeps the first
   step (the one a chain's acceptance hangs on) within the spread of ``rms(fc output)`` and makes later steps'
   residual ``kappa`` times too large against their update. The attention still reads ``hidden_norm(g)`` as before:
   the ``q``/``k``/``v`` columns that read it are divided by ``kappa``, exactly.

On the shipped Qwen2.5-Coder-1.5B heads (statistics from the 2,048 first tokens of the shipped benchmark prompts;
24 held-out rows of standard-library code, bf16) agreement by depth goes from 0.335, 0.288, 0.278 to 0.334, 0.267,
0.253: a chain of 3 drafts expects 1.446 tokens a step against 1.458. In experiments with statistics from the
held-out rows themselves, scaling by ``sqrt(kappa)`` instead (0.313, 0.281, 0.270) or not at all (0.297, 0.278,
0.274) traded the first step for later ones, and keeping the raw residual (no ``norm_before_residual``) lost later
steps (0.334, 0.147, 0.094). On SmolLM2-135M's shipped heads the fold moves chain-3 acceptance on 9 MT-Bench first
turns from 0.148 to 0.146, and llama.cpp accepts 0.147 with the folded draft.

Whatever the draft proposes, the base verifies it: the fold costs acceptance, never correctness. Its cost is measured,
not assumed: :func:`fold_for_llamacpp` returns the statistics it used, and the held-out agreement of the folded head
is what ``specheads`` decodes with it (it is an ordinary :class:`EagleHead`), so llama.cpp's acceptance is checked
against it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specheads.methods.eagle.heads import EagleHead

FOLD_NOTE = (
    "EAGLE 3.1 norms folded into llama.cpp's graph (fc_norm -> input_norm, norm_output -> norm_before_residual): "
    "an approximation of the draft, lossless under verification like any draft"
)


@dataclasses.dataclass
class FoldStatistics:
    """What the fold read from the base's features: per block, the median of ``rms(all) / rms(block)``, and the
    median ``rms`` of ``fc``'s output (``kappa``), over ``tokens`` calibration tokens."""

    block_ratios: list[float]
    kappa: float
    tokens: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def needs_fold(head: torch.nn.Module) -> bool:
    """True for EAGLE-3 heads with EAGLE 3.1's norms, which llama.cpp cannot run as they are."""
    config = getattr(head, "config", None)
    return isinstance(head, EagleHead) and bool(config.fc_norm or config.norm_output)


@torch.no_grad()
def fold_statistics(
    head: EagleHead, features: Sequence[torch.Tensor], mask: torch.Tensor | None = None
) -> FoldStatistics:
    """The statistics :func:`fold_weights` needs, from the base's hidden states at the head's feature layers.

    Args:
        head: EAGLE-3 heads with ``fc_norm``.
        features: ``hidden_states[layer]`` for each of ``head.hidden_state_layers``, each ``[B, T, H]``.
        mask: ``[B, T]`` the real tokens (default: all).
    """
    if not head.config.fc_norm:
        raise ValueError("fold_statistics reads heads with fc_norm (EAGLE 3.1); these have none")
    keep = torch.ones(features[0].shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    blocks = [f.float()[keep.to(f.device)] for f in features]  # [N, H] each
    if not blocks[0].shape[0]:
        raise ValueError("no calibration tokens")
    rms = torch.stack([b.pow(2).mean(-1).sqrt() for b in blocks], dim=-1)  # [N, K]
    whole = torch.cat(blocks, dim=-1).pow(2).mean(-1).sqrt()  # [N]
    ratios = (whole[:, None] / rms.clamp_min(1e-12)).median(dim=0).values
    fused = head.fuse([b.to(head.fc.weight.dtype) for b in blocks]).float()
    kappa = float(fused.pow(2).mean(-1).sqrt().median())
    return FoldStatistics([float(r) for r in ratios], kappa, int(blocks[0].shape[0]))


def fold_weights(head: EagleHead, statistics: FoldStatistics) -> EagleHead:
    """A new :class:`EagleHead` in llama.cpp's graph from EAGLE 3.1 heads (see the module docstring); ``head`` is
    left as it was. Its calibration (the tree it decodes with) carries over."""
    config = head.config
    if not config.fc_norm or not config.norm_output:
        raise ValueError("fold_weights rewrites heads with both EAGLE 3.1 norms (fc_norm and norm_output)")
    if config.norm_before_residual:
        raise ValueError("these heads already norm their residual: nothing to fold norm_output into")
    if len(statistics.block_ratios) != len(config.layer_ids):
        raise ValueError(f"{len(statistics.block_ratios)} block ratios for {len(config.layer_ids)} feature layers")
    folded_config = dataclasses.replace(
        config, fc_norm=False, norm_output=False, norm_before_fc=True, norm_before_residual=True
    )
    state = {key: value.detach().clone() for key, value in head.state_dict().items()}
    dtype = state["fc.weight"].dtype
    blocks = [state.pop(f"fc_norm.{k}.weight").float() * ratio for k, ratio in enumerate(statistics.block_ratios)]
    state["input_norm.weight"] = torch.cat(blocks).to(dtype)
    kappa = statistics.kappa
    state["midlayer.hidden_norm.weight"] = (state["midlayer.hidden_norm.weight"].float() * kappa).to(dtype)
    hidden = config.hidden_size
    for name in ("q_proj", "k_proj", "v_proj"):  # attention reads [input_layernorm(embedding) ; hidden_norm(g)]
        weight = state[f"midlayer.self_attn.{name}.weight"].float()
        weight[:, hidden:] /= kappa
        state[f"midlayer.self_attn.{name}.weight"] = weight.to(dtype)
    folded = EagleHead(folded_config)
    folded.load_state_dict(state, strict=True)
    folded.calibration = getattr(head, "calibration", None)
    return folded.to(dtype)


@torch.no_grad()
def fold_for_llamacpp(
    head: EagleHead, base: PreTrainedModel, rows: Sequence[Sequence[int]]
) -> tuple[EagleHead, FoldStatistics]:
    """EAGLE 3.1 heads as the nearest heads llama.cpp's EAGLE-3 graph runs, with the statistics of ``base``'s features
    on the token ``rows`` (a few thousand tokens of the kind of text the heads will draft are plenty: the statistics
    are medians). Returns ``(folded, statistics)``; the folded heads are bound to ``base``.
    """
    if not needs_fold(head):
        raise ValueError("these heads have no EAGLE 3.1 norms: llama.cpp runs them as they are")
    rows = [list(map(int, row)) for row in rows if len(row)]
    if not rows:
        raise ValueError("fold_for_llamacpp needs calibration tokens: no non-empty row given")
    device = base.get_input_embeddings().weight.device
    layers = head.hidden_state_layers
    features: list[list[torch.Tensor]] = [[] for _ in layers]
    for row in rows:
        out = base(torch.tensor([row], device=device), output_hidden_states=True)
        for k, layer in enumerate(layers):
            features[k].append(out.hidden_states[layer][0])
    statistics = fold_statistics(head, [torch.cat(f)[None] for f in features])
    folded = fold_weights(head, statistics)
    folded.attach_base(base)
    return folded.to(device=device, dtype=head.fc.weight.dtype).eval(), statistics


def calibration_rows(tokenizer: Any, texts: Sequence[str], tokens: int = 2048, row: int = 512) -> list[list[int]]:
    """Up to ``tokens`` tokens of ``texts`` (tokenized one by one, joined in order) cut into rows of ``row``."""
    ids: list[int] = []
    for text in texts:
        ids += list(tokenizer(text)["input_ids"])
        if len(ids) >= tokens:
            break
    ids = ids[:tokens]
    return [ids[start : start + row] for start in range(0, len(ids), row)]
