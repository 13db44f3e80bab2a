"""Host transfers per decode step: a greedy step with a deterministic drafter reads the device at most twice.

Every way a tensor's value reaches Python (``tolist``, ``item``, ``int()``, ``float()``, ``bool()``) is counted
between the start of a step's drafting and the end of its commit, on the CPU, where the same code runs as on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from helpers import tiny_model

from specheads import SpecDecoder
from specheads.heads import EagleHead, MedusaHeads
from specheads.inference.decoder import SpecDecoder as _Decoder
from specheads.inference.drafters import DraftModelDrafter, PromptLookupDrafter
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.medusa.drafter import MedusaDrafter

BUDGET = 2  # the acceptance's one read, and the drafter's one (a dynamic tree's shape, a draft model's counts)
_READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")


class _Counter:
    def __init__(self) -> None:
        self.active = False
        self.current = 0
        self.per_step: list[int] = []


@contextlib.contextmanager
def _counting(decoder: SpecDecoder) -> Iterator[_Counter]:
    """Count tensor reads inside each step (propose .. commit) of ``decoder``."""
    counter = _Counter()
    originals = {name: getattr(torch.Tensor, name) for name in _READS}

    def counted(name: str):  # noqa: ANN202
        original = originals[name]

        def read(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if counter.active:
                counter.current += 1
            return original(self, *args, **kwargs)

        return read

    propose, step = decoder.drafter.propose, _Decoder._step

    def counted_propose(state, request):  # noqa: ANN001, ANN202
        counter.active, counter.current = True, 0
        return propose(state, request)

    def counted_step(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        try:
            return step(self, *args, **kwargs)
        finally:
            counter.per_step.append(counter.current)
            counter.active = False

    for name in _READS:
        setattr(torch.Tensor, name, counted(name))
    decoder.drafter.propose = counted_propose
    _Decoder._step = counted_step
    try:
        yield counter
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
        _Decoder._step = step
        del decoder.drafter.propose


def _drafters(base):  # noqa: ANN001, ANN202
    torch.manual_seed(0)
    eagle = EagleHead.from_base(base, version=3, draft_vocab_size=40, token_counts=torch.arange(96))
    medusa = MedusaHeads.from_base(base, num_heads=3)
    draft = tiny_model("llama", seed=2, hidden=16, layers=1)
    return {
        "eagle-chain-3": (EagleDrafter(eagle), {"tree": "chain-3"}),
        "eagle-tree": (EagleDrafter(eagle), {"tree": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}),
        "eagle-dynamic": (EagleDrafter(eagle), {"tree": "dynamic-3-3-6"}),
        "medusa-tree": (MedusaDrafter(medusa), {"tree": [[0], [1], [0, 0], [1, 0]]}),
        "draft-k3": (DraftModelDrafter(draft, 3), {}),
        "prompt-lookup": (PromptLookupDrafter(4), {}),
    }


@pytest.mark.parametrize("batch", [1, 4])
def test_a_greedy_step_reads_the_device_at_most_twice(batch: int) -> None:
    base = tiny_model("llama", seed=1)
    generator = torch.Generator().manual_seed(3)
    piece = torch.randint(2, 96, (batch, 6), generator=generator)
    prompts = [row.repeat(3)[: 9 + 2 * i] for i, row in enumerate(piece)]  # ragged, with repeats for the lookup
    for name, (drafter, kwargs) in _drafters(base).items():
        decoder = SpecDecoder(base, drafter)
        with _counting(decoder) as counter:
            decoder.generate(prompts if batch > 1 else prompts[0], max_new_tokens=12, **kwargs)
        assert counter.per_step, name
        assert max(counter.per_step) <= BUDGET, f"{name}: reads per step {counter.per_step}"


def test_the_counter_sees_a_read() -> None:
    """The instrument itself: a drafter that reads one value per row more is caught."""
    base = tiny_model("llama", seed=1)

    class Reading(PromptLookupDrafter):
        def propose(self, state, request):  # noqa: ANN001, ANN201
            for row in state.rows:
                int(state.tokens[row, 0])
            return super().propose(state, request)

    decoder = SpecDecoder(base, Reading(4))
    with _counting(decoder) as counter:
        decoder.generate([torch.arange(2, 12), torch.arange(3, 15)], max_new_tokens=6)
    assert max(counter.per_step) == BUDGET + 1
