"""The facts read from models and tokenizers in one place: vocabulary size and agreement, EOS ids, pad id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from specheads.loading import check_same_vocabulary, eos_token_ids, pad_token_id, vocab_size


def test_vocabulary_size_and_agreement() -> None:
    base, same, other = tiny_model("llama"), tiny_model("gpt2", seed=1), tiny_model("llama", vocab_size=128)
    assert vocab_size(base) == 96 and vocab_size(other) == 128
    check_same_vocabulary(base, same)
    with pytest.raises(ValueError, match=r"vocabulary \(128 tokens\) differs from the base's \(96\)"):
        check_same_vocabulary(base, other)


def test_eos_ids_come_from_the_override_then_the_generation_config_then_the_tokenizer() -> None:
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    assert model.generation_config.eos_token_id is None
    assert eos_token_ids(model) == frozenset()
    assert eos_token_ids(model, tokenizer) == {tokenizer.eos_token_id}
    model.generation_config.eos_token_id = [7, 9]
    assert eos_token_ids(model, tokenizer) == {7, 9}
    assert eos_token_ids(model, tokenizer, override=3) == {3}


def test_pad_id_prefers_the_tokenizer_then_the_config_then_eos() -> None:
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    tokenizer.pad_token, model.generation_config.pad_token_id = None, None
    assert pad_token_id(model) is None
    assert pad_token_id(model, tokenizer) == tokenizer.eos_token_id
    model.generation_config.eos_token_id = [7, 9]
    assert pad_token_id(model) == 7
    model.generation_config.pad_token_id = 4
    assert pad_token_id(model, tokenizer) == 4
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(5)
    assert pad_token_id(model, tokenizer) == 5


def test_a_small_local_checkpoint_loads_without_transformers_progress_bar(tmp_path, capsys) -> None:
    from transformers.utils import logging as hf_logging

    from specheads.loading import load_causal_lm

    tiny_model("llama").save_pretrained(tmp_path / "base")
    capsys.readouterr()
    load_causal_lm(str(tmp_path / "base"))
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # switched off for the load only


def test_bench_drops_only_the_warning_transformers_raises_about_its_own_assisted_call() -> None:
    import logging

    from specheads.bench import _own_assisted_call_warning

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("transformers.generation.utils", logging.WARNING, __file__, 1, message, None, None)

    own = "Passing `generation_config` together with generation-related arguments=({'min_new_tokens'}) is deprecated"
    assert not _own_assisted_call_warning(record(own))
    assert _own_assisted_call_warning(record("Setting `pad_token_id` to `eos_token_id`"))


# ------------------------------------------------------------------------------------------------ --dtype auto
# The documented choice (resolve_dtype's docstring, README "Which dtype"): stored dtype -> the dtype a CPU with bf16
# units loads, the dtype a CPU without them loads. On a GPU every checkpoint loads in its own dtype.
AUTO_ON_A_CPU = {
    "float32": (torch.float32, torch.float32),
    "bfloat16": (torch.bfloat16, torch.float32),  # emulated bf16 is slower than float32
    "float16": (torch.float16, torch.float32),
    "gguf-quantized": (torch.bfloat16, torch.float32),  # a float32 folder of 4-8 bit weights: bf16 loses nothing
    "gguf-plain": (torch.float32, torch.float32),  # a float32 folder of a GGUF file of plain weights
}
OWN_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict[str, Path]:
    """A tiny checkpoint folder per stored kind, the GGUF ones as :func:`specheads.gguf.converted_folder` writes."""
    from specheads import gguf

    root = tmp_path_factory.mktemp("stored")
    folders = {}
    for kind in AUTO_ON_A_CPU:
        folders[kind] = root / kind
        tiny_model("llama").to(OWN_DTYPE.get(kind, torch.float32)).save_pretrained(folders[kind])
        if kind.startswith("gguf"):
            record = {"source": str(root / "gone.gguf"), "sha256": "0" * 64, "quantized": kind == "gguf-quantized"}
            (folders[kind] / gguf.MARKER).write_text(json.dumps(record))
    return folders


@pytest.mark.parametrize("native", [True, False], ids=["bf16-units", "no-bf16-units"])
@pytest.mark.parametrize("kind", AUTO_ON_A_CPU)
def test_dtype_auto_loads_the_documented_dtype_for_every_stored_dtype_and_machine(
    stored, monkeypatch, kind, native
) -> None:
    from transformers import AutoModelForCausalLM

    from specheads.loading import DTYPES, load_causal_lm, resolve_dtype

    monkeypatch.setenv("SPECHEADS_CPU_BF16", "1" if native else "0")
    folder = stored[kind]
    with_units, without_units = AUTO_ON_A_CPU[kind]
    assert load_causal_lm(str(folder), "auto").dtype == (with_units if native else without_units)
    assert resolve_dtype(folder, "auto", "cpu") == resolve_dtype(folder, "auto")
    # On a GPU: what load_causal_lm loads before it moves the model there.
    on_gpu = AutoModelForCausalLM.from_pretrained(folder, dtype=resolve_dtype(folder, "auto", "cuda:0"))
    assert on_gpu.dtype == OWN_DTYPE.get(kind, torch.float32)
    for name, dtype in DTYPES.items():  # a dtype asked for is the dtype loaded, everywhere
        assert resolve_dtype(folder, name) == resolve_dtype(folder, name, "cuda") == dtype


@pytest.mark.parametrize(
    ("flags", "override", "expected"),
    [("fpu avx2 avx512f avx512bw avx512_vnni", None, False),  # Skylake-X / Ice Lake: AVX-512 without bf16
     ("fpu avx2 avx512f avx512_bf16", None, True),  # Zen 4, Cooper Lake
     ("fpu avx2 avx512f amx_bf16 amx_tile", None, True),  # Sapphire Rapids (AMX)
     ("fpu avx2 fma", None, False),  # AVX2 only
     (None, None, False),  # no /proc/cpuinfo
     ("fpu avx2 fma", "1", True),
     ("fpu avx512_bf16 amx_bf16", "0", False)],
    ids=["avx512-without-bf16", "avx512-bf16", "amx", "avx2", "unreadable", "forced-on", "forced-off"],
)  # fmt: skip
def test_bf16_units_are_read_from_the_cpu_flags_unless_overridden(monkeypatch, flags, override, expected) -> None:
    from specheads import loading

    class Cpuinfo:
        def __init__(self, path: str) -> None:
            assert path == "/proc/cpuinfo"

        def read_text(self) -> str:
            if flags is None:
                raise FileNotFoundError("/proc/cpuinfo")
            return f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"

    monkeypatch.setattr(loading, "Path", Cpuinfo)
    if override is None:
        monkeypatch.delenv("SPECHEADS_CPU_BF16", raising=False)
    else:
        monkeypatch.setenv("SPECHEADS_CPU_BF16", override)
    assert loading.cpu_has_native_bf16() is expected


# ------------------------------------------------------------------------------ a hub id the hub cannot serve now
class _NoTransformersLoad:
    """Stands for AutoTokenizer / AutoModelForCausalLM: records a load (transformers' hub path retries for about a
    minute when the hub cannot be reached, so a name that cannot be served must not get there)."""

    calls: list[str] = []

    @classmethod
    def from_pretrained(cls, path, **kwargs):  # noqa: ANN001, ANN003, ANN206
        cls.calls.append(str(path))
        raise OSError("transformers was asked")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An empty hub cache, the hub online, its address a loopback port (9, discard: nothing listens), and
    transformers' loaders replaced by a recorder."""
    from huggingface_hub import constants

    from specheads import loading

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(loading, "AutoTokenizer", _NoTransformersLoad)
    monkeypatch.setattr(loading, "AutoModelForCausalLM", _NoTransformersLoad)
    _NoTransformersLoad.calls = []
    return tmp_path / "hub", monkeypatch


def _one_line_error(load, name: str) -> str:  # noqa: ANN001
    with pytest.raises(ValueError) as error:
        load(name)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{name!r} is neither a local folder")
    assert _NoTransformersLoad.calls == []  # decided before transformers' retrying hub path
    return message


@pytest.mark.parametrize("loader", ["tokenizer", "model"])
def test_a_hub_id_the_hub_cannot_serve_fails_at_once_in_one_line(hub, loader) -> None:
    from specheads.loading import load_causal_lm, load_tokenizer

    _, monkeypatch = hub
    load = load_tokenizer if loader == "tokenizer" else load_causal_lm
    message = _one_line_error(load, "qwen2.5-coder-1.5")
    assert "did you mean 'qwen2.5-coder-1.5b'?" in message
    assert "as a hub id, the hub could not be reached (ConnectError" in message
    assert "it is not valid (" in _one_line_error(load, "org/name/extra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert message.split("; as a hub id")[0] in _one_line_error(load, "qwen2.5-coder-1.5")
    assert "the hub is offline (HF_HUB_OFFLINE) and it is not in the cache" in _one_line_error(load, "org/model")


def test_a_hub_id_in_the_cache_is_left_to_transformers(hub) -> None:
    """Offline, a model downloaded before loads from the cache: the check lets it through."""
    from specheads.loading import load_tokenizer

    cache, monkeypatch = hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = cache / "models--org--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer_config.json").write_text("{}")
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("0" * 40)
    with pytest.raises(ValueError, match="the hub is offline"):  # the recorder's OSError, worded as before
        load_tokenizer("org/cached")
    assert _NoTransformersLoad.calls == ["org/cached"]


@pytest.mark.parametrize(("error_code", "reaches_transformers"), [("RepoNotFound", False), ("EntryNotFound", True)])
def test_the_hubs_answer_decides_in_one_request(hub, error_code, reaches_transformers) -> None:
    """A hub (a loopback server) that has no such repository: one line at once; a repository without config.json
    (a tokenizer-only repo): transformers loads what it has."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from huggingface_hub import constants

    from specheads.loading import load_tokenizer

    _, monkeypatch = hub
    requests = []

    class NotFound(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 - the http.server hook
            requests.append(self.path)
            self.send_response(404)
            self.send_header("X-Error-Code", error_code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:  # noqa: ANN002
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    template = f"http://127.0.0.1:{server.server_port}/{{repo_id}}/resolve/{{revision}}/{{filename}}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    try:
        if reaches_transformers:
            with pytest.raises(ValueError, match="transformers was asked"):
                load_tokenizer("org/tokenizer-only")
            assert _NoTransformersLoad.calls == ["org/tokenizer-only"]
        else:
            assert "the hub has no such model (or it is private or gated" in _one_line_error(load_tokenizer, "org/x")
    finally:
        server.shutdown()
        server.server_close()
    assert requests == [f"/{'org/tokenizer-only' if reaches_transformers else 'org/x'}/resolve/main/config.json"]
