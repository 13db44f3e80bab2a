"""The offline feature cache: what it stores equals the base's own forward, it resumes shard by shard, it refuses a
cache of another base or data, and heads trained from it train as they do with the base in the loop."""

from __future__ import annotations

import datasets
import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from specheads.training.config import load_config
from specheads.training.features import (
    _EXACT_TRANSFORMS,
    BaseView,
    CachedFeatures,
    CachedOutput,
    FeatureCacheError,
    base_output,
    collate_padded,
    projectable,
    rows_fingerprint,
    teacher_greedy,
    teacher_logits,
    write_feature_cache,
)
from specheads.training.trainer import train

LAYERS = (1, 2, 3)


def _rows(count: int = 10, length: int = 16, seed: int = 0) -> datasets.Dataset:
    """Right-padded rows of different real lengths, as the data loader lays out chats."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for index in range(count):
        real = 4 + (index * 5) % (length - 4)
        ids = torch.randint(0, 64, (length,), generator=generator)
        mask = (torch.arange(length) < real).to(torch.int8)
        targets = mask * (torch.arange(length) >= real // 2)  # a chat: the answer (second half) is the target
        rows.append({"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "loss_mask": targets.tolist()})
    return datasets.Dataset.from_list(rows).with_format("torch")


def test_cached_rows_hold_the_base_forward_in_bf16_and_logits_come_from_the_lm_head(tmp_path) -> None:
    base = tiny_model("llama", seed=1, layers=4)
    rows = _rows()
    write_feature_cache(base, rows, LAYERS, tmp_path, rows_fingerprint(rows), batch_size=3, rows_per_shard=4)
    cache = CachedFeatures(tmp_path)
    assert len(cache) == len(rows) and cache.layers == [1, 2, 3, 4]  # the final hidden state is always kept
    batch = collate_padded([cache[index] for index in (7, 2, 9)])
    reference = rows[[7, 2, 9]]
    length = batch["input_ids"].shape[1]
    assert length == int(reference["attention_mask"].sum(dim=1).max())
    assert torch.equal(batch["attention_mask"].long(), reference["attention_mask"][:, :length].long())
    assert torch.equal(batch["loss_mask"].long(), reference["loss_mask"][:, :length].long())
    assert not torch.equal(batch["loss_mask"], batch["attention_mask"])  # the fixture tells the two apart
    real = batch["attention_mask"].bool()
    assert torch.equal(batch["input_ids"][real].long(), reference["input_ids"][:, :length][real].long())
    with torch.no_grad():
        out = base(
            input_ids=batch["input_ids"].long(),
            attention_mask=batch["attention_mask"].long(),
            output_hidden_states=True,
        )
    cached = base_output(base, batch)
    assert isinstance(cached, CachedOutput)
    for layer in (*LAYERS, -1):
        assert torch.allclose(cached.hidden_states[layer][real], out.hidden_states[layer][real], rtol=2e-2, atol=2e-2)
    assert torch.allclose(cached.logits[real], out.logits[real], rtol=5e-2, atol=5e-2)
    with pytest.raises(FeatureCacheError, match="not in the feature cache"):
        cached.hidden_states[0]


def test_writing_resumes_shard_by_shard_and_refuses_another_base_or_data(tmp_path, monkeypatch) -> None:
    base = tiny_model("llama", seed=1, layers=4)
    rows = _rows()
    fingerprint = rows_fingerprint(rows)
    write_feature_cache(base, rows, LAYERS, tmp_path, fingerprint, rows_per_shard=4, progress=False)
    (tmp_path / "shard-00001.safetensors").unlink()  # as if killed while writing it
    calls = []
    forward = base.forward
    monkeypatch.setattr(base, "forward", lambda *a, **k: calls.append(k["input_ids"].shape[0]) or forward(*a, **k))
    write_feature_cache(base, rows, LAYERS, tmp_path, fingerprint, batch_size=8, rows_per_shard=4, progress=False)
    assert calls == [4]  # only the missing shard's four rows ran through the base
    assert len(CachedFeatures(tmp_path)) == len(rows)
    with pytest.raises(FeatureCacheError, match="data_fingerprint"):
        write_feature_cache(base, _rows(seed=1), LAYERS, tmp_path, rows_fingerprint(_rows(seed=1)), rows_per_shard=4)
    with pytest.raises(FeatureCacheError, match="base_fingerprint"):
        write_feature_cache(
            tiny_model("llama", seed=2, layers=4), rows, LAYERS, tmp_path, fingerprint, rows_per_shard=4
        )
    calls.clear()
    write_feature_cache(base, rows, (1, 3), tmp_path, fingerprint, rows_per_shard=4)  # fewer layers: served as is
    assert calls == []
    with pytest.raises(FeatureCacheError, match="layers"):
        write_feature_cache(base, rows, (0, 3), tmp_path, fingerprint, rows_per_shard=4)


@pytest.mark.parametrize("head_type", ["eagle", "medusa"])
def test_heads_train_from_the_cache_as_with_the_base_in_the_loop(tmp_path, head_type) -> None:
    tiny_model("llama", seed=1, layers=4).save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    (tmp_path / "data.txt").write_text("def add(a, b):\n    return a + b\n\n\nclass Stack:\n    pass\n" * 30)
    common = [
        f"model.base={tmp_path / 'base'}",
        f"data.paths=[{tmp_path / 'data.txt'}]",
        "data.format=text",
        "data.max_length=32",
        f"heads.type={head_type}",
        "train.batch_size=4",
        "train.steps=8",
        "train.lr=3e-3",
        "output.save_every=0",
        "log.every=1",
        "log.tracker=none",
    ]
    if head_type == "eagle":
        common += ["heads.version=3", "heads.ttt_steps=2"]
    runs = {}
    variants = (
        ("init", ["train.lr=1e-12"]),  # the same initialisation, (as good as) untrained
        ("loop", []),
        ("cached", [f"data.feature_cache={tmp_path / 'features'}"]),
    )
    for name, extra in variants:
        config = load_config(None, [*common, f"output.dir={tmp_path / name}"] + extra)
        runs[name] = load_heads_state(train(config))
    assert (tmp_path / "features" / "index.json").is_file()

    def distance(a: str, b: str) -> float:
        return sum(float((runs[a][key] - runs[b][key]).float().norm() ** 2) for key in runs[a]) ** 0.5

    # bf16 features move the heads a little off the float32 run; training moved them several times further.
    assert 0 < distance("cached", "loop") < 0.25 * distance("loop", "init")


def load_heads_state(path) -> dict[str, torch.Tensor]:  # noqa: ANN001
    from specheads.heads import load_heads

    return load_heads(path).state_dict()


def test_a_cache_of_more_rows_serves_data_that_is_its_first_rows_and_nothing_else(tmp_path, monkeypatch) -> None:
    base = tiny_model("llama", seed=1, layers=4)
    rows = _rows(count=12)
    write_feature_cache(base, rows, LAYERS, tmp_path, rows_fingerprint(rows), rows_per_shard=4, progress=False)
    prefix = rows.select(range(7))
    calls = []
    forward = base.forward
    monkeypatch.setattr(base, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    write_feature_cache(base, prefix, LAYERS, tmp_path, rows_fingerprint(prefix), rows_per_shard=4, progress=False)
    assert calls == []  # served, not written
    served = CachedFeatures(tmp_path, rows=len(prefix))
    assert len(served) == 7
    for index in (0, 6):
        assert torch.equal(
            served[index]["input_ids"].long(), prefix[index]["input_ids"][: len(served[index]["input_ids"])]
        )
    other = rows.select([0, 2, 1])  # the same rows in another order are other data
    with pytest.raises(FeatureCacheError, match="data_fingerprint"):
        write_feature_cache(base, other, LAYERS, tmp_path, rows_fingerprint(other), rows_per_shard=4)
    (tmp_path / "shard-00001.safetensors").unlink()
    with pytest.raises(FeatureCacheError, match="misses 1 shards"):
        write_feature_cache(base, prefix, LAYERS, tmp_path, rows_fingerprint(prefix), rows_per_shard=4)
    assert calls == []  # a prefix never writes into the cache of the whole data


def test_data_that_grew_grows_the_cache_and_only_its_new_rows_run_through_the_base(tmp_path, monkeypatch) -> None:
    base = tiny_model("llama", seed=1, layers=4)
    rows = _rows(count=12)
    first = rows.select(range(6))  # 6 rows: one full shard of 4 and a short one of 2
    write_feature_cache(base, first, LAYERS, tmp_path, rows_fingerprint(first), rows_per_shard=4, progress=False)
    calls = []
    forward = base.forward
    monkeypatch.setattr(base, "forward", lambda *a, **k: calls.append(k["input_ids"].shape[0]) or forward(*a, **k))
    write_feature_cache(base, rows, LAYERS, tmp_path, rows_fingerprint(rows), batch_size=8, rows_per_shard=4)
    assert calls == [4, 4]  # shard 0 kept; the short shard 1 and the new shard 2 written
    grown, fresh = CachedFeatures(tmp_path), tmp_path / "fresh"
    write_feature_cache(base, rows, LAYERS, fresh, rows_fingerprint(rows), rows_per_shard=4, progress=False)
    assert len(grown) == 12
    for index in range(12):
        for name, value in CachedFeatures(fresh)[index].items():
            assert torch.equal(grown[index][name], value), (index, name)
    reordered = rows.select([1, 0, *range(2, 12)])
    with pytest.raises(FeatureCacheError, match="data_fingerprint"):
        write_feature_cache(base, reordered, LAYERS, tmp_path, rows_fingerprint(reordered), rows_per_shard=4)


# ------------------------------------------------------------------------------- the cached teacher's logit transform
# Bases whose forward transforms lm_head(final hidden state): soft-capping (Gemma 2), a logit scale (Cohere, Granite).
# The settings make the transform matter on a tiny random model's small logits.
TRANSFORMED = {
    "gemma2": {"final_logit_softcapping": 0.05},
    "cohere": {"logit_scale": 4.0},
    "granite": {"logits_scaling": 0.25},
}


def _transformed_base(model_type: str, **transform: float) -> torch.nn.Module:
    """A tiny randomly initialised causal LM of ``model_type`` (4 layers) whose config sets ``transform``."""
    import transformers

    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=8)
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=96, num_key_value_heads=2, pad_token_id=0, bos_token_id=0, eos_token_id=1,
        **sizes, **transform,
    )  # fmt: skip
    torch.manual_seed(1)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _student_losses(base: torch.nn.Module, out, batch: dict[str, torch.Tensor]) -> tuple[float, float]:  # noqa: ANN001
    """What a fixed student trains on against ``out``'s teacher: EAGLE's cross-entropy over a draft vocabulary's
    columns (:func:`teacher_logits`) and draft-LM's KL over the whole vocabulary (the output's logits)."""
    from specheads.methods.eagle.losses import eagle_loss
    from specheads.training.losses import distillation_loss

    generator = torch.Generator().manual_seed(5)
    input_ids, loss_mask = batch["input_ids"].long(), (batch["loss_mask"] * batch["attention_mask"]).long()
    draft_ids = torch.arange(0, 96, 2)
    inputs = torch.randn(*input_ids.shape[:1], input_ids.shape[1] - 1, 16, generator=generator)
    weight = torch.randn(draft_ids.numel(), 16, generator=generator)
    teacher = teacher_logits(base, out, draft_ids)
    eagle = eagle_loss([inputs], weight, None, torch.ones(1), teacher, input_ids, loss_mask, draft_ids).loss
    student = torch.randn(*input_ids.shape, 96, generator=generator)
    return float(eagle), float(distillation_loss(student, out.logits, loss_mask))


@pytest.mark.parametrize("model_type", sorted(TRANSFORMED))
def test_the_cached_teacher_applies_the_bases_logit_transform_and_trains_as_the_online_one(
    tmp_path, model_type: str
) -> None:
    base = _transformed_base(model_type, **TRANSFORMED[model_type])
    assert not projectable(base)  # the online teacher is the forward's own logits
    rows = _rows()
    write_feature_cache(base, rows, LAYERS, tmp_path, rows_fingerprint(rows), rows_per_shard=4, progress=False)
    batch = collate_padded([CachedFeatures(tmp_path)[index] for index in range(6)])
    plain = {name: batch[name].long() for name in ("input_ids", "attention_mask", "loss_mask")}
    with torch.no_grad():
        online = base_output(base, plain)
        untransformed = base.get_output_embeddings()(online.hidden_states[-1])
    cached = base_output(base, batch)
    real = batch["attention_mask"].bool()
    bf16_error = (cached.logits[real] - online.logits[real]).abs().max()
    assert (untransformed[real] - online.logits[real]).abs().max() > 100 * bf16_error  # the transform matters here
    torch.testing.assert_close(cached.logits[real], online.logits[real], rtol=1e-2, atol=1e-2)
    cached_losses, online_losses = _student_losses(base, cached, batch), _student_losses(base, online, batch)
    assert cached_losses == pytest.approx(online_losses, rel=1e-3)
    torch.testing.assert_close(teacher_greedy(base, cached)[real], online.logits.argmax(dim=-1)[real])


SETTINGS = {"final_logit_softcapping": 0.05, "logit_scale": 4.0, "logits_scaling": 0.25}
EXTRA = {"granitemoehybrid": dict(mamba_n_heads=8, mamba_d_head=8, layer_types=["attention"] * 4)}  # no Mamba layer
CLAIMED = sorted((model_type, name) for name, (types, _) in _EXACT_TRANSFORMS.items() for model_type in types)


@pytest.mark.parametrize(("model_type", "name"), CLAIMED, ids=[model_type for model_type, _ in CLAIMED])
def test_every_transform_the_cache_claims_gives_the_forwards_logits_bit_for_bit(model_type: str, name: str) -> None:
    """Each model type the cached teacher applies a transform for: from the forward's own final hidden state, the
    cached teacher's logits are the forward's, bit for bit (the same operations in the same order)."""
    base = _transformed_base(model_type, **{name: SETTINGS[name]}, **EXTRA.get(model_type, {}))
    ids = torch.randint(2, 96, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = base(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True, use_cache=False)
        plain = base.get_output_embeddings()(out.hidden_states[-1])
    cached = CachedOutput(base, {f"hidden.{base.config.num_hidden_layers}": out.hidden_states[-1]})
    assert not torch.allclose(plain, out.logits, rtol=1e-2, atol=1e-2)  # the transform matters here
    assert torch.equal(cached.logits, out.logits)


def test_a_base_whose_logit_transform_the_cache_cannot_reproduce_is_refused(tmp_path) -> None:
    """A transform the cache does not know for the model type (a Llama that says it soft-caps; a soft-capping and a
    scale together) is refused before the base runs over the data, and by a cache written for the plain base."""
    rows = _rows()
    base = tiny_model("llama", seed=1, layers=4)
    write_feature_cache(base, rows, LAYERS, tmp_path / "plain", rows_fingerprint(rows), progress=False)
    batch = collate_padded([CachedFeatures(tmp_path / "plain")[index] for index in range(3)])
    base.config.final_logit_softcapping = 1.0  # a cap of 1.0 is tanh, not the identity
    message = r"cannot reproduce this base's logits \(llama with final_logit_softcapping=1.0 on top of its lm_head\)"
    with pytest.raises(FeatureCacheError, match=message):
        write_feature_cache(base, rows, LAYERS, tmp_path / "capped", rows_fingerprint(rows), progress=False)
    assert not (tmp_path / "capped").exists()
    with pytest.raises(FeatureCacheError, match=message):
        base_output(base, batch)
    gemma = _transformed_base("gemma2", final_logit_softcapping=30.0)
    gemma.config.logit_scale = 2.0
    with pytest.raises(FeatureCacheError, match="final_logit_softcapping=30.0, logit_scale=2.0"):
        write_feature_cache(gemma, rows, LAYERS, tmp_path / "both", rows_fingerprint(rows), progress=False)


def test_the_teachers_greedy_tokens_come_a_chunk_of_positions_at_a_time(monkeypatch) -> None:
    from specheads.training import losses

    base = tiny_model("llama", seed=1, layers=4)
    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", 5 * base.config.vocab_size)  # 5 positions a chunk
    batch = {name: value[:4].long() for name, value in _rows()[:].items()}
    lean = base_output(base, batch, full_logits=False)
    assert lean.logits.shape[1] == 1  # the forward projected the last position only
    with torch.no_grad():
        full = base_output(base, batch).logits
    assert torch.equal(teacher_greedy(base, lean), full.argmax(dim=-1))


# ------------------------------------------------------------------------------------------ one view of the base
@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_the_view_of_a_batch_reads_as_the_forward_online_and_from_the_cache(tmp_path, model_type: str) -> None:
    """A :class:`BaseView` of a forward (its whole logits skipped) and of the cache's batch: the hidden states by
    layer, the final state, the teacher over some columns and the greedy tokens are the forward's own (Gemma 2's
    logits soft-capped on top of its lm_head)."""
    if model_type == "llama":
        base = tiny_model("llama", seed=1, layers=4)
    else:
        base = _transformed_base(model_type, **TRANSFORMED[model_type])
    rows = _rows()
    write_feature_cache(base, rows, LAYERS, tmp_path, rows_fingerprint(rows), rows_per_shard=4, progress=False)
    batch = collate_padded([CachedFeatures(tmp_path)[index] for index in range(6)])
    plain = {name: batch[name].long() for name in ("input_ids", "attention_mask", "loss_mask")}
    with torch.no_grad():
        out = base(input_ids=plain["input_ids"], attention_mask=plain["attention_mask"], output_hidden_states=True)
    real = batch["attention_mask"].bool()
    columns = torch.tensor([5, 2, 17, 40])
    online, cached = BaseView.of(base, plain, full_logits=False), BaseView.of(base, batch)
    assert isinstance(cached.output, CachedOutput) and not isinstance(online.output, CachedOutput)
    for view, tolerance in ((online, 1e-5), (cached, 2e-2)):  # the cache holds bf16 features
        close = dict(rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(view.final.float()[real], out.hidden_states[-1][real], **close)
        torch.testing.assert_close(view.hidden(2).float()[real], out.hidden_states[2][real], **close)
        with torch.no_grad():
            torch.testing.assert_close(view.teacher(columns)[real].float(), out.logits[..., columns][real], **close)
            assert torch.equal(view.greedy()[real], out.logits.argmax(dim=-1)[real])
