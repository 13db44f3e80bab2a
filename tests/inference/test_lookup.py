"""Prompt lookup composed with every drafter: one tree from both sources, lossless, drafters kept consistent."""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import replace

import pytest
import torch
from helpers import (
    ARCHITECTURES,
    OracleTreeDrafter,
    base_samples,
    greedy_reference,
    tiny_model,
    tiny_tokenizer,
    train_eagle_head,
    train_medusa_heads,
)

from specheads import SpecDecoder
from specheads.inference.drafters import DraftModelDrafter, NoDrafter
from specheads.inference.lookup import (
    CorpusIndex,
    PromptLookup,
    SuffixIndex,
    WithLookup,
    combined_matches,
    merge,
    path_on_tree,
    read_corpus,
)
from specheads.inference.state import Proposal
from specheads.inference.trees import resolve_tree, tree_from_parents
from specheads.methods.dflash.drafter import DFlashDrafter
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.medusa.drafter import MedusaDrafter

# ---------------------------------------------------------------------------------------------------- the index


def test_the_longest_suffix_match_comes_first_most_recent_occurrence_first() -> None:
    settings = PromptLookup(max_ngram=4, min_ngram=1, candidates=3, tokens_by_match=(0, 2, 3, 4, 5))
    #          0  1  2  3  4  5  6  7  8  9 10 11
    context = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3, 7, 1, 2, 3]
    found = SuffixIndex(settings).lookup(context, limit=10)
    # "1 2 3" (3 tokens; "9 1 2 3" never occurred before) was followed by 9 (at 3) and by 8 (at 7): most recent first
    assert found[0] == (3, [8, 5, 2, 3])
    assert found[1] == (3, [9, 1, 2, 3])
    # then the shorter match "2 3", whose other continuation (at 11) is new
    assert found[2] == (2, [7, 1, 2])
    assert SuffixIndex(settings).lookup(context, limit=2)[0] == (3, [8, 5])


def test_no_match_below_min_ngram_and_no_tokens_for_a_zero_entry() -> None:
    context = [4, 5, 6, 7, 4]  # only the 1-gram "4" repeats
    assert SuffixIndex(PromptLookup(min_ngram=2)).lookup(context, 8) == []
    assert SuffixIndex(PromptLookup(min_ngram=1, tokens_by_match=(0, 0, 4))).lookup(context, 8) == []
    assert SuffixIndex(PromptLookup(min_ngram=1, tokens_by_match=(0, 2))).lookup(context, 8) == [(1, [5, 6])]


def test_the_index_grows_with_the_context_as_a_fresh_one_would() -> None:
    settings = PromptLookup(max_ngram=3, min_ngram=1, candidates=2, tokens_by_match=(0, 3))
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, 5, (60,), generator=generator).tolist()
    growing = SuffixIndex(settings)
    for end in range(2, len(context)):
        assert growing.lookup(context[:end], 4) == SuffixIndex(settings).lookup(context[:end], 4), end


@pytest.mark.parametrize(
    "bad",
    [dict(min_ngram=0), dict(min_ngram=3, max_ngram=2), dict(candidates=0), dict(tokens_by_match=(1, -1))],
)
def test_settings_are_checked(bad: dict) -> None:
    with pytest.raises(ValueError, match="PromptLookup"):
        PromptLookup(**bad)


# ---------------------------------------------------------------------------------------------------- the merged tree


def _proposal(parents: list[int], tokens: list[int], vocab: int | None = None) -> Proposal:
    probs = None
    if vocab is not None:
        probs = torch.softmax(torch.randn(1, len(tokens), vocab, generator=torch.Generator().manual_seed(1)), -1)
    return Proposal(torch.tensor([tokens]), tree_from_parents(parents), probs)


def test_branches_share_the_drafters_prefix_and_nodes_stay_in_depth_order() -> None:
    # drafter: root -> a(10) -> b(11); root -> c(12)
    inner = _proposal([-1, 0, 0, 1], [10, 12, 11], vocab=16)
    merged = merge(inner, [[10, 11, 13, 14], [15]], torch.device("cpu"))
    tokens = merged.tokens[0].tolist()
    parents = merged.tree.parents
    depths = merged.tree.levels
    assert list(depths) == sorted(depths)  # listed by depth
    assert len(tokens) == 3 + 3  # 10 and 11 shared; 13, 14 and 15 new
    paths = set()
    for node in range(1, len(parents)):
        path, walk = [], node
        while walk > 0:
            path.append(tokens[walk - 1])
            walk = parents[walk]
        paths.add(tuple(reversed(path)))
    assert paths == {(10,), (12,), (10, 11), (10, 11, 13), (10, 11, 13, 14), (15,)}
    # the drafter's nodes keep their draft distribution; a lookup node's is a point mass on its token
    for node, token in enumerate(tokens, 1):
        row = merged.draft_probs[0, node - 1]
        original = inner.tokens[0].tolist().index(token) if token in (10, 11, 12) else None
        if original is None:
            assert row[token] == 1.0 and row.sum() == 1.0
        else:
            assert torch.equal(row, inner.draft_probs[0, original])


def test_nothing_new_returns_the_drafters_proposal_and_no_drafter_takes_the_branch_alone() -> None:
    inner = _proposal([-1, 0, 1], [10, 11])
    assert merge(inner, [[10, 11]], torch.device("cpu")) is inner
    alone = merge(None, [[5, 6, 7]], torch.device("cpu"))
    assert alone.tokens[0].tolist() == [5, 6, 7] and alone.tree.is_chain and alone.draft_probs is None
    assert merge(None, [], torch.device("cpu")) is None


def test_path_on_tree_counts_the_accepted_tokens_on_the_drafters_own_tree() -> None:
    parents, tokens = (-1, 0, 0, 1), [10, 12, 11]
    assert path_on_tree(parents, tokens, [10, 11, 13]) == 2
    assert path_on_tree(parents, tokens, [12, 11]) == 1
    assert path_on_tree(parents, tokens, [15, 10]) == 0


# ---------------------------------------------------------------------------------------------------- lossless


def _prompts(vocab: int = 96) -> list[torch.Tensor]:
    """A prompt whose lookup is often right (a repeated phrase), a random one, and a one-token one."""
    generator = torch.Generator().manual_seed(5)
    piece = torch.randint(2, vocab, (1, 7), generator=generator)
    return [piece.repeat(1, 4), torch.randint(2, vocab, (1, 11), generator=generator), piece[:, :1]]


class _WrongBranches(SuffixIndex):
    """A lookup whose branches are tokens derived from the row's last token, unrelated to the base: wrong but for
    chance."""

    def lookup(self, context, limit):  # noqa: ANN001, ANN201
        if limit < 1:
            return []
        first = (context[-1] * 7 + 3) % 90 + 2
        return [(4, [first, first, first][:limit]), (3, [(first + 1) % 90 + 2][:limit])]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_drafter_with_lookup_equals_greedy_alone_and_batched_float32(arch: str) -> None:
    base = tiny_model(arch, seed=1)
    other = tiny_model(arch, seed=2, hidden=16, layers=1)
    samples = base_samples(base, rows=8, new_tokens=40)
    eagle = train_eagle_head(base, samples, steps=40)
    medusa = train_medusa_heads(base, samples, steps=30, num_heads=3)
    drafters = {
        "none": (NoDrafter(), {}),
        "draft-k3": (DraftModelDrafter(other, 3), {}),
        "oracle-tree": (OracleTreeDrafter(base, resolve_tree([[0], [1], [0, 0], [1, 0]])), {}),
        "eagle-dynamic": (EagleDrafter(eagle), {"tree": "dynamic", "tree_top_k": 3, "depth": 3, "total_tokens": 6}),
        "eagle-chain-3": (EagleDrafter(eagle), {"tree": "chain-3"}),
        "medusa-binary-7": (MedusaDrafter(medusa), {"tree": "binary-7"}),
    }
    prompts = _prompts()
    references = [greedy_reference(base, p, 24)[0, p.shape[1] :].tolist() for p in prompts]
    eos = references[1][5]  # the random prompt's row ends early on it; the others where it occurs, if at all
    with_eos = [r[: r.index(eos) + 1] if eos in r else r for r in references]
    lookup_accepted = 0
    for name, (drafter, options) in drafters.items():
        decoder = SpecDecoder(base, drafter, prompt_lookup=PromptLookup(min_ngram=1, tokens_by_match=(0, 2, 4, 6)))
        assert decoder.drafter.name == f"{drafter.name}+lookup"
        for prompt, expected in zip(prompts, references, strict=True):
            out = decoder.generate(prompt, max_new_tokens=24, **options)
            assert out.new_tokens == expected, (arch, name, prompt.shape)
        if name != "oracle-tree":  # the oracle drafts for one row
            batch = decoder.generate([p[0] for p in prompts], max_new_tokens=24, **options)
            assert [out.new_tokens for out in batch] == references, (arch, name, "batched")
            batch = decoder.generate([p[0] for p in prompts], max_new_tokens=24, eos_token_id=eos, **options)
            assert [out.new_tokens for out in batch] == with_eos, (arch, name, "batched, rows ending early")
        # the repeated-phrase prompt: the lookup carries the step (more than plain decoding's one token a step)
        lookup_accepted += decoder.generate(prompts[0], max_new_tokens=24, **options).stats.mean_accepted_length > 1.5
    assert lookup_accepted == len(drafters)


def test_a_lookup_that_is_always_wrong_changes_nothing(monkeypatch, llama) -> None:
    monkeypatch.setattr("specheads.inference.lookup.SuffixIndex", _WrongBranches)
    other = tiny_model("llama", seed=2, hidden=16, layers=1)
    for drafter in (NoDrafter(), DraftModelDrafter(other, 3), DraftModelDrafter(llama, 3)):
        for prompt in _prompts():
            expected = greedy_reference(llama, prompt, 20)[0, prompt.shape[1] :].tolist()
            alone = SpecDecoder(llama, drafter).generate(prompt, max_new_tokens=20)
            out = SpecDecoder(llama, drafter, prompt_lookup=True).generate(prompt, max_new_tokens=20)
            assert out.new_tokens == expected
            # the wrong branches cost verification, never acceptance: the drafter alone accepts as much
            assert sum(out.stats.accepted_drafts) <= sum(alone.stats.accepted_drafts) + 2


def test_an_idle_lookup_hands_the_engine_the_drafters_own_answer(monkeypatch, llama) -> None:
    """Where no row gains a lookup node, the composition returns the drafter's answer object itself (one tree for all
    rows stays one, and the verify forward is the drafter's alone); where a row gains one, the rows are merged."""
    other = tiny_model("llama", seed=2, hidden=16, layers=1)
    answers: list[tuple[object, object]] = []
    inner_propose, outer_propose = DraftModelDrafter.propose, WithLookup.propose

    def inner(self, state, request):  # noqa: ANN001, ANN202
        answers.append((inner_propose(self, state, request), None))
        return answers[-1][0]

    def outer(self, state, request):  # noqa: ANN001, ANN202
        result = outer_propose(self, state, request)
        answers[-1] = (answers[-1][0], result)
        return result

    monkeypatch.setattr(DraftModelDrafter, "propose", inner)
    monkeypatch.setattr(WithLookup, "propose", outer)
    prompts = [prompt[0].tolist() for prompt in _prompts()]
    expected = [greedy_reference(llama, torch.tensor([p]), 16)[0, len(p) :].tolist() for p in prompts]
    for settings, idle in ((PromptLookup(tokens_by_match=(0,)), True), (PromptLookup(), False)):
        answers.clear()
        out = SpecDecoder(llama, DraftModelDrafter(other, 3), prompt_lookup=settings).generate(
            prompts, max_new_tokens=16
        )
        assert [row.new_tokens for row in out] == expected
        same = [result is own for own, result in answers]
        assert all(same) if idle else not all(same), (idle, same)


def test_the_cache_reserves_the_lookups_branches_beyond_a_requested_tree(monkeypatch, llama) -> None:
    """The engine sizes the cache at prefill for the largest step, the lookup's branches included: it never grows."""

    def refuse(self, needed):  # noqa: ANN001, ANN202
        raise AssertionError(f"the cache grew to {needed} slots during decoding")

    monkeypatch.setattr("specheads.inference.kv_cache.SlotLayer._grow", refuse)
    # "5" was followed by three different runs: three branches of up to 6 tokens, more than the chain-2 tree's room
    prompt = torch.tensor([[5, 11, 12, 13, 5, 21, 22, 23, 5, 31, 32, 33, 5]])
    settings = PromptLookup(min_ngram=1, candidates=3, tokens_by_match=(0, 6))
    for new_tokens in (4, 9):
        expected = greedy_reference(llama, prompt, new_tokens)[0, prompt.shape[1] :].tolist()
        decoder = SpecDecoder(llama, OracleTreeDrafter(llama, resolve_tree("chain-2")), prompt_lookup=settings)
        assert decoder.generate(prompt, max_new_tokens=new_tokens, tree="chain-2").new_tokens == expected


def test_composition_is_refused_twice_and_reads_the_drafters_attributes(llama) -> None:
    composed = WithLookup(DraftModelDrafter(llama, 3))
    assert composed.model is llama and composed.num_speculative_tokens == 3
    with pytest.raises(ValueError, match="already"):
        WithLookup(composed)
    with pytest.raises(TypeError, match="prompt_lookup"):
        SpecDecoder(llama, NoDrafter(), prompt_lookup="yes")


# ---------------------------------------------------------------------------------------------------- bf16


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_drafter_with_lookup_equals_plain_bf16_decoding(arch: str) -> None:
    """bf16 with batch-invariant attention: every drafter + lookup equals the engine's own one-token decoding."""
    from inference.test_bf16_invariance import trained_parts

    parts = trained_parts(arch)  # the bf16 base and drafters of the invariance tests, trained once a session
    base = parts["base"]
    prompts = _prompts()
    plain = SpecDecoder(base, NoDrafter())
    expected = [plain.generate(prompt, max_new_tokens=40).new_tokens for prompt in prompts]
    drafters = {
        "none": (NoDrafter(), {}),
        "draft-k4": (DraftModelDrafter(parts["draft"], 4), {}),
        "eagle-dynamic": (
            EagleDrafter(parts["eagle"]),
            {"tree": "dynamic", "tree_top_k": 3, "depth": 4, "total_tokens": 10},
        ),
        "medusa-chain-3": (MedusaDrafter(parts["medusa"]), {"tree": "chain-3"}),
        "dflash-ddtree-8": (DFlashDrafter(parts["dflash"], tree="ddtree-8"), {}),
    }
    for name, (drafter, options) in drafters.items():
        decoder = SpecDecoder(base, drafter, prompt_lookup=PromptLookup(min_ngram=1, tokens_by_match=(0, 2, 4, 6)))
        assert decoder.batch_invariant
        outs = [decoder.generate(prompt, max_new_tokens=40, **options) for prompt in prompts]
        assert [out.new_tokens for out in outs] == expected, (arch, name)
        batch = decoder.generate([p[0] for p in prompts], max_new_tokens=40, **options)
        assert [out.new_tokens for out in batch] == expected, (arch, name, "batched")


# ---------------------------------------------------------------------------------------------------- drafter state


class _Recorder:
    """Records each proposal a drafter makes, with the committed length of its row (batch of one)."""

    def __init__(self, drafter) -> None:  # noqa: ANN001
        self.seen: list[tuple[int, list[int]]] = []
        original = drafter.propose

        def propose(state, request):  # noqa: ANN001, ANN202
            out = original(state, request)
            proposal = out[0] if isinstance(out, list) else out
            tokens = [] if proposal is None else proposal.tokens[0].tolist()
            self.seen.append((state.lengths[state.rows[0]], tokens))
            return out

        drafter.propose = propose


@pytest.mark.parametrize("skip", [None, 4], ids=["drafting", "skipping"])
@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_after_lookup_only_steps_the_drafter_proposes_as_if_it_had_decoded_the_tokens_itself(
    kind: str, skip: int | None
) -> None:
    """A drafter's state after a step in which only the lookup's tokens were accepted equals its state after
    decoding the same tokens without lookup: its next proposal equals a fresh drafter's on the same context. So
    after steps it skipped (``skip_drafter_at``: a long match, the lookup's branch alone verified)."""
    base = tiny_model("llama", seed=1)
    if kind == "draft":
        other = copy.deepcopy(base)  # the base with its weights perturbed: often, not always, right; context-sensitive
        torch.manual_seed(0)
        with torch.no_grad():
            for parameter in other.parameters():
                parameter.add_(0.6 * parameter.abs().mean() * torch.randn_like(parameter))

        def make():  # noqa: ANN202
            return DraftModelDrafter(other, 3)

        options: dict = {}
    else:
        head = train_eagle_head(base, base_samples(base, rows=8, new_tokens=40), steps=40)

        def make():  # noqa: ANN202
            return EagleDrafter(head)

        options = {"tree": "chain-3"}
    # skipping: the random prompt, whose output repeats itself later, so that the drafter drafts between skipped steps
    prompt = _prompts()[0 if skip is None else 1]
    drafter = make()
    recorder = _Recorder(drafter)
    settings = PromptLookup(min_ngram=1, tokens_by_match=(0, 2, 4, 8), skip_drafter_at=skip)
    decoder = SpecDecoder(base, drafter, prompt_lookup=settings)
    out = decoder.generate(prompt, max_new_tokens=40, **options)
    assert (decoder.drafter.last_stats.skipped_drafts > 0) == (skip is not None)
    sequence = out.sequences[0]
    checked = 0
    for (length, tokens), (next_length, _) in zip(recorder.seen, recorder.seen[1:], strict=False):
        accepted_from_drafter = path_on_tree(tuple(range(-1, len(tokens))), tokens, sequence[length:].tolist())
        lookup_carried = next_length - length > accepted_from_drafter + 1  # tokens the drafter had not drafted
        if lookup_carried and len(sequence) - next_length >= 2:  # and the next step may draft
            fresh = make()
            fresh_recorder = _Recorder(fresh)
            left = len(sequence) - next_length  # the composed run's budget at that step: the same depth limit
            SpecDecoder(base, fresh).generate(sequence[None, :next_length], max_new_tokens=left, **options)
            expected = fresh_recorder.seen[0][1]
            actual = next(t for n, t in recorder.seen if n == next_length)
            assert actual and actual == expected, (kind, length, next_length)
            checked += 1
    assert checked >= 2  # the prompt's repeats gave the lookup several such steps


# ---------------------------------------------------------------------------------------------------- sampling

VOCAB = 12
PROMPT = torch.tensor([[3, 5, 7, 3, 5, 7, 3, 5]])  # repeats: the lookup proposes from the first step on
SAMPLES = 4000


@pytest.fixture(scope="module")
def sharp_base():
    return tiny_model("llama", seed=3, vocab_size=VOCAB, hidden=16, layers=1, logit_scale=30)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["draft", "eagle"])
def test_hybrid_trees_sample_the_base_distribution(sharp_base, kind: str) -> None:
    from specheads.inference.oracle import chi_square_p, sequence_counts, token_distribution
    from specheads.inference.sampling import SamplingParams

    if kind == "draft":
        drafter = DraftModelDrafter(
            tiny_model("llama", seed=4, vocab_size=VOCAB, hidden=16, layers=1, logit_scale=15), 2
        )
        options: dict = {}
    else:
        head = train_eagle_head(sharp_base, base_samples(sharp_base, rows=16, new_tokens=12), steps=60)
        drafter = EagleDrafter(head)
        options = dict(tree="dynamic", tree_top_k=2, depth=2, total_tokens=3)
    sampling = dict(temperature=1.0, top_k=0, top_p=1.0)
    decoder = SpecDecoder(sharp_base, drafter, prompt_lookup=PromptLookup(min_ngram=1, tokens_by_match=(0, 2, 3)))
    with torch.no_grad():
        joint = token_distribution(sharp_base, PROMPT, SamplingParams(**sampling), 3)
    outs = decoder.generate(
        [PROMPT[0]] * SAMPLES, max_new_tokens=3, seed=list(range(SAMPLES)), batch_size=500,
        acceptance="rejection", **options, **sampling,
    )  # fmt: skip
    assert chi_square_p(sequence_counts([out.new_tokens for out in outs], VOCAB, 3), joint) > 1e-3
    # lookup branches were both accepted and rejected
    accepted = sum(sum(out.stats.accepted_drafts) for out in outs)
    assert SAMPLES // 10 < accepted < 2 * SAMPLES


# ---------------------------------------------------------------------------------------------------- the corpus


def test_a_corpus_match_proposes_its_most_frequent_continuation_within_one_text() -> None:
    settings = PromptLookup(max_ngram=4, min_ngram=1, candidates=2, tokens_by_match=(0, 3))
    # "2 3" is followed by 4 once and by 5 twice (then 6 once: the text [9, 2, 3, 5] ends after its 5); the
    # final "2 3" is followed by nothing
    texts = [[1, 2, 3, 4], [9, 2, 3, 5], [7, 2, 3, 5, 6], [2, 3]]
    index = CorpusIndex(texts, settings)
    assert index.lookup([8, 2, 3], limit=5) == [(2, [5, 6]), (2, [4])]
    # the longer match "1 2 3" first, then the shorter one's most frequent path
    assert index.lookup([1, 2, 3], limit=5) == [(3, [4]), (2, [5, 6])]
    assert index.lookup([8, 2, 3], limit=1) == [(2, [5]), (2, [4])]
    assert index.lookup([8, 8], limit=5) == []
    assert index.lookup([2, 3, 1000], limit=5) == []  # a token beyond the corpus's largest
    assert index.tokens == 15


def _corpus_reference(texts, settings, context, limit):  # noqa: ANN001, ANN202
    """What :class:`CorpusIndex` finds, by enumerating every occurrence of each suffix of ``context`` (followed in
    its text by a token) and taking their most frequent paths as the class describes."""
    found, seen = [], set()
    for size in range(min(settings.max_ngram, len(context)), settings.min_ngram - 1, -1):
        length = min(settings.tokens_for(size), limit)
        suffix = list(context[len(context) - size :])
        rows = [
            text[start + size : start + size + length]
            for text in texts
            for start in range(len(text) - size)
            if text[start : start + size] == suffix
        ]
        while length > 0 and rows and len(found) < settings.candidates:
            path, following = [], rows
            for depth in range(length):
                column = Counter(row[depth] for row in following if len(row) > depth)
                if not column:
                    break
                path.append(min(column, key=lambda token: (-column[token], token)))
                following = [row for row in following if len(row) > depth and row[depth] == path[-1]]
            if tuple(path) not in seen:
                seen.add(tuple(path))
                found.append((size, path))
            rows = [row for row in rows if row[0] != path[0]]
    return found


@pytest.mark.parametrize("seed", range(4))
def test_the_corpus_index_finds_what_enumerating_every_occurrence_finds(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    settings = PromptLookup(max_ngram=5, min_ngram=2, candidates=3, tokens_by_match=(0, 0, 2, 3, 4))
    # Five token ids, so that n-grams recur (each fewer times than CORPUS_SAMPLE: no sampling); large ones for odd
    # seeds, so that fewer than max_ngram of them fit one packed key
    scale = 1 if seed % 2 == 0 else 100_003
    texts = [(scale * torch.randint(0, 5, (int(n),), generator=generator)).tolist() for n in torch.randint(1, 30, (8,))]
    index = CorpusIndex(texts, settings)
    assert (index._packed < settings.max_ngram) == (scale > 1)
    for _ in range(40):
        context = torch.randint(0, 5, (int(torch.randint(1, 9, (1,), generator=generator)),), generator=generator)
        context = (scale * context).tolist()
        for limit in (1, 3):
            assert index.lookup(context, limit) == _corpus_reference(texts, settings, context, limit), (context, limit)


def test_at_equal_length_the_rows_own_continuation_comes_first() -> None:
    own = [(3, [1, 2]), (2, [7])]
    corpus = [(4, [9]), (3, [5, 6]), (3, [1, 2])]
    assert combined_matches(own, corpus, 3) == [(4, [9]), (3, [1, 2]), (3, [5, 6])]
    assert combined_matches(own, [(2, [8])], 3) == [(3, [1, 2]), (2, [7]), (2, [8])]
    assert combined_matches([], corpus, 2) == [(4, [9]), (3, [5, 6])]


def test_read_corpus_takes_token_lists_responses_assistant_turns_and_texts(tmp_path) -> None:
    tokenizer = tiny_tokenizer()
    path = tmp_path / "corpus.jsonl"
    records = [
        [5, 6, 7],
        {"token_ids": [8, 9]},
        {"prompt": "question", "response": "ab"},
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "cd"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "e"}]},
        {"text": "fg"},
    ]
    path.write_text("".join(json.dumps(record) + "\n" for record in records) + "\n")
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert read_corpus(path, tokenizer) == [[5, 6, 7], [8, 9], *(encode(text) for text in ("ab", "cd", "e", "fg"))]
    with pytest.raises(ValueError, match="tokenizer"):
        read_corpus(path)
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_corpus(tmp_path / "bad.jsonl", tokenizer)
    with pytest.raises(FileNotFoundError):
        read_corpus(tmp_path / "missing.jsonl", tokenizer)
    with pytest.raises(ValueError, match="non-negative"):
        CorpusIndex([[3, -2]], PromptLookup())


def _wrong_corpus(sequences: list[list[int]], vocab: int = 96) -> list[list[int]]:
    """Each bigram of ``sequences`` followed by a token that never follows it there: with ``min_ngram=2`` every
    continuation this corpus proposes is wrong."""
    followers: dict[tuple[int, ...], set[int]] = {}
    for seq in sequences:
        for end in range(2, len(seq)):
            followers.setdefault(tuple(seq[end - 2 : end]), set()).add(seq[end])
    return [[*bigram, min(set(range(2, vocab)) - after)] for bigram, after in followers.items()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_corpus_right_or_always_wrong_leaves_every_row_equal_to_plain_decoding(dtype: torch.dtype) -> None:
    base = tiny_model("llama", seed=1).to(dtype)
    other = tiny_model("llama", seed=2, hidden=16, layers=1).to(dtype)
    prompts = _prompts()
    plain = SpecDecoder(base, NoDrafter())
    expected = [plain.generate(prompt, max_new_tokens=24).new_tokens for prompt in prompts]
    eos = expected[1][5]  # the random prompt's row ends early on it
    with_eos = [r[: r.index(eos) + 1] if eos in r else r for r in expected]
    sequences = [prompt[0].tolist() + tokens for prompt, tokens in zip(prompts, expected, strict=True)]
    settings = PromptLookup(min_ngram=2, tokens_by_match=(0, 0, 2, 4, 6))
    for drafter in (NoDrafter(), DraftModelDrafter(other, 3)):
        alone = SpecDecoder(base, drafter, prompt_lookup=settings)
        without = [alone.generate(prompt, max_new_tokens=24) for prompt in prompts]
        proposed_without = sum(alone.drafter.last_stats.proposed.values())  # tokens the lookup proposed
        for name, corpus in {"right": sequences, "wrong": _wrong_corpus(sequences)}.items():
            decoder = SpecDecoder(base, drafter, prompt_lookup=replace(settings, corpus=corpus))
            outs = [decoder.generate(prompt, max_new_tokens=24) for prompt in prompts]
            assert [out.new_tokens for out in outs] == expected, (dtype, drafter.name, name)
            proposed = sum(decoder.drafter.last_stats.proposed.values())  # of the same (last) prompt
            batch = decoder.generate([p[0] for p in prompts], max_new_tokens=24)
            assert [out.new_tokens for out in batch] == expected, (dtype, drafter.name, name, "batched")
            batch = decoder.generate([p[0] for p in prompts], max_new_tokens=24, eos_token_id=eos)
            assert [out.new_tokens for out in batch] == with_eos, (dtype, drafter.name, name, "rows ending early")
            # the random prompt, where the row's own text has little to copy
            accepted = sum(outs[1].stats.accepted_drafts) - sum(without[1].stats.accepted_drafts)
            if name == "right":
                assert accepted >= 8, (dtype, drafter.name)  # the corpus carries it
            else:  # the corpus proposed, and its wrong branches cost verification, never acceptance
                assert proposed > proposed_without, (dtype, drafter.name)
                assert accepted <= 2, (dtype, drafter.name)


def test_the_corpus_is_indexed_once_per_decoder_and_tokenised_with_its_tokenizer(tmp_path, llama) -> None:
    tokenizer = tiny_tokenizer()
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps({"response": "abc abc"}) + "\n")
    decoder = SpecDecoder(llama, NoDrafter(), tokenizer, prompt_lookup=PromptLookup(corpus=path))
    index = decoder.drafter.corpus
    assert index.tokens == len(tokenizer("abc abc", add_special_tokens=False)["input_ids"])
    decoder.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    assert decoder.drafter.corpus is index
    assert SpecDecoder(llama, NoDrafter(), prompt_lookup=True).drafter.corpus is None  # off by default
    assert "corpus" not in PromptLookup(corpus=path).record()
