"""The block drafter at decode time: lossless chains and DDTree trees, the context it keeps, the DDTree builder."""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, greedy_reference, tiny_model

from specheads import SpecDecoder
from specheads.inference.state import DecodeState
from specheads.methods.dflash.drafter import DFlashDrafter, ddtree
from specheads.methods.dflash.heads import DFlashHead
from specheads.methods.dflash.trees import BlockTree
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.eagle.heads import EagleHead


def _head(base, variant: str, block: int = 4, seed: int = 0, **kwargs) -> DFlashHead:  # noqa: ANN001, ANN003
    torch.manual_seed(seed)
    head = DFlashHead.from_base(base, variant=variant, block_size=block, markov_rank=8, **kwargs)
    with torch.no_grad():  # a non-zero Markov bias, so that DSpark's trees differ from the marginals'
        for parameter in head.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return head


def _prompt(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, 96, (1, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_chains_static_trees_and_ddtrees_equal_greedy_alone_and_batched(arch: str, variant: str) -> None:
    base = tiny_model(arch, seed=1, layers=4)
    head = _head(base, variant)
    prompts = [_prompt(length, seed) for seed, length in enumerate((1, 5, 23))]
    expected = [greedy_reference(base, p, 12)[0, p.shape[1] :].tolist() for p in prompts]
    for tree in ("chain-3", "binary-7", "ddtree-8", "ddtree-1"):
        decoder = SpecDecoder(base, DFlashDrafter(head, tree=tree))
        for prompt, want in zip(prompts, expected, strict=True):
            assert decoder.generate(prompt, max_new_tokens=12).new_tokens == want, (tree, prompt.shape)
        batch = decoder.generate([p[0] for p in prompts], max_new_tokens=12)
        assert [out.new_tokens for out in batch] == expected, tree


def test_eos_inside_a_block_stops_where_greedy_stops() -> None:
    base = tiny_model("llama", seed=1, layers=4)
    prompt = _prompt(6, seed=4)
    free = greedy_reference(base, prompt, 16)[0, 6:].tolist()
    eos = free[5]  # the sixth new token: inside the second block of a chain of 3
    expected = greedy_reference(base, prompt, 16, eos_token_id=eos)[0, 6:].tolist()
    for variant in ("dflash", "dspark"):
        for tree in ("chain-3", "ddtree-8"):
            decoder = SpecDecoder(base, DFlashDrafter(_head(base, variant), tree=tree))
            out = decoder.generate(prompt, max_new_tokens=16, eos_token_id=eos)
            assert out.new_tokens == expected and out.finish_reason == "eos", (variant, tree)


class _CheckedDrafter(DFlashDrafter):
    """Before every block: the context cache equals one rebuilt from the committed tokens, and the block's logits
    equal the training forward's at the same anchor."""

    checked = 0

    def _block(self, state: DecodeState, depths: int | None = None):  # noqa: ANN202
        self._feed_context(state.draft)
        block = super()._block(state)
        base = self.head.base_model_of()
        for i, row in enumerate(state.rows):
            committed = torch.tensor([state.host_tokens[row]])
            length = committed.shape[1]
            assert state.draft.consumed[i] == length - 1
            with torch.no_grad():
                hidden_states = base(committed, output_hidden_states=True).hidden_states
                features = [hidden_states[k] for k in self.head.hidden_state_layers]
                context = self.head.fuse(features)[:, : length - 1]
                expected = self.head.context_keys_values(context, torch.arange(length - 1)[None])
                for layer, (keys, values) in enumerate(expected):
                    cached = state.draft.cache.layers[layer]
                    torch.testing.assert_close(cached.keys[i : i + 1, :, : length - 1], keys, atol=1e-5, rtol=0)
                    torch.testing.assert_close(cached.values[i : i + 1, :, : length - 1], values, atol=1e-5, rtol=0)
                hidden = self.head(committed, features, torch.tensor([[length - 1]]))[0, 0]  # [S, h]
                first = self.head.config.first_slot
                logits = self.head.lm_head()(hidden[first : first + self.depth]).float()
            torch.testing.assert_close(block.logits[i], logits, atol=1e-4, rtol=0)
            self.checked += 1
        return block


@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_the_context_equals_one_rebuilt_from_committed_tokens_after_every_step(variant: str) -> None:
    base = tiny_model("qwen2", seed=2, layers=4)
    drafter = _CheckedDrafter(_head(base, variant), tree="ddtree-6")
    decoder = SpecDecoder(base, drafter)
    prompts = [_prompt(length, seed) for seed, length in enumerate((1, 7, 15))]
    outs = decoder.generate([p[0] for p in prompts], max_new_tokens=14)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.new_tokens == greedy_reference(base, prompt, 14)[0, prompt.shape[1] :].tolist()
    assert drafter.checked >= 6


# ---------------------------------------------------------------------------------------------------- DDTree
def _marginal_children(values: list[list[float]], tokens: list[list[int]]):  # noqa: ANN202
    return lambda depth, token: (values[depth], tokens[depth])


def test_ddtree_builds_the_hand_worked_tree() -> None:
    values = [[-0.1, -2.0, -3.0], [-0.2, -1.5, -4.0]]
    tokens = [[10, 11, 12], [20, 21, 22]]
    parents, chosen = ddtree(5, 2, 4, _marginal_children(values, tokens))
    # a (-0.1), a-x (-0.3), a-y (-1.6), b (-2.0): b-x (-2.2) and c (-3.0) are the next best, past the budget
    assert chosen == [10, 20, 21, 11] and parents == [0, 1, 1, 0]
    parents, chosen = ddtree(5, 2, 6, _marginal_children(values, tokens))
    assert chosen == [10, 20, 21, 11, 20, 12] and parents == [0, 1, 1, 0, 4, 0]
    assert ddtree(5, 1, 2, _marginal_children(values, tokens)) == ([0, 0], [10, 11])


def _tree_scores(drafter: DFlashDrafter, block, row: int, parents: list[int], tokens: list[int]) -> list[float]:  # noqa: ANN001
    """Each node's path log-likelihood under the drafter's own (Markov-biased) distributions."""
    scores, node_tokens, depths = [0.0], [int(block.roots[row])], [0]
    torch.set_grad_enabled(False)
    for parent, token in zip(parents, tokens, strict=True):
        depth = depths[parent]
        logits = drafter._with_bias(block.logits[row, depth : depth + 1], torch.tensor([node_tokens[parent]]))
        scores.append(scores[parent] + float(logits.log_softmax(dim=-1)[0, token]))
        node_tokens.append(token)
        depths.append(depth + 1)
    torch.set_grad_enabled(True)
    return scores


def _block_of(drafter: DFlashDrafter, base, prompt: torch.Tensor):  # noqa: ANN001, ANN202
    """The drafter's block for one prompt, as the decoder would build it after the prefill."""
    captured = {}
    original = drafter._block

    def capture(state, depths=None):  # noqa: ANN001, ANN202
        captured.setdefault("block", original(state))
        return captured["block"]

    drafter._block = capture
    SpecDecoder(base, drafter).generate(prompt, max_new_tokens=2)
    drafter._block = original
    return captured["block"]


def test_the_markov_ddtree_is_best_first_without_duplicates_and_equals_the_marginal_one_without_a_bias() -> None:
    base = tiny_model("llama", seed=1, layers=4)
    head = _head(base, "dspark", block=5)
    with torch.no_grad():  # sharper draft distributions: the best paths go deep as well as wide
        head.norm.weight.mul_(100.0)
    drafter = DFlashDrafter(head)
    block = _block_of(drafter, base, _prompt(9, seed=5))
    budget = 12
    proposal = drafter._ddtree(block, 0, budget, drafter.depth)
    assert proposal.draft_probs is None  # a deterministic tree is verified as one-hot
    tree, tokens = proposal.tree, proposal.tokens[0].tolist()
    parents = tree.parents[1:]
    assert len(set(zip(parents, tokens, strict=True))) == len(tokens) == budget  # no duplicate (parent, token)
    scores = _tree_scores(drafter, block, 0, parents, tokens)
    assert all(scores[n] <= scores[p] for n, p in zip(range(1, len(scores)), parents, strict=True))
    # Best-first: no path left out (a child of a kept node, or of the root) scores above the worst kept one.
    kept = set(zip(parents, tokens, strict=True))
    frontier = []
    for node in range(len(scores)):
        if tree.levels[node] >= drafter.depth:
            continue
        token = int(block.roots[0]) if node == 0 else tokens[node - 1]
        logits = drafter._with_bias(block.logits[0, tree.levels[node], None], torch.tensor([token]))
        for candidate, value in enumerate(logits.log_softmax(dim=-1)[0].tolist()):
            if (node, candidate) not in kept:
                frontier.append(scores[node] + value)
    assert max(frontier) <= min(scores[1:]) + 1e-6
    # With the Markov bias at zero the tree is the marginal DDTree.
    with torch.no_grad():
        head.markov_head.markov_w2.weight.zero_()
    values = block.logits[0].log_softmax(dim=-1).topk(budget, dim=-1)
    expected = ddtree(int(block.roots[0]), drafter.depth, budget,
                      _marginal_children(values.values.tolist(), values.indices.tolist()))  # fmt: skip
    markov = drafter._ddtree(block, 0, budget, drafter.depth)
    assert (list(markov.tree.parents[1:]), markov.tokens[0].tolist()) == expected
    assert len(set(expected[0])) > 1, "the tree should have more than one level"


def test_a_ddtree_proposal_never_carries_draft_probabilities_even_when_sampling() -> None:
    base = tiny_model("llama", seed=1, layers=4)
    drafter = DFlashDrafter(_head(base, "dflash"), tree="ddtree-6")
    seen = []
    original = drafter.propose

    def spy(state, request):  # noqa: ANN001, ANN202
        proposals = original(state, request)
        seen.extend(proposals if isinstance(proposals, list) else [proposals])
        return proposals

    drafter.propose = spy
    SpecDecoder(base, drafter).generate(_prompt(5), max_new_tokens=10, temperature=1.0, seed=0)
    assert seen and all(p is None or p.draft_probs is None for p in seen)


def test_tree_ddtree_with_total_tokens_sets_the_budget() -> None:
    base = tiny_model("llama", seed=1, layers=4)
    drafter = DFlashDrafter(_head(base, "dflash"))
    seen = []
    original = drafter.propose

    def spy(state, request):  # noqa: ANN001, ANN202
        proposals = original(state, request)
        seen.append((request.tree, [p.tree.num_nodes for p in proposals or [] if p is not None] or [0]))
        return proposals

    drafter.propose = spy
    prompt = _prompt(5)
    out = SpecDecoder(base, drafter).generate(prompt, max_new_tokens=10, tree="ddtree", total_tokens=3)
    assert out.new_tokens == greedy_reference(base, prompt, 10)[0, 5:].tolist()
    assert seen and all(tree == BlockTree(3) and max(nodes) <= 3 for tree, nodes in seen)


# ---------------------------------------------------------------------------------------------------- bad input
def test_bad_requests_are_clear_errors_before_compute() -> None:
    base = tiny_model("llama", seed=1, layers=4)
    decoder = SpecDecoder(base, DFlashDrafter(_head(base, "dflash", block=4)))
    prompt = _prompt(5)
    with pytest.raises(ValueError, match="node budget"):
        decoder.generate(prompt, max_new_tokens=4, tree="ddtree-0")
    with pytest.raises(ValueError, match="drafts 3 tokens"):
        decoder.generate(prompt, max_new_tokens=4, tree="chain-5")
    with pytest.raises(ValueError, match="dynamic"):
        decoder.generate(prompt, max_new_tokens=4, tree="dynamic")
    with pytest.raises(ValueError, match="total_tokens"):
        decoder.generate(prompt, max_new_tokens=4, tree="ddtree", depth=3)
    with pytest.raises(ValueError, match="node budget"):
        BlockTree(0)
    eagle = SpecDecoder(base, EagleDrafter(EagleHead.from_base(base)))
    with pytest.raises(ValueError, match=r"grown by the drafters of methods \['dflash'\]"):
        eagle.generate(prompt, max_new_tokens=4, tree="ddtree")


def test_the_mask_token_is_the_tokenizers_then_a_spare_row_then_pad_then_eos() -> None:
    from types import SimpleNamespace

    from specheads.methods.dflash.heads import resolve_mask_token

    base = tiny_model("llama", seed=1, layers=4)  # 96 embedding rows, pad 0 in its config

    class Tokenizer(SimpleNamespace):
        def __len__(self) -> int:
            return self.size

    assert resolve_mask_token(base, Tokenizer(size=96, mask_token_id=7, pad_token_id=3)) == 7
    assert resolve_mask_token(base, Tokenizer(size=90, mask_token_id=None, pad_token_id=3)) == 90
    assert resolve_mask_token(base, Tokenizer(size=96, mask_token_id=None, pad_token_id=3)) == 3
    assert resolve_mask_token(base, Tokenizer(size=96, mask_token_id=None, pad_token_id=None, eos_token_id=5)) == 0
    assert resolve_mask_token(base) == base.config.pad_token_id == 0


# ------------------------------------------------------------------------------------- trained heads, several a step
@pytest.fixture(scope="module")
def trained_block_heads():
    """Block heads fitted to the base's own greedy continuations of 16 prompts and decoding from those prompts: they
    accept several drafts a step, so that multi-token commits (and EOS inside an accepted block) are exercised, not
    only the single-token steps random heads give."""
    from helpers import train_block_head

    base = tiny_model("llama", seed=1, layers=4)
    prompts = torch.randint(2, 96, (16, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        sequences = base.generate(prompts, do_sample=False, max_new_tokens=40, attention_mask=torch.ones_like(prompts))
    common = {"layer_ids": [1, 3], "num_layers": 1, "block_size": 4, "markov_rank": 8}
    heads = {
        "dflash": train_block_head(base, sequences, steps=300, lr=1e-2, variant="dflash", **common),
        "dspark": train_block_head(base, sequences, steps=100, variant="dspark", **common),
    }
    return base, heads, sequences


# (least mean drafts accepted per step, whether some step must accept 2+). Measured: dflash chain-3 0.22, ddtree-8
# 0.66; dspark chain-3 0.96 (steps of 2 and 3 drafts), ddtree-8 1.0. These heads' depth-1 marginals stay flat
# enough that DDTree's best-first tree spends its 8 nodes on depth-1 siblings: one draft a step at most.
ACCEPTED_PER_STEP = {("dflash", "chain-3"): (0.15, False), ("dflash", "ddtree-8"): (0.5, False),
                     ("dspark", "chain-3"): (0.8, True), ("dspark", "ddtree-8"): (0.8, False)}  # fmt: skip


@pytest.mark.parametrize("variant", ["dflash", "dspark"])
@pytest.mark.parametrize("tree", ["chain-3", "ddtree-8"])
def test_trained_block_heads_commit_several_tokens_a_step_and_equal_greedy(trained_block_heads, variant, tree) -> None:
    base, heads, sequences = trained_block_heads
    decoder = SpecDecoder(base, DFlashDrafter(heads[variant], tree=tree))
    prompts = [sequences[i : i + 1, :6] for i in range(4)]
    expected = [greedy_reference(base, p, 24)[0, 6:].tolist() for p in prompts]
    accepted = []
    for prompt, want in zip(prompts, expected, strict=True):
        out = decoder.generate(prompt, max_new_tokens=24)
        assert out.new_tokens == want
        accepted += out.stats.accepted_drafts
    least, several = ACCEPTED_PER_STEP[variant, tree]
    assert sum(accepted) / len(accepted) >= least, accepted
    assert max(accepted) >= (2 if several else 1)  # drafts were accepted (several in one step where measured so)
    batch = decoder.generate([p[0] for p in prompts], max_new_tokens=24)
    assert [o.new_tokens for o in batch] == expected


def test_eos_inside_an_accepted_block_stops_where_greedy_stops(trained_block_heads) -> None:
    base, heads, sequences = trained_block_heads
    decoder = SpecDecoder(base, DFlashDrafter(heads["dspark"], tree="chain-3"))
    for index in range(16):
        prompt = sequences[index : index + 1, :6]
        free = decoder.generate(prompt, max_new_tokens=24)
        position, candidate = 0, None
        for drafts, length in zip(free.stats.accepted_drafts, free.stats.accepted_lengths, strict=True):
            token = free.new_tokens[position]  # the step's first committed token: a draft when drafts >= 2
            if drafts >= 2 and token not in free.new_tokens[:position]:
                candidate = token
                break
            position += length
        if candidate is None:
            continue
        expected = greedy_reference(base, prompt, 24, eos_token_id=candidate)[0, 6:].tolist()
        out = decoder.generate(prompt, max_new_tokens=24, eos_token_id=candidate)
        assert out.new_tokens == expected and out.finish_reason == "eos"
        assert out.stats.accepted_drafts[-1] >= 1  # EOS was an accepted draft with drafts after it, cut there
        return
    pytest.fail("no step accepted two drafts with a fresh token first")
