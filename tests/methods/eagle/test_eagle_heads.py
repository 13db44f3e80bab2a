"""EAGLE heads: shapes for EAGLE-1 and EAGLE-3, a Llama-style layer on any base, the native checkpoint, d2t/t2d."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_model
from safetensors.torch import load_file
from torch import nn
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer

from specheads.heads import EagleHead, load_heads
from specheads.heads.checkpoint import fingerprint
from specheads.heads.vocab import select_draft_vocab
from specheads.methods.eagle.heads import Eagle3Layer, default_layer_ids

HIDDEN, VOCAB = 32, 96


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1, layers=4)


def _counts() -> torch.Tensor:
    return torch.randint(0, 1000, (VOCAB,), generator=torch.Generator().manual_seed(0))


def _perturbed(head: EagleHead) -> EagleHead:
    """Move every parameter away from its initial value, so a round trip that dropped one would show."""
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(3)))
    return head


def _features(base, head: EagleHead, tokens: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        out = base(tokens, output_hidden_states=True)
    return [out.hidden_states[index] for index in head.hidden_state_layers]


def test_eagle1_shapes(base) -> None:
    head = EagleHead.from_base(base, version=1)
    assert head.fc.weight.shape == (HIDDEN, 2 * HIDDEN) and head.fc.bias is not None  # [emb ; feature] -> h
    assert isinstance(head.midlayer, LlamaDecoderLayer)
    assert isinstance(head.midlayer.input_layernorm, nn.Identity)  # EAGLE-1's layer has no input norm
    assert head.norm is None and head.lm_head is None  # the base's own lm_head reads the output
    assert head.hidden_state_layers == (4,)  # the last feature, after the base's final norm
    assert head.d2t is None and head.t2d is None
    assert head.logits(torch.randn(2, HIDDEN)).shape == (2, VOCAB)
    assert EagleHead.from_base(base, version=1, fc_bias=False).fc.bias is None


def test_eagle3_shapes(base) -> None:
    head = EagleHead.from_base(base, version=3, draft_vocab_size=40, token_counts=_counts())
    assert head.fc.weight.shape == (HIDDEN, 3 * HIDDEN) and head.fc.bias is None  # three fused features -> h
    assert isinstance(head.midlayer, Eagle3Layer)
    attention = head.midlayer.self_attn
    assert attention.q_proj.in_features == 2 * HIDDEN  # [input_layernorm(embedding) ; hidden_norm(feature)]
    assert attention.k_proj.in_features == 2 * HIDDEN and attention.v_proj.in_features == 2 * HIDDEN
    assert attention.k_proj.out_features == 2 * 8  # the base's 2 kv heads of head_dim 8
    assert head.lm_head.weight.shape == (40, HIDDEN)  # [draft_vocab, h]
    assert head.norm is not None
    assert head.hidden_state_layers == tuple(default_layer_ids(4)) == (1, 2, 2)
    assert head.d2t.shape == (40,) and head.t2d.shape == (VOCAB,)
    assert EagleHead.from_base(base, version=3).lm_head.weight.shape == (VOCAB, HIDDEN)


@pytest.mark.parametrize("kwargs", [dict(version=1), dict(version=3, draft_vocab_size=40, token_counts=_counts())])
def test_the_projection_gives_the_logits_and_a_readout_replaces_them(base, kwargs: dict) -> None:
    head = _perturbed(EagleHead.from_base(base, **kwargs))
    tokens = torch.randint(2, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    features = _features(base, head, tokens)
    hidden = torch.randn(2, 3, HIDDEN)
    torch.testing.assert_close(F.linear(*head.projection(hidden)), head.logits(hidden))
    hiddens, logits = head(tokens, features, None, steps=2)
    _, read = head(tokens, features, None, steps=2, readout=lambda step, *projection: (step, F.linear(*projection)))
    assert [step for step, _ in read] == [0, 1]
    for (_, got), expected in zip(read, logits, strict=True):
        torch.testing.assert_close(got, expected)


def test_default_layer_ids() -> None:
    assert default_layer_ids(32) == [2, 16, 29]  # (2, L // 2, L - 3)
    assert default_layer_ids(2) == [0, 1, 1]  # shallow bases: (2, 1, -1) clamped into [0, L - 1]


def test_eagle3_lm_head_starts_from_the_base_projection_of_the_draft_tokens(base) -> None:
    head = EagleHead.from_base(base, version=3, draft_vocab_size=40, token_counts=_counts())
    expected = base.get_output_embeddings().weight[head.draft_token_ids()]
    torch.testing.assert_close(head.lm_head.weight, expected)


def test_a_gpt2_base_gets_a_llama_style_layer_with_its_head_count() -> None:
    gpt2 = tiny_model("gpt2", seed=1, layers=4)  # 4 heads of 32 / 4 = 8, no GQA, MLP 4 * h, LayerNorm eps 1e-5
    head = EagleHead.from_base(gpt2, version=3)
    config = head.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 4, 8)
    assert config.intermediate_size == 4 * HIDDEN and config.rms_norm_eps == gpt2.config.layer_norm_epsilon
    assert isinstance(head.midlayer.self_attn, LlamaAttention)
    assert head.midlayer.self_attn.q_proj.out_features == 4 * 8
    tokens = torch.randint(2, VOCAB, (1, 7), generator=torch.Generator().manual_seed(0))
    hiddens, logits = head(tokens, _features(gpt2, head, tokens), None, steps=2)
    assert hiddens[1].shape == (1, 6, HIDDEN) and logits[1].shape == (1, 6, VOCAB)


@pytest.mark.parametrize("kwargs", [dict(version=1), dict(version=3, draft_vocab_size=40)])
def test_save_and_load_round_trip(base, tmp_path, kwargs: dict) -> None:
    counts = _counts() if "draft_vocab_size" in kwargs else None
    head = _perturbed(EagleHead.from_base(base, token_counts=counts, **kwargs)).eval()
    head.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_heads(tmp_path, base)
    assert loaded.config == head.config
    assert loaded.config.base_model["fingerprint"] == fingerprint(base)
    tokens = torch.randint(2, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    features = _features(base, head, tokens)
    with torch.no_grad():
        expected, loaded_out = head(tokens, features, None, steps=3), loaded(tokens, features, None, steps=3)
    for step in range(3):
        assert torch.equal(loaded_out[0][step], expected[0][step])
        assert torch.equal(loaded_out[1][step], expected[1][step])
    if head.d2t is not None:
        assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)


@pytest.mark.parametrize("version", [1, 3])
def test_the_checkpoint_holds_no_base_weights(base, tmp_path, version: int) -> None:
    head = EagleHead.from_base(base, version=version)
    head.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert not [name for name in tensors if "embed" in name]
    assert ("lm_head.weight" in tensors) == (version == 3)  # EAGLE-3's own (draft-vocabulary) lm_head only
    assert sum(t.numel() for t in tensors.values()) == sum(p.numel() for p in head.parameters())
    base_parameters = sum(p.numel() for p in base.parameters())
    assert sum(t.numel() for t in tensors.values()) < base_parameters


def test_d2t_and_t2d_describe_the_same_draft_vocabulary(base) -> None:
    counts = _counts()
    head = EagleHead.from_base(base, version=3, draft_vocab_size=40, token_counts=counts)
    draft_ids = torch.arange(40)
    targets = head.to_target(draft_ids)
    assert targets.unique().numel() == 40 and int(targets.min()) >= 0 and int(targets.max()) < VOCAB
    assert targets.tolist() == sorted(targets.tolist())  # draft ids follow target ids
    assert torch.equal(targets, head.draft_token_ids())
    assert torch.equal(targets, select_draft_vocab(counts, 40))  # the 40 most frequent tokens
    expected_t2d = torch.zeros(VOCAB, dtype=torch.bool)
    expected_t2d[targets] = True
    assert torch.equal(head.t2d, expected_t2d)  # exactly the draft tokens are marked


@pytest.mark.parametrize(
    "ids", [torch.arange(39), torch.cat([torch.arange(39), torch.tensor([0])]), torch.arange(57, 97)]
)
def test_set_draft_vocab_refuses_a_bad_map(base, ids: torch.Tensor) -> None:
    head = EagleHead.from_base(base, version=3, draft_vocab_size=40, token_counts=_counts())
    with pytest.raises(ValueError, match="maps|outside"):
        head.set_draft_vocab(ids)
