"""EAGLE 3.1 heads folded into llama.cpp's graph (specheads.methods.eagle.fold): exact where the statistics it reads
hold for every token (features whose blocks keep their rms ratios, a first step whose input has rms kappa), measured
statistics, lossless decoding with the folded heads, and the gguf export through the CLI (refused without the fold,
written and checked with it)."""

from __future__ import annotations

import pytest
import torch
from helpers import base_samples, greedy_reference, tiny_model, train_eagle_head

from specheads import SpecDecoder
from specheads.cli import main
from specheads.heads import EagleHead
from specheads.loading import load_causal_lm
from specheads.methods.eagle.drafter import EagleDrafter
from specheads.methods.eagle.fold import (
    FoldStatistics,
    calibration_rows,
    fold_for_llamacpp,
    fold_statistics,
    fold_weights,
    needs_fold,
)

VOCAB = 96
HIDDEN = 32


@pytest.fixture(scope="module")
def base():
    return tiny_model("llama", seed=1, vocab_size=VOCAB, layers=4, logit_scale=4.0)


def _head(base, hidden_norm_ones: bool = False) -> EagleHead:
    torch.manual_seed(0)
    head = EagleHead.from_base(
        base, version=3, layer_ids=[1, 2, 3], draft_vocab_size=48, token_counts=torch.rand(VOCAB),
        fc_norm=True, norm_output=True,
    )  # fmt: skip
    with torch.no_grad():  # norms start at one: make each of them matter
        for parameter in head.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
        if hidden_norm_ones:
            head.midlayer.hidden_norm.weight.fill_(1.0)
    return head.eval()


def _unit_rms(x: torch.Tensor) -> torch.Tensor:
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


def _proportional_features(scales: list[float], tokens: int = 9) -> list[torch.Tensor]:
    """Features whose blocks have rms ``scale_k * t`` at every token (t varies by token): ratios hold exactly."""
    generator = torch.Generator().manual_seed(5)
    common = torch.rand(1, tokens, 1, generator=generator) + 0.5
    return [scale * common * _unit_rms(torch.randn(1, tokens, HIDDEN, generator=generator)) for scale in scales]


def test_the_statistics_are_the_rms_ratios_of_the_blocks_and_the_median_rms_of_fc(base) -> None:
    head = _head(base)
    scales = [0.4, 1.0, 3.0]
    features = _proportional_features(scales)
    statistics = fold_statistics(head, features)
    whole = (sum(s * s for s in scales) / 3) ** 0.5
    assert statistics.block_ratios == pytest.approx([whole / s for s in scales], rel=1e-4)
    with torch.no_grad():
        fused = head.fuse(features)
    assert statistics.kappa == pytest.approx(float(fused.pow(2).mean(-1).sqrt().median()), rel=1e-5)
    assert statistics.tokens == 9
    mask = torch.zeros(1, 9, dtype=torch.bool)
    mask[0, :4] = True
    assert fold_statistics(head, features, mask).tokens == 4


def test_the_folded_fuse_equals_the_heads_where_block_ratios_hold(base) -> None:
    head = _head(base)
    features = _proportional_features([0.4, 1.0, 3.0])
    folded = fold_weights(head, fold_statistics(head, features))
    folded.attach_base(base)
    assert folded.fc_norm is None and folded.input_norm is not None
    with torch.no_grad():
        torch.testing.assert_close(folded.fuse(features), head.fuse(features), rtol=1e-4, atol=1e-4)
        # and it is an approximation elsewhere: unequal ratios part the two
        other = _proportional_features([3.0, 1.0, 0.4])
        assert not torch.allclose(folded.fuse(other), head.fuse(other), rtol=1e-2, atol=1e-3)


def test_the_first_draft_step_is_exact_where_its_input_has_rms_kappa(base) -> None:
    """With hidden_norm's weight at one, a step input of rms kappa is its own normed residual times kappa: the folded
    layer (normed residual, q/k/v columns divided by kappa) then computes what EAGLE 3.1's does, to the logits."""
    head = _head(base, hidden_norm_ones=True)
    kappa = 2.5
    folded = fold_weights(head, FoldStatistics([1.0, 1.0, 1.0], kappa, 1))
    folded.attach_base(base)
    assert folded.config.norm_before_residual and not folded.config.norm_output
    ids = torch.randint(2, VOCAB, (1, 7), generator=torch.Generator().manual_seed(2))
    g = kappa * _unit_rms(torch.randn(1, 7, HIDDEN, generator=torch.Generator().manual_seed(4)))
    positions = torch.arange(7)[None]
    causal = torch.ones(7, 7, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        ours = folded.logits(folded.step(ids, g, positions, causal, None))
        theirs = head.logits(head.step(ids, g, positions, causal, None))
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
        # at another scale the normed residual no longer stands for the raw one
        half = folded.logits(folded.step(ids, g / 2, positions, causal, None))
        assert not torch.allclose(half, head.logits(head.step(ids, g / 2, positions, causal, None)), atol=1e-3)


def test_the_fold_leaves_the_heads_and_refuses_what_it_cannot_rewrite(base) -> None:
    head = _head(base)
    before = {key: value.clone() for key, value in head.state_dict().items()}
    folded = fold_weights(head, FoldStatistics([1.5, 1.2, 0.7], 3.0, 10))
    assert all(torch.equal(before[key], value) for key, value in head.state_dict().items())
    assert needs_fold(head) and not needs_fold(folded)
    with pytest.raises(ValueError, match="both EAGLE 3.1 norms"):
        fold_weights(folded, FoldStatistics([1.0, 1.0, 1.0], 1.0, 1))
    with pytest.raises(ValueError, match="2 block ratios for 3 feature layers"):
        fold_weights(head, FoldStatistics([1.0, 1.0], 1.0, 1))
    with pytest.raises(ValueError, match="no EAGLE 3.1 norms"):
        fold_for_llamacpp(folded, base, [[3, 4, 5]])
    with pytest.raises(ValueError, match="no non-empty row"):
        fold_for_llamacpp(head, base, [[]])


def test_folded_trained_heads_decode_losslessly_and_still_draft(base) -> None:
    sequences = base_samples(base)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    head = train_eagle_head(
        base, sequences, 80, version=3, draft_vocab_size=64, token_counts=counts, fc_norm=True, norm_output=True
    )
    folded, statistics = fold_for_llamacpp(head, base, sequences[:4].tolist())
    assert statistics.tokens == sequences[:4].numel() and statistics.kappa > 0
    accepted = {}
    for name, heads in (("3.1", head), ("folded", folded)):
        decoder = SpecDecoder(base, EagleDrafter(heads))
        new_tokens = steps = 0
        for length in (1, 5, 23):
            prompt = torch.randint(2, VOCAB, (1, length), generator=torch.Generator().manual_seed(length))
            reference = greedy_reference(base, prompt, 30)
            out = decoder.generate(prompt, max_new_tokens=30, tree="chain-3")
            assert torch.equal(out.sequences, reference), (name, length)
            new_tokens, steps = new_tokens + out.stats.new_tokens, steps + out.stats.steps
        accepted[name] = new_tokens / steps
    # drafts are still accepted (random heads: about 1.0); on this tiny base the blocks' rms are nearly equal, so the
    # fold's accuracy is what the exactness tests above pin down, not this
    assert accepted["folded"] > 1.1, accepted


def test_calibration_rows_cut_the_joined_tokens() -> None:
    class Tokenizer:
        def __call__(self, text: str) -> dict:
            return {"input_ids": [len(word) for word in text.split()]}

    rows = calibration_rows(Tokenizer(), ["a bb ccc", "dddd eeeee", "ffffff"], tokens=5, row=2)
    assert rows == [[1, 2], [3, 4], [5]]


def test_the_cli_refuses_eagle31_heads_for_gguf_unless_folded(tmp_path, capsys) -> None:
    default = load_causal_lm("default")
    torch.manual_seed(0)
    vocab = default.config.vocab_size
    head = EagleHead.from_base(
        default, version=3, layer_ids=[1, 2, 3], draft_vocab_size=vocab // 2, token_counts=torch.rand(vocab),
        fc_norm=True, norm_output=True,
    )  # fmt: skip
    heads = tmp_path / "heads"
    head.save_pretrained(heads)
    out = tmp_path / "draft.gguf"
    common = ["export", "--heads", str(heads), "--base", "default", "--format", "gguf", "--out", str(out)]
    assert main(common) != 0
    assert "add --fold-norms" in capsys.readouterr().err and not out.exists()
    assert main([*common[:5], "--format", "eagle3", "--out", str(tmp_path / "e3"), "--fold-norms"]) != 0
    assert "goes with --format gguf" in capsys.readouterr().err and not (tmp_path / "e3").exists()
    (tmp_path / "empty.txt").write_text("\n")
    assert main([*common, "--fold-norms", "--fold-text", str(tmp_path / "missing.txt")]) != 0
    assert "missing.txt: no such file" in capsys.readouterr().err
    assert main([*common, "--fold-norms", "--fold-text", str(tmp_path / "empty.txt")]) != 0
    assert "is empty" in capsys.readouterr().err and not out.exists()
    assert main([*common, "--fold-norms"]) == 0
    printed = capsys.readouterr().out
    assert "folded into llama.cpp's graph" in printed and "fold statistics from" in printed
    assert "llama.cpp: loads" in printed
    assert main(["export", "--check", str(out)]) == 0
    text = tmp_path / "code.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 20)
    other = tmp_path / "from-text.gguf"
    assert main([*common[:-1], str(other), "--fold-norms", "--fold-text", str(text)]) == 0
    assert f"calibration text: {text}" in capsys.readouterr().out and other.exists()
