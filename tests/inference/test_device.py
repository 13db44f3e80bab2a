"""The engine on an accelerator: the greedy invariant in fp32 and bf16 for every drafter, batched rows, and rejection
sampling drawn with generators on the device.

Marked ``gpu`` (opt-in: ``pytest -m gpu``) and run on CUDA. ``SPECHEADS_TEST_DEVICE=cpu pytest -m gpu`` runs the same
checks on the CPU, which is how they are kept working on machines without a GPU (``scripts/gpu_check.sh`` runs them on
the GPU).
"""

from __future__ import annotations

import os

import pytest
import torch
from helpers import base_samples, greedy_reference, tiny_model, train_block_head, train_eagle_head, train_medusa_heads

from specheads import SpecDecoder
from specheads.inference.drafters import DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specheads.inference.oracle import chi_square_p, pair_counts, two_token_distribution
from specheads.inference.sampling import SamplingParams
from specheads.methods.dflash.drafter import DFlashDrafter
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.medusa.drafter import MedusaDrafter

DEVICE = os.environ.get("SPECHEADS_TEST_DEVICE", "cuda")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="no CUDA device here"),
]
NEW_TOKENS = 40
# bf16 logits are exact to about 3 significant digits: two candidates closer than this are a tie in bf16, and which
# one wins may depend on the kernel (a 1-token step and a 9-token tree verify take different paths).
BF16_TIE = 0.08


@pytest.fixture(scope="module")
def cpu_models() -> dict:
    """A base, a draft and trained Medusa / EAGLE-1 / EAGLE-3 heads, on the CPU in fp32 (moved per test)."""
    base = tiny_model("llama", seed=0, layers=4, hidden=64, logit_scale=4)
    samples = base_samples(base, rows=16, new_tokens=40)
    return {
        "base": base,
        "draft": tiny_model("llama", seed=0, layers=4, hidden=64, logit_scale=4),  # the base's twin: drafts accepted
        "medusa": train_medusa_heads(base, samples, num_heads=3),
        "eagle3": train_eagle_head(base, samples, version=3),
        "eagle1": train_eagle_head(base, samples, version=1),
        "dflash": train_block_head(base, samples, variant="dflash", layer_ids=[1, 3], block_size=4),
        "dspark": train_block_head(base, samples, variant="dspark", layer_ids=[1, 3], block_size=4, markov_rank=8),
    }


def _on(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module).to(device=DEVICE, dtype=dtype).eval()


def _decoder(models: dict, method: str, dtype: torch.dtype) -> tuple[SpecDecoder, dict]:
    base = _on(models["base"], dtype)
    drafter, kwargs = {
        "none": (lambda: NoDrafter(), {}),
        "draft": (lambda: DraftModelDrafter(_on(models["draft"], dtype), 4), {}),
        "prompt-lookup": (lambda: PromptLookupDrafter(3), {}),
        "medusa-binary-7": (lambda: MedusaDrafter(_on(models["medusa"], dtype)), {"tree": "binary-7"}),
        "eagle3-chain-3": (lambda: EagleDrafter(_on(models["eagle3"], dtype)), {"tree": "chain-3"}),
        "eagle3-dynamic": (lambda: EagleDrafter(_on(models["eagle3"], dtype)), {"tree": "dynamic"}),
        "eagle1-binary-7": (lambda: EagleDrafter(_on(models["eagle1"], dtype)), {"tree": "binary-7"}),
        "dflash-ddtree-8": (lambda: DFlashDrafter(_on(models["dflash"], dtype)), {"tree": "ddtree-8"}),
        "dspark-chain-4": (lambda: DFlashDrafter(_on(models["dspark"], dtype)), {"tree": "chain-4"}),
    }[method]
    return SpecDecoder(base, drafter()), kwargs


def _assert_greedy(decoder: SpecDecoder, prompt: torch.Tensor, tokens: list[int], dtype: torch.dtype) -> None:
    """Equal to transformers' greedy output; in bf16, a first difference is allowed only at a tie."""
    reference = greedy_reference(decoder.model, prompt, NEW_TOKENS)[0, prompt.shape[1] :].tolist()
    if dtype == torch.float32 or tokens == reference:
        assert tokens == reference
        return
    first = next(i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b)
    prefix = torch.cat([prompt, torch.tensor([reference[:first]], device=prompt.device, dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = decoder.model(prefix).logits[0, -1].float()
    gap = float(logits[reference[first]] - logits[tokens[first]])
    assert abs(gap) <= BF16_TIE * max(1.0, float(logits.abs().max())), (first, gap)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "method",
    [
        "none", "draft", "prompt-lookup", "medusa-binary-7", "eagle3-chain-3", "eagle3-dynamic", "eagle1-binary-7",
        "dflash-ddtree-8", "dspark-chain-4",
    ],
)  # fmt: skip
def test_greedy_equals_transformers_on_the_device(cpu_models, method: str, dtype: torch.dtype) -> None:
    decoder, kwargs = _decoder(cpu_models, method, dtype)
    prompts = base_samples(cpu_models["base"], rows=3, new_tokens=8, seed=7).to(DEVICE)
    steps = 0
    for prompt in prompts:
        out = decoder.generate(prompt[None], max_new_tokens=NEW_TOKENS, **kwargs)
        assert out.sequences.device.type == torch.device(DEVICE).type
        _assert_greedy(decoder, prompt[None], out.new_tokens, dtype)
        steps += out.stats.steps
    if method != "none":
        assert steps < len(prompts) * NEW_TOKENS, "no draft was ever accepted"


@pytest.mark.parametrize("method", ["draft", "eagle3-dynamic", "medusa-binary-7"])
def test_batched_rows_equal_their_own_greedy_output_on_the_device(cpu_models, method: str) -> None:
    decoder, kwargs = _decoder(cpu_models, method, torch.float32)
    prompts = base_samples(cpu_models["base"], rows=4, new_tokens=8, seed=9).to(DEVICE)
    ragged = [prompts[0], prompts[1, 3:], prompts[2], prompts[3, 5:]]
    outs = decoder.generate(ragged, max_new_tokens=NEW_TOKENS, **kwargs)
    for prompt, out in zip(ragged, outs, strict=True):
        _assert_greedy(decoder, prompt[None], out.new_tokens, torch.float32)


def test_rejection_sampling_on_the_device_follows_the_base_distribution() -> None:
    """Chi-square of the first two tokens over 2,000 seeds, drafted by a draft model and verified on the device."""
    vocab, samples, prompt = 12, 2000, torch.tensor([[3, 5, 7]])
    base = tiny_model("llama", seed=3, vocab_size=vocab, hidden=16, layers=1, logit_scale=30)
    draft = tiny_model("llama", seed=4, vocab_size=vocab, hidden=16, layers=1, logit_scale=15)
    joint = two_token_distribution(base, prompt, SamplingParams(1.0))  # exact, on the CPU
    decoder = SpecDecoder(_on(base, torch.float32), DraftModelDrafter(_on(draft, torch.float32), 3))
    outs = decoder.generate(
        [prompt[0].to(DEVICE)] * samples,
        max_new_tokens=2,
        temperature=1.0,
        acceptance="rejection",
        seed=list(range(samples)),
        batch_size=500,
    )
    assert chi_square_p(pair_counts([out.new_tokens for out in outs], vocab), joint) > 1e-3


@pytest.mark.parametrize(
    ("method", "kwargs"),
    [("eagle3-chain-3", {}), ("draft", {"temperature": 1.0, "acceptance": "rejection", "seed": 0})],
    ids=["greedy", "rejection"],
)
def test_a_step_synchronises_only_where_it_reads_the_device(cpu_models, monkeypatch, method: str, kwargs) -> None:
    """One greedy step and one rejection step under ``set_sync_debug_mode("error")``: any synchronising operation
    raises, except the reads the engine means to make (``tolist``), which are counted."""
    if not DEVICE.startswith("cuda"):
        pytest.skip("CUDA's sync debug mode")
    decoder, extra = _decoder(cpu_models, method, torch.float32)
    prompt = base_samples(cpu_models["base"], rows=1, new_tokens=8, seed=4).to(DEVICE)
    decoder.generate(prompt, max_new_tokens=2, **extra, **kwargs)  # warm-up: allocations, caches
    reads, original = [], torch.Tensor.tolist

    def allowed(self):  # noqa: ANN001, ANN202
        torch.cuda.set_sync_debug_mode("default")
        try:
            reads.append(tuple(self.shape))
            return original(self)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(torch.Tensor, "tolist", allowed)
    steps = []
    step = decoder._step

    def one_step(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(*args, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            steps.append(len(reads))

    monkeypatch.setattr(decoder, "_step", one_step)
    decoder.generate(prompt, max_new_tokens=3, **extra, **kwargs)
    assert len(steps) >= 2  # the prompt's steps ran under the debug mode
    assert all(b - a <= 2 for a, b in zip([0, *steps], steps, strict=False)), f"reads per step: {steps}"
