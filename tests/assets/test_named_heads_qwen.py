"""The heads shipped for the named real base qwen2.5-coder-1.5b: hash-checked, within 64 MB, calibrated in bf16,
bound to the files they trained on, and lossless on the base.

The manifest checks need only the repository. The decoding check needs the base: its 22 registry packages (1.1 GB of
GGUF chunks, which the test command does not install) and, the first time, about 15 minutes and 14 GB of memory to
convert them; elsewhere it is skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from specheads import SpecDecoder, assets
from specheads.heads import load_heads

BASE = "qwen2.5-coder-1.5b"
ROOT = Path(assets.__file__).resolve().parent / BASE
pytestmark = pytest.mark.skipif(not (ROOT / "manifest.json").is_file(), reason=f"no heads shipped for {BASE}")
HAS_BASE = importlib.util.find_spec(assets.NAMED_BASES[BASE].package) is not None


def test_the_manifest_lists_every_shipped_file_with_its_hash_and_the_heads_fit_64_mb() -> None:
    manifest = json.loads((ROOT / "manifest.json").read_text())
    shipped = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert set(manifest["files"]) == shipped
    heads = manifest["heads"]["eagle3"]
    assert sum(p.stat().st_size for p in (ROOT / "eagle3").iterdir()) <= 64 * 10**6
    assert heads["training"]["tokens_seen"] > 0 and heads["heldout_agreement_with_base_greedy_by_depth"]
    assert {"bfloat16", "float32"} <= {dtype.split("/")[0] for dtype in heads["calibrated"] if dtype != "machine"}
    calibrate_commands = [command for command in heads["commands"] if command.startswith("specheads calibrate ")]
    assert {command.split("--dtype ")[1].split()[0] for command in calibrate_commands} == {"bfloat16", "float32"}
    assert heads["learning_curve"] and heads["commands"][0].startswith("specheads train --config configs/")
    assert assets.shipped_heads(BASE) == ROOT / "eagle3"


def test_the_heads_list_the_source_files_they_trained_on_and_none_held_out_is_trained_on() -> None:
    manifest = json.loads((ROOT / "manifest.json").read_text())
    facts = manifest["heads"]["eagle3"]["data_files"]
    listing = json.loads((ROOT / facts["listing"]).read_text())
    splits = {file["relpath"]: file["split"] for file in listing["files"]}
    assert len(splits) == len(listing["files"])  # a file is in one split only
    train = [file for file in listing["files"] if file["split"] == "train"]
    assert len(train) == facts["train_files"] == manifest["heads"]["eagle3"]["recipe"]["data"]["limit"]
    assert all(len(file["sha256"]) == 64 and file["bytes"] > 0 for file in listing["files"])
    assert facts["heldout_files"] > 0 and not any("/" in leak["path"] for leak in listing["leaks"])


def test_the_heads_are_sized_for_this_base() -> None:
    heads = load_heads(ROOT / "eagle3")
    config = json.loads((ROOT / "eagle3" / "config.json").read_text())
    assert heads.config.hidden_size == 1536 and config["draft_vocab_size"] < 151_936
    assert sum(p.numel() for p in heads.parameters()) * 2 <= 64 * 10**6


@pytest.mark.skipif(
    not HAS_BASE, reason=f"the base {BASE} is not installed: {assets.NAMED_BASES[BASE].install} (1.1 GB)"
)
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_default_heads_on_the_named_base_complete_code_losslessly(dtype: str) -> None:
    """float32: equal to transformers' greedy; auto (bf16 on a CPU with native bf16): equal to the engine's own
    one-token decoding in bf16, the exactness rule of reduced precision."""
    decoder = SpecDecoder.from_pretrained(BASE, heads="default", dtype=dtype)
    prompt = "def fibonacci(n: int) -> int:\n"
    if decoder.model.dtype == torch.float32:
        ids = decoder.tokenizer(prompt, return_tensors="pt").input_ids
        reference = decoder.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
        expected = reference[0, ids.shape[1] :].tolist()
    else:
        expected = (
            SpecDecoder(decoder.model, tokenizer=decoder.tokenizer).generate(prompt, max_new_tokens=24).new_tokens
        )
    for tree in ("auto", "dynamic"):
        out = decoder.generate(prompt, max_new_tokens=24, tree=tree)
        assert out.new_tokens == expected[: len(out.new_tokens)], tree
        assert len(out.new_tokens) == 24 or out.finish_reason == "eos"
