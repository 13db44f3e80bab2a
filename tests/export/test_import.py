"""Heads published in engine layouts, written here by hand as their trainers write them (SpecForge, ModelOpt, the
official EAGLE-1 repository, FasterDecoding Medusa), load as specheads heads and decode losslessly; exports of every
format load back into heads that draft exactly what the originals draft."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from helpers import greedy_reference, tiny_model
from safetensors.torch import save_file

from specheads import HeadCheckpointError, SpecDecoder, load_heads
from specheads.export import export_heads
from specheads.heads import EagleHead, MedusaHeads, head_type_of

VOCAB, HIDDEN = 96, 32
PROMPTS = [torch.randint(2, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)) for n in (1, 6, 17)]


def _llama_fields(head: EagleHead) -> dict:
    c = head.config
    return {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_parameters["rope_theta"],
        "max_position_embeddings": c.max_position_embeddings,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def _write(directory, config: dict, tensors: dict, weights: str = "model.safetensors") -> str:
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(directory / weights))
    return str(directory)


def _renamed(head: torch.nn.Module, old: str, new: str) -> dict:
    return {(new + k[len(old) :] if k.startswith(old) else k): v for k, v in head.state_dict().items()}


def _decode(base, heads, **kwargs) -> list:
    """Per prompt, the accepted lengths and every drafted token tree, after checking each output against the base's
    own greedy decoding (the drafted tokens make the comparison matter even where little is accepted)."""
    decoder = SpecDecoder.from_pretrained(base, heads=heads)
    drafted, propose = [], decoder.drafter.propose

    def recording(state, request):
        proposal = propose(state, request)
        rows = proposal if isinstance(proposal, list) else [proposal]
        drafted.append([None if row is None else row.tokens.tolist() for row in rows])
        return proposal

    decoder.drafter.propose = recording
    runs = []
    for prompt in PROMPTS:
        out = decoder.generate(prompt, max_new_tokens=24, **kwargs)
        assert torch.equal(out.sequences, greedy_reference(base, prompt, 24))
        runs.append((out.stats.accepted_lengths, list(drafted)))
        drafted.clear()
    return runs


def _longest(runs: list) -> int:
    return max(max(lengths) for lengths, _ in runs)


def _specforge(head: EagleHead, directory) -> str:
    config = {**_llama_fields(head), "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64}
    config["tie_word_embeddings"] = False
    return _write(directory, config, head.state_dict())  # midlayer.*, fc, norm, lm_head, d2t, t2d; no ids: defaults


def _modelopt(head: EagleHead, directory) -> str:
    config = {**_llama_fields(head), "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64}
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    tensors = _renamed(head, "midlayer.", "layers.0.")
    del tensors["t2d"]  # ModelOpt writes d2t only
    return _write(directory, config, tensors)


def _official_eagle1(head: EagleHead, base, directory) -> str:
    config = {**_llama_fields(head), "architectures": ["LlamaForCausalLM"]}
    tensors = _renamed(head, "midlayer.", "layers.0.")
    tensors["embed_tokens.weight"] = base.get_input_embeddings().weight
    tensors.setdefault("fc.bias", torch.zeros(HIDDEN))
    return _write(directory, config, tensors)


def _fasterdecoding(heads: MedusaHeads, directory) -> str:
    tensors = {}
    for h, blocks in enumerate(heads.blocks):
        tensors[f"{h}.0.linear.weight"] = blocks[0].linear.weight
        tensors[f"{h}.0.linear.bias"] = blocks[0].linear.bias
        if heads.lm_heads is not None:
            tensors[f"{h}.1.weight"] = heads.lm_heads[h].weight
    config = {"medusa_num_heads": 3, "medusa_num_layers": 1, "base_model_name_or_path": "org/base"}
    return _write(directory, config, tensors, "medusa_lm_head.safetensors")


FOREIGN = {
    "specforge-eagle3": ("eagle3", lambda t, base, d: _specforge(t["eagle3"], d)),
    "modelopt-eagle3": ("eagle3", lambda t, base, d: _modelopt(t["eagle3"], d)),
    "official-eagle1": ("eagle1", lambda t, base, d: _official_eagle1(t["eagle1"], base, d)),
    "fasterdecoding-medusa": ("medusa", lambda t, base, d: _fasterdecoding(t["medusa"], d)),
    "tgi-v2-medusa": ("medusa-shared", lambda t, base, d: _fasterdecoding(t["medusa-shared"], d)),
}


@pytest.mark.parametrize("layout", FOREIGN)
def test_foreign_checkpoints_decode_losslessly_and_draft_as_the_originals(base, trained, tmp_path, layout) -> None:
    kind, write = FOREIGN[layout]
    directory = write(trained, base, tmp_path / "heads")
    with pytest.warns(UserWarning, match="without a fingerprint of its base: only its shapes were checked"):
        loaded = load_heads(directory, base)
    original = trained[kind]
    assert head_type_of(loaded).name == head_type_of(original).name
    if isinstance(original, EagleHead):
        assert loaded.config.layer_ids == original.config.layer_ids
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = _decode(base, directory)
    native = _decode(base, original)
    assert imported == native
    if isinstance(original, EagleHead):  # trained EAGLE heads draft well enough for multi-token commits here
        assert _longest(native) >= 3


@pytest.mark.parametrize(
    ("format", "kind", "tree"),
    [
        ("eagle3", "eagle3", "dynamic"),
        ("eagle3", "eagle3-full", "chain-3"),
        ("speculators", "eagle3", "binary-7"),
        ("eagle", "eagle1", "dynamic"),
        ("eagle", "eagle1-bias", "chain-3"),
        ("medusa", "medusa", "binary-7"),
        ("medusa", "medusa-shared", "chain-2"),
    ],
)
def test_export_then_import_drafts_exactly_as_before(base, trained, tmp_path, format, kind, tree) -> None:
    export_heads(trained[kind], tmp_path / "out", format, base_model=base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exports carry specheads' record of the base: checked, no warning
        imported = _decode(base, str(tmp_path / "out"), tree=tree)
    native = _decode(base, trained[kind], tree=tree)
    assert imported == native
    if isinstance(trained[kind], EagleHead):
        assert _longest(native) >= 2


def test_an_export_loaded_on_another_base_fails_its_fingerprint(base, trained, tmp_path) -> None:
    export_heads(trained["eagle3"], tmp_path / "out", "eagle3", base_model=base)
    other = tiny_model("llama", seed=7, vocab_size=VOCAB, layers=8)
    with pytest.raises(HeadCheckpointError, match="another base model: base_model.fingerprint"):
        load_heads(tmp_path / "out", other)


# ---------------------------------------------------------------------------------------------- bad input
def test_a_foreign_checkpoint_needs_its_base(trained, tmp_path) -> None:
    directory = _specforge(trained["eagle3"], tmp_path / "heads")
    with pytest.raises(HeadCheckpointError, match="records no fingerprint of its base: load it with its base"):
        load_heads(directory)


def test_shapes_are_checked_against_the_base(trained, tmp_path) -> None:
    wider = tiny_model("llama", vocab_size=VOCAB, hidden=64, layers=8)
    with pytest.raises(HeadCheckpointError, match="another base: the hidden size is 32 there but 64"):
        load_heads(_specforge(trained["eagle3"], tmp_path / "a"), wider)
    larger = tiny_model("llama", vocab_size=128, layers=8)
    with pytest.raises(HeadCheckpointError, match="the vocabulary size is 96 there but 128"):
        load_heads(_specforge(trained["eagle3"], tmp_path / "b"), larger)
    shallow = tiny_model("llama", vocab_size=VOCAB, layers=4)
    with pytest.raises(HeadCheckpointError, match=r"layer_ids \[2, 4, 5\].*4 layers"):
        load_heads(_modelopt(trained["eagle3"], tmp_path / "c"), shallow)
    with pytest.raises(HeadCheckpointError, match="another base: the hidden size"):
        load_heads(_fasterdecoding(trained["medusa"], tmp_path / "d"), wider)


def test_an_embedding_from_another_base_is_refused(base, trained, tmp_path) -> None:
    directory = _official_eagle1(
        trained["eagle1"], tiny_model("llama", seed=9, vocab_size=VOCAB, layers=8), tmp_path / "h"
    )
    with pytest.raises(HeadCheckpointError, match="embed_tokens that differs from this base's"):
        load_heads(directory, base)


def test_pickled_sharded_and_corrupt_foreign_checkpoints(base, trained, tmp_path) -> None:
    directory = tmp_path / "pickled"
    _specforge(trained["eagle3"], directory.parent / "pickled")
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    with pytest.raises(HeadCheckpointError, match="pickle-based file; specheads never unpickles"):
        load_heads(directory, base)
    corrupt = tmp_path / "corrupt"
    _specforge(trained["eagle3"], corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x12" * 64)
    with pytest.raises(HeadCheckpointError):
        load_heads(corrupt, base)
    medusa = tmp_path / "medusa"
    _fasterdecoding(trained["medusa"], medusa)
    (medusa / "medusa_lm_head.safetensors").rename(medusa / "medusa_lm_head.pt")
    with pytest.raises(HeadCheckpointError, match="medusa_lm_head.pt is a pickle-based file"):
        load_heads(medusa, base)


def test_unsupported_draft_variants_are_named(base, trained, tmp_path) -> None:
    head = trained["eagle3"]
    config = {**_llama_fields(head), "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64}
    _write(tmp_path / "two", {**config, "num_hidden_layers": 2}, head.state_dict())
    with pytest.raises(HeadCheckpointError, match="more than one layer"):
        load_heads(tmp_path / "two", base)
    _write(tmp_path / "norm", {**config, "norm_before_fc": True}, head.state_dict())
    with pytest.raises(HeadCheckpointError, match="norm_before_fc=true drafts are not supported"):
        load_heads(tmp_path / "norm", base)
    export_heads(head, tmp_path / "spec", "speculators", base_model=base)
    spec = json.loads((tmp_path / "spec" / "config.json").read_text())
    spec["transformer_layer_config"]["model_type"] = "qwen3"
    (tmp_path / "spec" / "config.json").write_text(json.dumps(spec))
    with pytest.raises(HeadCheckpointError, match="a qwen3 draft layer"):
        load_heads(tmp_path / "spec", base)
    _write(tmp_path / "extra", {**config}, {**head.state_dict(), "mask_hidden": torch.zeros(3)})
    with pytest.raises(HeadCheckpointError, match="unexpected \\['mask_hidden'\\]"):
        load_heads(tmp_path / "extra", base)
