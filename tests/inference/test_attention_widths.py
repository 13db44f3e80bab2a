"""Exact in bf16 at a real head size: a query's attention has the same bits whatever the width of its forward.

The weighted sum of values is where width leaks in: a product sums its terms in blocks that depend on the width it
is given (oneDNN's bf16 kernels also pair neighbouring terms), so the same terms followed by more masked keys (a
longer row beside it, a deeper node in its tree, the chain after it) can round differently. Measured on SmolLM2-135M
(head size 64) on a CPU with AMX, a position alone at 97 or 103 keys and the same position in a forward of 112 parted,
and greedy outputs with them. The invariant attention sums each query's keys 64 at a time, by their place in its
sequence; these checks cross several such blocks.
"""

from __future__ import annotations

import pytest
import torch

from specheads.inference import attention, kv_cache
from specheads.inference.trees import tree_from_parents

HEAD_DIM = 64  # SmolLM2's, Llama's and Qwen's head size
HEADS, KV_HEADS = 9, 3  # SmolLM2-135M's grouping
PREFIXES = (5, 12, 63, 64, 97, 103, 124, 150, 200)  # keys before the query: short rows, block edges, measured partings
PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 6, 8, 9, 11, 12, 13]  # a 16-node tree, 7 deep, with side branches


class _Caller(torch.nn.Module):
    is_causal = True
    num_key_value_groups = HEADS // KV_HEADS


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    with torch.inference_mode():
        out, _ = attention.invariant_attention(_Caller().eval(), query, key, value, mask)
    return out  # [B, Q, H, D]


def _states(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 queries ``[1, H, count, D]`` and keys and values ``[1, H_kv, count, D]`` of one sequence."""
    generator = torch.Generator().manual_seed(seed)
    shape = (1, KV_HEADS, count, HEAD_DIM)
    query = torch.randn(1, HEADS, count, HEAD_DIM, generator=generator).bfloat16()
    return query, torch.randn(shape, generator=generator).bfloat16(), torch.randn(shape, generator=generator).bfloat16()


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_query_has_the_same_bits_alone_first_in_a_chain_and_beside_a_longer_row(prefix: int) -> None:
    """The query after ``prefix`` keys computed alone (its own width), as the first of 16 chained queries (15 more
    keys it must not see) and in a batch beside a row 70 keys longer (masked keys up to that row's width)."""
    query, key, value = _states(prefix + 16, seed=prefix)
    alone = _attend(query[:, :, prefix : prefix + 1], key[:, :, : prefix + 1], value[:, :, : prefix + 1], None)
    chain = _attend(query[:, :, prefix:], key, value, None)[:, :1]
    other_query, other_key, other_value = _states(prefix + 71, seed=prefix + 1)
    width = prefix + 71
    pad = (0, 0, 0, width - prefix - 1)
    batch_query = torch.cat([query[:, :, prefix : prefix + 1], other_query[:, :, -1:]])
    batch_key = torch.cat([torch.nn.functional.pad(key[:, :, : prefix + 1], pad), other_key])
    batch_value = torch.cat([torch.nn.functional.pad(value[:, :, : prefix + 1], pad), other_value])
    mask = kv_cache.tree_step_mask(torch.tensor([prefix, width - 1]), width - 1, torch.ones(1, 1, 1, dtype=torch.bool))
    beside = _attend(batch_query, batch_key, batch_value, mask)[:1]
    assert torch.equal(chain, alone), ("chain", prefix)
    assert torch.equal(beside, alone), ("beside a longer row", prefix)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_tree_node_has_the_bits_of_its_path_decoded_in_sequence(prefix: int) -> None:
    """Each node of a 16-node tree after ``prefix`` keys, against its own path's keys in consecutive places and
    the node alone (what decoding the accepted path one token at a time computes)."""
    tree = tree_from_parents(PARENTS)
    nodes = len(PARENTS)
    query, key, value = _states(prefix + nodes, seed=prefix)
    mask = kv_cache.tree_step_mask(torch.tensor([prefix]), prefix, tree.attention_mask[None])
    in_tree = _attend(query[:, :, prefix:], key, value, mask)
    parted = []
    for node in range(nodes):
        path = [node]
        while PARENTS[path[0]] >= 0:
            path.insert(0, PARENTS[path[0]])
        slots = list(range(prefix)) + [prefix + step for step in path]
        alone = _attend(query[:, :, prefix + node : prefix + node + 1], key[:, :, slots], value[:, :, slots], None)
        if not torch.equal(in_tree[:, node : node + 1], alone):
            parted.append(node)
    assert parted == [], prefix


def test_a_fold_adds_its_blocks_in_order_whatever_way_it_runs() -> None:
    """The one-pass cumulative sum (few numbers) and the loop of additions (many, or several pieces) give the same
    bits, and blocks of zeros after or among the blocks leave the sum as it is."""
    generator = torch.Generator().manual_seed(0)
    blocks = torch.randn(1, 3, 7, 8, HEAD_DIM, generator=generator) * torch.logspace(-3, 3, 7)[:, None, None]
    zeros = torch.zeros(1, 3, 2, 8, HEAD_DIM)
    whole = attention._fold(blocks)  # 3 x 8 x 64 numbers a block: the cumulative sum
    assert torch.equal(attention._fold(blocks[:, :, :3], blocks[:, :, 3:]), whole)  # two pieces: the loop
    assert torch.equal(attention._fold(torch.cat([blocks, zeros], dim=2)), whole)
    assert torch.equal(attention._fold(blocks[:, :, :3], zeros, blocks[:, :, 3:]), whole)
    assert not torch.equal(blocks.sum(dim=2), whole) or not torch.equal(blocks.flip(2).sum(dim=2), whole)
