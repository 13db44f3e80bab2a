"""Every registry entry is a complete method: each part it names has the type the registry declares, its recipe
section loads, it builds, saves and loads, decodes losslessly on four architectures, alone and in ragged batches,
trains through the trainer's step seam (a finite loss that falls on a fixed batch), evaluates its agreement per
depth, prices a draft level for calibration, calibrates (or its entry declares it cannot, and calibrate refuses it),
and exports and checks every format it lists (folders and one-file formats).

Nothing here names a method: a new entry is tested the moment it is registered. Each check is a function of a
:class:`~specheads.registry.HeadType` (:func:`check_method` runs them all), so that a method defined outside
specheads, the toy method of ``toy_method/`` (one residual layer drafting a chain), passes the same checks with one
entry, registered through :func:`specheads.registry.register`, and no other file changed: a new method is a folder
and an entry.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import ARCHITECTURES, greedy_reference, tiny_model, tiny_tokenizer
from methods import toy_method
from training_helpers import ragged_batch

from specheads import SpecDecoder
from specheads.export import check_export, export_heads
from specheads.heads import load_heads
from specheads.registry import (
    HEAD_TYPES,
    BuildHeads,
    DraftCost,
    Evaluate,
    Evaluation,
    FileChecker,
    FileExporter,
    FolderChecker,
    FolderReader,
    FolderWriter,
    HeadsModule,
    HeadType,
    LayoutDetector,
    MakeDrafter,
    TrainStep,
    export_formats,
    register,
)
from specheads.training.config import LogConfig, RecipeConfig, TrainConfig, load_config
from specheads.training.evaluate import simulated_tau
from specheads.training.run_state import Run
from specheads.training.step import StepContext, StepResult
from specheads.training.trainer import step_context, train_batch

METHODS = sorted(HEAD_TYPES)
TRAIN_STEPS = 6
TRAIN_LR = 3e-3


# ------------------------------------------------------------------------------------------------------ helpers
def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(2, 96, (1, length), generator=torch.Generator().manual_seed(seed))


def _greedy(base, prompt: torch.Tensor, new_tokens: int) -> list[int]:  # noqa: ANN001
    return greedy_reference(base, prompt, new_tokens)[0, prompt.shape[1] :].tolist()


def _section(method: HeadType, **values: Any) -> Any:
    """The method's recipe section: its defaults, with those of ``values`` it has."""
    recipe = method.recipe_section()
    return recipe(**{k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(recipe)}})


def _batch(seed: int = 0, rows: int = 2, length: int = 24) -> dict[str, torch.Tensor]:
    """A training batch as the trainer's loader gives it: the second row right-padded, the first tokens no target."""
    return ragged_batch(seed, rows, length, padding=4)


def _dataset() -> Any:
    """Tokenised training rows as the trainer hands them to ``build`` (a method may count their tokens)."""
    import datasets

    rows = [_batch(seed) for seed in range(4)]
    columns = {key: torch.cat([batch[key] for batch in rows]).tolist() for key in rows[0]}
    return datasets.Dataset.from_dict(columns).with_format("torch")


def _heads(method: HeadType, base, **section: Any):  # noqa: ANN001, ANN202
    torch.manual_seed(0)
    return method.build_heads(base, _section(method, **section), _dataset())


def _probe_sections(method: HeadType, fmt: str) -> list[dict[str, Any]]:
    """Recipe sections to try for heads a format holds: the method's default, then one field changed at a time,
    a string field to the format's name (a variant's format is named after it), a field that takes an integer (an
    optional one, or one that takes other values too) to 1, 2 or 3 (a version, a size), each kept only where the
    section validates."""
    recipe = method.recipe_section()
    hints = typing.get_type_hints(recipe)
    probes: list[dict[str, Any]] = [{}]
    for field in dataclasses.fields(recipe):
        hint = hints[field.name]
        values = [fmt] if hint is str else [1, 2, 3] if hint is int or int in typing.get_args(hint) else []
        for value in values:
            if field.name == "type" or value == getattr(recipe(), field.name):
                continue
            try:
                recipe(**{field.name: value}).validate()
            except Exception:  # noqa: BLE001 - a value the section refuses is no candidate
                continue
            probes.append({field.name: value})
    return probes


def _exported(method: HeadType, base, fmt: str, write: Callable[[Any, int], Any]) -> tuple[Any, Any]:  # noqa: ANN001
    """``(heads, write(heads, attempt))`` for the first probed heads (:func:`_probe_sections`) that ``fmt`` holds."""
    errors = []
    for attempt, section in enumerate(_probe_sections(method, fmt)):
        heads = _heads(method, base, **section)
        try:
            return heads, write(heads, attempt)
        except ImportError as error:
            pytest.skip(f"needs the package the {fmt} format writes with: {error}")
        except ValueError as error:
            errors.append(f"{section}: {error}")
    pytest.fail(f"no heads of {method.name} export as {fmt}: {errors}")


def _base_folder(base, folder: Path) -> Path:  # noqa: ANN001
    """``base`` saved with a BPE tokenizer of its vocabulary, as ``specheads export --base DIR`` reads a base."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab=tiny_tokenizer().get_vocab(), merges=[], unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")
    base.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _tiny_run(method: HeadType, base, heads, section: Any, output: Path) -> Run:  # noqa: ANN001
    """A trainer :class:`Run` over in-memory parts (one CPU process, no data loader): what ``setup`` builds."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import get_scheduler

    config = RecipeConfig(
        heads=section,
        train=TrainConfig(lr=TRAIN_LR, steps=TRAIN_STEPS, schedule="constant"),
        log=LogConfig(every=2),  # metrics logged every other step: both paths of a method's step run
    )
    AcceleratorState._reset_state(reset_partial_state=False)  # as the trainer does: this run's own settings
    accelerator = Accelerator(cpu=True, mixed_precision="no")
    optimizer = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=TRAIN_LR, weight_decay=0.0)
    heads, optimizer = accelerator.prepare(heads, optimizer)
    scheduler = get_scheduler("constant", optimizer)
    return Run(config, accelerator, base, heads, optimizer, scheduler, None, TRAIN_STEPS, 1, output, method)


def _part(path: str) -> Any:
    """The object a registry entry names as ``"module:attribute"``."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _callable_as(function: Callable[..., Any], protocol: type, what: str) -> None:
    """``function`` can be called as ``protocol.__call__`` declares: its positional arguments, then its keywords."""
    wanted = list(inspect.signature(protocol.__call__).parameters.values())[1:]  # without self
    positional = [object() for p in wanted if p.kind is p.POSITIONAL_ONLY]
    keywords = {p.name: object() for p in wanted if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    try:
        inspect.signature(function).bind(*positional, **keywords)
    except TypeError as error:
        pytest.fail(f"{what} cannot be called as a {protocol.__name__}: {error}")


# ------------------------------------------------------------------------------------------------------- checks
def check_parts_have_their_types(method: HeadType, tmp_path: Path) -> None:
    """Every part the entry names can be called as the registry's protocol for it declares, and the heads it builds
    are a :class:`HeadsModule`."""
    parts = {
        method.build: BuildHeads,
        method.train_step: TrainStep,
        method.evaluate: Evaluate,
        method.drafter: MakeDrafter,
        **({method.draft_cost: DraftCost} if method.draft_cost is not None else {}),
    }
    for path, protocol in parts.items():
        _callable_as(_part(path), protocol, f"{method.name}'s {path}")
    assert isinstance(_heads(method, tiny_model("llama", seed=1, layers=4)), HeadsModule), method.name


def check_recipe_section_loads(method: HeadType, tmp_path: Path) -> None:
    """``heads.type=<name>`` in a recipe gives the method's section, with defaults that validate."""
    config = load_config(None, [f"heads.type={method.name}", f"data.paths=[{tmp_path}]"])
    assert isinstance(config.heads, method.recipe_section()), method.name
    assert config.heads.type == method.name


def check_builds_saves_loads_and_decodes(method: HeadType, tmp_path: Path) -> None:
    """Fresh heads save, load back bit for bit, and decode exactly the base's greedy text, alone and batched."""
    name = method.name
    for arch in ARCHITECTURES:
        base = tiny_model(arch, seed=1, layers=4)
        heads = _heads(method, base)
        assert isinstance(heads, method.module_class())
        heads.save_pretrained(tmp_path / arch)
        loaded = load_heads(tmp_path / arch, base)
        assert type(loaded) is type(heads)
        for key, value in heads.state_dict().items():
            torch.testing.assert_close(loaded.state_dict()[key], value, rtol=0, atol=0, msg=f"{name} {arch} {key}")
        decoder = SpecDecoder(base, method.make_drafter(loaded))
        prompts = [_prompt(length, seed) for seed, length in enumerate((1, 6, 17))]
        for prompt in prompts:
            expected = _greedy(base, prompt, 10)
            assert decoder.generate(prompt, max_new_tokens=10).new_tokens == expected, f"{name} on {arch}"
        batch = decoder.generate([p[0] for p in prompts], max_new_tokens=10)
        for prompt, out in zip(prompts, batch, strict=True):
            assert out.new_tokens == _greedy(base, prompt, 10), f"{name} on {arch}, batched"


def check_trains(method: HeadType, tmp_path: Path) -> None:
    """Through the trainer's own micro-batch (:func:`train_batch`: the step context, the method's step resolved once
    per run, backward, clipping, optimizer): typed results, finite losses that fall over a few steps on one batch."""
    # the trainer's frozen base; sharper than a random one, so that a draft copied from it still has something to learn
    base = tiny_model("llama", seed=1, layers=4, logit_scale=4.0).requires_grad_(False)
    section = _section(method)
    section.validate()
    heads = _heads(method, base)
    run = _tiny_run(method, base, heads, section, tmp_path)
    assert run.train_step is not None  # resolved when the run was built, not per micro-batch
    batch = _batch()
    context = step_context(run, log_metrics=True)
    assert isinstance(context, StepContext) and context.section is section and context.joint is None
    assert context.module is heads and context.step == 0 and context.epoch == 0
    result = run.train_step(context, batch)
    assert isinstance(result, StepResult) and result.loss.dim() == 0 and result.loss.requires_grad
    assert all(isinstance(key, str) and isinstance(value, float) for key, value in result.metrics.items())
    before = {key: value.detach().clone() for key, value in heads.state_dict().items()}
    losses = []
    for _ in range(TRAIN_STEPS):
        metrics = train_batch(run, batch)
        run.step += 1
        run.batches_seen += 1
        assert all(isinstance(value, float) for value in metrics.values()), metrics
        losses.append(metrics["loss"])
    assert all(math.isfinite(loss) for loss in losses), f"{method.name}: {losses}"
    assert losses[-1] < losses[0], f"{method.name}: the loss on a fixed batch does not fall: {losses}"
    assert any(not torch.equal(value, heads.state_dict()[key]) for key, value in before.items()), "nothing trained"


def check_evaluates(method: HeadType, tmp_path: Path) -> None:
    """The method's held-out evaluation is an :class:`Evaluation` (its keys, no others): agreement with the base's
    greedy token per depth, which the trainer turns into simulated tau when it comes per rank (as it must for a
    calibratable method: calibration grows trees from it)."""
    base = tiny_model("llama", seed=1, layers=4)
    heads = _heads(method, base).eval()
    batches = [_batch(seed) for seed in (1, 2, 3)]
    result = method.evaluate_fn()(base, heads, iter(batches), max_batches=2)
    assert Evaluation.__required_keys__ <= set(result) <= set(typing.get_type_hints(Evaluation)), sorted(result)
    assert "agreement_by_rank" in result or not method.calibratable, f"{method.name} is calibratable"
    agreement = result["agreement_with_base_greedy"]
    assert len(agreement) >= 1 and all(0.0 <= value <= 1.0 for value in agreement), agreement
    if "positions" in result:
        assert len(result["positions"]) == len(agreement) and result["positions"][0] > 0
    if "agreement_by_rank" in result:
        by_rank = result["agreement_by_rank"]
        assert len(by_rank) == len(agreement) and all(0.0 <= p <= 1.0 for depth in by_rank for p in depth)
        taus = simulated_tau(by_rank)
        assert taus and all(math.isfinite(tau) and tau >= 1.0 for tau in taus.values()), taus


def check_prices_a_draft_level(method: HeadType, tmp_path: Path) -> None:
    """Calibration's draft-cost model: a finite, non-negative number of milliseconds."""
    base = tiny_model("llama", seed=1, layers=4)
    cost = method.draft_cost_ms(_heads(method, base).eval())
    assert isinstance(cost, float) and math.isfinite(cost) and cost >= 0.0, cost


def check_calibrates(method: HeadType, tmp_path: Path) -> None:
    """``calibrate`` times trees for a calibratable method's heads and records the fastest; the heads of a method
    whose entry says it cannot be calibrated are refused with a ValueError (which the CLI prints as one line)."""
    from specheads.calibrate import calibrate

    base = tiny_model("llama", seed=1, layers=4)
    heads = _heads(method, base).eval()
    options = {"batches": 1, "max_nodes": 4, "prompt_tokens": 8, "new_tokens": 4}
    if not method.calibratable:
        with pytest.raises(ValueError, match="cannot be calibrated"):
            calibrate(base, heads, _dataset(), **options)
        return
    record = calibrate(base, heads, _dataset(), **options).record
    timed = [row["tree"] for row in record["measured"]]
    assert record["choices"] in timed and record["plain_tokens_per_s"] > 0, record


def check_declares_its_formats(method: HeadType, tmp_path: Path) -> None:
    """Every listed format has its spec: a folder layout (written, checked, read and recognised when it is a layout
    the method loads) or one file (exported and checked), each part callable as the registry's protocol for it."""
    specs = method.export_formats()
    assert set(method.formats) == set(specs), method.name
    assert set(method.layouts) <= set(method.formats), method.name
    protocols = {
        "write": FolderWriter,
        "export": FileExporter,
        "read": FolderReader,
        "check": FolderChecker,
        "detect": LayoutDetector,
        "check_file": FileChecker,
    }
    for fmt, spec in specs.items():
        assert spec.name == fmt
        if spec.export is not None:
            assert spec.write is None and spec.suffix and spec.check_file is not None, fmt
        else:
            assert spec.write is not None and spec.weights and spec.check is not None, fmt
        for field, protocol in protocols.items():
            if getattr(spec, field) is not None:
                _callable_as(getattr(spec, field), protocol, f"{method.name}'s {fmt} {field}")
    for layout in method.layouts:
        assert specs[layout].read is not None and specs[layout].detect is not None, layout


def check_folder_format(method: HeadType, fmt: str, tmp_path: Path) -> None:
    """The format exports, passes its engines' checks, is recognised by its own detector, reads back as the same
    heads and decodes losslessly."""
    base = tiny_model("llama", seed=1, layers=8)  # deep enough for distinct default feature layers

    def write(heads, attempt: int):  # noqa: ANN001, ANN202
        return export_heads(heads, tmp_path / f"{fmt}-{attempt}", fmt, base_model=base)

    heads, result = _exported(method, base, fmt, write)
    assert result.report.ok, result.report.render()
    assert check_export(result.directory).format == fmt  # recognised by its own detector
    back = load_heads(result.directory, base)
    assert type(back) is type(heads)  # a format several methods write is read by the method that wrote it
    for key, value in heads.state_dict().items():
        torch.testing.assert_close(back.state_dict()[key], value, msg=f"{method.name} {fmt} {key}")
    decoder = SpecDecoder(base, method.make_drafter(back))
    prompt = _prompt(9, seed=3)
    assert decoder.generate(prompt, max_new_tokens=8).new_tokens == _greedy(base, prompt, 8)


def check_file_format(method: HeadType, fmt: str, tmp_path: Path) -> None:
    """A one-file format (``spec.export``) writes its file next to a base folder (model and tokenizer), which its
    own ``check_file`` and :func:`check_export` pass."""
    spec = method.export_formats()[fmt]
    base = tiny_model("llama", seed=1, layers=8)
    folder = _base_folder(base, tmp_path / "base")

    def write(heads, attempt: int):  # noqa: ANN001, ANN202
        out = tmp_path / f"draft-{attempt}{spec.suffix}"
        return export_heads(heads, out, fmt, base_model=base, base_name=str(folder))

    _, result = _exported(method, base, fmt, write)
    path = Path(result.directory)
    assert result.format == fmt and path.is_file() and path.suffix == spec.suffix, result.render()
    assert result.report.ok, result.report.render()
    assert spec.check_file(path, None).ok
    report = check_export(path, fmt)
    assert report.ok, report.render()


def folder_formats(method: HeadType) -> list[str]:
    return [fmt for fmt, spec in method.export_formats().items() if spec.write is not None]


def file_formats(method: HeadType) -> list[str]:
    return [fmt for fmt, spec in method.export_formats().items() if spec.export is not None]


CHECKS = (
    check_recipe_section_loads,
    check_declares_its_formats,
    check_builds_saves_loads_and_decodes,
    check_trains,
    check_evaluates,
    check_parts_have_their_types,
    check_prices_a_draft_level,
    check_calibrates,
)


def check_method(method: HeadType, tmp_path: Path) -> None:
    """Every check of this suite on one method, each in a folder of its own."""
    for check in CHECKS:
        check(method, tmp_path / check.__name__)
    for fmt in folder_formats(method):
        check_folder_format(method, fmt, tmp_path / f"folder-{fmt}")
    for fmt in file_formats(method):
        check_file_format(method, fmt, tmp_path / f"file-{fmt}")


def check_registry_formats() -> None:
    """Format names are unique, and a format several methods write is told apart by a specific detector and at
    most one fallback."""
    assert len(export_formats()) == len(set(export_formats()))
    for fmt in export_formats():
        specs = [m.export_formats()[fmt] for m in HEAD_TYPES.values() if fmt in m.formats]
        assert sum(not spec.fallback for spec in specs) >= len(specs) - 1, fmt


# ------------------------------------------------------------------------------------- every registered method
@pytest.mark.parametrize("name", METHODS)
def test_a_methods_recipe_section_loads(name: str, tmp_path) -> None:
    check_recipe_section_loads(HEAD_TYPES[name], tmp_path)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_builds_saves_loads_and_decodes_losslessly(name: str, tmp_path) -> None:
    check_builds_saves_loads_and_decodes(HEAD_TYPES[name], tmp_path)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_trains_through_the_trainers_step(name: str, tmp_path) -> None:
    check_trains(HEAD_TYPES[name], tmp_path)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_evaluates_agreement_per_depth(name: str, tmp_path) -> None:
    check_evaluates(HEAD_TYPES[name], tmp_path)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_prices_a_draft_level(name: str, tmp_path) -> None:
    check_prices_a_draft_level(HEAD_TYPES[name], tmp_path)


@pytest.mark.parametrize("name", METHODS)
def test_a_methods_parts_have_the_types_the_registry_declares(name: str, tmp_path) -> None:
    check_parts_have_their_types(HEAD_TYPES[name], tmp_path)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_calibrates_or_declares_it_cannot(name: str, tmp_path) -> None:
    check_calibrates(HEAD_TYPES[name], tmp_path)


FOLDER_FORMATS = [(name, fmt) for name in METHODS for fmt in folder_formats(HEAD_TYPES[name])]
FILE_FORMATS = [(name, fmt) for name in METHODS for fmt in file_formats(HEAD_TYPES[name])]


@pytest.mark.parametrize(("name", "fmt"), FOLDER_FORMATS)
def test_every_folder_format_of_a_method_exports_checks_and_reads_back(name: str, fmt: str, tmp_path) -> None:
    check_folder_format(HEAD_TYPES[name], fmt, tmp_path)


@pytest.mark.parametrize(("name", "fmt"), FILE_FORMATS)
def test_every_file_format_of_a_method_exports_and_checks(name: str, fmt: str, tmp_path) -> None:
    check_file_format(HEAD_TYPES[name], fmt, tmp_path)


@pytest.mark.parametrize("name", METHODS)
def test_every_listed_format_has_its_spec_and_every_layout_its_method(name: str, tmp_path) -> None:
    check_declares_its_formats(HEAD_TYPES[name], tmp_path)


def test_format_names_are_unique_and_shared_formats_told_apart() -> None:
    check_registry_formats()


# ------------------------------------------------------------------------- a new method: a folder and an entry
TOY_FOLDER = Path(toy_method.__file__).parent
TOY = toy_method.ENTRY
# What a method folder may import of specheads: the method API (one facade, three phase modules), and the registry
# for its entry.
METHOD_API = {"specheads.methods.api", "specheads.methods.api_decode", "specheads.methods.api_train"}
METHOD_API |= {"specheads.methods.api_export", "specheads.registry"}


@pytest.fixture
def toy_registered() -> Any:
    """The toy method, registered through the public call for one test (the registry has no unregister: a method
    stays for the process's life, so the test's own teardown takes it out)."""
    assert TOY.name not in HEAD_TYPES
    yield register(TOY)
    del HEAD_TYPES[TOY.name]


def test_the_toy_method_uses_only_the_declared_method_api() -> None:
    for path in sorted(TOY_FOLDER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert name.split(".")[0] != "specheads" or name in METHOD_API, f"{path.name}: {name}"


def test_a_new_method_is_a_folder_and_an_entry(toy_registered: HeadType, tmp_path) -> None:
    """The toy method, registered with one entry, passes every check of this suite."""
    assert HEAD_TYPES[TOY.name] is toy_registered is TOY
    assert {"toy", "toy-file"} <= set(export_formats())
    check_registry_formats()
    check_method(TOY, tmp_path)


def test_register_refuses_a_taken_name_and_a_layout_it_does_not_write() -> None:
    with pytest.raises(ValueError, match="registered already"):
        register(dataclasses.replace(TOY, name=METHODS[0]))
    with pytest.raises(ValueError, match="not among its formats"):
        register(dataclasses.replace(TOY, layouts=("elsewhere",)))
    assert TOY.name not in HEAD_TYPES


def _export_help(*setup: str) -> str:
    """``specheads export --help`` in a fresh interpreter, after the ``setup`` statements, run from tests/ (where
    ``methods.toy_method`` imports, as a method installed outside specheads would)."""
    code = "; ".join([*setup, "from specheads.cli import main", "raise SystemExit(main(['export', '--help']))"])
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=TOY_FOLDER.parents[1], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_method_registered_through_the_public_call_is_an_export_format_of_the_cli() -> None:
    registering = ("from methods import toy_method", "from specheads.registry import register")
    registered = _export_help(*registering, "register(toy_method.ENTRY)")
    assert "toy,toy-file}" in registered  # the --format choices
    assert "toy-file" not in _export_help(*registering)  # importing the method registers nothing
