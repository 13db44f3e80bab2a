"""Tree masks and the cache seam: a tree forward must equal plain causal forwards, and commit must equal a rebuild."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, tiny_model

from specheads.inference import kv_cache
from specheads.inference.trees import resolve_tree

TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def _forward(model, ids, cache=None, mask=None, positions=None):
    kwargs = kv_cache.forward_kwargs(model, cache) if cache is not None else {}
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_chain_shaped_tree_mask_gives_plain_causal_logits(arch: str) -> None:
    model = tiny_model(arch)
    ids = torch.randint(2, 96, (1, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = _forward(model, ids).logits
        cache = kv_cache.new_cache()
        _forward(model, ids[:, :9], cache)
        tree = resolve_tree("chain-4")
        mask = kv_cache.step_mask([9], [tree.attention_mask], tree.num_nodes + 1)
        chained = _forward(model, ids[:, 9:], cache, mask, (9 + tree.depths)[None]).logits
    torch.testing.assert_close(chained, full[:, 9:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_tree_node_sees_exactly_its_ancestors(arch: str) -> None:
    model = tiny_model(arch)
    tree = resolve_tree(TREE)
    generator = torch.Generator().manual_seed(1)
    prefix = torch.randint(2, 96, (1, 7), generator=generator)
    nodes = torch.randint(2, 96, (1, tree.num_nodes + 1), generator=generator)
    with torch.no_grad():
        cache = kv_cache.new_cache()
        _forward(model, prefix[:, :-1], cache)
        nodes[0, 0] = prefix[0, -1]  # the root is the last prefix token, not yet in the cache
        mask = kv_cache.step_mask([6], [tree.attention_mask], tree.num_nodes + 1)
        tree_logits = _forward(model, nodes, cache, mask, (6 + tree.depths)[None]).logits[0]
        for node in range(tree.num_nodes + 1):
            ancestry = [n for n in range(node + 1) if tree.attention_mask[node, n]]
            plain = _forward(model, torch.cat([prefix[:, :-1], nodes[:, ancestry]], dim=1)).logits[0, -1]
            torch.testing.assert_close(tree_logits[node], plain, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("accepted", [[0], [0, 1], [0, 2, 5], [0, 1, 3, 6]])
def test_commit_equals_a_cache_built_from_the_accepted_tokens(arch: str, accepted: list[int]) -> None:
    model = tiny_model(arch)
    tree = resolve_tree(TREE)
    generator = torch.Generator().manual_seed(2)
    prefix = torch.randint(2, 96, (1, 6), generator=generator)
    nodes = torch.randint(2, 96, (1, tree.num_nodes + 1), generator=generator)
    with torch.no_grad():
        cache = kv_cache.new_cache()
        _forward(model, prefix, cache)
        mask = kv_cache.step_mask([6], [tree.attention_mask], tree.num_nodes + 1)
        _forward(model, nodes, cache, mask, (6 + tree.depths)[None])
        assert kv_cache.seq_length(cache) == 6 + tree.num_nodes + 1
        kv_cache.commit(cache, accepted, prefix_len=6)
        rebuilt = kv_cache.new_cache()
        _forward(model, torch.cat([prefix, nodes[:, accepted]], dim=1), rebuilt)
    assert kv_cache.seq_length(cache) == 6 + len(accepted)
    for layer, reference in zip(cache.layers, rebuilt.layers, strict=True):
        torch.testing.assert_close(layer.keys, reference.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(layer.values, reference.values, rtol=1e-4, atol=1e-5)


def test_crop_rolls_back() -> None:
    model = tiny_model("llama")
    ids = torch.randint(2, 96, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        cache = kv_cache.new_cache()
        _forward(model, ids, cache)
        kv_cache.crop(cache, 4)
        rebuilt = kv_cache.new_cache()
        _forward(model, ids[:, :4], rebuilt)
    assert kv_cache.seq_length(cache) == 4
    torch.testing.assert_close(cache.layers[0].keys, rebuilt.layers[0].keys, rtol=1e-4, atol=1e-5)


def test_stacked_rows_hold_each_prompt_alone_and_a_step_reads_them_as_the_row_alone() -> None:
    """A batch's cache stacked from its prompts' own caches (one empty) holds each row's slots and length, and a
    ragged step over it gives each row the logits of the same step on that row's cache alone."""
    model = tiny_model("llama")
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(2, 96, (1, length), generator=generator) for length in (7, 0, 3)]
    rows = [kv_cache.new_cache(1, 12) for _ in prompts]
    with torch.no_grad():
        for ids, cache in zip(prompts, rows, strict=True):
            if ids.shape[1]:
                _forward(model, ids, cache, positions=torch.arange(ids.shape[1])[None])
                kv_cache.advance(cache, [ids.shape[1]])
        stacked = kv_cache.stack_rows(rows)
        assert kv_cache.row_lengths(stacked) == [7, 0, 3]
        for row, cache in enumerate(rows):
            for index, layer in enumerate(stacked.layers):
                for name in ("keys", "values"):
                    mine = getattr(layer, name)[row]
                    own = getattr(cache.layers[index], name)[0] if cache.layers else torch.zeros_like(mine)
                    assert torch.equal(mine, own), (row, index, name)
        step = torch.randint(2, 96, (3, 1), generator=generator)
        mask = kv_cache.step_mask([7, 0, 3], [kv_cache.causal(1)] * 3, 1)
        batched = _forward(model, step, stacked, mask, torch.tensor([[7], [0], [3]])).logits[:, -1]
        for row, cache in enumerate(rows):
            position = torch.tensor([[prompts[row].shape[1]]])
            alone = _forward(model, step[row : row + 1], cache, positions=position).logits[0, -1]
            torch.testing.assert_close(batched[row], alone, rtol=1e-4, atol=1e-5)
