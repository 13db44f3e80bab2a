"""What the batch-invariant switch is for, checked against the model's own computation, not against itself.

``invariant_attention`` is attention: on the same inputs it equals transformers' ``sdpa_attention_forward`` and
``eager_attention_forward`` within float32 rounding, in float32 and (against a float32 reference) in bf16, for every
mask the engine feeds (causal, a tree after a prefix, ragged rows in a slot buffer with padding queries), every head
grouping (MHA, GQA, MQA) and any score ``scaling``; what it does not implement it refuses. A model switched to it
(``batch_invariant``) gives its own logits, including a config whose scaling is not ``head_dim ** -0.5``. The switch's
linear layers give a row the same bits whatever the number of rows computed with it, at real widths (K >= 1,536,
where oneDNN's bf16/fp16 kernels round by row count), for every layer type it claims.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import tiny_model
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import eager_attention_forward
from transformers.pytorch_utils import Conv1D

from specheads.inference import attention, kv_cache

HEAD_DIM = 16
HEAD_GROUPINGS = {"MHA 4/4": (4, 4), "GQA 8/2": (8, 2), "MQA 6/1": (6, 1)}  # query heads / key-value heads
SCALINGS = (None, 0.37)  # the default head_dim ** -0.5 = 0.25, and a Gemma/Granite-style scale of the config's own
TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 3]  # node i's parent; the root (node 0) follows the prefix


class _Caller(torch.nn.Module):
    """What transformers' attention functions read from their calling attention module."""

    is_causal = True

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.eval()


def _ancestry(parents: list[int]) -> torch.Tensor:
    """``[N, N]`` bool: node i sees itself and its ancestors."""
    sees = torch.eye(len(parents), dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            sees[node] |= sees[parent]
    return sees


def _bottom_right_causal(queries: int, width: int) -> torch.Tensor:
    """``[1, 1, Q, K]``: the Q queries are the last Q of the K positions."""
    return (torch.arange(width)[None, :] <= torch.arange(width - queries, width)[:, None])[None, None]


def _mask_case(name: str) -> tuple[int, int, int, torch.Tensor | None]:
    """``(batch, queries, width, mask)`` of a named case: what the invariant attention receives, mask ``[B, 1, Q, K]``
    bool or None (causal)."""
    if name == "causal prefill":
        return 2, 12, 12, None
    if name == "a step after a prefix, no mask":
        return 2, 3, 20, None
    if name == "tree after a prefix":  # 9 prefix slots, the tree, 4 slots of the buffer not written yet
        tree = _ancestry(TREE_PARENTS)
        nodes = tree.shape[0]
        mask = torch.cat([torch.ones(nodes, 9, dtype=torch.bool), tree, torch.zeros(nodes, 4, dtype=torch.bool)], -1)
        return 1, nodes, mask.shape[-1], mask[None, None]
    if name == "ragged chains in a slot buffer":  # rows of 5, 11 and 8 committed slots, 4 new tokens each
        mask = kv_cache.step_mask([5, 11, 8], [kv_cache.causal(4)] * 3, 4)
        return 3, 4, mask.shape[-1], mask
    if name == "ragged trees with padding queries":  # a chain, a 4-node tree, 2 tokens and 2 padding queries
        inner = [kv_cache.causal(4), _ancestry([-1, 0, 0, 1]), kv_cache.causal(2)]
        mask = kv_cache.step_mask([5, 11, 8], inner, 4)
        return 3, 4, mask.shape[-1], mask
    raise ValueError(name)


MASK_CASES = (
    "causal prefill",
    "a step after a prefix, no mask",
    "tree after a prefix",
    "ragged chains in a slot buffer",
    "ragged trees with padding queries",
)
CASE_IDS = [case.replace(",", "").replace(" ", "-") for case in MASK_CASES]  # (node ids without spaces)


def _inputs(batch: int, heads: int, kv_heads: int, queries: int, width: int, mask, seed: int = 0):
    """Random query, key and value ``[B, H(kv), n, D]``; keys and values a query may not see are 50 times larger,
    so that any weight they get shows."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, queries, HEAD_DIM, generator=generator)
    key = torch.randn(batch, kv_heads, width, HEAD_DIM, generator=generator)
    value = torch.randn(batch, kv_heads, width, HEAD_DIM, generator=generator)
    if mask is not None:
        unseen = ~mask.any(dim=2)[:, :, :, None]  # [B, 1, K, 1]: slots no query of the row sees
        key, value = key + 49 * key * unseen, value + 49 * value * unseen
    return query, key, value


def _additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


def _references(caller, query, key, value, mask, scaling):
    """transformers' SDPA and eager attention in float32 on the same inputs, ``[B, Q, H, D]`` each."""
    query, key, value = query.float(), key.float(), value.float()
    queries, width = query.shape[2], key.shape[2]
    explicit = mask if mask is not None or queries == width else _bottom_right_causal(queries, width)
    sdpa, _ = sdpa_attention_forward(caller, query, key, value, explicit, scaling=scaling)
    full = explicit if explicit is not None else _bottom_right_causal(queries, width)
    eager, _ = eager_attention_forward(caller, query, key, value, _additive(full), scaling=scaling or HEAD_DIM**-0.5)
    return sdpa, eager


@pytest.mark.parametrize("case", MASK_CASES, ids=CASE_IDS)
def test_invariant_attention_equals_transformers_attention_in_float32(case: str) -> None:
    batch, queries, width, mask = _mask_case(case)
    for grouping, (heads, kv_heads) in HEAD_GROUPINGS.items():
        caller = _Caller(heads // kv_heads)
        query, key, value = _inputs(batch, heads, kv_heads, queries, width, mask)
        for scaling in SCALINGS:
            out, weights = attention.invariant_attention(caller, query, key, value, mask, scaling=scaling)
            assert weights is None and out.shape == (batch, queries, heads, HEAD_DIM) and out.dtype == torch.float32
            sdpa, eager = _references(caller, query, key, value, mask, scaling)
            where = f"{case}, {grouping}, scaling {scaling}"
            torch.testing.assert_close(out, sdpa, atol=2e-5, rtol=2e-5, msg=lambda m, w=where: f"{w} (sdpa): {m}")
            torch.testing.assert_close(out, eager, atol=2e-5, rtol=2e-5, msg=lambda m, w=where: f"{w} (eager): {m}")
            if mask is not None:  # an additive float mask means what the boolean one means
                same, _ = attention.invariant_attention(caller, query, key, value, _additive(mask), scaling=scaling)
                assert torch.equal(same, out), where


@pytest.mark.parametrize("case", MASK_CASES, ids=CASE_IDS)
def test_invariant_attention_in_bf16_is_float32_attention_rounded(case: str) -> None:
    """bf16 inputs, compared with float32 attention on the same (exactly representable) values: the error is bf16
    rounding of the weights and of the output, and not larger than transformers' own eager bf16 attention's (the
    module docstring: float32 scores make it, if anything, the more precise of the two; a quarter more is allowed,
    since where the output's final rounding dominates the two errors tie)."""
    batch, queries, width, mask = _mask_case(case)
    for grouping, (heads, kv_heads) in HEAD_GROUPINGS.items():
        caller = _Caller(heads // kv_heads)
        query, key, value = (t.to(torch.bfloat16) for t in _inputs(batch, heads, kv_heads, queries, width, mask))
        for scaling in SCALINGS:
            out, _ = attention.invariant_attention(caller, query, key, value, mask, scaling=scaling)
            assert out.dtype == torch.bfloat16
            reference, _ = _references(caller, query, key, value, mask, scaling)
            where = f"{case}, {grouping}, scaling {scaling}"
            torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=1e-2, msg=lambda m, w=where: f"{w}: {m}")
            full = mask if mask is not None else _bottom_right_causal(queries, width)
            eager, _ = eager_attention_forward(
                caller, query, key, value, _additive(full, torch.bfloat16), scaling=scaling or HEAD_DIM**-0.5
            )
            error = (out.float() - reference).abs().max()
            assert error <= 1.25 * (eager.float() - reference).abs().max(), where


@pytest.mark.parametrize(
    "name, value",
    [
        ("softcap", 1.0),
        ("sliding_window", 4),
        ("s_aux", torch.zeros(4)),
        ("sinks", torch.zeros(4)),
        ("position_bias", torch.ones(1, 4, 12, 12)),
    ],
    ids=["softcap", "sliding_window", "s_aux", "sinks", "position_bias"],
)
def test_invariant_attention_refuses_what_it_does_not_compute(name: str, value) -> None:
    """Arguments of transformers' attention interface that change the result (a score cap, a window the mask may not
    carry, attention sinks, an additive position bias) raise instead of being silently ignored."""
    query, key, value_states = _inputs(1, 4, 4, 12, 12, None)
    with pytest.raises(NotImplementedError, match=name):
        attention.invariant_attention(_Caller(1), query, key, value_states, None, **{name: value})


# ------------------------------------------------------------------------------------- whole models, float32
def _granite(seed: int = 0) -> torch.nn.Module:
    """A tiny Granite: its attention scale is the config's ``attention_multiplier``, not ``head_dim ** -0.5``."""
    torch.manual_seed(seed)
    config = transformers.GraniteConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attention_multiplier=0.9, bos_token_id=0,
        eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    assert model.model.layers[0].self_attn.scaling == 0.9 != (32 // 4) ** -0.5
    return model


def _model(arch: str) -> torch.nn.Module:
    return _granite() if arch == "granite" else tiny_model(arch, logit_scale=4.0)


def _prefill_and_tree_logits(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of a 14-token prefill (no mask) and of a ragged step into a slot cache: two rows of 9 and 13 committed
    tokens, row 0 feeding a 7-node tree, row 1 a 3-token chain and padding."""
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(2, 96, (1, 14), generator=generator)
    prefill = model(input_ids=prompt).logits[0]
    lengths = [9, 13]
    cache = kv_cache.SlotCache(2, 32)
    ids = torch.randint(2, 96, (2, 13), generator=generator)
    mask = kv_cache.step_mask([0, 0], [kv_cache.causal(n) for n in lengths], 13)
    model(input_ids=ids, attention_mask=mask, position_ids=torch.arange(13)[None].expand(2, -1),
          **kv_cache.forward_kwargs(model, cache))  # fmt: skip
    kv_cache.advance(cache, lengths)
    tree = _ancestry(TREE_PARENTS)
    feed = torch.randint(2, 96, (2, tree.shape[0]), generator=generator)
    mask = kv_cache.step_mask(lengths, [tree, kv_cache.causal(3)], tree.shape[0])
    depths = torch.stack([tree.sum(-1) - 1, torch.arange(tree.shape[0])])  # padding positions are never read
    out = model(input_ids=feed, attention_mask=mask, position_ids=torch.tensor(lengths)[:, None] + depths,
                **kv_cache.forward_kwargs(model, cache))  # fmt: skip
    return prefill, torch.cat([out.logits[0], out.logits[1, :3]])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2", "granite"])
def test_a_model_switched_to_the_invariant_computation_keeps_its_logits_in_float32(arch: str) -> None:
    model = _model(arch)
    with torch.inference_mode():
        own = _prefill_and_tree_logits(model)
        with attention.batch_invariant(model):
            switched = _prefill_and_tree_logits(model)
    for name, mine, theirs in zip(("prefill", "ragged tree step"), switched, own, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{arch} {n}: {m}")


@pytest.mark.parametrize("arch", ["llama", "granite"])
def test_a_switched_bf16_model_is_as_close_to_its_float32_twin_as_its_own_attention(arch: str) -> None:
    """bf16 weights and activations against the same weights in float32: the switched model's logits are no
    further from float32 than the model's own bf16 attention leaves them (three times that, for the luck of rounding:
    measured, 0.8 to 1.5 times)."""
    model = _model(arch).to(torch.bfloat16)
    with torch.inference_mode():
        own = _prefill_and_tree_logits(model)
        with attention.batch_invariant(model):
            switched = _prefill_and_tree_logits(model)
        reference = _prefill_and_tree_logits(model.float())
    for name, mine, theirs, exact in zip(("prefill", "ragged tree step"), switched, own, reference, strict=True):
        own_error = (theirs.float() - exact).abs().max()
        assert (mine.float() - exact).abs().max() <= 3 * own_error, (arch, name)


def test_a_sliding_window_model_is_refused_not_computed_without_its_window() -> None:
    model = tiny_model("mistral")
    model.config.sliding_window = 6
    refused = pytest.raises(NotImplementedError, match="sliding_window")
    with torch.inference_mode(), attention.batch_invariant(model), refused:
        model(input_ids=torch.randint(2, 96, (1, 12)))


# ------------------------------------------------------------------------------------------- linear layers
REAL_WIDTHS = dict(hidden=576, layers=1, intermediate=1536)  # SmolLM2-135M's widths, one layer


@pytest.fixture(scope="module")
def wide_models() -> dict[str, torch.nn.Module]:
    """A llama (``nn.Linear``, a 4,096-token output layer) and a GPT-2 (transformers' ``Conv1D``) at real widths."""
    return {"llama": tiny_model("llama", vocab_size=4096, **REAL_WIDTHS), "gpt2": tiny_model("gpt2", **REAL_WIDTHS)}


def _layers_by_shape(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """One layer of each type and shape: every ``nn.Linear`` and ``Conv1D`` of the model, named by type and K x N."""
    layers = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            layers.setdefault(f"Linear {module.in_features}x{module.out_features}", module)
        elif isinstance(module, Conv1D):
            layers.setdefault(f"Conv1D {module.weight.shape[0]}x{module.nf}", module)
    return layers


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_row_has_the_same_bits_alone_and_among_many_rows(wide_models, arch: str, dtype: torch.dtype) -> None:
    """Under the switch every linear layer of the model computes a row alone as it computes it among 5, 20, 28 or 64
    rows. Without the switch, on a CPU with AMX some rows of a 64-row bf16 product (of a 28-row one, over a
    ``Conv1D``'s own ``[K, N]`` weight) and most one-row fp16 products at these widths part (measured when this test
    was written)."""
    model = wide_models[arch].to(dtype)
    layers = _layers_by_shape(model)
    assert any(int(name.split()[1].split("x")[0]) >= 1536 for name in layers)  # a real inner size is among them
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode(), attention.batch_invariant(model):
        for name, layer in layers.items():
            width = int(name.split()[1].split("x")[0])
            rows = torch.randn(1, 64, width, generator=generator).to(dtype)  # [B, T, K], as a model feeds it
            many = layer(rows)[0]
            for size in (1, 5, 20, 28):  # a step of one token, trees, batches of trees
                fewer = torch.cat([layer(rows[:, start : start + size])[0] for start in range(0, 64, size)])
                assert torch.equal(fewer, many), (arch, name, dtype, f"rows computed {size} at a time vs 64")


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_position_has_the_same_bits_decoded_alone_and_verified_in_a_40_token_chain(arch: str) -> None:
    """The engine's promise at real widths in bf16: a chain of 40 drafts verified in one forward (more rows than one
    kernel block) gives each position the logits of decoding the tokens one at a time."""
    model = tiny_model(arch, **{**REAL_WIDTHS, "layers": 2}).to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(2, 96, (1, 20), generator=generator)
    feed = torch.randint(2, 96, (1, 40), generator=generator)
    with torch.inference_mode(), attention.batch_invariant(model):
        cache = kv_cache.SlotCache(1, 64)
        model(input_ids=prefix, position_ids=torch.arange(20)[None], **kv_cache.forward_kwargs(model, cache))
        kv_cache.advance(cache, [20])
        one_at_a_time = []
        for index in range(40):
            out = model(input_ids=feed[:, index : index + 1], position_ids=torch.tensor([[20 + index]]),
                        **kv_cache.forward_kwargs(model, cache))  # fmt: skip
            kv_cache.advance(cache, [1])
            one_at_a_time.append(out.logits[0, 0])
        kv_cache.crop(cache, 20)
        chain = model(input_ids=feed, position_ids=20 + torch.arange(40)[None], **kv_cache.forward_kwargs(model, cache))
    parted = [i for i, logits in enumerate(one_at_a_time) if not torch.equal(chain.logits[0, i], logits)]
    assert parted == []
