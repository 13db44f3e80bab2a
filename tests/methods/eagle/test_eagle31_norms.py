"""EAGLE 3.1's norms (heads.fc_norm, heads.norm_output) and norm_before_fc (one norm over the concatenated features):
the computation by hand, lossless decoding with trained heads, and the exports: eagle3 / speculators carry them (read
back to the same drafts); llama.cpp's GGUF refuses EAGLE 3.1's and carries norm_before_fc. speculators itself runs
them in tests/methods/eagle/test_speculators_consumer.py, llama.cpp's converter in test_llamacpp.py."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import base_samples, greedy_reference, tiny_model, train_eagle_head
from safetensors.torch import load_file

from specheads import SpecDecoder, load_heads
from specheads.export import export_heads
from specheads.heads import EagleHead
from specheads.inference import kv_cache
from specheads.methods.api import ConfigError
from specheads.methods.eagle.config import EagleHeadsConfig
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.eagle.gguf import GGUFDraftError, TargetVocab, validate_for_llamacpp

VOCAB = 96


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1, vocab_size=VOCAB, layers=4, logit_scale=4.0)


def _head(base, layer_ids=(1, 2, 3), **norms) -> EagleHead:
    torch.manual_seed(0)
    head = EagleHead.from_base(
        base, version=3, layer_ids=list(layer_ids), draft_vocab_size=48, token_counts=torch.rand(VOCAB), **norms
    )
    with torch.no_grad():  # norms start at one: make each of them matter
        for parameter in head.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return head.eval()


def _features(base, head: EagleHead, ids: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        states = base(ids, output_hidden_states=True).hidden_states
    return [states[index] for index in head.hidden_state_layers]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()


IDS = torch.randint(2, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))


def test_fc_norm_normalises_each_fused_layer_before_fc(base) -> None:
    head = _head(base, fc_norm=True)
    features = _features(base, head, IDS)
    eps = head.config.rms_norm_eps
    normed = [_rms_norm(f, norm.weight, eps) for f, norm in zip(features, head.fc_norm, strict=True)]
    with torch.no_grad():
        torch.testing.assert_close(head.fuse(features), torch.cat(normed, dim=-1) @ head.fc.weight.T)
    assert [name for name, _ in head.named_parameters() if name.startswith("fc_norm")] == [
        f"fc_norm.{k}.weight" for k in range(3)
    ]


def test_norm_before_fc_normalises_the_concatenated_features_once_before_fc(base) -> None:
    head = _head(base, norm_before_fc=True)
    features = _features(base, head, IDS)
    fused = torch.cat(features, dim=-1)  # one rms over all 3h values, not one per layer
    with torch.no_grad():
        expected = _rms_norm(fused, head.input_norm.weight, head.config.rms_norm_eps) @ head.fc.weight.T
        torch.testing.assert_close(head.fuse(features), expected)
        per_layer = torch.cat([_rms_norm(f, torch.ones(()), head.config.rms_norm_eps) for f in features], dim=-1)
        assert not torch.allclose(head.fuse(features), (head.input_norm.weight * per_layer) @ head.fc.weight.T)
    assert head.input_norm.weight.shape == (3 * head.config.hidden_size,) and head.fc_norm is None


def test_fc_norm_and_norm_before_fc_exclude_each_other(base) -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        _head(base, fc_norm=True, norm_before_fc=True)
    with pytest.raises(ConfigError, match="llama.cpp runs norm_before_fc only"):
        EagleHeadsConfig(fc_norm=True, norm_before_fc=True).validate()
    with pytest.raises(ConfigError, match="EAGLE-3 settings"):
        EagleHeadsConfig(version=1, norm_before_fc=True).validate()


def test_norm_output_feeds_the_normed_state_forward(base) -> None:
    plain, normed = _head(base), _head(base, norm_output=True)
    normed.load_state_dict(plain.state_dict())
    features = _features(base, plain, IDS)
    batch, span = IDS.shape[0], IDS.shape[1] - 1
    with torch.no_grad():
        hidden, logits = normed(IDS, features, steps=2)
        # step 0 reads the same feature as without the flag: the same logits, and the state it passes on is normed
        torch.testing.assert_close(logits[0], plain(IDS, features, steps=1)[1][0])
        # step 1 by hand with the plain head's step: fed norm(step 0's output), read by the lm_head without a norm
        tril, eye = torch.ones(span, span, dtype=torch.bool).tril(), torch.eye(span, dtype=torch.bool)
        positions = torch.arange(span)[None].expand(batch, span)
        cache = kv_cache.new_cache()
        first = plain.step(IDS[:, 1:], plain.fuse(features)[:, :span], positions, tril[None, None], cache)
        torch.testing.assert_close(hidden[0], plain.norm(first))
        next_tokens = torch.cat([IDS[:, 2:], IDS.new_zeros(batch, 1)], dim=1)
        mask = torch.cat([tril, eye], dim=-1)[None, None]
        second = plain.step(next_tokens, plain.norm(first), positions + 1, mask, cache)
        torch.testing.assert_close(logits[1], plain.lm_head(plain.norm(second)))
        assert not torch.allclose(logits[1], plain(IDS, features, steps=2)[1][1], atol=1e-3)  # the flag matters


def test_heads_trained_with_the_norms_decode_losslessly_and_draft_well(base) -> None:
    sequences = base_samples(base)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    head = train_eagle_head(
        base, sequences, 80, version=3, draft_vocab_size=64, token_counts=counts, fc_norm=True, norm_output=True
    )
    decoder = SpecDecoder(base, EagleDrafter(head))
    new_tokens = steps = 0
    for length in (1, 5, 23):
        prompt = torch.randint(2, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))
        reference = greedy_reference(base, prompt, 30)
        for tree in ("chain-3", "dynamic"):
            out = decoder.generate(prompt, max_new_tokens=30, tree=tree)
            assert torch.equal(out.sequences, reference), (tree, length)
            new_tokens, steps = new_tokens + out.stats.new_tokens, steps + out.stats.steps
    assert new_tokens / steps > 1.2  # the drafter reads the norms as training did: drafts are accepted


def test_native_checkpoints_keep_the_norms(base, tmp_path) -> None:
    head = _head(base, layer_ids=(3, 1, 2), fc_norm=True, norm_output=True)
    head.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["fc_norm"], config["norm_output"]) == (True, True)
    loaded = load_heads(tmp_path, base)
    features = _features(base, head, IDS)
    with torch.no_grad():
        for ours, theirs in zip(head(IDS, features, steps=3)[1], loaded(IDS, features, steps=3)[1], strict=True):
            torch.testing.assert_close(theirs, ours)


def test_eagle1_has_no_eagle31_norms(base) -> None:
    with pytest.raises(ValueError, match="EAGLE-3"):
        EagleHead.from_base(base, version=1, fc_norm=True)


# ---------------------------------------------------------------------------------------------------- exports
NORMS = {"eagle31": {"fc_norm": True, "norm_output": True}, "before-fc": {"norm_before_fc": True}}


@pytest.mark.parametrize("norms", NORMS)
@pytest.mark.parametrize("format", ["eagle3", "speculators"])
def test_the_engine_layouts_carry_the_norms_and_read_back_the_same_drafts(
    base, tmp_path, format: str, norms: str
) -> None:
    head = _head(base, layer_ids=(3, 1, 2), **NORMS[norms])  # unsorted: engines sort, fc permutes
    out = tmp_path / format
    result = export_heads(head, out, format, base_model=base)
    config = json.loads((out / "config.json").read_text())
    for flag in ("fc_norm", "norm_output", "norm_before_fc"):
        assert config.get(flag, False) is NORMS[norms].get(flag, False), flag
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    tensors = load_file(str(out / "model.safetensors"))
    hidden = head.config.hidden_size
    for k, layer in enumerate([1, 2, 3]):  # fc_norm.k normalises the k-th fused layer in the engines' order
        source = [3, 1, 2].index(layer)
        if head.fc_norm is not None:
            assert torch.equal(tensors[f"fc_norm.{k}.weight"], head.fc_norm[source].weight)
        else:  # input_norm's k-th block scales the k-th fused layer
            block = tensors["input_norm.weight"][k * hidden : (k + 1) * hidden]
            assert torch.equal(block, head.input_norm.weight[source * hidden : (source + 1) * hidden])
    verdicts = {v.engine: v for v in result.report.verdicts}
    assert verdicts["vllm"].loads and not result.report.problems
    if format == "eagle3":
        assert verdicts["sglang"].loads
    if norms == "eagle31":
        assert not verdicts["llama.cpp"].targeted and "fc_norm" in verdicts["llama.cpp"].note
        assert "llama.cpp" not in result.commands
    elif format == "eagle3":
        assert "llama.cpp" in result.commands
    loaded = load_heads(out, base)
    for flag in ("fc_norm", "norm_output", "norm_before_fc"):
        assert getattr(loaded.config, flag) is NORMS[norms].get(flag, False), flag
    features = _features(base, head, IDS)
    with torch.no_grad():
        ours = head(IDS, features, steps=3)[1]
        theirs = loaded(IDS, [features[[3, 1, 2].index(layer)] for layer in (1, 2, 3)], steps=3)[1]
    for mine, read in zip(ours, theirs, strict=True):
        torch.testing.assert_close(read, mine)


def test_exports_without_the_norms_write_what_they_wrote_before(base, tmp_path) -> None:
    head = _head(base)
    export_heads(head, tmp_path / "eagle3", "eagle3", base_model=base)
    config = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    assert "fc_norm" not in config and "norm_output" not in config
    assert not any(name.startswith("fc_norm") for name in load_file(str(tmp_path / "eagle3" / "model.safetensors")))
    result = export_heads(head, tmp_path / "spec", "speculators", base_model=base)
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert (config["fc_norm"], config["norm_output"], config["norm_before_fc"]) == (False, False, False)
    assert "llama.cpp" in result.commands


@pytest.mark.parametrize("norms", [{"fc_norm": True}, {"norm_output": True}])
def test_llamacpp_refuses_the_norms(base, tmp_path, norms: dict) -> None:
    head = _head(base, **norms)
    with pytest.raises(ValueError, match="llama.cpp's EAGLE-3 graph cannot run EAGLE 3.1"):
        export_heads(head, tmp_path / "draft.gguf", "gguf", base_model=base)
    assert not (tmp_path / "draft.gguf").exists()
    layer = {"vocab_size": VOCAB, "hidden_size": 32, "num_attention_heads": 4}
    config = {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], **layer, **norms}
    with pytest.raises(GGUFDraftError, match="fc_norm / norm_output"):
        validate_for_llamacpp(config, {}, TargetVocab({}, "test", vocab_size=VOCAB, num_layers=4))
