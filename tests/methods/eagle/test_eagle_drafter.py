"""Decoding with EAGLE heads: lossless on several architectures and trees, a draft cache that always equals a rebuild
from the committed tokens, EAGLE-2 dynamic trees checked by hand, and bad input refused before any compute.

Random EAGLE heads almost never agree with a random base, so a small module fixture trains a head on the tiny
base's own samples for a few seconds: its drafts are accepted often enough (tau clearly above 1) that multi-token
commits, EOS inside an accepted run and the draft cache after long accepted paths are all exercised.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import ARCHITECTURES, base_samples, greedy_reference, tiny_model, train_eagle_head
from safetensors.torch import load_file, save_file

from specheads import HeadCheckpointError, SpecDecoder, TreeError, load_heads
from specheads.heads import EagleHead, MedusaHeads
from specheads.inference import kv_cache
from specheads.inference.sampling import SamplingParams
from specheads.inference.state import DecodeState, DraftRequest
from specheads.inference.trees import TreeBuffers, resolve_tree, tree_from_parents
from specheads.methods.eagle.drafter import EagleDrafter, _ancestry, _EagleState, _Root
from specheads.methods.eagle.trees import DynamicTree
from specheads.methods.medusa.drafter import MedusaDrafter

VOCAB = 96
STATIC_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
TREES = [
    ("chain-3", {}),
    (STATIC_TREE, {}),
    ("dynamic", {}),
    ("dynamic", dict(tree_top_k=3, depth=3, total_tokens=6)),
]
HEAD_KINDS = {
    "eagle1": dict(version=1),
    "eagle3": dict(version=3),
    "eagle3-reduced": dict(version=3, draft_vocab_size=40),
}


def _random_head(base, kind: str) -> EagleHead:
    kwargs = dict(HEAD_KINDS[kind])
    if "draft_vocab_size" in kwargs:
        kwargs["token_counts"] = torch.randint(0, 50, (VOCAB,), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    return EagleHead.from_base(base, **kwargs)


def _prompt(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1, vocab_size=VOCAB, layers=4, logit_scale=4.0)


@pytest.fixture(scope="module")
def trained(base) -> dict[str, EagleHead]:
    """EAGLE-1 and EAGLE-3 (reduced draft vocabulary) heads trained on the base's own sampled text."""
    sequences = base_samples(base)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    return {
        "eagle1": train_eagle_head(base, sequences, version=1),
        "eagle3-reduced": train_eagle_head(base, sequences, version=3, draft_vocab_size=64, token_counts=counts),
    }


# ---------------------------------------------------------------------------------------------- the greedy invariant
@pytest.mark.parametrize("kind", HEAD_KINDS)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_random_eagle_heads_match_greedy(arch: str, kind: str) -> None:
    base = tiny_model(arch, seed=1, layers=4)
    decoder = SpecDecoder(base, EagleDrafter(_random_head(base, kind)))
    for length in (1, 5, 23):
        prompt = _prompt(length, seed=length)
        reference = greedy_reference(base, prompt, 12)
        for tree, kwargs in TREES:
            out = decoder.generate(prompt, max_new_tokens=12, tree=tree, **kwargs)
            assert torch.equal(out.sequences, reference), (arch, kind, tree, kwargs, length)


@pytest.mark.parametrize("kind", ["eagle1", "eagle3-reduced"])
def test_trained_eagle_heads_match_greedy_over_multi_token_commits(base, trained, kind: str) -> None:
    decoder = SpecDecoder(base, EagleDrafter(trained[kind]))
    new_tokens, steps, longest = 0, 0, 0
    for length in (1, 5, 23):
        prompt = _prompt(length, seed=length)
        reference = greedy_reference(base, prompt, 30)
        for tree, kwargs in [*TREES, ("binary-7", {})]:
            out = decoder.generate(prompt, max_new_tokens=30, tree=tree, **kwargs)
            assert torch.equal(out.sequences, reference), (kind, tree, kwargs, length)
            new_tokens, steps = new_tokens + out.stats.new_tokens, steps + out.stats.steps
            longest = max(longest, *out.stats.accepted_drafts)
    # A drafter that pairs tokens with the wrong features or skips d2t stays lossless but accepts less (tau ~1.3 here).
    assert new_tokens / steps > 1.2
    assert longest >= 2


# ---------------------------------------------------------------------------------------- stopping inside a run
def _run_with_an_inner_token(accepted_lengths: list[int], new_tokens: list[int]) -> tuple[int, int] | None:
    """``(step, start)`` of the first step that emitted >= 3 tokens (>= 2 accepted drafts) whose second token does not
    occur earlier; ``start`` is the index of its first token among the new tokens."""
    start = 0
    for step, emitted in enumerate(accepted_lengths):
        if emitted >= 3 and new_tokens[start + 1] not in new_tokens[: start + 1]:
            return step, start
        start += emitted
    return None


def test_eos_inside_an_accepted_run_stops_like_generate(base, trained) -> None:
    decoder = SpecDecoder(base, EagleDrafter(trained["eagle3-reduced"]))
    for seed in range(10):
        prompt = _prompt(5, seed=seed)
        full = decoder.generate(prompt, max_new_tokens=40)
        found = _run_with_an_inner_token(full.stats.accepted_lengths, full.new_tokens)
        if found is None:
            continue
        step, start = found
        eos = full.new_tokens[start + 1]  # an accepted draft, with more tokens of the same step after it
        out = decoder.generate(prompt, max_new_tokens=40, eos_token_id=eos)
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 40, eos_token_id=eos))
        assert out.new_tokens == full.new_tokens[: start + 2]
        # The same steps as without EOS, the last one cut after its second token.
        assert out.stats.accepted_lengths == [*full.stats.accepted_lengths[:step], 2]
        return
    pytest.fail("no prompt gave an accepted run of >= 2 drafts; the trained fixture drafts too poorly")


def test_max_new_tokens_cuts_an_accepted_run(base, trained) -> None:
    decoder = SpecDecoder(base, EagleDrafter(trained["eagle1"]))
    prompt = _prompt(5, seed=3)
    reference = greedy_reference(base, prompt, 16)
    ends_in_a_run = 0
    for budget in range(1, 17):
        out = decoder.generate(prompt, max_new_tokens=budget)
        assert torch.equal(out.sequences, reference[:, : 5 + budget]), budget
        assert len(out.new_tokens) == budget
        ends_in_a_run += out.stats.accepted_lengths[-1] >= 2
    assert ends_in_a_run > 0  # some budget ended exactly at the end of an accepted multi-token run


# ---------------------------------------------------------------------------------------- the draft cache
def _rebuilt_cache(head: EagleHead, base, committed: torch.Tensor) -> tuple:
    """A draft cache fed every committed pair (token t + 1, feature of t) at once, from a plain base forward."""
    pairs = committed.shape[1] - 1
    out = base(committed[:, :pairs], output_hidden_states=True)
    features = head.fuse([out.hidden_states[index] for index in head.hidden_state_layers])  # [1, pairs, H]
    cache = kv_cache.new_cache()
    mask = torch.ones(pairs, pairs, dtype=torch.bool).tril()[None, None]
    hidden = head.step(committed[:, 1:], features, torch.arange(pairs)[None], mask, cache)
    return cache, hidden[:, -1]


class _CheckedDrafter(EagleDrafter):
    """Compares every row's draft cache with a rebuild from its committed tokens every time queued pairs are fed."""

    def __init__(self, head: EagleHead, base) -> None:
        super().__init__(head)
        self.base = base
        self.checks = 0

    def _feed_pending(self, state: DecodeState):
        fed = super()._feed_pending(state)
        draft = state.draft
        for i, row in enumerate(state.rows):
            committed = state.lengths[row]
            assert draft.consumed[i] == committed - 1
            length = kv_cache.row_lengths(draft.cache)[i]
            assert length == committed - 1
            if committed == 1:  # a one-token prompt: no pair yet
                assert fed is None or not fed[1][i]
                continue
            rebuilt, rebuilt_root = _rebuilt_cache(self.head, self.base, state.tokens[row : row + 1, :committed])
            for layer, reference in zip(draft.cache.layers, rebuilt.layers, strict=True):
                assert torch.allclose(layer.keys[i, :, :length], reference.keys[0], atol=1e-5)
                assert torch.allclose(layer.values[i, :, :length], reference.values[0], atol=1e-5)
            assert torch.allclose(fed[0].hidden[i], rebuilt_root[0], atol=1e-5)
            self.checks += 1
        return fed


@pytest.mark.parametrize("tree", ["dynamic", "binary-7"])
@pytest.mark.parametrize("kind", ["eagle1", "eagle3-reduced"])
def test_draft_cache_equals_a_rebuild_from_the_committed_pairs(base, trained, kind: str, tree: str) -> None:
    drafter = _CheckedDrafter(trained[kind], base)
    decoder = SpecDecoder(base, drafter)
    accepted_drafts = []
    prompts = [_prompt(length, seed=11) for length in (1, 6)]
    for prompt in prompts:
        out = decoder.generate(prompt, max_new_tokens=30, tree=tree)
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 30))
        accepted_drafts += out.stats.accepted_drafts
    outs = decoder.generate([*prompts, _prompt(13, seed=2)], max_new_tokens=30, tree=tree)  # rows in one batch
    for out, prompt in zip(outs, [*prompts, _prompt(13, seed=2)], strict=True):
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 30))
    assert drafter.checks > 40
    assert max(accepted_drafts) >= 2  # the cache was checked after multi-token commits


# ---------------------------------------------------------------------------------------- tree construction
DRAFT_VOCAB, OFFSET = 6, 10  # the stub's draft id d is target id d + OFFSET


class _StubHead(torch.nn.Module):
    """A head whose draft distribution depends only on the token just fed: ``next_probs[its draft id]``.

    Its output for a fed token is the one-hot of that token's draft id, so the logits of a node are the log of the
    row of ``next_probs`` for its token. Every ``step`` call is recorded with its inputs.
    """

    hidden_state_layers = (0,)

    def __init__(self, next_probs: torch.Tensor) -> None:
        super().__init__()
        self.next_log_probs = next_probs.log()
        self.config = SimpleNamespace(draft_vocab_size=DRAFT_VOCAB)
        self.calls: list[dict] = []

    def fuse(self, features):
        return features[0]

    def step(self, input_ids, features, position_ids, attention_mask, cache):
        count = input_ids.shape[1]
        self.calls.append(
            dict(
                tokens=input_ids[0].tolist(),
                features=features[0],
                positions=position_ids[0].tolist(),
                mask=attention_mask,
            )
        )
        cache.update(torch.zeros(1, 1, count, 1), torch.zeros(1, 1, count, 1), 0)
        return torch.nn.functional.one_hot(input_ids - OFFSET, DRAFT_VOCAB).float()  # [1, count, Vd]

    def logits(self, hidden):
        return hidden @ self.next_log_probs

    def to_target(self, draft_ids):
        return draft_ids + OFFSET


def _stub_drafter(consumed: int = 3) -> tuple[EagleDrafter, _StubHead]:
    # next_probs[d]: the draft's next-token distribution after a node whose token has draft id d.
    next_probs = torch.full((DRAFT_VOCAB, DRAFT_VOCAB), 1 / DRAFT_VOCAB)
    next_probs[1] = torch.tensor([0.05, 0.05, 0.05, 0.5, 0.3, 0.05])  # after 1: 3 (0.5), 4 (0.3)
    next_probs[2] = torch.tensor([0.0125, 0.0125, 0.0125, 0.05, 0.0125, 0.9])  # after 2: 5 (0.9), 3 (0.05)
    next_probs[3] = torch.tensor([0.02, 0.9, 0.05, 0.01, 0.01, 0.01])  # after 3: 1 (0.9), 2 (0.05)
    next_probs[5] = torch.tensor([0.3, 0.05, 0.05, 0.05, 0.5, 0.05])  # after 5: 4 (0.5), 0 (0.3)
    head = _StubHead(next_probs)
    drafter = EagleDrafter(head)
    cache = kv_cache.new_cache(1, 64)
    cache.update(torch.zeros(1, 1, consumed, 1), torch.zeros(1, 1, consumed, 1), 0)  # committed pairs
    kv_cache.advance(cache, [consumed])
    return drafter, head, _EagleState(cache, [consumed])


def _stub_root() -> _Root:
    probs = torch.full((DRAFT_VOCAB,), 0.0375)
    probs[1], probs[2] = 0.6, 0.25
    return _Root(hidden=torch.full((1, DRAFT_VOCAB), 7.0), log_probs=probs.log()[None])


def test_dynamic_tree_by_hand() -> None:
    """EAGLE-2 with top_k=2, depth=3, total_tokens=4; draft ids below, target id = draft id + 10.

    Root: 1 (0.6), 2 (0.25), the rest 0.0375.              depth 1 candidates A=1 (0.6), B=2 (0.25)
    Expand A, B: A->3 0.30, A->4 0.18; B->5 0.225, B->3 0.0125.   best two: A3 (0.30), B5 (0.225)
    Expand A3, B5: A3->1 0.27, A3->2 0.015; B5->4 0.1125, B5->0 0.0675.
    Best four overall: A 0.6, A3 0.30, A31 0.27, B 0.25 (B5 0.225 just misses).
    Kept, by depth then creation: A, B, A3, A31 -> with the root first, parents [-1, 0, 0, 1, 3], depths
    [0, 1, 1, 2, 3] (the positions after the root's).
    """
    drafter, head, draft = _stub_drafter(consumed=3)
    [proposal] = drafter._dynamic(draft, _stub_root(), DynamicTree(top_k=2, depth=3, total_tokens=4), 10)
    tokens, tree = proposal.tokens[0], proposal.tree
    assert tokens.tolist() == [11, 12, 13, 11]
    assert tree.parents == (-1, 0, 0, 1, 3)
    assert tree.depths.tolist() == [0, 1, 1, 2, 3]
    expected_mask = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]
    assert tree.attention_mask.int().tolist() == expected_mask
    assert proposal.attention_mask.int().tolist() == [expected_mask]  # the same, built on the device
    assert proposal.depths.tolist() == [[0, 1, 1, 2, 3]]
    # What the draft was fed: depth 1 (A, B) at position consumed - 1 + 1 = 3 on the root's output, then depth 2
    # (A3, B5) at position 4, each on its parent's output, seeing every committed pair and its own ancestors.
    first, second = head.calls
    assert first["tokens"] == [11, 12] and first["positions"] == [3, 3]
    assert torch.equal(first["features"], torch.full((2, DRAFT_VOCAB), 7.0))
    assert first["mask"][0, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    assert second["tokens"] == [13, 15] and second["positions"] == [4, 4]
    assert second["features"].argmax(dim=-1).tolist() == [1, 2]  # the outputs of A and B
    assert second["mask"][0, 0].int().tolist() == [[1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 1, 0, 1]]


@pytest.mark.parametrize(
    ("spec", "max_depth", "tokens", "parents"),
    [
        (DynamicTree(top_k=2, depth=3, total_tokens=4), 1, [11, 12], (-1, 0, 0)),  # the budget caps the depth
        (DynamicTree(top_k=2, depth=3, total_tokens=5), 2, [11, 12, 13, 14, 15], (-1, 0, 0, 1, 1, 2)),
        (DynamicTree(top_k=1, depth=3, total_tokens=8), 10, [11, 13, 11], (-1, 0, 1, 2)),  # top_k=1: a chain
        (DynamicTree(top_k=2, depth=3, total_tokens=1), 10, [11], (-1, 0)),
    ],
)
def test_dynamic_tree_limits_by_hand(spec: DynamicTree, max_depth: int, tokens: list[int], parents: tuple) -> None:
    """Same stub as above. depth 2 with 5 kept: A .6, A3 .30, B .25, B5 .225, A4 .18 (B3 .0125 dropped)."""
    drafter, _, draft = _stub_drafter()
    [proposal] = drafter._dynamic(draft, _stub_root(), spec, max_depth)
    assert proposal.tokens.tolist() == [tokens]
    assert proposal.tree.parents == parents
    if proposal.tree.is_chain:  # a chain's buffers come from the engine's cache
        assert proposal.attention_mask is None and proposal.depths is None
    else:
        assert torch.equal(proposal.attention_mask[0], proposal.tree.attention_mask)
        assert torch.equal(proposal.depths[0], proposal.tree.depths)


class _KeepingProposals(EagleDrafter):
    """Keeps every dynamic-tree proposal it makes."""

    def __init__(self, head: EagleHead) -> None:
        super().__init__(head)
        self.proposals: list = []

    def _dynamic(self, *args):
        proposals = super()._dynamic(*args)
        self.proposals.extend(proposals)
        return proposals


@pytest.mark.parametrize("tree", ["dynamic-3-3-6", "dynamic-4-5-16", "dynamic-2-6-9"])
def test_dynamic_trees_bring_their_mask_and_depths_built_on_the_device(monkeypatch, tree: str) -> None:
    """Every row's dynamic tree comes with exactly its host tree's attention mask and depths, built where the tree
    was grown (unless every row's tree is a chain); the engine verifies with those, uploading no tree but chains
    (a lone root's, a chain's: few shapes, cached), and the output stays the base's greedy one."""
    base = tiny_model("llama", seed=1)
    torch.manual_seed(0)
    head = EagleHead.from_base(base, version=3, draft_vocab_size=40, token_counts=torch.arange(VOCAB))
    drafter = _KeepingProposals(head)
    uploaded = []
    on = TreeBuffers.on

    def recording_on(self, *args, **kwargs):
        uploaded.append(self)
        return on(self, *args, **kwargs)

    monkeypatch.setattr(TreeBuffers, "on", recording_on)
    prompts = [row[: 5 + 2 * i] for i, row in enumerate(base_samples(base, rows=3, new_tokens=6, seed=2))]
    outs = SpecDecoder(base, drafter).generate(prompts, max_new_tokens=12, tree=tree)
    for out, prompt in zip(outs, prompts, strict=True):
        assert torch.equal(out.sequences, greedy_reference(base, prompt[None], 12))
    assert len({p.tree.parents for p in drafter.proposals if not p.tree.is_chain}) > 3  # different trees
    for proposal in drafter.proposals:
        if proposal.attention_mask is None:
            assert proposal.tree.is_chain
            continue
        assert torch.equal(proposal.attention_mask[0], proposal.tree.attention_mask)
        assert torch.equal(proposal.depths[0], proposal.tree.depths)
    assert all(t.is_chain for t in uploaded)


@pytest.mark.parametrize("seed", range(20))
def test_the_device_ancestry_of_random_trees_is_the_host_trees(seed: int) -> None:
    """:func:`_ancestry` on a batch of random trees (parents before children, any depth limit at least the
    deepest node's) gives each one's :class:`TreeBuffers` mask and depths."""
    generator = torch.Generator().manual_seed(seed)
    rows, size = 1 + seed % 4, 1 + 7 * seed % 23
    parents = torch.stack([torch.randint(0, node, (rows,), generator=generator) for node in range(1, size + 1)], 1)
    trees = [tree_from_parents([-1, *row]) for row in parents.tolist()]
    deepest = max(tree.max_depth for tree in trees)
    for limit in (deepest, deepest + 2):
        mask, depths = _ancestry(parents, limit)
        assert torch.equal(mask, torch.stack([tree.attention_mask for tree in trees]))
        assert torch.equal(depths, torch.stack([tree.depths for tree in trees]))


class _RecordingDrafter(EagleDrafter):
    """Records the draft outputs of every node it feeds while drafting a tree."""

    def __init__(self, head: EagleHead) -> None:
        super().__init__(head)
        self.outputs: list[torch.Tensor] = []

    def _feed_nodes(self, *args):
        hidden, log_probs = super()._feed_nodes(*args)
        self.outputs.extend(hidden[0])  # one row: its nodes' outputs
        return hidden, log_probs


def test_static_tree_nodes_are_the_drafts_top_k_at_their_rank() -> None:
    """Node (r1, .., rd) is the rank-rd token of the draft after its ancestors, decoded one token at a time; the
    tree-masked expansion must also give each node the same draft output as that chain."""
    base = tiny_model("llama", seed=1, layers=4)
    head = _random_head(base, "eagle3-reduced")
    with torch.no_grad():  # sharper than the init
        for parameter in head.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
    prompt = _prompt(7, seed=4)
    with torch.no_grad():
        out = base(prompt[:, :-1], output_hidden_states=True)
    hidden_states = tuple(out.hidden_states[index] for index in head.hidden_state_layers)
    state = DecodeState(prompt.clone(), [7], [7], kv_cache.new_cache(1, 64), hidden_states, [False])
    drafter = _RecordingDrafter(head)
    drafter.reset(state)
    tree = resolve_tree([[0], [1], [2], [0, 0], [0, 2], [1, 1], [0, 0, 1], [0, 2, 0]])
    proposal = drafter.propose(state, DraftRequest(SamplingParams(), max_depth=10, tree=tree))
    assert proposal.tree is tree and proposal.draft_probs is None
    with torch.no_grad():
        chains = [_chain(head, base, prompt, path) for path in tree.choices]
    assert proposal.tokens[0].tolist() == [token for token, _ in chains]
    assert all(bool(head.t2d[token]) for token, _ in chains)
    # Nodes with children were fed, depth by depth in index order: [0], [1], then [0, 0], [0, 2] ([1, 1] is a leaf).
    fed = [node for depth in (1, 2) for node in range(1, 9) if tree.depths[node] == depth and tree.children[node]]
    assert len(drafter.outputs) == len(fed) == 4
    for output, node in zip(drafter.outputs, fed, strict=True):
        torch.testing.assert_close(output, chains[node - 1][1], rtol=1e-4, atol=1e-5)


def _chain(head: EagleHead, base, committed: torch.Tensor, path: tuple[int, ...]) -> tuple[int, torch.Tensor]:
    """Tree node ``path`` decoded as a chain in a fresh cache (no tree mask): its token and its draft output."""
    cache, hidden = _rebuilt_cache(head, base, committed)
    root_position = committed.shape[1] - 2
    for depth, rank in enumerate(path, start=1):
        token = head.to_target(head.logits(hidden)[0].topk(rank + 1).indices[rank])
        position = torch.tensor([[root_position + depth]])
        hidden = head.step(token.view(1, 1), hidden[:, None], position, None, cache)[:, -1]
    return int(token), hidden[0]


# ---------------------------------------------------------------------------------------- bad input
@pytest.fixture
def forward_calls(base):
    """Counts the base's forwards: bad input must be refused before any."""
    calls: list[int] = []
    handle = base.register_forward_pre_hook(lambda module, args: calls.append(1))
    yield calls
    handle.remove()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(tree="dynamic", tree_top_k=0), TreeError, "top_k must be an integer >= 1"),
        (dict(tree="dynamic", depth=0), TreeError, "depth must be an integer >= 1"),
        (dict(tree="dynamic", total_tokens=-2), TreeError, "total_tokens must be an integer >= 1"),
        (dict(depth=3), ValueError, "pass tree='dynamic'"),
        (dict(tree="chain-3", total_tokens=5), ValueError, "pass tree='dynamic'"),
        (dict(tree=[[0], [40]]), ValueError, "rank 40 but the draft vocabulary has 40"),
    ],
)
def test_bad_dynamic_tree_arguments(base, forward_calls, kwargs: dict, error: type, message: str) -> None:
    decoder = SpecDecoder(base, EagleDrafter(_random_head(base, "eagle3-reduced")))
    with pytest.raises(error, match=message):
        decoder.generate(_prompt(5), max_new_tokens=4, **kwargs)
    assert not forward_calls


@pytest.mark.parametrize("kwargs", [dict(tree="dynamic"), dict(tree="dynamic", depth=2)])
def test_dynamic_trees_need_eagle_heads(base, forward_calls, kwargs: dict) -> None:
    medusa = SpecDecoder(base, MedusaDrafter(MedusaHeads.from_base(base, num_heads=3)))
    with pytest.raises(ValueError, match=r"grown by the drafters of methods \['eagle'\]"):
        medusa.generate(_prompt(5), max_new_tokens=4, **kwargs)
    with pytest.raises(ValueError, match=r"grown by the drafters of methods \['eagle'\]"):
        SpecDecoder(base).generate(_prompt(5), max_new_tokens=4, **kwargs)
    assert not forward_calls


def test_a_d2t_map_outside_the_vocabulary_is_refused(base, tmp_path) -> None:
    head = _random_head(base, "eagle3-reduced")
    for name, edit in [("outside", lambda d2t: d2t.add_(1000)), ("repeated", lambda d2t: d2t.copy_(-torch.arange(40)))]:
        directory = tmp_path / name
        head.save_pretrained(directory)
        tensors = load_file(str(directory / "model.safetensors"))
        edit(tensors["d2t"])  # "repeated": every draft id d maps to target id d + (-d) = 0
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(HeadCheckpointError, match="d2t"):
            load_heads(directory, base)


@pytest.mark.parametrize("size", [0, -1, VOCAB + 1, 2.5, True])
def test_draft_vocab_size_outside_the_vocabulary(base, size) -> None:
    counts = torch.ones(VOCAB)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        EagleHead.from_base(base, version=3, draft_vocab_size=size, token_counts=counts)


def test_a_reduced_vocabulary_without_counts_and_eagle1_reduced_are_refused(base) -> None:
    with pytest.raises(ValueError, match="token_counts"):
        EagleHead.from_base(base, version=3, draft_vocab_size=32)
    with pytest.raises(ValueError, match="EAGLE-1"):
        EagleHead.from_base(base, version=1, draft_vocab_size=32)


@pytest.mark.parametrize("layer_ids", [[0, 1, 99], [-1, 0, 1], [0, 1, 4], [0, 1]])
def test_fused_layers_outside_the_base_are_refused(base, tmp_path, layer_ids: list[int]) -> None:
    with pytest.raises(ValueError, match="layer"):
        EagleHead.from_base(base, version=3, layer_ids=layer_ids)
    # The same through a checkpoint whose config was edited: refused at load, not deep inside a decode.
    _random_head(base, "eagle3").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "layer_ids": layer_ids}))
    with pytest.raises(HeadCheckpointError, match="layer_ids"):
        load_heads(tmp_path, base)


@pytest.mark.parametrize("layer_ids", [[2], [99]])
def test_an_eagle1_checkpoint_must_read_the_last_feature(base, tmp_path, layer_ids: list[int]) -> None:
    _random_head(base, "eagle1").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["layer_ids"] == [4]
    (tmp_path / "config.json").write_text(json.dumps({**config, "layer_ids": layer_ids}))
    with pytest.raises(HeadCheckpointError, match="layer_ids"):
        load_heads(tmp_path, base)


def test_heads_for_another_base_are_refused(base, tmp_path) -> None:
    _random_head(base, "eagle3").save_pretrained(tmp_path)
    for other in (tiny_model("llama", seed=2, vocab_size=VOCAB, layers=4), tiny_model("qwen2", seed=1, layers=4)):
        with pytest.raises(HeadCheckpointError, match="another base"):
            load_heads(tmp_path, other)
        with pytest.raises(HeadCheckpointError, match="another base"):
            SpecDecoder.from_pretrained(other, heads=str(tmp_path))


# ---------------------------------------------------------------------------------------- loading
def test_from_pretrained_infers_eagle_from_the_checkpoint(base, trained, tmp_path) -> None:
    head = trained["eagle3-reduced"]
    head.save_pretrained(tmp_path)
    decoder = SpecDecoder.from_pretrained(base, heads=str(tmp_path))
    assert decoder.drafter.name == "eagle"
    assert isinstance(decoder.drafter, EagleDrafter)
    prompt = _prompt(5, seed=2)
    out = decoder.generate(prompt, max_new_tokens=24)
    assert torch.equal(out.sequences, greedy_reference(base, prompt, 24))
    in_memory = SpecDecoder(base, EagleDrafter(head)).generate(prompt, max_new_tokens=24)
    assert out.stats.accepted_lengths == in_memory.stats.accepted_lengths  # the same head, the same drafts
    assert out.stats.mean_accepted_length > 1


def test_dynamic_tree_string_form_equals_the_keywords() -> None:
    base = tiny_model("llama", seed=1, layers=4)
    decoder = SpecDecoder(base, EagleDrafter(EagleHead.from_base(base, version=3)))
    prompt = torch.randint(2, 96, (1, 7), generator=torch.Generator().manual_seed(3))
    by_name = decoder.generate(prompt, max_new_tokens=12, tree="dynamic-3-4-6")
    by_keywords = decoder.generate(prompt, max_new_tokens=12, tree="dynamic", tree_top_k=3, depth=4, total_tokens=6)
    assert torch.equal(by_name.sequences, by_keywords.sequences)
    assert by_name.stats.accepted_lengths == by_keywords.stats.accepted_lengths
    assert torch.equal(by_name.sequences, greedy_reference(base, prompt, 12))
    assert DynamicTree.parse("dynamic-3-4-6") == DynamicTree(3, 4, 6) and DynamicTree(3, 4, 6).name == "dynamic-3-4-6"
    with pytest.raises(TreeError, match="total_tokens"):
        decoder.generate(prompt, max_new_tokens=4, tree="dynamic-3-4-0")
