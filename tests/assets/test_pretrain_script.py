"""scripts/pretrain_default.py at toy scale: exact resume from a pickle-free checkpoint, and an export that ships the
models' position limit in the tokenizers. The real corpus, sizes and assets are never touched."""

from __future__ import annotations

import importlib.util
import json
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specheads import assets
from specheads.assets.corpus import is_heldout

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pretrain_default.py"
STEPS = 6
TINY = [
    "--threads", "1", "--seed", "7", "--vocab-size", "300", "--seq-len", "32", "--batch-size", "4",
    "--token-budget", str(STEPS * 4 * 32), "--base-hidden", "32", "--base-layers", "2", "--base-heads", "2",
    "--base-intermediate", "64", "--draft-hidden", "16", "--draft-layers", "1", "--draft-heads", "2",
    "--draft-intermediate", "32", "--eval-every", "2", "--eval-windows", "4", "--log-every", "1",
    "--warmup-frac", "0.34",
]  # fmt: skip


@pytest.fixture(scope="module")
def script():  # noqa: ANN201 - the script module
    spec = importlib.util.spec_from_file_location("pretrain_default", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def toy_corpus(root: Path) -> Path:
    """Forty small generated Python files: 36 in the train split, 4 in the held-out split."""
    candidates = [f"pkg{i % 3}/mod_{i}.py" for i in range(400)]
    names = [name for name in candidates if not is_heldout(name)][:36] + [
        name for name in candidates if is_heldout(name)
    ][:4]
    for index, name in enumerate(names):
        body = "".join(
            f"def {verb}_{noun}_{index}(value, count={j}):\n"
            f'    """Return the {noun} of value after {j} {verb} steps."""\n'
            f"    total = value * {j} + count\n    return [total, '{noun}', {index}]\n\n"
            for j, (verb, noun) in enumerate(
                [("parse", "text"), ("build", "tree"), ("merge", "list"), ("split", "name")]
            )
        )
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"import os\n\n{body}")
    return root


@pytest.fixture(scope="module")
def prepared(script, tmp_path_factory) -> tuple[Path, Path]:
    """A work dir holding the toy tokenizer and token caches, and the toy corpus it came from."""
    corpus = toy_corpus(tmp_path_factory.mktemp("corpus"))
    work = tmp_path_factory.mktemp("work")
    script.main(["tokenizer", "--work-dir", str(work), "--corpus-root", str(corpus), *TINY])
    return work, corpus


def train(script, work: Path, corpus: Path, *extra: str) -> None:  # noqa: ANN001
    script.main(["train", "--work-dir", str(work), "--corpus-root", str(corpus), *TINY, *extra])


def refuse_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the pretraining script unpickled something")

    for owner, name in ((torch, "load"), (pickle, "load"), (pickle, "loads")):
        monkeypatch.setattr(owner, name, refuse)


def test_resume_from_the_safetensors_checkpoint_is_exact(script, prepared, tmp_path, monkeypatch) -> None:
    work, corpus = prepared
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    shutil.copytree(work, straight)
    shutil.copytree(work, resumed)
    train(script, straight, corpus)
    train(script, resumed, corpus, "--max-steps", str(STEPS // 2))
    middle = json.loads((resumed / "checkpoint" / "state.json").read_text())
    assert middle["state"]["step"] == STEPS // 2
    refuse_unpickling(monkeypatch)
    train(script, resumed, corpus)

    records, tensors = [], []
    for run in (straight, resumed):
        folder = run / "checkpoint"
        assert {path.suffix for path in folder.iterdir()} == {".json", ".safetensors"}
        assert not list(run.rglob("*.pt")) and not list(run.rglob("*.pkl"))
        records.append(json.loads((folder / "state.json").read_text()))
        tensors.append(load_file(str(folder / records[-1]["tensors"])))
    assert records[0]["state"]["step"] == records[1]["state"]["step"] == STEPS
    assert records[0]["state"]["history"] == records[1]["state"]["history"]  # the same held-out losses, exactly
    assert [entry["step"] for entry in records[0]["state"]["history"]] == [2, 4, 6]
    assert records[0]["optims"] == records[1]["optims"] and records[0]["rng"] == records[1]["rng"]
    assert tensors[0].keys() == tensors[1].keys()
    assert any(key.startswith("optim.base.state.0.") for key in tensors[0])
    for key, value in tensors[0].items():
        assert torch.equal(value, tensors[1][key]), key
    assert not torch.equal(tensors[0]["model.base.model.norm.weight"], torch.ones(32))  # it did train


def test_export_writes_the_position_limit_into_the_tokenizers(script, prepared, tmp_path, monkeypatch) -> None:
    work, corpus = prepared
    run = tmp_path / "run"
    shutil.copytree(work, run)
    train(script, run, corpus, "--max-steps", "2")
    # the export sets the limit itself, also from a work dir whose tokenizer an older script saved with 512
    tokenizer_config_path = run / "tokenizer" / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    assert tokenizer_config["model_max_length"] == 2048
    tokenizer_config_path.write_text(json.dumps({**tokenizer_config, "model_max_length": 512}))
    refuse_unpickling(monkeypatch)
    out = tmp_path / "assets"
    script.main(["export", "--work-dir", str(run), "--corpus-root", str(corpus), "--assets-dir", str(out), *TINY])

    manifest = json.loads((out / "manifest.json").read_text())
    for role in ("base", "draft"):
        config = json.loads((out / role / "config.json").read_text())
        tokenizer_config = json.loads((out / role / "tokenizer_config.json").read_text())
        assert tokenizer_config["model_max_length"] == config["max_position_embeddings"] == 2048
        # a rerun of the real export writes the shipped tokenizer config byte for byte (same special tokens)
        shipped = (assets.DEFAULT_DIR / role / "tokenizer_config.json").read_text()
        assert (out / role / "tokenizer_config.json").read_text() == shipped
        assert manifest["models"][role]["steps"] == 2
        assert manifest["files"][f"{role}/tokenizer_config.json"] == script.sha256_file(
            out / role / "tokenizer_config.json"
        )


def test_a_pickled_checkpoint_is_refused_not_loaded(script, prepared, tmp_path, monkeypatch) -> None:
    work, corpus = prepared
    run = tmp_path / "run"
    shutil.copytree(work, run)
    (run / "ckpt.pt").write_bytes(b"not loaded")
    refuse_unpickling(monkeypatch)
    with pytest.raises(SystemExit, match="never unpickles"):
        train(script, run, corpus)
