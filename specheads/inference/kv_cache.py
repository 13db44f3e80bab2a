"""The only module that knows how a transformers cache is laid out.

The base model keeps its own cache object (``DynamicCache``); speculative decoding needs two operations on it that
transformers does not name:

* :func:`commit`: after verifying a tree, keep the key/value slots of the accepted nodes, moved right after the
  prefix, and drop the rest;
* :func:`crop`: roll the cache back to a given length (rejected chain drafts, a draft model's own cache).

transformers has moved its cache internals between releases (``past_key_values`` became ``cache`` in 5.x; tensors
moved from ``key_cache[i]`` lists to ``layers[i].keys``). Keeping that knowledge here keeps the damage in one file.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel


def new_cache() -> DynamicCache:
    """An empty cache that holds every position (no sliding window eviction)."""
    return DynamicCache()


@lru_cache(maxsize=32)
def _cache_argument(forward_cls: type) -> str:
    parameters = inspect.signature(forward_cls.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def forward_kwargs(model: PreTrainedModel, cache: DynamicCache) -> dict[str, Any]:
    """Keyword arguments that hand ``cache`` to ``model.forward`` under this transformers release's name."""
    return {_cache_argument(type(model)): cache, "use_cache": True}


def seq_length(cache: DynamicCache) -> int:
    """Number of positions held in the cache."""
    return cache.get_seq_length()


def _layers(cache: DynamicCache) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported cache type {type(cache).__name__}: specheads needs a transformers DynamicCache")
    for layer in layers:
        if getattr(layer, "is_sliding", False):
            raise TypeError("sliding-window cache layers cannot be rolled back; build the cache with new_cache()")
    return layers


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of every layer.

    Args:
        cache: the cache to trim in place.
        length: positions to keep, ``0 <= length <= seq_length(cache)``.
    """
    for layer in _layers(cache):
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def commit(cache: DynamicCache, keep_indices: torch.Tensor | list[int], prefix_len: int) -> None:
    """Move the accepted tree slots into place and drop the rest.

    After a verify forward the cache holds ``prefix_len`` committed positions followed by one slot per tree node.
    ``keep_indices`` are node indices (0 = root) of the accepted path in order; afterwards the cache holds
    ``prefix_len + len(keep_indices)`` positions, the accepted nodes in path order.

    Args:
        cache: the base model's cache, modified in place.
        keep_indices: ``[M]`` accepted node indices relative to ``prefix_len``.
        prefix_len: number of positions committed before the verify forward.
    """
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


@lru_cache(maxsize=32)
def _layer_cache_argument(module_cls: type) -> str:
    parameters = inspect.signature(module_cls.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def layer_kwargs(module: torch.nn.Module, cache: DynamicCache | None) -> dict[str, Any]:
    """Keyword arguments that hand ``cache`` to a transformers attention or decoder-layer module's forward."""
    return {_layer_cache_argument(type(module)): cache}
