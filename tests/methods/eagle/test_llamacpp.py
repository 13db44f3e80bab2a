"""The llama.cpp EAGLE-3 draft GGUF: what the file holds (read back with gguf's reader), the checks llama.cpp's loader
and speculative setup make, bad input refused with nothing written, and, where llama.cpp's converter is available
(``SPECHEADS_LLAMA_CPP`` = its source tree), equality with what the converter writes from the ``eagle3`` export."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = importlib.import_module("gguf") if importlib.util.find_spec("gguf") is not None else None
pytestmark = pytest.mark.skipif(gguf is None, reason="needs pip install -e '.[gguf]' (the gguf package)")

from specheads import assets, load_heads  # noqa: E402
from specheads.cli import main  # noqa: E402
from specheads.export import check_export, export_heads  # noqa: E402
from specheads.methods.eagle.gguf import (  # noqa: E402
    GGUFDraftError,
    check_gguf_draft,
    compare_gguf,
    converter_command,
    read_target_gguf,
    target_vocab_from_tokenizer,
    write_gguf_draft,
)

VOCAB, HIDDEN, LAYERS = 96, 32, 8
LLAMA_CPP = os.environ.get("SPECHEADS_LLAMA_CPP")


def _target_gguf(path: Path, vocab: int = VOCAB, tokens: list[str] | None = None, arch: str = "llama") -> Path:
    """A base GGUF with what a draft takes from it: its tokenizer keys, depth and width (no tensors needed)."""
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(HIDDEN)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens or [f"t{i}" for i in range(vocab)])
    writer.add_token_types([3] + [1] * (vocab - 1))
    writer.add_bos_token_id(0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _fields(path: Path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()}, {t.name: t for t in reader.tensors}


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def test_a_target_whose_graph_hands_eagle3_no_layer_inputs_is_named(base, trained, tmp_path, capsys) -> None:
    """The pinned llama.cpp aborts with an EAGLE-3 draft for a qwen2 target (its graph does not expose the layer
    inputs): the export still writes the right file and warns; checking it against that target fails."""
    qwen2 = _target_gguf(tmp_path / "qwen2.gguf", arch="qwen2")
    result = export_heads(trained["eagle3"], tmp_path / "draft.gguf", "gguf", base_model=base, target_gguf=qwen2)
    assert result.report.ok  # the draft file is not at fault
    warnings = [note for note in result.notes if note.startswith("warning:")]
    assert len(warnings) == 1 and "'qwen2' model" in warnings[0] and "layer input tensor is null" in warnings[0]
    assert main(["export", "--check", str(tmp_path / "draft.gguf"), "--target-gguf", str(qwen2)]) == 1
    assert "'qwen2' model" in capsys.readouterr().out
    llama = _target_gguf(tmp_path / "llama.gguf")
    assert main(["export", "--check", str(tmp_path / "draft.gguf"), "--target-gguf", str(llama)]) == 0
    again = export_heads(trained["eagle3"], tmp_path / "again.gguf", "gguf", base_model=base, target_gguf=llama)
    assert not [note for note in again.notes if note.startswith("warning:")]


def test_the_draft_reads_back_with_every_key_and_tensor(base, trained, tmp_path) -> None:
    head = trained["eagle3"]
    target = _target_gguf(tmp_path / "base.gguf")
    result = export_heads(head, tmp_path / "draft.gguf", "gguf", base_model=base, target_gguf=target)
    assert result.report.ok and result.report.engines == ["llama.cpp"]
    assert (
        "--spec-type draft-eagle3" in result.commands["llama.cpp"]
        and str(target.resolve()) in result.commands["llama.cpp"]
    )
    fields, tensors = _fields(tmp_path / "draft.gguf")
    ids = sorted(head.config.layer_ids)
    assert fields["general.architecture"] == "eagle3"
    assert list(fields["eagle3.target_layers"]) == ids
    assert fields["eagle3.target_hidden_size"] == HIDDEN and fields["eagle3.embedding_length"] == HIDDEN
    assert fields["eagle3.vocab_size"] == VOCAB and fields["eagle3.block_count"] == 1
    assert fields["eagle3.attention.head_count"] == 4 and fields["eagle3.attention.head_count_kv"] == 2
    assert fields["eagle3.norm_before_residual"] is False and fields["general.file_type"] == 0
    assert fields["tokenizer.ggml.tokens"] == [f"t{i}" for i in range(VOCAB)]  # copied from the target
    assert fields["tokenizer.ggml.bos_token_id"] == 0
    expected = {
        "fc.weight", "output.weight", "output_norm.weight", "d2t", "blk.0.attn_norm.weight",
        "blk.0.attn_norm_2.weight", "blk.0.ffn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
        "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
        "blk.0.ffn_down.weight",
    }  # fmt: skip
    assert set(tensors) == expected  # no t2d, no token_embd: llama.cpp borrows the target's embedding
    state = {k: v.detach() for k, v in head.state_dict().items()}
    assert [int(n) for n in tensors["fc.weight"].shape] == [3 * HIDDEN, HIDDEN]
    d2t = np.asarray(tensors["d2t"].data)
    assert tensors["d2t"].tensor_type == gguf.GGMLQuantizationType.I64
    assert d2t.tolist() == (state["d2t"] + torch.arange(state["d2t"].numel())).tolist()  # absolute ids
    assert np.array_equal(np.asarray(tensors["output.weight"].data), state["lm_head.weight"].numpy())
    q = np.asarray(tensors["blk.0.attn_q.weight"].data)
    k = np.asarray(tensors["blk.0.attn_k.weight"].data)
    assert not np.array_equal(q, state["midlayer.self_attn.q_proj.weight"].numpy())  # rows are permuted ...
    assert np.array_equal(_unpermute(q, 4), state["midlayer.self_attn.q_proj.weight"].numpy())  # ... and only that
    assert np.array_equal(_unpermute(k, 2), state["midlayer.self_attn.k_proj.weight"].numpy())  # by kv heads
    assert check_gguf_draft(tmp_path / "draft.gguf", read_target_gguf(target)).ok


def _norm_before_fc_head(base, layer_ids=(6, 2, 4)):
    """Heads with norm_before_fc over unsorted feature layers (engines sort them; the norm's blocks must follow)."""
    from specheads.heads import EagleHead

    torch.manual_seed(0)
    head = EagleHead.from_base(
        base, version=3, layer_ids=list(layer_ids), draft_vocab_size=64,
        token_counts=torch.rand(base.get_output_embeddings().weight.shape[0]), norm_before_fc=True,
    )  # fmt: skip
    with torch.no_grad():  # the norm starts at one: make its blocks differ
        head.input_norm.weight.add_(0.3 * torch.randn_like(head.input_norm.weight))
    return head.eval()


def test_norm_before_fc_is_written_as_llama_cpps_input_norm_in_its_layer_order(base, tmp_path) -> None:
    head = _norm_before_fc_head(base)
    target = _target_gguf(tmp_path / "base.gguf")
    result = export_heads(head, tmp_path / "draft.gguf", "gguf", base_model=base, target_gguf=target)
    assert result.report.ok
    fields, tensors = _fields(tmp_path / "draft.gguf")
    assert fields["eagle3.norm_before_fc"] is True and list(fields["eagle3.target_layers"]) == [2, 4, 6]
    written = np.asarray(tensors["enc.output_norm.weight"].data)
    assert tensors["enc.output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    blocks = head.input_norm.weight.detach().split(HIDDEN)
    expected = torch.cat([blocks[[6, 2, 4].index(layer)] for layer in (2, 4, 6)])  # the blocks follow fc's columns
    assert np.array_equal(written, expected.numpy())
    assert check_gguf_draft(tmp_path / "draft.gguf", read_target_gguf(target)).ok


def test_the_checker_wants_norm_before_fc_and_its_norm_together(base, tmp_path) -> None:
    head = _norm_before_fc_head(base)
    target = _target_gguf(tmp_path / "base.gguf")
    export_heads(head, tmp_path / "draft.gguf", "gguf", base_model=base, target_gguf=target)
    reader = gguf.GGUFReader(str(tmp_path / "draft.gguf"))
    writer = gguf.GGUFWriter(str(tmp_path / "broken.gguf"), arch="eagle3")  # the same file without the norm
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value, kind = field.contents(), field.types[0]
        writer.add_key_value(name, value, kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        if tensor.name != "enc.output_norm.weight":
            shape = [int(n) for n in reversed(tensor.shape)]
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_shape=shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    report = check_gguf_draft(tmp_path / "broken.gguf", read_target_gguf(target))
    assert not report.ok and "norm_before_fc is True but enc.output_norm.weight is absent" in report.render()


@pytest.mark.parametrize(("dtype", "qtype"), [("float16", "F16"), ("bfloat16", "BF16")])
def test_half_dtypes_keep_norms_in_float32(base, trained, tmp_path, dtype, qtype) -> None:
    target = _target_gguf(tmp_path / "base.gguf")
    export_heads(trained["eagle3"], tmp_path / "d.gguf", "gguf", base_model=base, target_gguf=target, dtype=dtype)
    fields, tensors = _fields(tmp_path / "d.gguf")
    assert fields["general.file_type"] == {"float16": 1, "bfloat16": 32}[dtype]
    for name, tensor in tensors.items():
        want = (
            "I64"
            if name == "d2t"
            else "F32"
            if name.endswith("norm.weight") or name.endswith("_norm_2.weight")
            else qtype
        )
        assert tensor.tensor_type.name == want, name
    lm_head = trained["eagle3"].state_dict()["lm_head.weight"].detach()
    stored = np.asarray(tensors["output.weight"].data)
    if dtype == "float16":
        assert np.array_equal(stored, lm_head.numpy().astype(np.float16))
    else:  # round to nearest even, as torch rounds
        assert np.array_equal(
            stored.view(np.uint16), lm_head.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        )


def test_bad_input_is_refused_before_writing(base, trained, tmp_path) -> None:
    target = _target_gguf(tmp_path / "base.gguf")
    with pytest.raises(ValueError, match="EAGLE-3 heads; these are EAGLE-1"):
        export_heads(trained["eagle1"], tmp_path / "a.gguf", "gguf", base_model=base, target_gguf=target)
    with pytest.raises(ValueError, match="must end in .gguf"):
        export_heads(trained["eagle3"], tmp_path / "a", "gguf", base_model=base, target_gguf=target)
    other = _target_gguf(tmp_path / "other.gguf", vocab=VOCAB + 4)
    with pytest.raises(GGUFDraftError, match="llama.cpp refuses a draft for another vocabulary"):
        export_heads(trained["eagle3"], tmp_path / "a.gguf", "gguf", base_model=base, target_gguf=other)
    eagle3 = tmp_path / "e3"
    export_heads(trained["eagle3"], eagle3, "eagle3", base_model=base)
    config = json.loads((eagle3 / "config.json").read_text())
    from safetensors.torch import load_file

    tensors = load_file(str(eagle3 / "model.safetensors"))
    vocab = read_target_gguf(target)
    for ids, message in (([1, 3], "reads exactly 3"), ([1, 3, 5, 7], "reads exactly 3"), (None, "assumes layers")):
        broken = {**config, "eagle_aux_hidden_state_layer_ids": ids}
        with pytest.raises(GGUFDraftError, match=message):
            write_gguf_draft(broken, tensors, tmp_path / "a.gguf", vocab)
    duplicated = {**tensors, "d2t": torch.zeros_like(tensors["d2t"])}
    duplicated["d2t"][1] = -1  # draft ids 0 and 1 both map to target id 0
    with pytest.raises(GGUFDraftError, match="two draft ids to one target id"):
        write_gguf_draft(config, duplicated, tmp_path / "a.gguf", vocab)
    (tmp_path / "taken.gguf").write_bytes(b"mine")
    with pytest.raises(GGUFDraftError, match="exists"):
        write_gguf_draft(config, tensors, tmp_path / "taken.gguf", vocab)
    assert (tmp_path / "taken.gguf").read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.gguf", "e3", "other.gguf", "taken.gguf"]


def test_a_failed_write_leaves_nothing(base, trained, tmp_path, monkeypatch) -> None:
    target = _target_gguf(tmp_path / "base.gguf")

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
    with pytest.raises(OSError, match="disk full"):
        export_heads(trained["eagle3"], tmp_path / "d.gguf", "gguf", base_model=base, target_gguf=target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.gguf"]


def test_the_checker_sees_what_llama_cpp_refuses(base, trained, tmp_path) -> None:
    target = _target_gguf(tmp_path / "base.gguf")
    export_heads(trained["eagle3"], tmp_path / "d.gguf", "gguf", base_model=base, target_gguf=target)
    renamed = _target_gguf(tmp_path / "renamed.gguf", tokens=[f"t{i}" for i in range(VOCAB - 1)] + ["other"])
    report = check_gguf_draft(tmp_path / "d.gguf", read_target_gguf(renamed))
    assert not report.ok and "1 tokens differ from the target's (first id 95)" in report.render()
    assert "not a readable GGUF file" in check_gguf_draft(target.with_name("none.gguf")).render()
    base_report = check_gguf_draft(target)
    assert not base_report.ok and "'llama'" in base_report.render()
    # the CLI checks a file and says so in its exit code
    assert main(["export", "--check", str(tmp_path / "d.gguf"), "--target-gguf", str(target)]) == 0
    assert main(["export", "--check", str(tmp_path / "d.gguf"), "--target-gguf", str(renamed)]) == 1


def test_checking_a_file_that_is_not_gguf_gives_one_verdict(tmp_path, capsys) -> None:
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(bytes(range(100)))
    assert main(["export", "--check", str(draft)]) == 1
    printed = capsys.readouterr().out
    assert "  problem: not a readable GGUF file" in printed
    verdicts = [line for line in printed.splitlines() if line.startswith("  llama.cpp:")]
    assert verdicts == ["  llama.cpp: would not serve it correctly (the problems above)"]


def test_directory_checks_name_llama_cpps_rules(base, trained, tmp_path) -> None:
    export_heads(trained["eagle3"], tmp_path / "e3", "eagle3", base_model=base)
    config = json.loads((tmp_path / "e3" / "config.json").read_text())
    del config["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "e3" / "config.json").write_text(json.dumps(config))
    report = check_export(tmp_path / "e3")
    assert "llama.cpp: problem: no eagle_aux_hidden_state_layer_ids" in report.render()


def test_the_tokenizer_vocabulary_of_a_base_folder() -> None:
    folder = assets.resolve("default")
    vocab = target_vocab_from_tokenizer(folder, 8192)
    assert vocab.vocab_size == 8192 and len(vocab.tokens) == 8192
    assert vocab.fields["tokenizer.ggml.model"][0] == "gpt2" and vocab.fields["tokenizer.ggml.pre"][0] == "gpt-2"
    assert vocab.tokens[0] == "<|endoftext|>" and vocab.fields["tokenizer.ggml.token_type"][0][0] == 3  # control
    assert len(vocab.fields["tokenizer.ggml.merges"][0]) == 7935
    with pytest.raises(GGUFDraftError, match="has ids beyond"):
        target_vocab_from_tokenizer(folder, 100)


def test_the_cli_writes_the_default_draft(tmp_path, capsys) -> None:
    out = tmp_path / "draft.gguf"
    assert main(["export", "--heads", "default", "--base", "default", "--format", "gguf", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "llama.cpp: loads" in printed and "llama-server -m <base.gguf>" in printed
    assert main(["export", "--check", str(out)]) == 0


@pytest.mark.skipif(LLAMA_CPP is None, reason="set SPECHEADS_LLAMA_CPP to llama.cpp's source tree (its converter)")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_equal_to_llama_cpps_converter(tmp_path, dtype) -> None:
    base_dir = assets.resolve("default")
    head = load_heads(assets.shipped_heads("default"))
    export_heads(head, tmp_path / "e3", "eagle3")
    outtype = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[dtype]
    for args in (
        [
            str(tmp_path / "e3"),
            "--target-model-dir",
            base_dir,
            "--outtype",
            outtype,
            "--outfile",
            str(tmp_path / "c.gguf"),
        ],
        [base_dir, "--outtype", "f32", "--outfile", str(tmp_path / "base.gguf")],
    ):
        subprocess.run(converter_command(LLAMA_CPP, args), check=True, capture_output=True)
    export_heads(head, tmp_path / "ours.gguf", "gguf", dtype=dtype, target_gguf=tmp_path / "base.gguf")
    assert compare_gguf(tmp_path / "ours.gguf", tmp_path / "c.gguf") == []
    # built from the tokenizer instead of copied from the base GGUF: the same keys (the pre-tokenizer is named, not
    # looked up in the converter's hash table, and this tokenizer's hash is not in it)
    export_heads(head, tmp_path / "hf.gguf", "gguf", dtype=dtype, base_name=base_dir)
    assert compare_gguf(tmp_path / "hf.gguf", tmp_path / "c.gguf") == []


def _converted_like_ours(head, base, tmp_path: Path) -> dict:
    """llama.cpp's converter on ``head``'s eagle3 export (and on the default base, for the target) against
    specheads' own gguf writer: asserts the two files are equal and returns the converted file's keys."""
    base_dir = assets.resolve("default")
    export_heads(head, tmp_path / "e3", "eagle3", base_model=base)
    for args in (
        [
            str(tmp_path / "e3"),
            "--target-model-dir",
            base_dir,
            "--outtype",
            "f32",
            "--outfile",
            str(tmp_path / "c.gguf"),
        ],
        [base_dir, "--outtype", "f32", "--outfile", str(tmp_path / "base.gguf")],
    ):
        subprocess.run(converter_command(LLAMA_CPP, args), check=True, capture_output=True)
    export_heads(head, tmp_path / "ours.gguf", "gguf", dtype="float32", target_gguf=tmp_path / "base.gguf")
    assert compare_gguf(tmp_path / "ours.gguf", tmp_path / "c.gguf") == []
    return _fields(tmp_path / "c.gguf")[0]


@pytest.mark.skipif(LLAMA_CPP is None, reason="set SPECHEADS_LLAMA_CPP to llama.cpp's source tree (its converter)")
def test_norm_before_fc_equal_to_llama_cpps_converter(tmp_path) -> None:
    """Heads with norm_before_fc on the default base (unsorted layers): the converter maps the eagle3 export's
    input_norm and flag to the same GGUF as specheads' own writer."""
    from specheads.loading import load_causal_lm

    base = load_causal_lm("default")
    layers = base.config.num_hidden_layers
    head = _norm_before_fc_head(base, layer_ids=(layers - 2, 1, layers // 2))
    assert _converted_like_ours(head, base, tmp_path)["eagle3.norm_before_fc"] is True


@pytest.mark.skipif(LLAMA_CPP is None, reason="set SPECHEADS_LLAMA_CPP to llama.cpp's source tree (its converter)")
def test_folded_eagle31_heads_equal_to_llama_cpps_converter(tmp_path) -> None:
    """EAGLE 3.1 heads folded for llama.cpp (export --fold-norms: input_norm and a normed residual) on the default
    base: the converter reads the eagle3 export's flags and tensors into the same GGUF as specheads' own writer."""
    from specheads.heads import EagleHead
    from specheads.loading import load_causal_lm
    from specheads.methods.eagle.fold import fold_for_llamacpp

    base = load_causal_lm("default")
    layers = base.config.num_hidden_layers
    vocab = base.get_output_embeddings().weight.shape[0]
    torch.manual_seed(0)
    head = EagleHead.from_base(
        base, version=3, layer_ids=[layers - 2, 1, layers // 2], draft_vocab_size=64, token_counts=torch.rand(vocab),
        fc_norm=True, norm_output=True,
    )  # fmt: skip
    folded, _ = fold_for_llamacpp(head, base, [list(range(5, 69))])
    fields = _converted_like_ours(folded, base, tmp_path)
    assert fields["eagle3.norm_before_fc"] is True and fields["eagle3.norm_before_residual"] is True


def test_compare_gguf_reports_a_differing_key_and_a_differing_tensor(base, trained, tmp_path) -> None:
    """The comparator behind "equal to llama.cpp's converter" can fail: other values are found and named."""
    target = _target_gguf(tmp_path / "base.gguf")
    export_heads(trained["eagle3"], tmp_path / "f32.gguf", "gguf", base_model=base, target_gguf=target)
    export_heads(trained["eagle3"], tmp_path / "f16.gguf", "gguf", base_model=base, target_gguf=target, dtype="float16")
    assert compare_gguf(tmp_path / "f32.gguf", tmp_path / "f32.gguf") == []
    differences = compare_gguf(tmp_path / "f32.gguf", tmp_path / "f16.gguf")
    assert "key general.file_type: values differ" in differences
    assert any(line.startswith("tensor blk.0.attn_q.weight: F32") for line in differences)
    other = trained["eagle3"]
    with torch.no_grad():
        other.lm_head.weight[0, 0] += 1.0
    try:
        export_heads(other, tmp_path / "moved.gguf", "gguf", base_model=base, target_gguf=target)
    finally:
        with torch.no_grad():
            other.lm_head.weight[0, 0] -= 1.0
    assert compare_gguf(tmp_path / "f32.gguf", tmp_path / "moved.gguf") == ["tensor output.weight: data differ"]
