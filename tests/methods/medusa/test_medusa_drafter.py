"""Decoding with Medusa heads: lossless on several architectures and trees, and trees must fit the heads."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, greedy_reference, tiny_model

from specheads import SpecDecoder
from specheads.heads import MedusaHeads
from specheads.methods.medusa.drafter import MedusaDrafter


def _random_heads(base, num_heads: int = 4, seed: int = 0) -> MedusaHeads:
    heads = MedusaHeads.from_base(base, num_heads=num_heads)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return heads


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("tree", ["chain-3", "binary-7", [[0], [1], [2], [3], [0, 0], [1, 0], [0, 0, 0], [0, 0, 0, 0]]])
def test_medusa_matches_greedy(arch: str, tree) -> None:
    base = tiny_model(arch, seed=1)
    decoder = SpecDecoder(base, MedusaDrafter(_random_heads(base)))
    for length in (1, 9):
        prompt = torch.randint(2, 96, (1, length), generator=torch.Generator().manual_seed(length))
        out = decoder.generate(prompt, max_new_tokens=20, tree=tree)
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 20)), (arch, tree, length)


def test_node_tokens_are_the_heads_top_k_at_their_depth_and_rank() -> None:
    from specheads.inference import kv_cache
    from specheads.inference.sampling import SamplingParams
    from specheads.inference.state import DecodeState, DraftRequest
    from specheads.inference.trees import resolve_tree

    base = tiny_model("llama")
    heads = _random_heads(base, num_heads=3)
    hidden = torch.randn(1, 4, base.config.hidden_size)
    state = DecodeState(torch.zeros(1, 8, dtype=torch.long), [5], [5], kv_cache.new_cache(), (hidden,), [False])
    tree = resolve_tree([[0], [1], [0, 0], [0, 2], [1, 1], [0, 0, 1]])
    request = DraftRequest(SamplingParams(), max_depth=10, tree=tree)
    proposal = MedusaDrafter(heads).propose(state, request)
    top = heads(hidden[:, -1]).topk(3, dim=-1).indices[:, 0]  # [heads, 3]
    expected = [int(top[len(path) - 1, path[-1]]) for path in tree.choices]
    assert proposal.tokens[0].tolist() == expected
    assert proposal.draft_probs is None


def test_medusa_from_pretrained_directory(tmp_path) -> None:
    base = tiny_model("qwen2", seed=2)
    _random_heads(base, num_heads=3).save_pretrained(tmp_path)
    decoder = SpecDecoder.from_pretrained(base, heads=str(tmp_path))
    assert decoder.drafter.name == "medusa"
    prompt = torch.tensor([[4, 8, 15, 16, 23, 42]])
    assert torch.equal(decoder.generate(prompt, max_new_tokens=12).sequences, greedy_reference(base, prompt, 12))


def test_a_tree_deeper_than_the_heads_is_refused() -> None:
    base = tiny_model("llama")
    decoder = SpecDecoder(base, MedusaDrafter(_random_heads(base, num_heads=2)))
    with pytest.raises(ValueError, match="only 2 Medusa heads"):
        decoder.generate(torch.tensor([[3, 4]]), max_new_tokens=4, tree="chain-3")
    with pytest.raises(ValueError, match="only 2 Medusa heads"):
        MedusaDrafter(_random_heads(base, num_heads=2), tree="binary-7")
