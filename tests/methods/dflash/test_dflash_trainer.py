"""Block-drafter training: the targets line up with the slots by hand, anchors stay inside the targets, the trainer
trains, evaluates and exports DFlash and DSpark heads, resumes after SIGKILL exactly and runs on two processes as
on one, and bad recipes are refused before any compute."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_model
from training_helpers import (
    heads_state,
    kill_after_checkpoint_and_resume,
    make_workspace,
    rows_cache,  # noqa: F401 - autouse: a private rows cache per test
    two_processes,
)

from specheads import SpecDecoder
from specheads.heads import load_heads
from specheads.methods.dflash.config import DFlashHeadsConfig
from specheads.methods.dflash.drafter import DFlashDrafter
from specheads.methods.dflash.heads import DFlashHead
from specheads.methods.dflash.train import (
    block_losses,
    depth_hidden,
    depth_targets,
    previous_tokens,
    row_seed,
    sample_anchors,
    valid_anchors,
)
from specheads.training.config import ConfigError, load_config
from specheads.training.trainer import train


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("dflash-train"), layers=4)


def _base() -> torch.nn.Module:
    return tiny_model("llama", seed=1, layers=4)


def _overrides(workspace: Path, out: Path, variant: str = "dflash", **extra) -> list[str]:
    values = {
        "model.base": str(workspace / "base"),
        "data.paths": f"[{workspace / 'data'}]",
        "data.format": "text",
        "data.max_length": 32,
        "heads.type": "dflash",
        "heads.variant": variant,
        "heads.num_layers": 1,
        "heads.block_size": 4,
        "heads.num_anchors": 6,
        "heads.markov_rank": 8,
        "train.batch_size": 4,
        "train.steps": 6,
        "train.lr": 3e-3,
        "train.warmup_steps": 1,
        "output.dir": str(out),
        "output.save_every": 0,
        "log.every": 2,
    }
    values.update(extra)
    return [f"{key}={value}" for key, value in values.items()]


# ---------------------------------------------------------------------------------------------------- alignment
@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_each_depth_targets_the_base_position_before_its_token_in_both_layouts(variant: str) -> None:
    base = _base()
    head = DFlashHead.from_base(base, variant=variant, block_size=4, markov_rank=8)
    ids = torch.arange(10, 20)[None]  # token at position p is 10 + p
    ones = torch.ones_like(ids)
    loss_mask = ones.clone()
    loss_mask[0, 7] = 0  # position 7 is not a target: depths that reach it, and those after, do not count
    anchors = torch.tensor([[2, 5]])
    tokens, teacher, valid = depth_targets(head, ids, loss_mask, ones, anchors, torch.ones(1, 2, dtype=torch.bool))
    depths = head.config.num_drafts
    assert depths == (4 if variant == "dspark" else 3)
    # depth d of the block at a drafts the token at a + d, from the base's distribution at a + d - 1
    assert tokens[0, 0].tolist() == [13, 14, 15, 16][:depths] and teacher[0, 0].tolist() == [2, 3, 4, 5][:depths]
    assert tokens[0, 1].tolist()[:2] == [16, 17] and teacher[0, 1].tolist()[:2] == [5, 6]
    assert valid[0, 0].tolist() == [True] * depths
    assert valid[0, 1].tolist() == [True, False, False, False][:depths]  # position 7 breaks the run
    hidden = torch.arange(4)[None, None, :, None].float()  # slot index as the hidden state
    assert depth_hidden(head, hidden)[0, 0, :, 0].tolist() == ([0, 1, 2, 3] if variant == "dspark" else [1, 2, 3])
    if variant == "dspark":  # the Markov head's previous token: the one at a + d - 1 (the anchor for depth 1)
        assert previous_tokens(head, ids, anchors)[0, 0].tolist() == [12, 13, 14, 15]


def test_anchors_are_positions_whose_first_target_is_real_and_are_reproducible() -> None:
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])
    valid = valid_anchors(loss_mask, attention)
    assert valid[0].nonzero().squeeze(-1).tolist() == [1, 2, 3, 4]
    anchors, used = sample_anchors(valid, 3, seeds=[5])
    again, _ = sample_anchors(valid, 3, seeds=[5])
    assert torch.equal(anchors, again) and used.all() and anchors[0].tolist() == sorted(anchors[0].tolist())
    assert set(anchors[0].tolist()) <= {1, 2, 3, 4}
    all_of_them, used = sample_anchors(valid, 6, seeds=[5])
    assert all_of_them[0, :4].tolist() == [1, 2, 3, 4] and used[0].tolist() == [True] * 4 + [False] * 2
    ids = torch.arange(8)
    assert row_seed(0, 0, ids) == row_seed(0, 0, ids.clone()) != row_seed(0, 1, ids)


def test_a_block_sees_the_context_before_its_anchor_only() -> None:
    base = _base()
    head = DFlashHead.from_base(base, variant="dflash", block_size=4)
    ids = torch.randint(2, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = [base(ids, output_hidden_states=True).hidden_states[i] for i in head.hidden_state_layers]
        before = head(ids, features, torch.tensor([[6]]))
        later = [f.clone() for f in features]
        for f in later:
            f[:, 6:] += 1.0  # the anchor's own features and everything after: not yet computed at decode time
        assert torch.equal(head(ids, later, torch.tensor([[6]])), before)
        earlier = [f.clone() for f in features]
        earlier[0][:, 5] += 1.0
        assert not torch.allclose(head(ids, earlier, torch.tensor([[6]])), before)


def test_the_loss_of_a_split_batch_adds_up_to_the_loss_of_the_whole() -> None:
    """Each row's share of the loss is its own: two halves, averaged, are the whole (what DDP computes)."""
    section = DFlashHeadsConfig(variant="dspark", markov_rank=8)
    base = _base()
    head = DFlashHead.from_base(base, variant="dspark", block_size=4, markov_rank=8)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, 96, generator=generator)
    teacher = torch.randn(6, 4, 96, generator=generator)
    tokens = torch.randint(0, 96, (6, 4), generator=generator)
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]).bool()
    confidence = torch.randn(6, 4, generator=generator)
    whole, _ = block_losses(section, head, logits, teacher, tokens, valid, confidence)
    halves = [block_losses(section, head, logits[s], teacher[s], tokens[s], valid[s], confidence[s])[0]
              for s in (slice(0, 3), slice(3, 6))]  # fmt: skip
    torch.testing.assert_close((halves[0] + halves[1]) / 2, whole)


# ---------------------------------------------------------------------------------------------------- the trainer
@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_block_training_evaluates_exports_and_decodes_losslessly(workspace, tmp_path, variant: str) -> None:
    extra = {"data.eval_paths": f"[{workspace / 'data'}]", "data.eval_batches": 2}
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "run", variant, **extra)))
    base = _base()
    heads = load_heads(heads_dir, base_model=base)
    assert isinstance(heads, DFlashHead) and heads.config.variant == variant
    assert (heads.confidence_head is not None) is (variant == "dspark")
    fresh = train(load_config(None, _overrides(workspace, tmp_path / "one", variant, **{"train.steps": 1})))
    assert any(not torch.equal(v, heads_state(fresh)[k]) for k, v in heads.state_dict().items())
    evaluation = json.loads((heads_dir / "eval.json").read_text())
    assert len(evaluation["agreement_with_base_greedy"]) == heads.config.num_drafts
    assert evaluation["positions"][0] > 0 and evaluation["chain_tau"] >= 1.0
    prompt = torch.randint(2, 96, (1, 7), generator=torch.Generator().manual_seed(1))
    out = SpecDecoder(base, DFlashDrafter(heads)).generate(prompt, max_new_tokens=8)
    assert out.new_tokens == base.generate(prompt, do_sample=False, max_new_tokens=8, pad_token_id=0,
                                           attention_mask=torch.ones_like(prompt))[0, 7:].tolist()  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("heads.block_size=1", "block_size"),
        ("heads.variant=medusa", "variant"),
        ("heads.num_anchors=0", "num_anchors"),
        ("heads.loss=kl", "targets=self"),
    ],
)
def test_bad_block_recipes_are_refused_before_compute(workspace, tmp_path, override: str, message: str) -> None:
    extra = dict([override.split("=")])
    if override == "heads.loss=kl":
        extra["heads.targets"] = "corpus"
    with pytest.raises(ConfigError, match=message):
        load_config(None, _overrides(workspace, tmp_path / "bad", **extra))


def test_bad_layer_ids_and_mask_tokens_are_clear_errors() -> None:
    base = _base()
    for ids in ([0, 2], [2, 2], [3, 1], [4]):
        with pytest.raises(ValueError, match=r"distinct, ascending hidden_states indices in \[1, 3\]"):
            DFlashHead.from_base(base, layer_ids=ids)
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashHead.from_base(base, mask_token_id=96)
    with pytest.raises(ValueError, match="block_size"):
        DFlashHead.from_base(base, block_size=1)


# ---------------------------------------------------------------------------------------------------- resume, DDP
@pytest.mark.slow
def test_dspark_resume_after_sigkill_matches_an_uninterrupted_run(workspace, tmp_path) -> None:
    steps = {"train.steps": 30, "output.save_every": 4, "train.seed": 7}
    reference = train(load_config(None, _overrides(workspace, tmp_path / "reference", "dspark", **steps)))
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "specheads.train", *_overrides(workspace, out, "dspark", **steps)]
    resumed = kill_after_checkpoint_and_resume(command, out, tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resumed from" in resumed.stdout
    for name, value in heads_state(reference).items():
        torch.testing.assert_close(heads_state(out / "heads")[name], value, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_block_training_on_two_processes_agrees_with_one(workspace, tmp_path) -> None:
    common = {"train.steps": 4}
    single = train(load_config(None, _overrides(workspace, tmp_path / "single", "dspark", **common)))
    out = tmp_path / "double"
    overrides = _overrides(workspace, out, "dspark", **{**common, "train.batch_size": 2})
    result = two_processes(overrides, tmp_path / "double.log")
    assert result.returncode == 0, result.stdout[-3000:]
    final = json.loads((out / "final_state.json").read_text())
    assert final["world_size"] == 2
    for name, value in heads_state(single).items():
        torch.testing.assert_close(heads_state(out / "heads")[name], value, rtol=1e-4, atol=1e-5)


def test_the_evaluation_walks_the_base_path_through_chains_and_ddtrees() -> None:
    """A drafter that always drafts the base's own greedy tokens: every chain and tree accepts the whole on-path
    block; tree tau never falls below chain tau and grows with the budget."""
    from specheads.methods.dflash.train import TREE_BUDGETS, _tree_walk, block_agreement

    base = _base()
    head = DFlashHead.from_base(base, variant="dspark", block_size=4, markov_rank=8)
    ids = torch.randint(2, 96, (2, 24), generator=torch.Generator().manual_seed(3))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    summary = block_agreement(base, head, [batch])
    assert summary["chain_tau"] >= 1.0 and set(summary["tree_tau"]) == set(TREE_BUDGETS)
    taus = [summary["tree_tau"][budget] for budget in TREE_BUDGETS]
    assert taus == sorted(taus) and taus[0] >= 1.0
    # A tree holding the path accepts all of it; one without its first token accepts nothing.
    hidden = torch.zeros(4, base.config.hidden_size)
    lm_head = base.get_output_embeddings().weight
    with torch.no_grad():
        head.markov_head.markov_w2.weight.zero_()
        path = [int(lm_head[:, 0].argmax()), int(lm_head[:, 1].argmax())]
        hidden[0, 0] = hidden[1, 1] = 5000.0  # slot d's logits peak where column d of the lm_head does
        assert _tree_walk(head, hidden, 5, 2, path) == 2
        assert _tree_walk(head, hidden, 5, 2, [(path[0] + 1) % 96, path[1]]) == 0


# ---------------------------------------------------------------------------------------------- losses by hand
def _softmax(values: list[float]) -> list[float]:
    import math

    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


DRAFT_LOGITS = [[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]]  # one block, two depths, three tokens
BASE_LOGITS = [[0.0, 1.0, 0.0], [2.0, 0.0, 1.0]]
DATA_TOKENS = [2, 0]


def _block_loss_of(variant: str, confidence: list[float] | None = None) -> torch.Tensor:
    section = DFlashHeadsConfig(variant=variant, decay_gamma=4.0, confidence_weight=0.5)
    loss, _ = block_losses(
        section, None, torch.tensor([DRAFT_LOGITS]), torch.tensor([BASE_LOGITS]), torch.tensor([DATA_TOKENS]),
        torch.ones(1, 2, dtype=torch.bool), None if confidence is None else torch.tensor([confidence]),
    )  # fmt: skip
    return loss


def test_the_dflash_loss_is_the_decay_weighted_kl_to_the_base_by_hand() -> None:
    import math

    weights = [1.0, math.exp(-1 / 4)]  # exp(-(d - 1) / gamma) for d = 1, 2
    total = 0.0
    for weight, draft, base in zip(weights, DRAFT_LOGITS, BASE_LOGITS, strict=True):
        q, p = _softmax(draft), _softmax(base)
        total += weight * sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    assert float(_block_loss_of("dflash")) == pytest.approx(total / sum(weights), rel=1e-5)


def test_the_dspark_loss_is_0_1_ce_plus_0_9_l1_plus_the_confidence_bce_by_hand() -> None:
    import math

    weights = [1.0, math.exp(-1 / 4)]
    confidence = [0.3, -0.7]
    main = bce = 0.0
    for depth, (weight, draft, base) in enumerate(zip(weights, DRAFT_LOGITS, BASE_LOGITS, strict=True)):
        q, p = _softmax(draft), _softmax(base)
        ce = -math.log(q[DATA_TOKENS[depth]])  # to the data's token
        l1 = sum(abs(qi - pi) for qi, pi in zip(q, p, strict=True))
        main += weight * (0.1 * ce + 0.9 * l1)
        target = 1 - 0.5 * l1  # 1 - total variation
        c = 1 / (1 + math.exp(-confidence[depth]))
        bce += weight * -(target * math.log(c) + (1 - target) * math.log(1 - c))
    expected = main / sum(weights) + 0.5 * bce / sum(weights)
    assert float(_block_loss_of("dspark", confidence)) == pytest.approx(expected, rel=1e-5)
    assert float(_block_loss_of("dspark")) == pytest.approx(main / sum(weights), rel=1e-5)
