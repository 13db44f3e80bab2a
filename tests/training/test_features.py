"""The offline feature cache: what it stores equals the base's own forward, it resumes shard by shard, it refuses a
cache of another base or data, and heads trained from it train as they do with the base in the loop."""

from __future__ import annotations

import datasets
import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from specheads.training.config import load_config
from specheads.training.features import (
    CachedFeatures,
    CachedOutput,
    FeatureCacheError,
    base_output,
    collate_padded,
    rows_fingerprint,
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
