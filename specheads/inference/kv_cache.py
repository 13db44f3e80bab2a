"""The only module that knows how a transformers cache is laid out.

Decoding runs on a :class:`SlotCache`: preallocated key/value buffers ``[B, kv_heads, capacity, head_dim]`` per layer
(the gpt-fast way) with a committed length per row. Rows are independent: a forward writes each row's new slots at
that row's own offset, and the 4D mask (:func:`step_mask`) says which slots each query sees. The base runs through
its public forward; the cache is a transformers ``Cache`` subclass, so every attention implementation that calls
``cache.update`` takes it (transformers' ``StaticCache`` writes every row at one shared position, which ragged
rows cannot use). Speculative decoding then needs three operations transformers does not name:

* :func:`commit`: after verifying a tree, move each row's accepted slots right after its prefix (an in-place gather)
  and advance its length; nothing else moves;
* :func:`crop`: roll rows back to given lengths (rejected chain drafts, a draft's own cache): a length update;
* :func:`keep_rows`: drop finished rows from the batch (once per finished row, not per step);
* :func:`stack_rows`: one batch's cache from its rows' caches (each prompt prefilled alone).

``DynamicCache`` (concatenation per step) stays for training-time unrolls and the functions' original one-row form.

transformers has moved its cache internals between releases (``past_key_values`` became ``cache`` in 5.x; tensors
moved from ``key_cache[i]`` lists to ``layers[i].keys``). Keeping that knowledge here keeps the damage in one file.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One layer's preallocated buffers; the write offsets and lengths live in the owning :class:`SlotCache`."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: SlotCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        shape = (max(batch, self.owner.batch_capacity), heads, self.owner.capacity, dim)
        self.keys = key_states.new_zeros(shape)
        self.values = value_states.new_zeros(shape[:3] + (value_states.shape[-1],))
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, _, count, _ = key_states.shape
        lengths = self.owner.lengths[:batch]
        width = max(lengths) + count
        if width > self.keys.shape[2]:
            self._grow(width)
        first = lengths[0]
        if all(length == first for length in lengths):  # one row, or rows in step: a plain slice copy
            self.keys[:batch, :, first : first + count] = key_states
            self.values[:batch, :, first : first + count] = value_states
        else:  # ragged rows: each row's new slots start at its own length
            rows, positions = self.owner.write_index(count, key_states.device)
            self.keys[rows, :, positions] = key_states.transpose(1, 2)
            self.values[rows, :, positions] = value_states.transpose(1, 2)
        return self.keys[:batch, :, :width], self.values[:batch, :, :width]

    def _grow(self, needed: int) -> None:
        """Only when a forward outgrows the capacity sized at prefill (a drafter that did not announce its size)."""
        size = max(needed, 2 * self.keys.shape[2])
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[:2] + (size,) + old.shape[3:])
            new[:, :, : old.shape[2]] = old
            setattr(self, name, new)
        self.owner.reallocations += 1

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width(query_length), 0

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return -1


class SlotCache(Cache):
    """Preallocated key/value buffers with one committed length per row (see the module docstring).

    Args:
        batch_size: rows.
        capacity: slots per row allocated at the first write (prompt + new tokens + the largest step).
        device: where the lengths live.
    """

    def __init__(self, batch_size: int, capacity: int, device: torch.device | str | None = None) -> None:
        super().__init__(layers=[])
        self.batch_capacity = batch_size
        self.capacity = capacity
        self.batch = batch_size  # rows taking part in forwards (a prefix of the buffers' rows)
        self.lengths = [0] * batch_size  # committed slots per row (Python ints: no device sync per layer)
        self.reallocations = 0
        self._write_index: tuple[Any, tuple[torch.Tensor, torch.Tensor]] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        while len(self.layers) <= layer_idx:
            self.layers.append(SlotLayer(self))
        return self.layers[layer_idx].update(key_states, value_states)

    def write_index(self, count: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``([B, 1], [B, count])`` row and slot indices a forward of ``count`` tokens per row writes (right after
        each row's length); built once per forward and shared by every layer."""
        key = (tuple(self.lengths[: self.batch]), count, str(device))
        if self._write_index is None or self._write_index[0] != key:
            lengths = to_device(list(key[0]), device)
            positions = lengths[:, None] + torch.arange(count, device=device)[None]
            self._write_index = (key, (torch.arange(self.batch, device=device)[:, None], positions))
        return self._write_index[1]

    def width(self, count: int) -> int:
        """Slots a forward of ``count`` tokens per row attends over: the longest row plus the new tokens."""
        return max(self.lengths[: self.batch]) + count if self.batch else count

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(self.lengths[: self.batch]) if self.batch else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.width(query_length), 0

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The allocated buffers (for tests: their identity shows that nothing was reallocated)."""
        return [t for layer in self.layers if layer.is_initialized for t in (layer.keys, layer.values)]


def to_device(values: list, device: torch.device | str | None, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Host values as a tensor on ``device`` without making the host wait: on CUDA they go through pinned memory
    with a non-blocking copy (a copy from pageable memory synchronises); elsewhere a plain tensor."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype, device=device)


def new_cache(batch_size: int | None = None, capacity: int | None = None, device: Any = None) -> Any:
    """A cache for decoding: a :class:`SlotCache` when ``capacity`` is given, else an empty ``DynamicCache``."""
    if capacity is None:
        return DynamicCache()
    return SlotCache(batch_size or 1, capacity, device)


def row_lengths(cache: SlotCache) -> list[int]:
    """Committed slots of each row taking part in forwards."""
    return list(cache.lengths[: cache.batch])


def advance(cache: SlotCache, counts: list[int]) -> None:
    """Commit the first ``counts[b]`` slots a forward wrote for row b (a ragged feed: padded tokens are dropped)."""
    cache.lengths[: cache.batch] = [length + count for length, count in zip(cache.lengths, counts, strict=False)]


def stack_rows(rows: list[SlotCache]) -> SlotCache:
    """One cache whose rows are the one-row caches ``rows``, in order (prompts prefilled one at a time); a row whose
    cache was never written holds zeros. The caches have one capacity."""
    cache = SlotCache(len(rows), rows[0].capacity)
    cache.lengths = [row.lengths[0] for row in rows]
    written = next((row for row in rows if row.layers), None)
    for index, template in enumerate([] if written is None else written.layers):
        layer = SlotLayer(cache)
        for name in ("keys", "values"):
            empty = torch.zeros_like(getattr(template, name))
            setattr(layer, name, torch.cat([getattr(row.layers[index], name) if row.layers else empty for row in rows]))
        layer.device, layer.dtype, layer.is_initialized = template.device, template.dtype, True
        cache.layers.append(layer)
    return cache


def keep_rows(cache: SlotCache, rows: list[int]) -> None:
    """Keep only ``rows`` (indices among the rows taking part), in that order, as the first rows of the buffers."""
    if rows == list(range(cache.batch)):
        return
    index = torch.tensor(rows, dtype=torch.long)
    for layer in cache.layers:
        if layer.is_initialized:
            layer.keys[: len(rows)] = layer.keys[index.to(layer.keys.device)]
            layer.values[: len(rows)] = layer.values[index.to(layer.values.device)]
    cache.lengths[: len(rows)] = [cache.lengths[row] for row in rows]
    cache.batch = len(rows)


def step_mask(
    lengths: list[int], inner: list[torch.Tensor | None], count: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """``[B, 1, count, width]`` bool mask of a forward feeding ``count`` (padded) tokens per row into a SlotCache.

    Row b's queries see its committed slots ``[0, lengths[b])`` and, among its new slots ``lengths[b] + j``, what
    ``inner[b]`` (``[n_b, n_b]``, ``n_b <= count``; None: nothing new is fed) allows. Padding queries see only their
    own slot, so no softmax row is empty; their outputs are never read.
    """
    block = torch.eye(count, dtype=torch.bool).repeat(len(lengths), 1, 1)
    for row, own in enumerate(inner):
        if own is not None and own.shape[0]:
            block[row, : own.shape[0], : own.shape[0]] = own.cpu()
    return tree_step_mask(to_device(lengths, device), max(lengths), block.to(device))


def tree_step_mask(starts: torch.Tensor, longest: int, block: torch.Tensor) -> torch.Tensor:
    """``[B, 1, Q, longest + E]`` bool mask of a forward into a SlotCache, built by broadcasting.

    Args:
        starts: ``[B]`` on the device: where each row's block of slots begins (its committed length before the
            block).
        longest: ``max(starts)``, known on the host.
        block: ``[B, Q, E]`` (or ``[1, Q, E]``, shared): what each of the Q queries sees among the row's E slots
            from its start on, the last Q of which this forward writes (E = Q for a plain step; a draft tree fed
            depth by depth has earlier entries too). Padding queries should see only themselves.

    Row b's queries see its slots ``[0, starts[b])`` and its slots ``starts[b] + j`` as ``block[b]`` allows: the
    prefix by one comparison, the block by one scatter, with no per-row slices.
    """
    queries, entries = block.shape[-2:]
    batch = starts.shape[0]
    if batch == 1:  # one row: its prefix is the whole of `longest`
        prefix = torch.ones(1, queries, longest, dtype=torch.bool, device=starts.device)
        return torch.cat([prefix, block.to(torch.bool)], dim=-1)[:, None]
    columns = torch.arange(longest + entries, device=starts.device)
    mask = (columns[None, :] < starts[:, None])[:, None, :].expand(batch, queries, -1).clone()
    offsets = starts[:, None, None] + torch.arange(entries, device=starts.device)[None, None, :]
    mask.scatter_(2, offsets.expand(batch, queries, entries), block.expand(batch, queries, entries))
    return mask[:, None]


def causal(size: int, device: torch.device | str | None = None) -> torch.Tensor | None:
    """``[size, size]`` lower-triangular bool: the ``inner`` mask of a plain (ragged) feed; None when nothing is fed."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril() if size else None


@lru_cache(maxsize=32)
def _cache_argument(forward_cls: type) -> str:
    parameters = inspect.signature(forward_cls.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def forward_kwargs(model: PreTrainedModel, cache: Any) -> dict[str, Any]:
    """Keyword arguments that hand ``cache`` to ``model.forward`` under this transformers release's name."""
    return {_cache_argument(type(model)): cache, "use_cache": True}


def seq_length(cache: Any) -> int:
    """Number of positions held in the cache (a SlotCache: its longest row)."""
    return cache.get_seq_length()


def _layers(cache: DynamicCache) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: specheads needs a transformers DynamicCache")
    for layer in layers:
        if getattr(layer, "is_sliding", False):
            raise TypeError("sliding-window cache layers cannot be rolled back; build the cache with new_cache()")
    return layers


def crop(cache: Any, length: int | list[int]) -> None:
    """Roll the cache back: keep the first ``length`` positions (a SlotCache: per row when a list is given).

    Args:
        cache: the cache to trim in place.
        length: positions to keep, ``0 <= length <=`` the current length.
    """
    if isinstance(cache, SlotCache):
        cache.lengths[: cache.batch] = [length] * cache.batch if isinstance(length, int) else list(length)
        return
    for layer in _layers(cache):
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def commit(cache: Any, keep_indices: Any, prefix_len: int | None = None) -> None:
    """Move the accepted tree slots into place and drop the rest.

    A :class:`SlotCache` takes ``keep_indices`` per row (``list[list[int]]``, node indices relative to each row's
    length, 0 = root) and no ``prefix_len``: the accepted slots are gathered in place after each row's prefix and the
    row's length advances by their number. A ``DynamicCache`` (one row) works as described below.

    After a verify forward the cache holds ``prefix_len`` committed positions followed by one slot per tree node.
    ``keep_indices`` are node indices (0 = root) of the accepted path in order; afterwards the cache holds
    ``prefix_len + len(keep_indices)`` positions, the accepted nodes in path order.

    Args:
        cache: the base model's cache, modified in place.
        keep_indices: ``[M]`` accepted node indices relative to ``prefix_len``.
        prefix_len: number of positions committed before the verify forward.
    """
    if isinstance(cache, SlotCache):
        _commit_slots(cache, [[int(i) for i in row] for row in keep_indices])
        return
    indices = [int(i) for i in keep_indices]
    count = len(indices)
    if indices == list(range(count)):  # a chain prefix (every step of a chain drafter): already in place
        crop(cache, prefix_len + count)
        return
    keep = torch.tensor(indices, dtype=torch.long)
    for layer in _layers(cache):
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        source = (keep + prefix_len).to(layer.keys.device)
        # [B, H, M, D] gathered, then written over the first M tree slots; the tail is cropped.
        layer.keys[..., prefix_len : prefix_len + count, :] = layer.keys.index_select(-2, source)
        layer.values[..., prefix_len : prefix_len + count, :] = layer.values.index_select(-2, source)
        layer.keys = layer.keys[..., : prefix_len + count, :]
        layer.values = layer.values[..., : prefix_len + count, :]


def _commit_slots(cache: SlotCache, keep: list[list[int]]) -> None:
    lengths = cache.lengths[: cache.batch]
    moves = [
        (row, length + index, length + target)
        for row, (length, indices) in enumerate(zip(lengths, keep, strict=True))
        for target, index in enumerate(indices)
        if index != target
    ]
    if moves:
        host = [list(column) for column in zip(*moves, strict=True)]  # [3, M]: rows, sources, targets
        on_device: dict[torch.device, torch.Tensor] = {}  # layers may sit on different devices (device_map)
        for layer in cache.layers:
            if layer.is_initialized:
                device = layer.keys.device
                if device not in on_device:
                    on_device[device] = to_device(host, device)
                r, src, dst = on_device[device]
                layer.keys[r, :, dst] = layer.keys[r, :, src]  # gathered first (advanced indexing copies), then written
                layer.values[r, :, dst] = layer.values[r, :, src]
    advance(cache, [len(indices) for indices in keep])


@lru_cache(maxsize=32)
def _layer_cache_argument(module_cls: type) -> str:
    parameters = inspect.signature(module_cls.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def layer_kwargs(module: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """Keyword arguments that hand ``cache`` to a transformers attention or decoder-layer module's forward."""
    return {_layer_cache_argument(type(module)): cache}
