"""Each exporter against the engines' loading tables, the rule checker against broken directories, and
bad input refused with nothing written."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_model
from safetensors.torch import load_file, save_file

from specheads import EagleHead, HeadCheckpointError
from specheads.cli import main
from specheads.export import check_export, export_heads
from specheads.heads.calibration import Calibration

VOCAB, HIDDEN = 96, 32
LAYER = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]


def _read(directory, weights="model.safetensors"):
    return json.loads((directory / "config.json").read_text()), load_file(str(directory / weights))


# ---------------------------------------------------------------------------------------------- layouts
def test_eagle3_is_the_specforge_layout_with_ids_in_both_conventions(base, trained, tmp_path) -> None:
    head = trained["eagle3"]
    result = export_heads(head, tmp_path / "out", "eagle3", base_model=base, base_name="org/base")
    config, tensors = _read(tmp_path / "out")
    layer = {f"midlayer.{n}" for n in LAYER} | {
        f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")
    }
    assert set(tensors) == layer | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert tensors["fc.weight"].shape == (HIDDEN, 3 * HIDDEN)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (4 * 8, 2 * HIDDEN)
    assert tensors["midlayer.self_attn.k_proj.weight"].shape == (2 * 8, 2 * HIDDEN)
    assert tensors["lm_head.weight"].shape == (64, HIDDEN)
    assert tensors["d2t"].dtype == torch.int64 and tensors["d2t"].shape == (64,)
    assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == 64
    assert torch.equal(torch.arange(64) + tensors["d2t"], head.draft_token_ids())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 64 and config["vocab_size"] == VOCAB
    assert config["tie_word_embeddings"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == head.config.layer_ids == [2, 4, 5]  # vLLM: hidden_states
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang: output of layer id
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"]
    assert result.report.engines == ["vllm", "sglang", "llama.cpp"]
    assert "--speculative-algorithm EAGLE3" in result.commands["sglang"]
    assert '"method": "eagle3"' in result.commands["vllm"] and "vllm serve org/base" in result.commands["vllm"]


def test_a_full_draft_vocabulary_writes_no_d2t_or_t2d(base, trained, tmp_path) -> None:
    export_heads(trained["eagle3-full"], tmp_path / "out", "eagle3", base_model=base)
    config, tensors = _read(tmp_path / "out")
    assert "d2t" not in tensors and "t2d" not in tensors  # vLLM raises on a d2t it has no parameter for
    assert tensors["lm_head.weight"].shape == (VOCAB, HIDDEN) and config["draft_vocab_size"] == VOCAB


def test_speculators_format(base, trained, tmp_path) -> None:
    head = trained["eagle3"]
    result = export_heads(head, tmp_path / "out", "speculators", base_model=base, base_name="/models/base")
    config, tensors = _read(tmp_path / "out")
    assert config["speculators_model_type"] == "eagle3" and "model_type" not in config
    assert config["transformer_layer_config"]["model_type"] == "llama"
    assert config["norm_before_residual"] is False  # always written: vLLM assumes true when absent
    assert config["draft_vocab_size"] == 64 and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] >= 1
    assert spec["verifier"]["name_or_path"] == "/models/base"
    assert spec["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert {"embed_tokens.weight", "t2d", "d2t", "fc.weight", "norm.weight", "lm_head.weight"} <= set(tensors)
    assert all(not n.startswith("midlayer.") for n in tensors) and "layers.0.hidden_norm.weight" in tensors
    assert torch.equal(tensors["embed_tokens.weight"], base.get_input_embeddings().weight)
    assert result.report.engines == ["vllm", "speculators", "llama.cpp"]


def test_eagle1_layout(base, trained, tmp_path) -> None:
    result = export_heads(trained["eagle1"], tmp_path / "out", "eagle", base_model=base)
    config, tensors = _read(tmp_path / "out")
    assert set(tensors) == {"fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight"} | {
        f"layers.0.{n}" for n in LAYER
    }  # no input norm, no final norm, no lm_head: vLLM raises on those names
    assert tensors["fc.weight"].shape == (HIDDEN, 2 * HIDDEN)
    assert not tensors["fc.bias"].any()  # trained without a bias: zeros, which SGLang's fc needs
    assert config["architectures"] == ["LlamaForCausalLMEagle", "EagleLlamaForCausalLM"]
    assert "bias" not in config  # "bias": true would give vLLM's attention an uninitialised bias
    assert result.report.engines == ["vllm", "sglang"]


def test_an_eagle1_fc_bias_is_not_served_on_vllm(base, trained, tmp_path) -> None:
    head = trained["eagle1-bias"]
    assert head.fc.bias.abs().max() > 0
    result = export_heads(head, tmp_path / "out", "eagle", base_model=base)
    config, tensors = _read(tmp_path / "out")
    assert config["architectures"] == ["LlamaForCausalLMEagle"]
    assert torch.equal(tensors["fc.bias"], head.fc.bias.detach())
    assert result.report.engines == ["sglang"] and "vllm" not in result.commands
    assert any("vllm not served" in note and "fc_bias=false" in note for note in result.notes)
    with pytest.raises(ValueError, match="vllm cannot serve these heads.*non-zero bias"):
        export_heads(head, tmp_path / "vllm", "eagle", base_model=base, engines=["vllm"])
    assert not (tmp_path / "vllm").exists()


def test_medusa_layout(base, trained, tmp_path) -> None:
    heads = trained["medusa"]
    result = export_heads(heads, tmp_path / "out", "medusa", base_model=base, base_name="/models/base")
    config, tensors = _read(tmp_path / "out", "medusa_lm_head.safetensors")
    assert not (tmp_path / "out" / "model.safetensors").exists()
    assert "architectures" not in config  # TGI looks for an MLP speculator when it is there
    assert config["medusa_num_heads"] == 3 and config["medusa_num_layers"] == 1
    assert config["base_model_name_or_path"] == "/models/base"
    expected = {f"{h}.0.linear.{k}" for h in range(3) for k in ("weight", "bias")} | {f"{h}.1.weight" for h in range(3)}
    assert set(tensors) == expected
    assert tensors["2.1.weight"].shape == (VOCAB, HIDDEN) and tensors["0.0.linear.weight"].shape == (HIDDEN, HIDDEN)
    assert result.report.engines == ["tgi", "tensorrt-llm", "fasterdecoding"]


def test_shared_lm_head_medusa_with_and_without_the_base(base, trained, tmp_path) -> None:
    heads = trained["medusa-shared"]
    result = export_heads(heads, tmp_path / "shared", "medusa")
    _, tensors = _read(tmp_path / "shared", "medusa_lm_head.safetensors")
    assert "0.1.weight" not in tensors and result.report.engines == ["tgi", "fasterdecoding"]
    result = export_heads(heads, tmp_path / "copied", "medusa", base_model=base)
    _, tensors = _read(tmp_path / "copied", "medusa_lm_head.safetensors")
    assert torch.equal(tensors["1.1.weight"], base.get_output_embeddings().weight)
    assert "tensorrt-llm" in result.report.engines


def test_unsorted_layer_ids_are_written_in_engine_order_with_fc_permuted(base, tmp_path) -> None:
    torch.manual_seed(0)
    head = EagleHead.from_base(base, version=3, layer_ids=[5, 2, 4])
    export_heads(head, tmp_path / "out", "eagle3", base_model=base)
    config, tensors = _read(tmp_path / "out")
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    blocks = head.fc.weight.detach().split(HIDDEN, dim=1)
    assert torch.equal(tensors["fc.weight"], torch.cat([blocks[1], blocks[2], blocks[0]], dim=1))
    features = [torch.randn(1, 3, HIDDEN) for _ in range(3)]  # hidden_states[5], [2], [4]
    fused = torch.nn.functional.linear(torch.cat([features[1], features[2], features[0]], -1), tensors["fc.weight"])
    torch.testing.assert_close(fused, head.fuse(features))


def test_bfloat16_export(base, trained, tmp_path) -> None:
    result = export_heads(trained["eagle3"], tmp_path / "out", "eagle3", base_model=base, dtype="bfloat16")
    config, tensors = _read(tmp_path / "out")
    assert config["torch_dtype"] == "bfloat16" and tensors["fc.weight"].dtype == torch.bfloat16
    assert tensors["d2t"].dtype == torch.int64 and result.report.ok


# ---------------------------------------------------------------------------------------------- the rule checker
def _mutate(directory, change_tensors=None, change_config=None) -> None:
    config, tensors = _read(directory)
    if change_tensors:
        change_tensors(tensors)
        save_file(tensors, str(directory / "model.safetensors"))
    if change_config:
        change_config(config)
        (directory / "config.json").write_text(json.dumps(config))


def _problems(directory) -> str:
    report = check_export(directory)
    assert not report.ok
    return "\n".join(report.all_problems())


@pytest.mark.parametrize(
    ("change_tensors", "change_config", "expected"),
    [
        (lambda t: t.pop("norm.weight"), None, "missing tensor norm.weight"),
        (lambda t: t.update({"lm_head.weight": torch.zeros(60, HIDDEN)}), None, "lm_head.weight has shape"),
        (lambda t: t.update({"medusa_head.0.weight": torch.zeros(2)}), None, "vllm: unknown tensor medusa_head"),
        (lambda t: t.update({"medusa_head.0.weight": torch.zeros(2)}), None, "sglang: unknown tensor medusa_head"),
        (lambda t: t.pop("d2t"), None, "missing tensor d2t"),
        (lambda t: t.update({"d2t": t["d2t"] + 40}), None, "outside the vocabulary"),
        (None, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 4, 5]), "conventions disagree"),
        (None, lambda c: c.pop("eagle_aux_hidden_state_layer_ids"), "vLLM reads eagle_config's ids"),
        (None, lambda c: c.update(tie_word_embeddings=True), "tie_word_embeddings"),
        (None, lambda c: c.update(draft_vocab_size=VOCAB), "d2t with a full draft vocabulary"),
    ],
)
def test_the_checker_names_what_an_engine_would_get_wrong(
    base, trained, tmp_path, change_tensors, change_config, expected
) -> None:
    export_heads(trained["eagle3"], tmp_path / "out", "eagle3", base_model=base)
    report = check_export(tmp_path / "out")
    assert report.ok, report
    _mutate(tmp_path / "out", change_tensors, change_config)
    assert expected in _problems(tmp_path / "out")


@pytest.mark.parametrize(
    ("change_tensors", "change_config", "expected"),
    [
        (lambda t: t.pop("embed_tokens.weight"), None, "speculators: no embed_tokens.weight"),
        (lambda t: t.pop("t2d"), None, "speculators: no t2d"),
        (None, lambda c: c.pop("norm_before_residual"), "norm_before_residual is not written"),
        (None, lambda c: c["speculators_config"]["verifier"].pop("name_or_path"), "verifier.name_or_path"),
        (None, lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 2, 5]), "repeat a layer"),
    ],
)
def test_the_checker_on_speculators(base, trained, tmp_path, change_tensors, change_config, expected) -> None:
    export_heads(trained["eagle3"], tmp_path / "out", "speculators", base_model=base)
    _mutate(tmp_path / "out", change_tensors, change_config)
    assert expected in _problems(tmp_path / "out")


def test_the_checker_on_eagle1_and_medusa(base, trained, tmp_path) -> None:
    export_heads(trained["eagle1"], tmp_path / "e1", "eagle", base_model=base)
    _mutate(tmp_path / "e1", lambda t: t.update({"norm.weight": torch.ones(HIDDEN)}))
    assert "vllm: unknown tensor norm.weight: vLLM raises" in _problems(tmp_path / "e1")
    export_heads(trained["eagle1"], tmp_path / "e1b", "eagle", base_model=base)
    _mutate(tmp_path / "e1b", lambda t: t.update({"fc.bias": torch.ones(HIDDEN)}))
    assert "vLLM's EAGLE-1 fc has no bias" in _problems(tmp_path / "e1b")
    export_heads(trained["medusa"], tmp_path / "m", "medusa", base_model=base)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "architectures": ["MedusaModel"]}))
    assert "tgi: config has 'architectures'" in _problems(tmp_path / "m")


def test_the_checker_on_unreadable_directories(tmp_path) -> None:
    assert "not a directory" in "\n".join(check_export(tmp_path / "missing").all_problems())
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 40)
    assert "not a readable safetensors file" in "\n".join(check_export(tmp_path).all_problems())
    (tmp_path / "config.json").write_text("{not json")
    assert "cannot be read" in "\n".join(check_export(tmp_path).all_problems())


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_exports_are_refused_and_write_nothing(base, trained, tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown export format 'onnx'"):
        export_heads(trained["eagle3"], tmp_path / "a", "onnx", base_model=base)
    with pytest.raises(ValueError, match="eagle3 format holds EAGLE-3 heads; these are MedusaHeads"):
        export_heads(trained["medusa"], tmp_path / "b", "eagle3", base_model=base)
    with pytest.raises(ValueError, match="eagle format holds EAGLE-1 heads; these are EAGLE-3"):
        export_heads(trained["eagle3"], tmp_path / "c", "eagle", base_model=base)
    with pytest.raises(ValueError, match="needs the base"):
        export_heads(trained["eagle3"], tmp_path / "d", "speculators")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        export_heads(trained["eagle3"], taken, "eagle3", base_model=base)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"] and (taken / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]  # no staging folder left behind


def test_duplicate_layer_ids_cannot_be_served(base, tmp_path) -> None:
    head = EagleHead.from_base(base, version=3, layer_ids=[2, 2, 5])
    with pytest.raises(ValueError, match="repeat a layer"):
        export_heads(head, tmp_path / "out", "eagle3", base_model=base)


def test_heads_for_another_base_are_refused(trained, tmp_path) -> None:
    other = tiny_model("llama", seed=7, vocab_size=VOCAB, layers=8)
    with pytest.raises(HeadCheckpointError, match="another base"):
        export_heads(trained["eagle3"], tmp_path / "out", "eagle3", base_model=other)
    trained["eagle3"].bind_base(trained["eagle3"]._base[0])  # (restore nothing: attach failed before binding)


# ---------------------------------------------------------------------------------------------- the command line
def test_cli_export_and_check(base, trained, tmp_path, capsys) -> None:
    base.save_pretrained(tmp_path / "base")
    trained["medusa"].save_pretrained(tmp_path / "heads")
    base_dir, heads_dir = str(tmp_path / "base"), str(tmp_path / "heads")
    out = tmp_path / "out"
    assert main(["export", "--heads", heads_dir, "--base", base_dir, "--format", "medusa", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tgi: text-generation-launcher --model-id" in printed and "ok" in printed
    assert main(["export", "--check", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["X"]}))
    assert main(["export", "--check", str(out)]) == 1
    assert "config has 'architectures'" in capsys.readouterr().err
    assert main(["export", "--heads", heads_dir, "--format", "medusa"]) == 2
    assert "needs --out" in capsys.readouterr().err
    again = ["export", "--heads", heads_dir, "--base", base_dir, "--format", "medusa", "--out", str(out)]
    assert main(again) == 2 and "refusing to overwrite" in capsys.readouterr().err
    assert main(["export", "--heads", heads_dir, "--format", "eagle3", "--out", str(tmp_path / "x")]) == 2
    assert "eagle3 format holds EAGLE-3 heads" in capsys.readouterr().err


def _verdicts(printed: str) -> dict[str, list[str]]:
    """``export --check``'s lines per engine (``  engine: ...``), the shared ``problem:`` lines left out."""
    verdicts: dict[str, list[str]] = {}
    for line in printed.splitlines():
        engine, colon, verdict = line.strip().partition(": ")
        if line.startswith("  ") and colon and engine != "problem":
            verdicts.setdefault(engine, []).append(verdict)
    return verdicts


def test_check_gives_each_engine_one_verdict_that_agrees_with_the_shared_problems(base, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    export_heads(EagleHead.from_base(base, version=3), out, "eagle3", base_model=base)
    assert main(["export", "--check", str(out)]) == 0
    targeted = {e: v for e, v in _verdicts(capsys.readouterr().out).items() if not v[0].startswith("not targeted")}
    assert len(targeted) >= 2 and all(len(v) == 1 and v[0].startswith("loads") for v in targeted.values())
    _mutate(out, lambda t: t.pop("fc.weight"))  # a problem of every engine's: none may still say "loads"
    assert main(["export", "--check", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "  problem: missing tensor fc.weight" in printed
    verdicts, spoiled = _verdicts(printed), ["would not serve it correctly (the problems above)"]
    assert {engine: verdicts[engine] for engine in targeted} == dict.fromkeys(targeted, spoiled)


def test_the_shipped_default_heads_export_for_every_eagle3_engine(tmp_path, capsys) -> None:
    for format in ("eagle3", "speculators"):
        argv = [
            "export",
            "--heads",
            "default",
            "--base",
            "default",
            "--format",
            format,
            "--out",
            str(tmp_path / format),
        ]
        assert main(argv) == 0
        assert main(["export", "--check", str(tmp_path / format)]) == 0
    printed = capsys.readouterr().out
    assert "sglang: python -m sglang.launch_server" in printed and "--speculative-algorithm EAGLE3" in printed
    assert main(["export", "--heads", "default", "--base", "default", "--format", "eagle", "--out", "x"]) == 2
    assert "eagle format holds EAGLE-1 heads; these are EAGLE-3" in capsys.readouterr().err


def test_serve_commands_name_local_folders_by_absolute_path(tmp_path, monkeypatch) -> None:
    """Engines read a relative directory name as a hub id: the printed commands must not depend on the cwd."""
    base = tiny_model("llama", layers=6)
    head = EagleHead.from_base(base, version=3, layer_ids=[1, 3, 5])
    (tmp_path / "base").mkdir()
    monkeypatch.chdir(tmp_path)
    result = export_heads(head, "out", "eagle3", base_model=base, base_name="base")
    for command in result.commands.values():
        assert str(tmp_path / "out") in command
    assert f"vllm serve {tmp_path / 'base'} " in result.commands["vllm"]
    hub = export_heads(head, "hub", "eagle3", base_model=base, base_name="org/base")
    assert "vllm serve org/base " in hub.commands["vllm"]  # a hub id (no such folder here) stays a hub id


def test_sglang_tree_flags_come_from_the_calibrated_eagle2_tree(base, trained, tmp_path) -> None:
    head = trained["eagle3"]
    default = export_heads(head, tmp_path / "plain", "eagle3", base_model=base, base_name="org/base")
    head.calibration = Calibration([[0]], record={"dynamic": {"top_k": 3, "depth": 5, "total_tokens": 11}})
    try:
        calibrated = export_heads(head, tmp_path / "calibrated", "eagle3", base_model=base, base_name="org/base")
    finally:
        head.calibration = None
    flags = "--speculative-num-steps 5 --speculative-eagle-topk 3 --speculative-num-draft-tokens 11"
    assert flags in calibrated.commands["sglang"]
    assert flags not in default.commands["sglang"] and "--speculative-eagle-topk 4" in default.commands["sglang"]


@pytest.mark.parametrize("format", ["eagle3", "speculators"])
def test_a_folder_export_that_fails_midway_leaves_nothing_behind(base, trained, tmp_path, monkeypatch, format) -> None:
    from specheads.export import formats

    def broken(tensors, path, metadata=None):  # noqa: ANN001, ANN202
        with open(path, "wb") as handle:
            handle.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(formats, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        export_heads(trained["eagle3"], tmp_path / "out", format, base_model=base, base_name="org/base")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy


def test_an_eagle3_folder_without_t2d_serves_as_modelopt_writes_it(base, trained, tmp_path) -> None:
    """ModelOpt writes d2t but no t2d, and vLLM's and SGLang's EAGLE-3 loaders skip t2d: no problem to report."""
    export_heads(trained["eagle3"], tmp_path / "out", "eagle3", base_model=base)
    _mutate(tmp_path / "out", lambda t: t.pop("t2d"), None)
    report = check_export(tmp_path / "out")
    assert report.ok and report.engines == ["vllm", "sglang", "llama.cpp"], report.all_problems()
