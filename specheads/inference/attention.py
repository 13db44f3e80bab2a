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
  row's slots add exact zeros;
* but a product groups its sums by the width it is given (oneDNN's bf16 kernels also pair neighbouring terms): on
  SmolLM2-135M on a CPU with AMX, one bf16 product over a position's 97 or 103 keys and the same keys followed by
  masked ones up to 112 rounded differently, and greedy outputs parted. So the scores are padded with masked places
  to whole blocks of :data:`KEY_BLOCK` keys (the softmax then sees a width it reduces alike), and the weighted sum of
  values is one float32 product per block, the blocks added in order in float64 (:func:`_fold`): a query's blocks
  hold the same terms whatever the width, and blocks of masked keys add exact zeros;
* a tree node's visible keys (the prefix and its ancestors, among masked siblings) take consecutive places first, in
  sequence order: its scores are gathered, and its values are read from the buffer for the whole blocks of the run
  of slots it sees from the first and gathered for the rest, so that each block holds the terms it holds when those
  tokens are decoded one at a time and sit in consecutive slots (without it, outputs part wherever an accepted path
  went through a second sibling);
* the softmax runs in float32 over the last axis, a per-row reduction;
* the result is rounded once to the model's dtype.

A prompt is not computed here: :class:`~specheads.inference.decoder.SpecDecoder` runs its prefill with the model's
own kernels, each prompt alone, since no step computes a prompt's positions again.

:func:`batch_invariant` switches a model to it (and its linear layers to blocks) for a block of code and back. The
engine does that for every bf16/fp16 base on a CPU (``SpecDecoder(attention="auto")``); calibration and the bench's
engine rows time the same path. The scores are float32 where transformers' eager bf16 attention rounds them to bf16,
so this is, if anything, the more precise of the two.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch.utils.weak import WeakIdKeyDictionary

NAME = "specheads_invariant"
MIN_ROWS = 8  # float32 products of 1-3 rows take a kernel that rounds differently from 4+ rows (measured on CPUs)
# Keys per product of the weighted sum of values (see _block_products): a product's sums group its terms by the width
# it is given (oneDNN's bf16 products pair neighbouring terms, and both kinds block the key axis by the width), so
# each query's terms are summed KEY_BLOCK places at a time, by their place in the query's sequence, whatever the width.
KEY_BLOCK = 64
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
    plan = _plan(attention_mask, batch, queries, width, groups, query.device)
    # [B, H_kv, groups * Q, D]: heads h = kv * groups + g are adjacent, so this is a view for Q = 1 and a copy else
    q = query.reshape(batch, kv_heads, rows, dim).float()
    if plan.rows > rows:
        q = F.pad(q, (0, 0, 0, plan.rows - rows))
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scale)  # [B, H_kv, plan.rows, K]
    if plan.gather is None:
        out = _prefix_attention(scores, value, plan)[:, :, :rows]
    else:
        out = _gathered_attention(scores[:, :, :rows], value, plan.gather, queries)
    out = out.reshape(batch, heads, queries, value.shape[-1]).transpose(1, 2)  # [B, Q, H, D]
    return out.to(query.dtype).contiguous(), None


@dataclass(frozen=True)
class _Gather:
    """Where the queries of a forward with holes find their keys (see :func:`_gathered_attention`).

    Attributes:
        order: ``[B, Q, K']`` each query's visible slots, in order, then slot 0 (K' a multiple of KEY_BLOCK).
        visible: ``[B, Q, K']`` which places of ``order`` the query sees.
        in_buffer: ``[B, Q, P]`` the places a query takes from the buffer as it is: the whole key blocks of the run
            of slots ``0, 1, ...`` it sees from the first (P, a multiple of KEY_BLOCK, the most of any query).
        tail: ``[B, Q, T]`` the places of ``order`` in each query's key blocks after those (T a multiple of
            KEY_BLOCK), ``tail_slots`` their slots and ``tail_visible`` which of them the query sees.
    """

    order: torch.Tensor
    visible: torch.Tensor
    in_buffer: torch.Tensor
    tail: torch.Tensor
    tail_slots: torch.Tensor
    tail_visible: torch.Tensor


@dataclass(frozen=True)
class _Plan:
    """One forward's mask work, shared by its layers.

    Attributes:
        rows: query rows of a product: ``groups * Q``, at least :data:`MIN_ROWS`.
        width: K rounded up to a multiple of :data:`KEY_BLOCK`.
        masked: without holes, ``[B, 1, rows, K]`` True where a score is masked (rows ``g * Q + i``, padding rows
            unmasked), None when no query misses any key.
        gather: with holes (some query sees a key after one it does not see), where each query finds its keys.
    """

    rows: int
    width: int
    masked: torch.Tensor | None
    gather: _Gather | None


# The last forward's plan, shared by its layers: every layer receives the same mask object (a weak reference tells
# it apart from a later mask that reuses its memory) or, for a causal step, the same shapes.
_last_plan: dict[str, Any] = {"key": None, "ref": None, "value": None}


def _plan(mask: torch.Tensor | None, batch: int, queries: int, width: int, groups: int, device: torch.device) -> _Plan:
    """The :class:`_Plan` of a forward's mask (computed by its first layer, reused by the others)."""
    version = None if mask is None else 0 if mask.is_inference() else mask._version  # (inference tensors have none)
    key = (batch, queries, width, groups, device, version)
    cached_mask = _last_plan["ref"]() if _last_plan["ref"] is not None else None
    if _last_plan["key"] == key and (mask is None or cached_mask is mask):
        return _last_plan["value"]
    rows = max(groups * queries, MIN_ROWS)
    allowed = _allowed(mask, batch, queries, width, device).expand(batch, 1, queries, width)
    if _has_holes(allowed):
        plan = _Plan(rows, _whole_blocks(width), None, _gather_plan(allowed[:, 0]))
    else:
        masked = ~allowed.repeat(1, 1, groups, 1)
        if rows > groups * queries:
            masked = F.pad(masked, (0, 0, 0, rows - groups * queries), value=False)
        plan = _Plan(rows, _whole_blocks(width), masked if bool(masked.any()) else None, None)
    _last_plan.update(key=key, ref=None if mask is None else weakref.ref(mask), value=plan)
    return plan


def _whole_blocks(count: int) -> int:
    """``count`` rounded up to a multiple of :data:`KEY_BLOCK`."""
    return -(-count // KEY_BLOCK) * KEY_BLOCK


def _gather_plan(allowed: torch.Tensor) -> _Gather:
    """The :class:`_Gather` of ``[B, Q, K]`` visibility with holes."""
    device = allowed.device
    counts = allowed.sum(dim=-1)  # [B, Q]
    longest = int(counts.max())
    order = torch.sort((~allowed).to(torch.uint8), dim=-1, stable=True).indices[..., :longest]
    places = _whole_blocks(longest)
    order = F.pad(order, (0, places - longest))  # [B, Q, K']: slot 0 where no query has a key
    visible = torch.arange(places, device=device) < counts[..., None]
    leading = allowed.to(torch.int32).cumprod(dim=-1).sum(dim=-1)  # [B, Q]: the run of slots 0, 1, ... it sees
    buffered = leading // KEY_BLOCK * KEY_BLOCK  # [B, Q]: its whole key blocks in that run
    in_buffer = torch.arange(int(buffered.max()), device=device) < buffered[..., None]  # [B, Q, P]
    tail = buffered[..., None] + torch.arange(_whole_blocks(int((counts - buffered).max())), device=device)
    tail_visible = tail < counts[..., None]  # [B, Q, T]
    tail = tail.clamp(max=places - 1)
    return _Gather(order, visible, in_buffer, tail, order.gather(-1, tail), tail_visible)


def _has_holes(allowed: torch.Tensor) -> bool:
    """Whether some query sees a key after one it does not see (a tree's masked siblings, a padding query)."""
    counts = allowed.sum(dim=-1, keepdim=True)
    return not torch.equal(torch.arange(allowed.shape[-1], device=allowed.device) < counts, allowed)


def _prefix_attention(scores: torch.Tensor, value: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """``[B, H_kv, rows, D]`` float32 attention of queries that each see slots ``0, 1, ...`` and no others: a
    key's slot is its place in the query's sequence, so the buffer is used as it is.

    Args:
        scores: ``[B, H_kv, rows, K]`` float32 scores, rows ``g * Q + i``.
        value: ``[B, H_kv, K, D]``.
    """
    width = scores.shape[-1]
    if plan.width > width:
        scores = F.pad(scores, (0, plan.width - width), value=float("-inf"))
    if plan.masked is not None:
        scores[..., :width].masked_fill_(plan.masked, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # [B, H_kv, rows, K rounded up]
    values = value.new_empty((*value.shape[:2], plan.width, value.shape[-1]), dtype=torch.float32)
    values[:, :, :width] = value  # [B, H_kv, K rounded up, D]: contiguous, so its blocks are a view
    values[:, :, width:] = 0.0
    return _fold(_block_products(weights, values))


def _gathered_attention(scores: torch.Tensor, value: torch.Tensor, plan: _Gather, queries: int) -> torch.Tensor:
    """``[B, H_kv, groups * Q, D]`` float32 attention of queries whose visible keys are not a prefix of the buffer
    (tree nodes), from their scores.

    A tree node sees the prefix and its ancestors, which sit in the buffer among masked siblings. Masked keys add
    exact zeros, but the softmax and the weighted sum of values would still group the visible terms by their buffer
    slots, which differ from the slots the same tokens hold once accepted and decoded one at a time. Each score does
    not depend on its slot (one dot product), so each query's visible scores are gathered first, in slot order (their
    order in the sequence), into the first places of a row of their own, padded with masked places: its softmax then
    sees what plain decoding's does. The weighted sum takes the whole key blocks of the run of slots the query sees
    from the first straight from the buffer (its slots there are its places) and gathers the values of the rest of its
    places, so that every block of :func:`_block_products` holds the terms it holds in plain decoding.

    Args:
        scores: ``[B, H_kv, groups * Q, K]`` float32 scores, rows ``g * Q + i``.
        value: ``[B, H_kv, K, D]``.
    """
    batch, kv_heads, rows, width = scores.shape
    groups = rows // queries
    index = plan.order[:, None, None].expand(batch, kv_heads, groups, queries, -1)
    gathered = torch.gather(scores.reshape(batch, kv_heads, groups, queries, width), 4, index)  # [B, H_kv, G, Q, K']
    gathered.masked_fill_(~plan.visible[:, None, None], float("-inf"))
    weights = torch.softmax(gathered, dim=-1)
    values = value.float()
    partials = []
    buffered = plan.in_buffer.shape[-1]
    if buffered:
        kept = weights[..., :buffered].masked_fill(~plan.in_buffer[:, None, None], 0.0)
        kept = _padded_rows(kept.reshape(batch, kv_heads, rows, buffered))
        partials.append(_block_products(kept, values[:, :, :buffered])[:, :, :, :rows])  # [B, H_kv, n, R, D]
    index = plan.tail[:, None, None].expand(batch, kv_heads, groups, queries, -1)
    tail = torch.gather(weights, 4, index).masked_fill_(~plan.tail_visible[:, None, None], 0.0)  # [B, H_kv, G, Q, T]
    tail = _padded_rows(tail.transpose(2, 3).reshape(batch * kv_heads * queries, groups, -1))
    products = _block_products(tail, _gather_slots(values, plan.tail_slots))[:, :, :groups]  # [B H_kv Q, n', G, D]
    products = products.reshape(batch, kv_heads, queries, -1, groups, value.shape[-1]).permute(0, 1, 3, 4, 2, 5)
    partials.append(products.reshape(batch, kv_heads, -1, rows, value.shape[-1]))
    return _fold(*partials)


def _padded_rows(weights: torch.Tensor) -> torch.Tensor:
    """``weights`` ``[..., R, K]`` with zero rows up to :data:`MIN_ROWS` (a product's rows then have their bits)."""
    rows = weights.shape[-2]
    return F.pad(weights, (0, 0, 0, MIN_ROWS - rows)) if rows < MIN_ROWS else weights


def _block_products(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[..., K / KEY_BLOCK, R, D]``: each block of :data:`KEY_BLOCK` keys' weighted sum, one float32 product of
    that width (a product's sums then group the same terms whatever K)."""
    *lead, rows, width = weights.shape
    blocks = width // KEY_BLOCK
    weights = weights.reshape(*lead, rows, blocks, KEY_BLOCK).transpose(-3, -2)  # [..., n, R, KEY_BLOCK]
    return torch.matmul(weights, values.reshape(*lead, blocks, KEY_BLOCK, values.shape[-1]))


# A fold of blocks of at most this many numbers runs as one cumulative sum (on a CPU), a larger one as a loop of
# additions: the same float64 additions in the same order, so the same bits, each the faster one where it is used.
_FOLD_ELEMENTS = 4096


def _fold(*partials: torch.Tensor) -> torch.Tensor:
    """``[..., R, D]`` float32: the blocks of ``partials`` (``[..., n_i, R, D]`` each, in order) added one after the
    other to a float64 zero, then rounded once. Blocks of exact zeros after or among the others leave the sum as it
    is, so a query's sum does not depend on how many such blocks its forward computes."""
    first = partials[0]
    if first.device.type == "cpu" and first[..., 0, :, :].numel() <= _FOLD_ELEMENTS:
        blocks = first if len(partials) == 1 else torch.cat(partials, dim=-3)
        return blocks.cumsum(dim=-3).select(-3, -1)  # (a CPU's cumulative sum of float32 runs in float64)
    total = torch.zeros(first[..., 0, :, :].shape, dtype=torch.float64, device=first.device)
    for blocks in partials:
        for block in blocks.unbind(dim=-3):
            total += block
    return total.float()


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
        if rows.shape[0] == 1 and x.dim() > 1:  # a decoding step's row [..., 1, K]: as below, without the split
            return forward(F.pad(x, (0, 0, 0, 1)))[..., :1, :]
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
    kernels from as few as 5 rows (measured: 4,096 x 1,024), where over ``[N, K]`` they keep one up to 32 rows.
    Where :func:`_packs_weights`, over oneDNN's blocked copy of that weight (:func:`_packed_weight`)."""
    packed = _packed_weight(module)
    if packed is not None:
        return _packed_product(module, packed)
    if isinstance(module, torch.nn.Linear):
        return module.forward
    weight = module.weight.detach().t().contiguous()  # [N, K]
    return lambda x: F.linear(x, weight, module.bias)


# A layer's weight in oneDNN's blocked layout, made once per weight (and again if it changes): the plain product hands
# oneDNN the weight as it is, which its AMX kernel rearranges on every call, about half the cost of a decoding step's
# products (measured on a CPU with AMX, SmolLM2-135M's 576 x 1,536 layer, one thread: 51 us blocked, 107 us plain).
# It holds a second copy of the weights.
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()
# The batch size the blocked layout is chosen for: at 2 (and 8, 32) a product has the plain product's bits at every
# row count measured; the layout chosen for 1 row rounds 2-row products over an 8,960-wide inner size differently.
_PACKED_FOR_ROWS = 2


@lru_cache(maxsize=1)
def _cpu_has_amx() -> bool:
    """Whether this CPU has AMX-BF16 units (Linux's CPU flags) and torch has oneDNN's blocked linear layers."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    has_op = hasattr(torch.ops.mkldnn, "_linear_pointwise")
    return "amx_bf16" in flags and torch.backends.mkldnn.is_available() and has_op


def _packs_weights(module: torch.nn.Module) -> bool:
    """Whether the switch computes the layer over a blocked copy of its weight: a bf16 weight in CPU memory on a CPU
    with AMX (where the blocked product was measured to give the plain product's bits at 2-64 rows for every layer
    shape of SmolLM2-135M and Qwen2.5-1.5B, output layers included), and no forward of its own (accelerate's offload
    hooks load the weight there)."""
    weight, own_forward = module.weight, "forward" in module.__dict__
    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and not own_forward and _cpu_has_amx()


def _packed_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """The layer's weight as ``[N, K]`` in oneDNN's blocked layout (cached while the weight lives and is unchanged),
    or None where the plain product is kept (:func:`_packs_weights`)."""
    if not _packs_weights(module):
        return None
    weight = module.weight
    stamp = (weight._version, weight.data_ptr())
    cached = _PACKED.get(weight)
    if cached is None or cached[0] != stamp:
        plain = weight.detach() if isinstance(module, torch.nn.Linear) else weight.detach().t().contiguous()
        cached = _PACKED[weight] = (stamp, torch.ops.mkldnn._reorder_linear_weight(plain, _PACKED_FOR_ROWS))
    return cached[1]


def _packed_product(module: torch.nn.Module, packed: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The layer's product over its blocked weight; with autograd recording, the plain one over ``[N, K]`` (the
    blocked product has no derivative)."""
    forward = module.forward if isinstance(module, torch.nn.Linear) else None  # (before the switch replaces it)

    def product(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return forward(x) if forward is not None else F.linear(x, module.weight.t().contiguous(), module.bias)
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, module.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], out.shape[-1])  # [..., N]

    return product


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

    On a CPU with AMX a bf16 layer is computed over a copy of its weight in oneDNN's blocked layout, which the plain
    product makes on every call (:func:`_packed_weight`): the same bits at half the cost of a decoding step's layers.
    The copies are made at the first switch over a model (a second copy of its linear weights, kept while the
    weights live and remade if they change).
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
