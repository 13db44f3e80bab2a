"""Batched decoding: every row of a batch is decoded exactly as it would be alone.

Rows of different lengths (1 to 40 tokens) decode together with every drafter and on four architectures, each equal
to transformers' greedy output for that prompt alone; rows finish on their own (EOS, budget) and leave the batch;
each row's cache equals one rebuilt from its committed tokens after every step, in buffers allocated once; with
rejection sampling each row's first two tokens follow the base's distribution while its neighbours draft other
trees, and a seeded row draws the same alone or in any batch.
"""

from __future__ import annotations

import pytest
import torch
from helpers import ARCHITECTURES, _StubDrafter, base_samples, greedy_reference, tiny_model, train_eagle_head

from specheads import SpecDecoder
from specheads.heads import MedusaHeads
from specheads.inference import kv_cache
from specheads.inference.drafters import Drafter, DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specheads.inference.oracle import chi_square_p, sequence_counts, token_distribution
from specheads.inference.sampling import SamplingParams
from specheads.inference.state import Proposal
from specheads.inference.trees import resolve_tree
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.medusa.drafter import MedusaDrafter

VOCAB = 96
LENGTHS = (1, 3, 9, 17, 40, 2, 25, 5)


def _prompts(count: int = len(LENGTHS), seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (n,), generator=generator).tolist() for n in LENGTHS[:count]]


def _drafters(base, arch: str) -> dict[str, tuple]:
    torch.manual_seed(0)
    medusa = MedusaHeads.from_base(base, num_heads=3)
    with torch.no_grad():
        for parameter in medusa.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    sequences = base_samples(base, rows=8, new_tokens=40)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    eagle = train_eagle_head(base, sequences, steps=40, version=3, draft_vocab_size=64, token_counts=counts)
    return {
        "none": (NoDrafter(), {}),
        "prompt-lookup": (PromptLookupDrafter(3), {}),
        "draft": (DraftModelDrafter(tiny_model(arch, seed=5, layers=1), 3), {}),
        "medusa": (MedusaDrafter(medusa), {"tree": "binary-7"}),
        "eagle-static": (EagleDrafter(eagle), {"tree": "binary-7"}),
        "eagle-dynamic": (EagleDrafter(eagle), {"tree": "dynamic"}),
    }


# ---------------------------------------------------------------------------------------------- the greedy invariant
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_row_of_a_batch_equals_greedy_alone(arch: str) -> None:
    base = tiny_model(arch, seed=1, layers=4, logit_scale=3.0)
    prompts = _prompts()
    references = [greedy_reference(base, torch.tensor([p]), 12) for p in prompts]
    for name, (drafter, kwargs) in _drafters(base, arch).items():
        decoder = SpecDecoder(base, drafter)
        for count in (1, 2, 5, 8):
            outs = decoder.generate(prompts[:count], max_new_tokens=12, **kwargs)
            assert len(outs) == count
            for row, (out, reference) in enumerate(zip(outs, references, strict=False)):
                assert torch.equal(out.sequences, reference), (arch, name, count, row)
                assert out.stats.new_tokens == 12


def test_rows_that_hit_eos_early_stop_and_leave_the_batch() -> None:
    base = tiny_model("llama", seed=1, layers=2, logit_scale=3.0)
    prompts = _prompts(5)
    references = [greedy_reference(base, torch.tensor([p]), 16)[0, len(p) :].tolist() for p in prompts]
    eos = references[1][3]  # row 1 emits it as its 4th token; other rows may emit it too, or never
    batches: list[int] = []
    handle = base.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        outs = SpecDecoder(base, PromptLookupDrafter(2)).generate(prompts, max_new_tokens=16, eos_token_id=eos)
    finally:
        handle.remove()
    for out, reference in zip(outs, references, strict=True):
        expected = reference[: reference.index(eos) + 1] if eos in reference else reference
        assert out.new_tokens == expected
    assert len(outs[1].new_tokens) <= 4
    prefills = sum(len(prompt) > 1 for prompt in prompts)  # each prompt computed alone (a one-token one: nothing)
    steps = batches[prefills:]
    assert batches[:prefills] == [1] * prefills
    assert steps[0] == 5 and steps[-1] < 5  # finished rows stopped costing compute
    assert steps == sorted(steps, reverse=True)


class _HalfOracle(_StubDrafter):
    """Even rows get the base's true greedy continuation (all accepted), odd rows wrong tokens (none accepted)."""

    name = "half-oracle"

    def __init__(self, base, depth: int = 3) -> None:
        self.base, self.depth = base, depth

    def propose(self, state, request):
        depth = min(self.depth, request.max_depth)
        if depth < 1:
            return None
        tree = resolve_tree(f"chain-{depth}")
        proposals = []
        for row in state.rows:
            sequence = state.sequence(row)[None]
            truth = self.base.generate(
                sequence,
                do_sample=False,
                max_new_tokens=depth,
                pad_token_id=0,
                attention_mask=torch.ones_like(sequence),
            )[:, sequence.shape[1] :]
            tokens = truth if row % 2 == 0 else (truth + 1) % VOCAB
            proposals.append(Proposal(tokens, tree))
        return proposals


def test_a_row_that_accepts_everything_next_to_one_that_accepts_nothing() -> None:
    base = tiny_model("qwen2", seed=1, layers=2)
    prompts = _prompts(4)
    outs = SpecDecoder(base, _HalfOracle(base)).generate(prompts, max_new_tokens=13)
    for row, (out, prompt) in enumerate(zip(outs, prompts, strict=True)):
        assert torch.equal(out.sequences, greedy_reference(base, torch.tensor([prompt]), 13))
        if row % 2 == 0:
            assert out.stats.accepted_lengths == [4, 4, 4, 1]
        else:
            assert out.stats.accepted_lengths == [1] * 13


def test_batch_size_splits_the_list_and_changes_nothing() -> None:
    base = tiny_model("mistral", seed=1, layers=2)
    decoder = SpecDecoder(base, PromptLookupDrafter(3))
    prompts = _prompts(5)
    whole = decoder.generate(prompts, max_new_tokens=10)
    split = decoder.generate(prompts, max_new_tokens=10, batch_size=2)
    assert [o.new_tokens for o in whole] == [o.new_tokens for o in split]
    assert [o.stats.accepted_lengths for o in whole] == [o.stats.accepted_lengths for o in split]
    assert whole.stats.new_tokens == 50 and split.stats.new_tokens == 50
    assert whole.stats.steps == sum(o.stats.steps for o in whole)


# ---------------------------------------------------------------------------------------------- the cache
class _CacheChecker(Drafter):
    """Wraps a drafter: after every commit, each row's base cache must equal one rebuilt from its committed tokens,
    in the buffers allocated at prefill."""

    def __init__(self, base, drafter) -> None:
        self.base, self.drafter = base, drafter
        self.name, self.hidden_state_layers = drafter.name, drafter.hidden_state_layers
        self.buffers: list[int] | None = None
        self.checks = 0
        for hook in ("check_request", "resolve", "max_nodes", "gives_draft_probs", "reset", "propose", "keep_rows"):
            setattr(self, hook, getattr(drafter, hook))  # every other hook is the wrapped drafter's

    def accepted(self, state, num_accepted) -> None:
        cache = state.cache
        pointers = [t.data_ptr() for t in cache.buffers]
        self.buffers = self.buffers or pointers
        assert pointers == self.buffers and cache.reallocations == 0
        for i, row in enumerate(state.rows):
            length = kv_cache.row_lengths(cache)[i]
            assert length == state.lengths[row] - 1
            rebuilt = kv_cache.new_cache()
            self.base(state.tokens[row : row + 1, :length], **kv_cache.forward_kwargs(self.base, rebuilt))
            for layer, reference in zip(cache.layers, rebuilt.layers, strict=True):
                torch.testing.assert_close(layer.keys[i, :, :length], reference.keys[0], atol=1e-5, rtol=1e-4)
                torch.testing.assert_close(layer.values[i, :, :length], reference.values[0], atol=1e-5, rtol=1e-4)
            self.checks += 1
        self.drafter.accepted(state, num_accepted)


@pytest.mark.parametrize("tree", ["binary-7", "dynamic"])
def test_each_rows_cache_equals_a_rebuild_and_is_never_reallocated(tree: str) -> None:
    base = tiny_model("llama", seed=1, layers=4, logit_scale=3.0)
    eagle = _drafters(base, "llama")["eagle-static"][0]
    checker = _CacheChecker(base, eagle)
    prompts = _prompts(6)
    outs = SpecDecoder(base, checker).generate(prompts, max_new_tokens=20, tree=tree)
    for out, prompt in zip(outs, prompts, strict=True):
        assert torch.equal(out.sequences, greedy_reference(base, torch.tensor([prompt]), 20))
    assert checker.checks > 50
    assert max(max(o.stats.accepted_lengths) for o in outs) >= 2  # non-contiguous commits happened


# ---------------------------------------------------------------------------------------------- sampling
SMALL = 12
PROMPT = [3, 5, 7]


def _joint(base, temperature: float) -> torch.Tensor:
    """The base's exact distribution of its first three sampled tokens after PROMPT."""
    with torch.no_grad():
        return token_distribution(base, torch.tensor([PROMPT]), SamplingParams(temperature), 3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.slow
def test_rejection_sampling_per_row_matches_the_base_next_to_other_rows(temperature: float) -> None:
    base = tiny_model("llama", seed=3, vocab_size=SMALL, hidden=16, layers=1, logit_scale=30)
    draft = tiny_model("llama", seed=4, vocab_size=SMALL, hidden=16, layers=1, logit_scale=15)
    samples = 3000
    neighbours = [[4], [8, 2, 9, 1, 5], [6, 6]]
    prompts = [PROMPT if i % 2 == 0 else neighbours[(i // 2) % 3] for i in range(2 * samples)]
    decoder = SpecDecoder(base, DraftModelDrafter(draft, 2))
    outs = decoder.generate(
        prompts, max_new_tokens=3, temperature=temperature, acceptance="rejection", seed=list(range(len(prompts)))
    )  # three tokens: drafts at depth 2 are verified too
    counts = sequence_counts([out.new_tokens for out in outs[::2]], SMALL, 3)
    assert chi_square_p(counts, _joint(base, temperature)) > 1e-3


@pytest.mark.parametrize("method", ["draft", "prompt-lookup", "eagle-dynamic"])
def test_a_seeded_row_draws_the_same_alone_or_in_any_batch(method: str) -> None:
    base = tiny_model("llama", seed=1, layers=4, logit_scale=2.0)
    drafter, kwargs = _drafters(base, "llama")[method]
    decoder = SpecDecoder(base, drafter)
    prompts = _prompts(6)
    settings = dict(max_new_tokens=14, temperature=0.9, acceptance="rejection", **kwargs)
    alone = [decoder.generate(p, seed=11, **settings) for p in prompts]
    together = decoder.generate(prompts, seed=11, **settings)
    reordered = decoder.generate(prompts[::-1], seed=11, **settings)[::-1]
    for a, b, c in zip(alone, together, reordered, strict=True):
        assert a.new_tokens == b.new_tokens == c.new_tokens
        assert a.stats.accepted_lengths == b.stats.accepted_lengths == c.stats.accepted_lengths
    seeds = decoder.generate(prompts[:2], seed=[11, 12], **settings)
    assert seeds[0].new_tokens == alone[0].new_tokens
    assert seeds[1].new_tokens == decoder.generate(prompts[1], seed=12, **settings).new_tokens


# ---------------------------------------------------------------------------------------------- bad input
@pytest.fixture
def forward_calls():
    base = tiny_model("llama", seed=1, layers=1)
    calls: list[int] = []
    handle = base.register_forward_pre_hook(lambda module, args: calls.append(1))
    yield SpecDecoder(base, PromptLookupDrafter(2)), calls
    handle.remove()


@pytest.mark.parametrize(
    ("prompts", "kwargs", "message"),
    [
        ([], {}, "list of prompts is empty"),
        ([[3, 4], [], [5]], {}, "prompt 1: the prompt is empty"),
        ([[3, 4], "text"], {}, "mix types"),
        ([[3, 4], [5]], {"batch_size": 0}, "batch_size must be an integer >= 1"),
        ([[3, 4], [5]], {"batch_size": 1.5}, "batch_size must be an integer >= 1"),
        ([3, 4], {"batch_size": 2}, "batch_size applies to a list of prompts"),
        ([[3, 4], [5, 999]], {}, "prompt 1: prompt token ids must lie in"),
        ([[3, 4], [5]], {"seed": [1, 2, 3]}, "one seed per prompt"),
    ],
)
def test_bad_batches_are_refused_before_any_compute(forward_calls, prompts, kwargs, message: str) -> None:
    decoder, calls = forward_calls
    with pytest.raises(ValueError, match=message):
        decoder.generate(prompts, max_new_tokens=3, **kwargs)
    assert not calls


def test_stream_takes_one_prompt(forward_calls) -> None:
    from helpers import tiny_tokenizer

    decoder, calls = forward_calls
    decoder.tokenizer = tiny_tokenizer()
    with pytest.raises(ValueError, match="stream\\(\\) takes one prompt"):
        decoder.stream(["ab", "cd"], max_new_tokens=3)
    assert not calls


# ---------------------------------------------------------------------------------------------- reentrancy
def test_two_generations_at_once_on_one_decoder() -> None:
    """Per-generation drafter state lives in the generation: interleaved streams and threads do not mix."""
    import threading

    from helpers import tiny_tokenizer

    base = tiny_model("llama", seed=1, layers=4, logit_scale=3.0)
    drafter, _ = _drafters(base, "llama")["eagle-dynamic"]
    decoder = SpecDecoder(base, drafter, tokenizer=tiny_tokenizer())
    texts = ["def f(x):", "abc = 12"]
    expected = [decoder.generate(t, max_new_tokens=16).text for t in texts]
    streams = [decoder.stream(t, max_new_tokens=16) for t in texts]
    pieces = [[], []]
    live = [True, True]
    while any(live):
        for i, stream in enumerate(streams):
            if live[i]:
                piece = next(stream, None)
                live[i] = piece is not None
                pieces[i] += [piece] if piece is not None else []
    assert ["".join(p) for p in pieces] == expected
    results: dict[int, list[int]] = {}

    def run(index: int) -> None:
        results[index] = decoder.generate(texts[index % 2], max_new_tokens=16).new_tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [decoder.tokenizer.decode(results[i], skip_special_tokens=True) for i in range(4)] == expected * 2


def test_a_prompt_too_long_in_a_later_chunk_is_refused_before_any_compute() -> None:
    base = tiny_model("llama", seed=1, layers=1, max_positions=16)
    calls: list[int] = []
    handle = base.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        with pytest.raises(ValueError, match="prompt 3 has 20 tokens; the model allows at most 16"):
            SpecDecoder(base).generate([[3, 4], [5], [6, 7], list(range(2, 22))], max_new_tokens=3, batch_size=2)
    finally:
        handle.remove()
    assert not calls
