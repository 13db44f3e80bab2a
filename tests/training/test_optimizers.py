"""train.optimizer and train.schedule (specheads.training.optimizers): Muon on the hidden matrices against a
hand-written Muon step, AdamW on the rest against a hand-written AdamW step, one optimizer for schedules and
checkpoints, warmup-stable-decay by hand, and the settings' validation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from specheads.training.config import ConfigError, TrainConfig, load_config
from specheads.training.optimizers import MuonWithAdamW, build_optimizer, build_scheduler, muon_split

LR, MULTIPLIER, WEIGHT_DECAY, MUON_WEIGHT_DECAY = 1e-2, 10.0, 0.01, 0.1


class Toy(nn.Module):
    """A hidden matrix with a bias, a norm and a vocabulary projection: one parameter of each kind."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(5, 3)
        self.norm = nn.RMSNorm(3)
        self.lm_head = nn.Linear(3, 7, bias=False)
        self.embed_tokens = nn.Embedding(7, 3)
        self.gate = nn.Linear(5, 1, bias=False)  # a [1, 5] "matrix" is a vector: AdamW


def _names(module: nn.Module, parameters: list[nn.Parameter]) -> list[str]:
    ids = {id(p) for p in parameters}
    return [name for name, p in module.named_parameters() if id(p) in ids]


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest() -> None:
    toy = Toy()
    matrices, others = muon_split(toy)
    assert _names(toy, matrices) == ["proj.weight"]
    assert _names(toy, others) == ["proj.bias", "norm.weight", "lm_head.weight", "embed_tokens.weight", "gate.weight"]
    toy.proj.weight.requires_grad_(False)
    assert muon_split(toy)[0] == []  # frozen parameters are nobody's


def test_eagle_heads_split_as_speculators_splits_them(llama) -> None:
    from specheads import EagleHead

    head = EagleHead.from_base(llama, version=3, fc_norm=True)
    matrices, others = muon_split(head)
    assert _names(head, matrices) == [
        "fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
        "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
        "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight",
    ]  # fmt: skip
    assert all(p.ndim == 1 for p in others if p is not head.lm_head.weight)
    assert any(p is head.lm_head.weight for p in others)


# ---------------------------------------------------------------------------------------------------- the update
def _newton_schulz(matrix: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Keller Jordan's quintic Newton-Schulz iteration towards the orthogonal factor of ``matrix`` (float64)."""
    a, b, c = 3.4445, -4.775, 2.0315
    tall = matrix.shape[0] > matrix.shape[1]
    x = matrix.T if tall else matrix
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _muon_reference(weight: torch.Tensor, grads: list[torch.Tensor], lr: float) -> torch.Tensor:
    """Muon as its paper and speculators describe it: Nesterov momentum 0.95, the update orthogonalised and scaled
    to AdamW's size (0.2 sqrt(max(rows, cols))), decoupled weight decay."""
    momentum, buffer, weight = 0.95, torch.zeros_like(weight), weight.clone()
    for grad in grads:
        buffer = momentum * buffer + (1 - momentum) * grad
        update = _newton_schulz((1 - momentum) * grad + momentum * buffer)
        weight = weight * (1 - lr * MUON_WEIGHT_DECAY) - lr * 0.2 * math.sqrt(max(weight.shape)) * update
    return weight


def _adamw_reference(value: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    first, second, value = torch.zeros_like(value), torch.zeros_like(value), value.clone()
    for step, grad in enumerate(grads, start=1):
        first = beta1 * first + (1 - beta1) * grad
        second = beta2 * second + (1 - beta2) * grad**2
        corrected = (first / (1 - beta1**step)) / ((second / (1 - beta2**step)).sqrt() + eps)
        value = value * (1 - LR * WEIGHT_DECAY) - LR * corrected
    return value


def test_two_steps_match_hand_written_muon_and_adamw() -> None:
    torch.manual_seed(0)
    toy = Toy()
    start = {name: p.detach().double().clone() for name, p in toy.named_parameters()}
    train = TrainConfig(lr=LR, weight_decay=WEIGHT_DECAY, optimizer="muon", muon_lr_multiplier=MULTIPLIER)
    optimizer = build_optimizer(train, [{"params": list(toy.parameters()), "lr": LR}], toy)
    grads = {name: [torch.randn(p.shape, dtype=torch.float64) for _ in range(2)] for name, p in toy.named_parameters()}
    for step in range(2):
        for name, parameter in toy.named_parameters():
            parameter.grad = grads[name][step].float()
        optimizer.step()
    weight = dict(toy.named_parameters())["proj.weight"].detach().double()
    expected = _muon_reference(start["proj.weight"], grads["proj.weight"], LR * MULTIPLIER)
    moved = expected - start["proj.weight"]  # Muon orthogonalises in bfloat16: compare the step within 2% of its size
    torch.testing.assert_close(weight - start["proj.weight"], moved, rtol=0, atol=0.02 * float(moved.abs().max()))
    for name in ("proj.bias", "norm.weight", "lm_head.weight", "embed_tokens.weight", "gate.weight"):
        value = dict(toy.named_parameters())[name].detach().double()
        torch.testing.assert_close(value, _adamw_reference(start[name], grads[name]), rtol=1e-5, atol=1e-6)


def test_the_schedule_reaches_both_optimizers_even_after_a_state_is_loaded() -> None:
    toy = Toy()
    optimizer = MuonWithAdamW(*muon_split(toy), lr=1.0, weight_decay=0.0, muon_lr=10.0, muon_weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    optimizer.load_state_dict(optimizer.state_dict())  # Accelerate's prepare does this: new group dicts
    optimizer.step()
    scheduler.step()
    assert [part.param_groups[0]["lr"] for part in optimizer.parts] == [0.5, 5.0]
    assert [group["lr"] for group in optimizer.param_groups] == [0.5, 5.0]  # AdamW's first: the logged lr


def test_a_loaded_state_continues_the_momentum() -> None:
    torch.manual_seed(1)
    first, second = Toy(), Toy()
    second.load_state_dict(first.state_dict())
    optimizers = [MuonWithAdamW(*muon_split(m), lr=0.1, weight_decay=0.0, muon_lr=0.1, muon_weight_decay=0.1)
                  for m in (first, second)]  # fmt: skip
    grads = [{name: torch.randn(p.shape) for name, p in first.named_parameters()} for _ in range(2)]
    for name, parameter in first.named_parameters():
        parameter.grad = grads[0][name]
    optimizers[0].step()
    second.load_state_dict(first.state_dict())
    optimizers[1].load_state_dict(copy.deepcopy(optimizers[0].state_dict()))  # as if read back from a file
    for model, optimizer in zip((first, second), optimizers, strict=True):
        for name, parameter in model.named_parameters():
            parameter.grad = grads[1][name].clone()
        optimizer.step()
    for (name, value), other in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(value, other), name
    with pytest.raises(ValueError, match="not a state dict of this Muon"):
        optimizers[0].load_state_dict(torch.optim.AdamW(first.parameters()).state_dict())


def test_adamw_is_todays_optimizer() -> None:
    toy = Toy()
    optimizer = build_optimizer(TrainConfig(weight_decay=0.05), [{"params": list(toy.parameters()), "lr": 0.3}], toy)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.param_groups[0]["lr"] == 0.3 and optimizer.param_groups[0]["weight_decay"] == 0.05


# ---------------------------------------------------------------------------------------------------- the schedule
def _lrs(train: TrainConfig, total: int) -> list[float]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(train, optimizer, total)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_warmup_stable_decay_by_hand() -> None:
    # 10 steps: warmup 2, decay over the last 30% (3 steps), the peak in between
    lrs = _lrs(TrainConfig(schedule="wsd", warmup_steps=2, decay_fraction=0.3), 10)
    assert lrs == pytest.approx([0.0, 0.5, 1, 1, 1, 1, 1, 1, 2 / 3, 1 / 3])
    assert _lrs(TrainConfig(schedule="wsd", warmup_steps=0), 10) == pytest.approx([1] * 9 + [0.5])  # decay: 2 steps


def test_a_continued_run_without_warmup_starts_at_the_peak() -> None:
    for schedule in ("wsd", "cosine", "linear", "constant"):
        assert _lrs(TrainConfig(schedule=schedule, warmup_steps=0), 8)[0] == 1.0, schedule


def test_todays_schedules_are_transformers_own() -> None:
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    expected = get_scheduler("cosine", optimizer, num_warmup_steps=3, num_training_steps=12)
    assert _lrs(TrainConfig(schedule="cosine", warmup_steps=3), 12) == pytest.approx(
        [expected.lr_lambdas[0](step) for step in range(12)]
    )


def test_a_warmup_and_decay_longer_than_the_run_is_refused() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError, match="train.warmup_steps=8 and train.decay_fraction=0.5"):
        build_scheduler(TrainConfig(schedule="wsd", warmup_steps=8, decay_fraction=0.5), optimizer, 10)


# ---------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.optimizer=sgd", "train.optimizer"),
        ("train.schedule=step", "train.schedule"),
        ("train.decay_fraction=0", "train.decay_fraction"),
        ("train.decay_fraction=1.5", "train.decay_fraction"),
        ("train.muon_lr_multiplier=0", "train.muon_lr_multiplier"),
        ("train.muon_weight_decay=-0.1", "train.muon_weight_decay"),
        ("train.warmup_steps=-1", "train.warmup_steps"),
        ("train.decay_fraction=much", "train.decay_fraction"),
    ],
)
def test_bad_settings_name_their_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, ["data.paths=[x]", override])


def test_muon_trains_heads_on_a_frozen_base_only() -> None:
    with pytest.raises(ConfigError, match="train.optimizer=muon"):
        load_config(None, ["data.paths=[x]", "train.optimizer=muon", "lora.enabled=true"])
    settings = load_config(None, ["data.paths=[x]", "train.optimizer=muon", "train.schedule=wsd"]).train
    assert (settings.optimizer, settings.schedule, settings.muon_lr_multiplier, settings.decay_fraction) == (
        "muon", "wsd", 10.0, 0.2,
    )  # fmt: skip
