"""EAGLE training end to end on a tiny model: it trains and exports, resumes after SIGKILL exactly, runs on two
processes like on one, and refuses bad recipes before any compute. Modelled on ``tests/training/test_trainer.py``
(Medusa)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_model
from training_helpers import (
    free_port,
    heads_state,
    kill_after_checkpoint_and_resume,
    make_workspace,
    medusa_overrides,
    rows_cache,  # noqa: F401 - autouse: a private rows cache per test
    run_logged,
    two_processes,
)

from specheads.heads import load_heads
from specheads.training.config import ConfigError, load_config
from specheads.training.trainer import train

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A tiny Llama base (4 layers, so EAGLE-3's three feature layers are distinct) and a few KB of code text."""
    return make_workspace(tmp_path_factory.mktemp("eagle-train"), layers=4)


def _base() -> torch.nn.Module:
    return tiny_model("llama", seed=1, layers=4)


def _overrides(workspace: Path, out: Path, version: int = 3, **extra) -> list[str]:
    values = {
        "model.base": str(workspace / "base"),
        "data.paths": f"[{workspace / 'data'}]",
        "data.format": "text",
        "data.max_length": 32,
        "heads.type": "eagle",
        "heads.version": version,
        "train.batch_size": 4,
        "train.steps": 6,
        "train.lr": 3e-3,
        "train.warmup_steps": 1,
        "output.dir": str(out),
        "output.save_every": 0,
        "log.every": 2,
    }
    if version == 3:
        values.update({"heads.draft_vocab_size": 48, "heads.ttt_steps": 3})
    values.update(extra)
    return [f"{key}={value}" for key, value in values.items()]


_heads = heads_state


# ---------------------------------------------------------------------------------------------------- train + export
@pytest.mark.parametrize("version", [3, 1])
def test_eagle_training_exports_heads_and_per_depth_agreement(workspace, tmp_path, version) -> None:
    extra = {"data.eval_paths": f"[{workspace / 'data'}]", "data.eval_batches": 2}
    heads_dir = train(load_config(None, _overrides(workspace, tmp_path / "run", version, **extra)))
    heads = load_heads(heads_dir, base_model=_base())
    assert heads.config.version == version
    assert json.loads((heads_dir / "recipe.json").read_text())["heads"]["type"] == "eagle"
    if version == 3:
        assert heads.config.draft_vocab_size == 48 and heads.config.reduced_vocab
        assert int(heads.t2d.sum()) == 48
    else:
        assert heads.config.draft_vocab_size == heads.config.vocab_size == 96
        assert heads.fc.bias is not None  # EAGLE-1's default, as EAGLE's repo and SGLang
    initial = load_heads(heads_dir).state_dict()
    fresh = train(load_config(None, _overrides(workspace, tmp_path / "one-step", version, **{"train.steps": 1})))
    moved = [name for name, value in _heads(fresh).items() if not torch.equal(value, initial[name])]
    assert any("midlayer" in name for name in moved)  # six steps train more than one
    evaluation = json.loads((heads_dir / "eval.json").read_text())
    agreement = evaluation["agreement_with_base_greedy"]
    assert len(agreement) == len(evaluation["positions"]) >= 3  # one entry per draft depth
    assert all(0.0 <= value <= 1.0 for value in agreement)
    assert evaluation["positions"][0] > 0


def test_corpus_targets_train(workspace, tmp_path) -> None:
    corpus = train(load_config(None, _overrides(workspace, tmp_path / "corpus", **{"heads.targets": "corpus"})))
    assert json.loads((corpus / "recipe.json").read_text())["heads"]["targets"] == "corpus"
    assert load_heads(corpus, base_model=_base()).config.version == 3
    assert json.loads((tmp_path / "corpus" / "final_state.json").read_text())["step"] == 6
    distilled = train(load_config(None, _overrides(workspace, tmp_path / "self", **{"heads.targets": "self"})))
    assert any(not torch.equal(value, _heads(distilled)[name]) for name, value in _heads(corpus).items())


# ---------------------------------------------------------------------------------------------------- init_from
def test_init_from_continues_earlier_heads_with_their_draft_vocabulary(workspace, tmp_path) -> None:
    first = train(load_config(None, _overrides(workspace, tmp_path / "first")))
    other = tmp_path / "other"
    other.mkdir()  # other text: its most frequent tokens, the draft vocabulary a fresh run builds, differ
    (other / "prose.txt").write_text("The cat sat on the mat. A dog ran in the park, and the sun was warm.\n" * 20)
    still = {"data.paths": f"[{other}]", "train.steps": 1, "train.lr": 1e-12, "train.warmup_steps": 0}
    fresh = _heads(train(load_config(None, _overrides(workspace, tmp_path / "fresh", **still))))
    assert not torch.equal(fresh["d2t"], _heads(first)["d2t"])  # else the draft vocabulary test below proves nothing
    continued = _heads(
        train(load_config(None, _overrides(workspace, tmp_path / "continued", **still, **{"train.init_from": first})))
    )
    for name, value in _heads(first).items():
        torch.testing.assert_close(continued[name], value, rtol=0, atol=1e-6)
    recorded = json.loads((tmp_path / "continued" / "heads" / "recipe.json").read_text())
    assert recorded["train"]["init_from"] == str(first)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"heads.draft_vocab_size": 32}, "draft_vocab_size: 48 there, 32 here"),
        ({"heads.ttt_steps": 2, "heads.version": 1, "heads.draft_vocab_size": 0}, "version"),
    ],
)
def test_init_from_heads_of_another_architecture_is_a_config_error(workspace, tmp_path, extra, message) -> None:
    first = train(load_config(None, _overrides(workspace, tmp_path / "first", **{"train.steps": 1})))
    with pytest.raises(ConfigError, match=message):
        train(load_config(None, _overrides(workspace, tmp_path / "next", **{"train.init_from": first, **extra})))


def test_init_from_heads_of_another_method_or_nothing_is_a_config_error(workspace, tmp_path) -> None:
    other = train(load_config(None, medusa_overrides(workspace, tmp_path / "medusa", **{"train.steps": 1})))
    with pytest.raises(ConfigError, match="holds 'medusa' heads; this recipe trains 'eagle'"):
        train(load_config(None, _overrides(workspace, tmp_path / "next", **{"train.init_from": other})))
    with pytest.raises(ConfigError, match="does not exist"):
        train(load_config(None, _overrides(workspace, tmp_path / "next", **{"train.init_from": tmp_path / "nowhere"})))


# ---------------------------------------------------------------------------------------------------- resume
@pytest.mark.slow
def test_eagle3_resume_after_sigkill_matches_an_uninterrupted_run(workspace, tmp_path) -> None:
    steps = {"train.steps": 30, "output.save_every": 4, "train.seed": 7}
    reference = train(load_config(None, _overrides(workspace, tmp_path / "reference", **steps)))
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "specheads.train", *_overrides(workspace, out, **steps)]
    resumed = kill_after_checkpoint_and_resume(command, out, tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resumed from" in resumed.stdout
    for name, value in _heads(reference).items():
        torch.testing.assert_close(_heads(out / "heads")[name], value, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------- two processes
def _two_equal_one(workspace: Path, tmp_path: Path, config_file: Path | None) -> None:
    """2 processes x batch 2 == 1 process x batch 4: same global batches (seedable sampler), same heads."""
    common = {"train.steps": 4}
    single = train(load_config(None, _overrides(workspace, tmp_path / "single", **common)))
    out = tmp_path / "double"
    overrides = _overrides(workspace, out, **{**common, "train.batch_size": 2})
    result = two_processes(overrides, tmp_path / "double.log", config_file)
    assert result.returncode == 0, result.stdout[-3000:]
    final = json.loads((out / "final_state.json").read_text())
    assert final["world_size"] == 2
    first, second = final["heads_checksum_by_rank"]
    assert first == second
    for name, value in _heads(single).items():
        torch.testing.assert_close(_heads(out / "heads")[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_eagle3_two_processes_agree_with_one(workspace, tmp_path) -> None:
    _two_equal_one(workspace, tmp_path, config_file=None)


@pytest.mark.slow
def test_eagle3_ddp_accelerate_config_agrees_with_one_process(workspace, tmp_path) -> None:
    """The shipped ``configs/accelerate/ddp.yaml``, its bf16 mixed precision overridden to no on the launch command:
    the trainer chooses no for this float32 base too (bf16 only for a bf16 base, on a CPU with native bf16
    products)."""
    _two_equal_one(workspace, tmp_path, config_file=REPO / "configs" / "accelerate" / "ddp.yaml")


FSDP_PROBE = """
import os
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)  # as specheads' trainer builds it without a GPU
print(f"rank {accelerator.process_index}: distributed_type={accelerator.distributed_type.value} "
      f"ACCELERATE_USE_FSDP={os.environ.get('ACCELERATE_USE_FSDP')}", flush=True)
"""


def _fsdp_on_cpu_blocker(tmp_path: Path) -> str | None:
    """Why ``configs/accelerate/fsdp.yaml`` cannot run here, as accelerate itself reports it (None: it can).

    The trainer builds ``Accelerator(cpu=True)`` when there is no GPU (without it, CPU processes each train alone).
    accelerate selects ``DistributedType.FSDP`` only inside its GPU-class branch (``MULTI_GPU``, ``MULTI_NPU``,
    ...); with ``cpu=True`` it picks ``MULTI_CPU`` (DDP over gloo) and ignores ``ACCELERATE_USE_FSDP``, silently,
    so a CPU "FSDP" run would only test DDP again. (torch's own FSDP1 does run on CPU over gloo.)
    """
    if torch.cuda.device_count() >= 2:
        return None
    probe = tmp_path / "fsdp_probe.py"
    probe.write_text(FSDP_PROBE)
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    launcher += [str(REPO / "configs" / "accelerate" / "fsdp.yaml"), "--num_processes", "2"]
    launcher += ["--main_process_port", str(free_port())]
    result = run_logged([*launcher, "--mixed_precision", "no", str(probe)], tmp_path / "probe.log", timeout=120)
    observed = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    if result.returncode == 0 and observed and all("distributed_type=FSDP" in line for line in observed):
        return None
    failure = (
        f" output: {result.stdout.strip().splitlines()[-1]}" if result.returncode and result.stdout.strip() else ""
    )
    return (
        f"FSDP does not run on CPU: launched with configs/accelerate/fsdp.yaml (rc={result.returncode}), "
        f"Accelerator(cpu=True) reports {'; '.join(observed) or 'nothing'}{failure}. No exception is raised: "
        "accelerate (state.py) selects DistributedType.FSDP only for GPU-class back-ends, cpu=True gives MULTI_CPU "
        "(plain DDP over gloo) whatever ACCELERATE_USE_FSDP says, and without cpu=True the CPU processes form no "
        "process group at all, so the trainer's FSDP path cannot be reached on a CPU-only machine"
    )


def test_what_the_fsdp_path_does_not_cover_is_refused(workspace, tmp_path) -> None:
    """Checked before the base loads: FSDP2, and held-out evaluation (it runs on one process, while a sharded base's
    forward needs all of them: it would hang)."""
    from specheads.training.processes import check_fsdp_recipe

    def fsdp(version: int) -> SimpleNamespace:  # the part of an Accelerator the check reads
        return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=version)))

    plain = load_config(None, _overrides(workspace, tmp_path / "ok"))
    check_fsdp_recipe(plain, fsdp(1))
    with pytest.raises(ConfigError, match="fsdp_version 2: specheads shards the base with FSDP1"):
        check_fsdp_recipe(plain, fsdp(2))
    evaluated = load_config(None, _overrides(workspace, tmp_path / "eval", **{"data.heldout_fraction": 0.1}))
    with pytest.raises(ConfigError, match="held-out evaluation is not supported under FSDP"):
        check_fsdp_recipe(evaluated, fsdp(1))


@pytest.mark.slow
def test_fsdp_accelerate_config_agrees_with_one_process(workspace, tmp_path) -> None:
    blocker = _fsdp_on_cpu_blocker(tmp_path)
    if blocker is not None:
        pytest.skip(blocker)
    _two_equal_one(workspace, tmp_path, config_file=REPO / "configs" / "accelerate" / "fsdp.yaml")


# ---------------------------------------------------------------------------------------------------- bad recipes
BAD_RECIPES = {
    "heads.version=2": ({"heads.version": 2}, "EAGLE versions are 1 and 3"),
    "heads.targets=bogus": ({"heads.targets": "bogus"}, "heads.targets is 'bogus'"),
    "two layer_ids": ({"heads.layer_ids": "[1, 2]"}, "names 3 base layers"),
    "draft_vocab_size=0": ({"heads.draft_vocab_size": 0}, "draft_vocab_size must be >= 1"),
    "ttt_steps=0": ({"heads.ttt_steps": 0}, "ttt_steps must be >= 1"),
    "lora with eagle": ({"lora.enabled": "true"}, "lora.enabled .* Medusa-2 setting"),
    "medusa key in the eagle section": ({"heads.num_heads": 2}, r"unknown key\(s\) \['heads.num_heads'\]"),
    "unknown head type": ({"heads.type": "hydra"}, "heads.type is 'hydra'; choose one of"),
}


@pytest.mark.parametrize("extra,message", BAD_RECIPES.values(), ids=BAD_RECIPES.keys())
def test_bad_eagle_recipes_are_config_errors(workspace, tmp_path, extra, message) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, _overrides(workspace, tmp_path / "bad", **extra))
    assert not (tmp_path / "bad").exists()  # refused before any output, let alone compute


def test_layer_ids_outside_the_base_are_a_clear_error_at_setup(workspace, tmp_path) -> None:
    config = load_config(None, _overrides(workspace, tmp_path / "far", **{"heads.layer_ids": "[0, 1, 99]"}))
    with pytest.raises(ValueError, match=r"layer_ids \[0, 1, 99\].*in \[0, 3\].*4 decoder layers"):
        train(config)
    assert not (tmp_path / "far" / "checkpoints").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_held_out_evaluation_runs_on_the_device_with_batches_from_a_cpu_loader() -> None:
    from helpers import base_samples, tiny_model

    from specheads.heads import EagleHead, MedusaHeads
    from specheads.methods.eagle.train import eagle_agreement
    from specheads.methods.medusa.evaluate import head_agreement

    base = tiny_model("llama", layers=4).cuda()
    rows = base_samples(base.cpu()).cpu()
    base.cuda()
    batches = [{"input_ids": rows, "attention_mask": torch.ones_like(rows), "loss_mask": torch.ones_like(rows)}]
    medusa = MedusaHeads.from_base(base, num_heads=2)
    eagle = EagleHead.from_base(base, version=3)
    assert len(head_agreement(base, medusa, batches)["agreement_with_base_greedy"]) == 2
    assert eagle_agreement(base, eagle, batches, max_batches=1)["positions"][0] > 0


def test_the_draft_vocabulary_holds_the_answer_tokens_of_chat_data_not_the_prompt_tokens(tmp_path) -> None:
    """The draft predicts answers: on chats whose long prompts use digits the short answers never do, a draft
    vocabulary as large as the answers' alphabet (with the end marker they also predict) is exactly that alphabet."""
    from chat_helpers import CHATML
    from helpers import tiny_tokenizer

    from specheads.methods.eagle.config import EagleHeadsConfig
    from specheads.methods.eagle.train import build_heads
    from specheads.training.config import DataConfig
    from specheads.training.data import build_dataset

    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.chat_template = CHATML
    answers = ["ab", "ba", "abba", "b", "aab", "bab"]
    chats = [[{"from": "human", "value": f"{n}0123456789" * 3}, {"from": "gpt", "value": answer}]
             for n, answer in enumerate(answers)]  # fmt: skip
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"conversations": chat}) + "\n" for chat in chats))
    dataset = build_dataset(DataConfig(paths=[str(tmp_path)], format="sharegpt", max_length=64), tokenizer)
    base = tiny_model("llama", seed=1, layers=4, vocab_size=len(tokenizer))
    head = build_heads(base, EagleHeadsConfig(version=3, draft_vocab_size=3), dataset)
    assert tokenizer.convert_ids_to_tokens(head.draft_token_ids().tolist()) == ["a", "b", "<|im_end|>"]


# ------------------------------------------------------------------------------------ throughput: teacher, bf16
def test_the_draft_vocabulary_teacher_is_the_full_teachers_distribution_renormalised() -> None:
    from specheads.methods.eagle.losses import eagle_loss
    from specheads.training.features import base_output, teacher_logits
    from specheads.training.losses import TeacherLogits

    base = _base()
    ids = torch.randint(2, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    full_out = base_output(base, batch)
    lean_out = base_output(base, batch, full_logits=False)
    assert lean_out.logits.shape[1] == 1  # the online forward skipped the [B, T, V] logits
    columns = torch.tensor([5, 1, 40, 7, 93, 60])
    restricted = teacher_logits(base, lean_out, columns)
    assert restricted.shape == (2, 12, 6)
    torch.testing.assert_close(restricted, full_out.logits[..., columns], rtol=0, atol=1e-5)
    wanted = TeacherLogits(full_out.logits.reshape(-1, 96), None, columns).probabilities(0, 24)
    renormalised = full_out.logits.reshape(-1, 96)[:, columns].softmax(-1)
    torch.testing.assert_close(wanted, renormalised)
    torch.testing.assert_close(TeacherLogits(restricted.reshape(-1, 6)).probabilities(0, 24), renormalised)
    # the loss reads either: the full logits with the draft columns, or the restricted ones as they are
    steps = [torch.randn(2, 11, 8), torch.randn(2, 11, 8)]
    weight, mask = torch.randn(6, 8), torch.ones(2, 12)
    weights = torch.tensor([1.0, 0.8])
    full = eagle_loss(steps, weight, None, weights, full_out.logits, ids, mask, columns)
    lean = eagle_loss(steps, weight, None, weights, restricted, ids, mask, columns)
    torch.testing.assert_close(full.loss, lean.loss, rtol=1e-5, atol=1e-6)


def test_a_soft_capped_base_keeps_its_full_logits() -> None:
    from specheads.training.features import projectable, teacher_logits

    base = _base()
    assert projectable(base)
    base.config.final_logit_softcapping = 30.0
    assert not projectable(base)
    out = SimpleNamespace(logits=torch.randn(1, 3, 96), hidden_states=None)
    torch.testing.assert_close(teacher_logits(base, out, torch.tensor([2, 3])), out.logits[..., [2, 3]])


def test_a_logging_step_projects_the_bases_logits_a_chunk_at_a_time_and_changes_no_loss(monkeypatch) -> None:
    """The logged agreement reads the base's greedy tokens: no projection through the base's lm_head gives more
    than one chunk of positions (8 here) of full-vocabulary logits, every position is projected once, and the
    losses are a plain step's."""
    import datasets
    from accelerate import Accelerator

    from specheads.methods.eagle.config import EagleHeadsConfig
    from specheads.methods.eagle.train import build_heads, train_step
    from specheads.training import losses as shared_losses
    from specheads.training.step import StepContext

    base = _base()
    vocab, chunk = base.config.vocab_size, 8
    ids = torch.randint(2, vocab, (4, 24), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
    section = EagleHeadsConfig(version=3, draft_vocab_size=48, ttt_steps=2)
    rows = datasets.Dataset.from_dict({key: value.tolist() for key, value in batch.items()}).with_format("torch")
    head = build_heads(base, section, rows)  # the draft vocabulary: the batch's most frequent targets
    monkeypatch.setattr(shared_losses, "CHUNK_ELEMENTS", chunk * vocab)
    lm_head = base.get_output_embeddings().weight
    projected: list[int] = []  # positions of each projection through the base's whole lm_head
    linear = torch.nn.functional.linear

    def watched(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = linear(inputs, weight, bias)
        if weight.data_ptr() == lm_head.data_ptr():
            projected.append(out.numel() // vocab)
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", watched)
    results = {}
    for logging in (False, True):
        projected.clear()
        context = StepContext(0, 0, 0, section, None, logging, base, head, Accelerator(cpu=True))
        results[logging] = (train_step(context, batch), list(projected))
    (plain, plain_projected), (logged, logged_projected) = results[False], results[True]
    assert max(logged_projected) <= chunk, logged_projected
    assert sum(logged_projected) - sum(plain_projected) == ids.numel()  # the greedy token of every position, once
    assert "step_1/agreement" in logged.metrics and "step_1/agreement" not in plain.metrics
    assert torch.equal(logged.loss, plain.loss)
    assert {k: v for k, v in logged.metrics.items() if "agreement" not in k} == plain.metrics


@pytest.mark.parametrize(
    ("dtype", "setting", "native", "expected"),
    [("bfloat16", "auto", True, "bf16"), ("bfloat16", "auto", False, "no"), ("float32", "auto", True, "no"),
     ("float32", "bf16", False, "bf16"), ("bfloat16", "no", True, "no")],
)  # fmt: skip
def test_mixed_precision_on_a_cpu(monkeypatch, workspace, tmp_path, dtype, setting, native, expected) -> None:
    from specheads.training import processes

    monkeypatch.setenv("SPECHEADS_CPU_BF16", "1" if native else "0")
    overrides = _overrides(workspace, tmp_path, **{"model.dtype": dtype, "train.mixed_precision": setting})
    assert processes.mixed_precision(load_config(None, overrides)) == expected


def test_a_bad_mixed_precision_is_refused(workspace, tmp_path) -> None:
    with pytest.raises(ConfigError, match="train.mixed_precision"):
        load_config(None, _overrides(workspace, tmp_path, **{"train.mixed_precision": "fp8"}))


def test_bf16_autocast_training_learns(workspace, tmp_path) -> None:
    """A bf16 base and the heads under bf16 autocast (fp32 master weights): 30 steps agree with the base's greedy
    token far more often than one step does, as in float32."""
    bf16 = {"model.dtype": "bfloat16", "train.mixed_precision": "bf16", "data.eval_paths": f"[{workspace / 'data'}]",
            "data.eval_batches": 2}  # fmt: skip
    agreement = {}
    for steps in (1, 30):
        overrides = _overrides(workspace, tmp_path / f"bf16-{steps}", **{**bf16, "train.steps": steps})
        heads_dir = train(load_config(None, overrides))
        assert all(value.dtype == torch.float32 for value in _heads(heads_dir).values() if value.is_floating_point())
        agreement[steps] = json.loads((heads_dir / "eval.json").read_text())["agreement_with_base_greedy"][0]
    assert agreement[30] > agreement[1] + 0.1, agreement


@pytest.mark.slow
def test_bf16_autocast_resume_after_sigkill_matches_an_uninterrupted_run(workspace, tmp_path) -> None:
    steps = {"train.steps": 24, "output.save_every": 4, "train.seed": 7, "model.dtype": "bfloat16",
             "train.mixed_precision": "bf16"}  # fmt: skip
    reference = train(load_config(None, _overrides(workspace, tmp_path / "reference", **steps)))
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "specheads.train", *_overrides(workspace, out, **steps)]
    resumed = kill_after_checkpoint_and_resume(command, out, tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    for name, value in _heads(reference).items():
        assert torch.equal(_heads(out / "heads")[name], value), name  # bit-identical


@pytest.mark.parametrize("version, expected", [(1, 0.3), (3, 0.0)])
def test_eagle1_training_adds_the_recipes_feature_noise_and_eagle3_none(
    workspace, tmp_path, monkeypatch, version, expected
) -> None:
    from specheads.methods.eagle.heads import EagleHead

    seen = []
    forward = EagleHead.forward

    def spy(self, input_ids, features, attention_mask=None, steps=1, feature_noise=0.0, readout=None):  # noqa: ANN001, ANN202
        seen.append(feature_noise)
        return forward(self, input_ids, features, attention_mask, steps, feature_noise, readout)

    monkeypatch.setattr(EagleHead, "forward", spy)
    extra = {"train.steps": 2, "heads.feature_noise": 0.3}
    train(load_config(None, _overrides(workspace, tmp_path / "noise", version=version, **extra)))
    assert seen[:2] == [expected, expected]  # the two training steps (held-out evaluation adds none)


def test_feature_noise_is_uniform_of_the_given_width() -> None:
    from specheads.methods.eagle.heads import EagleHead

    base = _base()
    head = EagleHead.from_base(base, version=1).eval()
    ids = torch.randint(2, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features = [base(ids, output_hidden_states=True).hidden_states[index] for index in head.hidden_state_layers]
        clean, _ = head(ids, features, None, 1)
        torch.manual_seed(0)
        noisy, _ = head(ids, features, None, 1, 0.2)
        torch.manual_seed(0)
        again, _ = head(ids, features, None, 1, 0.2)
    assert torch.equal(noisy[0], again[0]) and not torch.equal(noisy[0], clean[0])


# A child process measures the peak of its own resident memory over each region (Linux: writing 5 to
# /proc/self/clear_refs resets VmHWM; glibc returns every block of 64 KB or more to the system when it is freed, so
# the peak follows live tensors): two plain steps, a logging step, then the control, a forward that builds the whole
# [B, T, V] logits, which the instrument must see.
_PEAK_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import datasets
from accelerate import Accelerator
from helpers import tiny_model
from specheads.methods.eagle.config import EagleHeadsConfig
from specheads.methods.eagle.train import build_heads, train_step
from specheads.training import losses
from specheads.training.features import base_output
from specheads.training.step import StepContext

def status(field):
    line = next(line for line in open("/proc/self/status") if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024

def region(run):
    open("/proc/self/clear_refs", "w").write("5")
    start = status("VmRSS")
    kept = run()
    return status("VmHWM") - start, kept

losses.CHUNK_ELEMENTS = int(sys.argv[2])
base = tiny_model("llama", seed=1, layers=4, vocab_size=65536, hidden=264)
ids = torch.randint(2, 65536, (4, 128), generator=torch.Generator().manual_seed(0))
batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}
section = EagleHeadsConfig(version=3, draft_vocab_size=512, ttt_steps=2)
rows = datasets.Dataset.from_dict({key: value.tolist() for key, value in batch.items()}).with_format("torch")
head = build_heads(base, section, rows)
accelerator = Accelerator(cpu=True)

def step(logging):
    result = train_step(StepContext(0, 0, 0, section, None, logging, base, head, accelerator), batch)
    result.loss.backward()
    head.zero_grad(set_to_none=False)

peaks = {name: region(lambda: step(logging))[0] for name, logging in (("warm", False), ("plain", False),
                                                                     ("logging", True))}
with torch.no_grad():
    peaks["whole"], whole = region(lambda: base_output(base, batch, full_logits=True).logits)
peaks["whole_bytes"] = whole.numel() * whole.element_size()
print(json.dumps(peaks))
"""


def _can_reset_peak_memory() -> bool:
    """Whether this process may reset its peak resident memory (Linux's ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _can_reset_peak_memory(), reason="needs a writable /proc/self/clear_refs (Linux)")
def test_a_logging_step_at_a_real_vocabulary_allocates_no_more_than_a_plain_step_plus_one_chunk() -> None:
    """Measured, not counted: at V = 65,536 (a real-size vocabulary; 4 x 128 positions, whose whole float32 logits
    are 134 MB) the peak resident memory a logging step adds exceeds what a plain step adds by no more than one
    chunk of logits (4 MB here) and some slack, while a forward that builds the whole logits adds at least three
    quarters of their size (the instrument sees what it must)."""
    import os
    import subprocess

    chunk_elements = 2**20  # 16 positions x 65,536 columns: 4 MB of float32
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(REPO / "tests"), str(chunk_elements)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    peaks = json.loads(child.stdout.strip().splitlines()[-1])
    chunk_bytes, slack = chunk_elements * 4, 16 * 2**20
    assert peaks["logging"] - peaks["plain"] <= chunk_bytes + slack, peaks
    assert peaks["whole"] >= 0.75 * peaks["whole_bytes"], peaks
