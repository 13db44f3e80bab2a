"""Batch-invariant attention: a position's output does not depend on how many tokens are verified with it.

At temperature 0 the engine promises that speculative output equals plain decoding token for token. In float32 the
base's own attention keeps that promise in practice (its rounding differences are far below a logit gap). In bfloat16
and float16 they are not: torch's SDPA kernel on CPUs blocks its work by the number of query rows, so the logits of
a position computed alone (one-token decoding) and as the first node of an 8-node tree differ by up to a few tenths,
and greedy outputs part within a hundred tokens. The linear layers' products also choose their kernel by the number
of rows; :func:`batch_invariant` computes them in blocks whose every size rounds alike.

:func:`invariant_attention` is registered in transformers' attention interface under :data:`NAME` (no modeling
file is forked) and computed so that every number a query row produces depends only on that row, its keys and its
mask, not on the other rows or on the buffer's width:

* scores and the weighted sum of values are computed in float32 (the bf16 inputs are exact in float32), with the
  query rows of a key-value head group stacked and padded to at least :data:`MIN_ROWS` rows: float32 matrix products
  on CPUs take another kernel for 1-3 rows than for 4 or more, and that kernel rounds differently;
* masked keys get a weight of exactly 0 (``-inf`` before the softmax), so keys beyond a row's length and another
  row's slots add exact zeros, whatever the width of the preallocated buffer;
* a tree node's visible keys (the prefix and its ancestors, among masked siblings) are gathered into consecutive
  places first, in sequence order: sums then group the same terms as when those tokens are decoded one at a time
  and sit in consecutive slots (without it, outputs part wherever an accepted path went through a second sibling);
* the softmax runs in float32 over the last axis, a per-row reduction;
* the result is rounded once to the model's dtype.

:func:`batch_invariant` switches a model to it (and its linear layers to blocks) for a block of code and back. The
engine does that for every bf16/fp16 base on a CPU (``SpecDecoder(attention="auto")``); calibration and the bench's
engine rows time the same path. The scores are float32 where transformers' eager bf16 attention rounds them to bf16,
so this is, if anything, the more precise of the two.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

NAME = "specheads_invariant"
MIN_ROWS = 8  # float32 products of 1-3 rows take a kernel that rounds differently from 4+ rows (measured on CPUs)
# kwargs whose semantics this function does not apply (a position bias is added to the scores by SDPA and eager)
_UNSUPPORTED = ("s_aux", "sinks", "softcap", "sliding_window", "position_bias")


def invariant_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention with the signature of transformers' attention interface; see the module docstring.

    Args:
        module: the calling attention module (its ``training`` flag is read: dropout is refused in training).
        query: ``[B, H, Q, D]``.
        key, value: ``[B, H_kv, K, D]`` (grouped-query heads are not repeated in memory).
        attention_mask: ``[B, 1, Q, K]`` boolean (True = attend) or additive float mask; None is causal with the Q
            queries at the last Q key positions.
        scaling: the score scale (default ``D ** -0.5``).

    Returns:
        ``([B, Q, H, D]`` in ``query``'s dtype, ``None)``: transformers' layout, no attention weights.
    """
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"batch-invariant attention does not implement {name!r}; pass attention='model' to SpecDecoder"
            )
    if dropout and module.training:
        raise NotImplementedError("batch-invariant attention is for inference; it has no dropout")
    batch, heads, queries, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    rows = groups * queries
    scale = dim**-0.5 if scaling is None else scaling
    padded = max(rows, MIN_ROWS)
    holes, masked = _prepared_mask(attention_mask, batch, queries, width, groups, padded, query.device)
    # [B, H_kv, groups * Q, D]: heads h = kv * groups + g are adjacent, so this is a view for Q = 1 and a copy else
    q = query.reshape(batch, kv_heads, rows, dim).float()
    if padded > rows:
        q = F.pad(q, (0, 0, 0, padded - rows))
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * scale  # [B, H_kv, padded, K]
    if holes:
        return _gathered_attention(scores[:, :, :rows], value, masked, queries)
    scores = scores.masked_fill(masked, float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights, value)[:, :, :rows]  # [B, H_kv, groups * Q, D]
    out = out.reshape(batch, heads, queries, value.shape[-1]).transpose(1, 2)
    return out.to(query.dtype).contiguous(), None


# The last forward's mask work, shared by its layers: every layer receives the same mask object (a weak reference
# tells it apart from a later mask that reuses its memory) or, for a causal step, the same shapes.
_last_mask: dict[str, Any] = {"key": None, "ref": None, "value": None}


def _prepared_mask(
    mask: torch.Tensor | None, batch: int, queries: int, width: int, groups: int, padded: int, device: torch.device
) -> tuple[bool, torch.Tensor]:
    """``(holes, masked)``: with holes, the gather plan of :func:`_gathered_attention` (each query's visible slots
    in order, which places are visible, the most visible keys of a query); else
    ``[B, 1, padded, K]`` True where a score is masked, rows ``g * Q + i``, padding rows unmasked."""
    version = None if mask is None else 0 if mask.is_inference() else mask._version  # (inference tensors have none)
    key = (batch, queries, width, groups, padded, str(device), version)
    cached_mask = _last_mask["ref"]() if _last_mask["ref"] is not None else None
    if _last_mask["key"] == key and (mask is None or cached_mask is mask):
        return _last_mask["value"]
    allowed = _allowed(mask, batch, queries, width, device).expand(batch, 1, queries, width)
    if _has_holes(allowed):
        counts = allowed[:, 0].sum(dim=-1)  # [B, Q]
        longest = int(counts.max())
        order = torch.sort((~allowed[:, 0]).to(torch.uint8), dim=-1, stable=True).indices[..., :longest]
        visible = torch.arange(longest, device=device) < counts[..., None]  # [B, Q, K']
        value = (True, (order, visible, longest))
    else:
        masked = ~allowed.repeat(1, 1, groups, 1)
        if padded > groups * queries:
            masked = F.pad(masked, (0, 0, 0, padded - groups * queries), value=False)
        value = (False, masked)
    _last_mask.update(key=key, ref=None if mask is None else weakref.ref(mask), value=value)
    return value


def _has_holes(allowed: torch.Tensor) -> bool:
    """Whether some query sees a key after one it does not see (a tree's masked siblings, a padding query)."""
    counts = allowed.sum(dim=-1, keepdim=True)
    return not torch.equal(torch.arange(allowed.shape[-1], device=allowed.device) < counts, allowed)


def _gathered_attention(
    scores: torch.Tensor, value: torch.Tensor, plan: tuple[torch.Tensor, torch.Tensor, int], queries: int
) -> tuple[torch.Tensor, None]:
    """Attention of queries whose visible keys are not a prefix of the buffer (tree nodes), from their scores.

    A tree node sees the prefix and its ancestors, which sit in the buffer among masked siblings. Masked keys add
    exact zeros, but the softmax and the weighted sum of values would still group the visible terms by their buffer
    slots, which differ from the slots the same tokens hold once accepted and decoded one at a time. Each score does
    not depend on its slot (one dot product), so each query's visible scores, and the values they weigh, are gathered
    first, in slot order (their order in the sequence), into the first places of a row of their own; padded with
    masked places, the sums then group the same terms as plain decoding does.

    Args:
        scores: ``[B, H_kv, groups * Q, K]`` float32 scores, rows ``g * Q + i``.
        value: ``[B, H_kv, K, D]``.
        plan: each query's visible slots first (``[B, Q, K']``), which of those places are visible, and K'.
    """
    batch, kv_heads, rows, _ = scores.shape
    groups = rows // queries
    order, visible, longest = plan
    index = order[:, None, None].expand(batch, kv_heads, groups, queries, longest)
    gathered = torch.gather(scores.reshape(batch, kv_heads, groups, queries, -1), 4, index)  # [B, H_kv, G, Q, K']
    gathered = gathered.masked_fill(~visible[:, None, None], float("-inf"))
    weights = torch.softmax(gathered, dim=-1).to(value.dtype).transpose(2, 3)  # [B, H_kv, Q, G, K']
    items = batch * kv_heads * queries
    out = torch.bmm(weights.reshape(items, groups, longest), _gather_slots(value, order))  # [items, G, D]
    out = out.reshape(batch, kv_heads, queries, groups, value.shape[-1]).transpose(2, 3)
    out = out.reshape(batch, kv_heads * groups, queries, value.shape[-1]).transpose(1, 2)
    return out.contiguous(), None


def _gather_slots(states: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``[B * H_kv * Q, K', D]``: for each row, head and query, the slots ``order[b, i]`` of ``states``
    ``[B, H_kv, K, D]`` (one ``index_select`` per row: a third of the cost of advanced indexing here)."""
    batch, kv_heads, _, dim = states.shape
    queries, longest = order.shape[1:]
    rows = [states[b].index_select(1, order[b].flatten()) for b in range(batch)]  # [H_kv, Q * K', D] each
    gathered = rows[0][None] if batch == 1 else torch.stack(rows)
    return gathered.reshape(batch * kv_heads * queries, longest, dim)


def _allowed(mask: torch.Tensor | None, batch: int, queries: int, width: int, device: torch.device) -> torch.Tensor:
    """The mask as ``[B or 1, 1, Q, K]`` booleans."""
    if mask is None:  # causal, the queries being the last Q of the K positions
        columns = torch.arange(width, device=device)
        last = torch.arange(width - queries, width, device=device)
        return (columns[None, :] <= last[:, None])[None, None]
    if mask.dtype != torch.bool:  # an additive mask: 0 where allowed, a large negative number elsewhere
        mask = mask > torch.finfo(mask.dtype).min / 2
    return mask[..., -width:] if mask.shape[-1] > width else mask


def register() -> str:
    """Register :func:`invariant_attention` (and boolean masks for it) with transformers; returns :data:`NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, invariant_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def wants_invariance(model: torch.nn.Module) -> bool:
    """Whether ``attention="auto"`` uses the invariant attention for ``model``: a bf16/fp16 base on a CPU.

    In float32 the model's own attention is kept (its output equals transformers' greedy, which is the reference
    there). On a GPU the matrix-product libraries choose kernels by shape, so invariance would need kernels of its
    own; the model's attention is kept and exactness is transformers' usual "equal up to near-ties".
    """
    parameter = next(model.parameters())
    return parameter.dtype in (torch.bfloat16, torch.float16) and parameter.device.type == "cpu"


def _configs(model: torch.nn.Module) -> list[Any]:
    """Every config object the model's attention modules read ``_attn_implementation`` from."""
    seen: dict[int, Any] = {}
    for sub in model.modules():
        config = getattr(sub, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            seen.setdefault(id(config), config)
    return list(seen.values())


# bf16/fp16 products of more rows than this can take another oneDNN kernel, which rounds some rows differently from a
# product of 2-32 rows (measured on a CPU with AMX: a 1,536 x 576 layer, 64 random rows, 8 of them part).
MAX_PRODUCT_ROWS = 32


def _rows_in_blocks(forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A linear layer's ``forward`` computed as products of 2 to :data:`MAX_PRODUCT_ROWS` rows: the input's rows
    (``[..., K]``, flattened) in consecutive blocks of :data:`MAX_PRODUCT_ROWS`, a lone row with a zero second row."""

    def blocked(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [M, K]
        if 2 <= rows.shape[0] <= MAX_PRODUCT_ROWS:
            return forward(x)
        outs = []
        for block in rows.split(MAX_PRODUCT_ROWS):
            count = block.shape[0]
            outs.append(forward(F.pad(block, (0, 0, 0, 1)) if count == 1 else block)[:count])
        out = torch.cat(outs)  # [M, N]
        return out.reshape(*x.shape[:-1], out.shape[-1])

    return blocked


def _product(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The layer's product with its weight laid out as ``nn.Linear``'s, ``[N, K]``: a ``Conv1D`` (weight ``[K, N]``)
    is computed with a transposed copy of its weight, since oneDNN's bf16 products over a ``[K, N]`` weight change
    kernels from as few as 5 rows (measured: 4,096 x 1,024), where over ``[N, K]`` they keep one up to 32 rows."""
    if isinstance(module, torch.nn.Linear):
        return module.forward
    weight = module.weight.detach().t().contiguous()  # [N, K]
    return lambda x: F.linear(x, weight, module.bias)


def _linear_types() -> tuple[type, ...]:
    """``nn.Linear`` and transformers' ``Conv1D`` (GPT-2's projections: a linear layer with its weight transposed)."""
    from transformers.pytorch_utils import Conv1D

    return (torch.nn.Linear, Conv1D)


@contextmanager
def batch_invariant(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Run ``model`` batch-invariantly inside the block, then restore it.

    Two switches: the attention goes through :func:`invariant_attention`, and every linear layer (:func:`_linear_types`)
    computes its rows as products of 2 to :data:`MAX_PRODUCT_ROWS` rows. oneDNN's bf16/fp16 products choose their
    kernel by the number of rows, and for inner sizes past about a thousand (an MLP's down projection) the kernels
    accumulate in different orders: one row alone takes a vector-matrix kernel (measured on SmolLM2-135M on a CPU with
    AVX512-BF16: one bf16 step in a few hundred rounds differently, enough to part greedy outputs), and on a CPU with
    AMX products of 33 rows or more take another kernel (a verified tree of 40 nodes then parts from plain decoding).
    Products of 2 to 32 rows give a row the same bits on both, with the weight laid out as ``nn.Linear``'s (a
    ``Conv1D`` holds a transposed copy of its weight while the switch is on: :func:`_product`). The second row of a
    one-row product costs about what a one-row product costs; a long prefill takes one product a block.
    """
    if not enabled:
        yield
        return
    register()
    configs = _configs(model)
    before = [config._attn_implementation for config in configs]
    linears = [module for module in model.modules() if isinstance(module, _linear_types())]
    own_forwards = [module.__dict__.get("forward") for module in linears]  # (set by accelerate's offload hooks)
    try:
        for config in configs:
            config._attn_implementation = NAME
        for module in linears:
            module.forward = _rows_in_blocks(_product(module))
        yield
    finally:
        for module, forward in zip(linears, own_forwards, strict=True):
            if forward is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = forward
        for config, name in zip(configs, before, strict=True):
            config._attn_implementation = name
