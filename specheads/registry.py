"""One registry of methods with trained drafters: each entry names everything about one method, which lives in its
own folder (``specheads/methods/<name>/``: recipe section, heads module, drafter, training step and evaluation).

The entry also states what the rest of specheads asks of a method: the export formats it writes, the engine layouts
whose folders load as it, its draft-cost model for ``calibrate``, the family of trees its drafter grows while
decoding (their names, size keywords and calibration record, which the engine reads without naming a kind), how it
trains jointly with the base (its joint-training hooks). The decoder, CLI, trainer, calibration and export look a
method up in its entry and read these fields rather than comparing its name; a new method is a folder and an entry.

Entries name their parts as ``"module:attribute"`` strings resolved on first use (as torchtune's ``_component_``
configs do), so that the registry (read by ``specheads --help``) imports neither torch nor the method's code. What
each part must be is typed below (:class:`HeadsModule`, :class:`TrainStep`, :class:`Evaluate`, ...; the
conformance suite checks every entry against them), and whether ``calibrate`` applies is the entry's
``calibratable``. A method defined outside specheads joins with :func:`register`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

if TYPE_CHECKING:  # the CLI imports this registry for its --help: torch loads only when a command needs it
    import torch

# What a head module's ``forward(..., readout=fn)`` calls instead of computing logits: ``fn(index, inputs, weight,
# bias)`` with ``F.linear(inputs, weight, bias)`` the logits of head / draft step ``index``; its results are returned.
Readout = Callable[[int, "torch.Tensor", "torch.Tensor", "torch.Tensor | None"], Any]


# ---------------------------------------------------------------------------------- what a method provides, typed
# Each part a registry entry names has one of these types: the conformance suite (tests/methods/test_conformance.py)
# checks every entry's parts against them, a type checker the methods' own signatures. The engine's objects (the
# base, a recipe section, a step context, a check report) are ``Any`` here: this module imports nothing of specheads.


@runtime_checkable
class HeadsModule(Protocol):
    """What the engine uses of a method's heads (an ``nn.Module``; in specheads a subclass of
    :class:`~specheads.heads.checkpoint.DraftHeads`): the config saved with them (a dataclass with ``head_type`` and
    ``base_model``), the native checkpoint, and binding to the base they were made for."""

    config: Any

    def save_pretrained(self, directory: str) -> None: ...

    def attach_base(self, base_model: Any) -> None: ...


class BuildHeads(Protocol):
    """``build(base, section, dataset) -> heads``: fresh heads for training (``section``: the recipe's ``heads``)."""

    def __call__(self, base: Any, section: Any, dataset: Any, /) -> HeadsModule: ...


class TrainStep(Protocol):
    """``train_step(context, batch) -> StepResult``: the loss and metrics of one micro-batch
    (:class:`specheads.training.step.StepContext` in, :class:`specheads.training.step.StepResult` out)."""

    def __call__(self, context: Any, batch: dict[str, torch.Tensor], /) -> Any: ...


class _EvaluationRequired(TypedDict):
    agreement_with_base_greedy: list[float]


class Evaluation(_EvaluationRequired, total=False):
    """A method's held-out evaluation: agreement with the base's greedy token per depth always, the rest where the
    method measures it.

    Keys:
        agreement_with_base_greedy: ``[D]`` how often the draft's top token at depth d is the base's greedy token.
        top5_agreement: ``[D]`` how often the base's greedy token is among the draft's top 5.
        accuracy_vs_data: ``[D]`` how often the draft's top token is the data's.
        agreement_by_rank: ``[D][R]`` how often the base's greedy token is the draft's rank-r candidate: what
            ``calibrate`` grows trees from and the trainer's simulated tau reads.
        positions: ``[D]`` the target positions counted per depth.
        chain_tau, tree_tau: tokens per step the method's own drafting accepts along the data (a chain; trees by
            node budget).
    """

    top5_agreement: list[float]
    accuracy_vs_data: list[float]
    agreement_by_rank: list[list[float]]
    positions: list[int]
    chain_tau: float
    tree_tau: dict[int, float]


class Evaluate(Protocol):
    """``evaluate(base, heads, batches, max_batches=None) -> Evaluation`` over held-out batches (``input_ids``,
    ``attention_mask``, ``loss_mask``), at most ``max_batches`` of them."""

    def __call__(
        self, base: Any, heads: Any, batches: Iterable[dict[str, torch.Tensor]], /, max_batches: int | None = None
    ) -> Evaluation: ...


class MakeDrafter(Protocol):
    """``drafter(heads, **options) -> Drafter`` (:class:`specheads.inference.drafters.Drafter`; options such as
    ``tree``)."""

    def __call__(self, heads: Any, /, **options: Any) -> Any: ...


class DraftCost(Protocol):
    """``draft_cost(heads) -> ms``: what one more draft level (or one block) costs on this machine."""

    def __call__(self, heads: Any, /) -> float: ...


# What a folder layout's writer returns: its config.json, its tensors by name, serve commands by engine, notes.
FolderContents = tuple[dict[str, Any], dict[str, "torch.Tensor"], dict[str, str], list[str]]


class FolderWriter(Protocol):
    """``write(heads, base, base_name, engines, steps) -> (config, tensors, serve commands, notes)`` of a folder
    layout (``steps``: the speculative tokens to configure, None: the method's default)."""

    def __call__(
        self, heads: Any, base: Any, base_name: str, engines: list[str] | None, steps: int | None, /
    ) -> FolderContents: ...


class FileExporter(Protocol):
    """``export(heads, out, base, base_name, steps, dtype, target) -> ExportResult`` of a one-file format
    (:class:`specheads.export.formats.ExportResult`; ``target``: the model file it serves the draft with, or None)."""

    def __call__(
        self, heads: Any, out: Any, base: Any, base_name: str | None, steps: int | None, dtype: Any, target: Any, /
    ) -> Any: ...


class FolderReader(Protocol):
    """``read(config, tensors, base, where) -> heads``: native heads from a folder of a layout (``where`` names
    it in errors)."""

    def __call__(
        self, config: dict[str, Any], tensors: dict[str, torch.Tensor], base: Any, where: str, /
    ) -> HeadsModule: ...


class FolderChecker(Protocol):
    """``check(config, tensors, report)``: a layout's loading rules, replayed into ``report``
    (:class:`specheads.export.check.CheckReport`: ``problems``, ``verdicts``)."""

    def __call__(self, config: dict[str, Any], tensors: dict[str, torch.Tensor], report: Any, /) -> None: ...


class LayoutDetector(Protocol):
    """``detect(config, tensor_names) -> bool``: a folder's config (and its tensor names when the config is silent,
    None before they are read) is this layout."""

    def __call__(self, config: dict[str, Any], tensor_names: set[str] | None, /) -> bool: ...


class FileChecker(Protocol):
    """``check_file(path, target) -> CheckReport`` of a one-file format, against the model file ``target`` (may be
    None)."""

    def __call__(self, path: Any, target: Any, /) -> Any: ...


class HeadsAdapter(Protocol):
    """``adapt(heads, base, tokenizer, texts) -> (heads, notes)``: heads a format cannot hold as they are, rewritten
    into the nearest heads it can, from the base's activations on ``texts`` (an approximation of the draft, which the
    notes say; verification keeps decoding lossless). Returns the heads unchanged, with no notes, where none is
    needed."""

    def __call__(self, heads: Any, base: Any, tokenizer: Any, texts: list[str], /) -> tuple[Any, list[str]]: ...


def _resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class ExportFormat:
    """One engine layout a method writes (its ``export.py`` lists them; its registry entry names that list).

    Attributes:
        name: the ``--format`` name.
        weights: the safetensors file of a folder layout ("" for a format with its own ``export``).
        write: ``write(heads, base, base_name, engines, steps) -> (config, tensors, serve commands, notes)`` of a
            folder layout; :func:`specheads.export.formats.export_heads` casts, writes, checks and renames the folder.
        export: ``export(heads, out, base, base_name, steps, dtype, target) -> ExportResult``, for a format that is
            not a folder of config + safetensors (one GGUF file).
        read: ``read(config, tensors, base, where) -> heads``: native heads from a folder of this layout.
        check: ``check(config, tensors, report)``: replay the engines' loading rules into ``report`` (a
            :class:`specheads.export.check.CheckReport`).
        detect: ``detect(config, tensor_names) -> bool``: a folder's config (and tensor names when the config is
            silent, None before they are read) is this layout.
        fallback: ``detect`` claims a whole family of layouts (any speculators model type), so that a method whose
            detector is specific to its own members of the family wins over it.
        suffix: the file name suffix of a format that is one file (``.gguf``).
        check_file: ``check_file(path, target) -> CheckReport`` of a one-file format: the engine's loading rules,
            against the model file it serves the draft with (``target``, may be None).
        adapt: ``adapt(heads, base, tokenizer, texts) -> (heads, notes)``: the nearest heads this format holds, for
            heads it cannot hold as they are (``gguf``: EAGLE 3.1's norms folded into llama.cpp's graph); asked for
            by ``specheads export --fold-norms``.
    """

    name: str
    weights: str
    write: FolderWriter | None = None
    export: FileExporter | None = None
    read: FolderReader | None = None
    check: FolderChecker | None = None
    detect: LayoutDetector | None = None
    fallback: bool = False
    suffix: str = ""
    check_file: FileChecker | None = None
    adapt: HeadsAdapter | None = None


@dataclass(frozen=True)
class HeadType:
    """Where everything about one head type lives.

    Attributes:
        name: ``head_type`` in checkpoints, ``heads.type`` in recipes and the decoding ``method``.
        module: the ``nn.Module`` class (``from_base``, ``from_checkpoint``, ``save_pretrained``, ``attach_base``;
            its instances are :class:`HeadsModule`).
        recipe: the dataclass of the recipe's ``heads`` section.
        build: a :class:`BuildHeads`, ``build(base, section, dataset) -> heads``: fresh heads for training.
        train_step: a :class:`TrainStep`, ``train_step(context, batch) -> StepResult``: the loss and metrics of one
            micro-batch, base in the loop (:class:`specheads.training.step.StepContext`: step, epoch, recipe
            section, the base, the heads); the trainer resolves it once per run.
        evaluate: an :class:`Evaluate`, ``evaluate(base, heads, batches, max_batches) -> Evaluation``: held-out
            agreement with the base's greedy token per depth (``agreement_with_base_greedy``,
            ``agreement_by_rank``, ...).
        drafter: a :class:`MakeDrafter`, ``drafter(heads, **options) -> Drafter``.
        bench_trees: the trees ``specheads bench`` decodes these heads with by default (rows ``<type>-<tree>``),
            or ``"module:attribute"`` naming them where the method keeps its tree names (read by
            :meth:`default_bench_trees`).
        formats: the export formats (``specheads export --format``) these heads are written in.
        layouts: the engine layouts (as :func:`specheads.heads.foreign.foreign_format` names them) whose folders
            load as these heads.
        draft_cost: ``"module:function"``, a :class:`DraftCost`: the cost of one draft level, which calibration
            adds per tree depth (None: drafting costs the same at any depth, e.g. one forward of all heads).
        trees: ``"module:attribute"``, the method's tree family (:class:`specheads.inference.trees.TreeFamily`):
            the trees its drafter grows beyond static ones, owned by the method: their names, the size keywords
            they take, what calibration times, records and reads back (default: static trees only).
        joint_training: ``"module:Class"``, the method's hooks for training the base jointly with the heads
            (:class:`specheads.training.step.JointTraining`; Medusa-2's LoRA adapters, ``lora.enabled``), which
            the trainer calls and loading binds; None: the heads train on a frozen base only.
        public: ``"module:Name"`` of the method's public classes (heads, their config, drafter, the trees it grows),
            which ``specheads`` and ``specheads.heads`` export under ``Name``.
        exports: ``"module:attribute"``, a ``{format: ExportFormat}`` mapping (:class:`ExportFormat`): how each of
            ``formats`` is written, read, checked and recognised.
        calibratable: ``specheads calibrate`` can choose trees for these heads: their evaluation gives
            ``agreement_by_rank`` and their drafter takes the static trees calibration grows. False: calibrate
            refuses them (:func:`specheads.calibrate.calibrate` raises ValueError; the CLI says so in one line).
    """

    name: str
    module: str
    recipe: str
    build: str
    train_step: str
    evaluate: str
    drafter: str
    bench_trees: tuple[str, ...] | str = ()
    formats: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()
    draft_cost: str | None = None
    trees: str = "specheads.inference.trees:STATIC"
    joint_training: str | None = None
    exports: str | None = None
    public: tuple[str, ...] = ()
    calibratable: bool = True

    def module_class(self) -> type[HeadsModule]:
        return _resolve(self.module)

    def recipe_section(self) -> type:
        return _resolve(self.recipe)

    def build_heads(self, base: Any, section: Any, dataset: Any) -> HeadsModule:
        build: BuildHeads = _resolve(self.build)
        return build(base, section, dataset)

    def train_step_fn(self) -> TrainStep:
        """The method's ``train_step(context, batch) -> StepResult`` (imported on first use)."""
        return _resolve(self.train_step)

    def evaluate_fn(self) -> Evaluate:
        return _resolve(self.evaluate)

    def make_drafter(self, heads: Any, **kwargs: Any) -> Any:
        drafter: MakeDrafter = _resolve(self.drafter)
        return drafter(heads, **kwargs)

    def export_formats(self) -> dict[str, ExportFormat]:
        """``{format: ExportFormat}`` of this method (empty when it exports nothing)."""
        return {} if self.exports is None else dict(_resolve(self.exports))

    def default_bench_trees(self) -> tuple[str, ...]:
        """The trees ``specheads bench`` decodes these heads with by default (``bench_trees``, resolved)."""
        return tuple(_resolve(self.bench_trees)) if isinstance(self.bench_trees, str) else self.bench_trees

    def tree_family(self) -> Any:
        """The method's :class:`~specheads.inference.trees.TreeFamily`."""
        return _resolve(self.trees)

    def joint_training_for(self, recipe: Any) -> Any:
        """The method's joint-training hooks for ``recipe`` (a ``RecipeConfig``), or None: the base stays frozen."""
        return None if self.joint_training is None else _resolve(self.joint_training).from_recipe(recipe)

    def bind_joint(self, directory: Any, base: Any) -> Any:
        """``base`` with what joint training saved into ``directory`` applied (the base the heads decode with).

        Raises:
            ValueError: the method trains no base jointly with its heads.
        """
        if self.joint_training is None:
            raise ValueError(f"{directory}: {self.name} heads train on a frozen base; nothing of a base to bind")
        return _resolve(self.joint_training).bind(directory, base)

    def draft_cost_ms(self, heads: Any) -> float:
        """Milliseconds one more draft level costs (0.0 when depth costs nothing extra)."""
        return 0.0 if self.draft_cost is None else float(_resolve(self.draft_cost)(heads))


HEAD_TYPES: dict[str, HeadType] = {
    "medusa": HeadType(
        name="medusa",
        module="specheads.methods.medusa.heads:MedusaHeads",
        recipe="specheads.methods.medusa.config:HeadsConfig",
        build="specheads.methods.medusa.train:build_heads",
        train_step="specheads.methods.medusa.train:train_step",
        evaluate="specheads.methods.medusa.evaluate:head_agreement",
        drafter="specheads.methods.medusa.drafter:MedusaDrafter",
        bench_trees=("chain-2", "chain-3", "binary-7"),
        formats=("medusa",),
        layouts=("medusa",),
        exports="specheads.methods.medusa.export:FORMATS",
        joint_training="specheads.methods.medusa.joint:LoraJointTraining",
        public=(
            "specheads.methods.medusa.heads:MedusaHeads",
            "specheads.methods.medusa.heads:MedusaConfig",
            "specheads.methods.medusa.drafter:MedusaDrafter",
        ),
    ),
    "eagle": HeadType(
        name="eagle",
        module="specheads.methods.eagle.heads:EagleHead",
        recipe="specheads.methods.eagle.config:EagleHeadsConfig",
        build="specheads.methods.eagle.train:build_heads",
        train_step="specheads.methods.eagle.train:train_step",
        evaluate="specheads.methods.eagle.train:eagle_agreement",
        drafter="specheads.methods.eagle.drafter:EagleDrafter",
        bench_trees="specheads.methods.eagle.names:BENCH_TREES",
        formats=("eagle3", "speculators", "eagle", "gguf"),
        layouts=("eagle3", "speculators", "eagle"),
        exports="specheads.methods.eagle.export:FORMATS",
        draft_cost="specheads.methods.eagle.drafter:measure_draft_cost",
        trees="specheads.methods.eagle.trees:TREES",
        public=(
            "specheads.methods.eagle.heads:EagleHead",
            "specheads.methods.eagle.heads:EagleConfig",
            "specheads.methods.eagle.drafter:EagleDrafter",
            "specheads.methods.eagle.trees:DynamicTree",
        ),
    ),
    "draft-lm": HeadType(
        name="draft-lm",
        module="specheads.methods.draft_lm.heads:DraftLM",
        recipe="specheads.methods.draft_lm.config:DraftHeadsConfig",
        build="specheads.methods.draft_lm.train:build_heads",
        train_step="specheads.methods.draft_lm.train:train_step",
        evaluate="specheads.methods.draft_lm.train:draft_agreement",
        drafter="specheads.methods.draft_lm.heads:draft_drafter",
        public=("specheads.methods.draft_lm.heads:DraftLM", "specheads.methods.draft_lm.heads:DraftConfig"),
        calibratable=False,  # one chain of its own greedy tokens: no agreement by rank, no tree to choose
    ),
    "dflash": HeadType(
        name="dflash",
        module="specheads.methods.dflash.heads:DFlashHead",
        recipe="specheads.methods.dflash.config:DFlashHeadsConfig",
        build="specheads.methods.dflash.train:build_heads",
        train_step="specheads.methods.dflash.train:train_step",
        evaluate="specheads.methods.dflash.train:block_agreement",
        drafter="specheads.methods.dflash.drafter:DFlashDrafter",
        bench_trees=("chain-3", "chain-7", "ddtree-8", "ddtree-16", "ddtree-32"),
        formats=("dflash", "dspark", "speculators"),
        layouts=("dflash", "dspark", "speculators"),
        exports="specheads.methods.dflash.export:FORMATS",
        draft_cost="specheads.methods.dflash.drafter:measure_draft_cost",
        trees="specheads.methods.dflash.trees:TREES",
        public=(
            "specheads.methods.dflash.heads:DFlashHead",
            "specheads.methods.dflash.heads:DFlashConfig",
            "specheads.methods.dflash.drafter:DFlashDrafter",
            "specheads.methods.dflash.trees:BlockTree",
        ),
    ),
}


def register(entry: HeadType) -> HeadType:
    """Add a method defined outside specheads: from then on recipes (``heads.type``), decoding (``method``),
    loading, calibration and export (``--format``) take it as they take the built-in methods.

    Registering resolves none of the entry's parts (they load on first use). The CLI's method and format choices
    list the method in every parser built after it is registered (``specheads.cli.build_parser``, which ``main``
    calls); ``specheads.<Name>`` lists only the built-in methods' public names.

    Returns:
        ``entry``, so that a method's module can write ``ENTRY = register(HeadType(...))``.

    Raises:
        ValueError: a method of that name is registered, or the entry lists a layout it does not write.
    """
    if entry.name in HEAD_TYPES:
        raise ValueError(f"a method named {entry.name!r} is registered already: {HEAD_TYPES[entry.name]}")
    unwritten = sorted(set(entry.layouts) - set(entry.formats))
    if unwritten:
        raise ValueError(f"{entry.name}: layouts {unwritten} are not among its formats {list(entry.formats)}")
    HEAD_TYPES[entry.name] = entry
    return entry


def export_formats() -> tuple[str, ...]:
    """Every export format of every method, in registry order, each once (a format several methods write, such as
    ``speculators``, is one name)."""
    return tuple(dict.fromkeys(fmt for method in HEAD_TYPES.values() for fmt in method.formats))


def methods_of_format(format: str) -> list[HeadType]:
    """The methods whose heads an export format holds (several for a family format such as ``speculators``).

    Raises:
        ValueError: no method writes ``format``.
    """
    methods = [method for method in HEAD_TYPES.values() if format in method.formats]
    if not methods:
        raise ValueError(f"unknown export format {format!r}; choose one of {list(export_formats())}")
    return methods


def _serving(
    candidates: list[tuple[HeadType, ExportFormat]], heads: Any = None, config: dict[str, Any] | None = None
) -> tuple[HeadType, ExportFormat]:
    """The one rule for which method serves a format several write: the heads' own type, else the folder's
    ``config`` by the methods' detectors (a specific detector before one that claims the whole family), else the
    first in registry order."""
    if len(candidates) > 1 and heads is not None:
        name = getattr(getattr(heads, "config", None), "head_type", None)
        for method, spec in candidates:
            if method.name == name:
                return method, spec
    if len(candidates) > 1 and config is not None:
        matching = [
            (spec.fallback, index)
            for index, (_, spec) in enumerate(candidates)
            if spec.detect is not None and spec.detect(config, None)
        ]
        if matching:
            return candidates[min(matching)[1]]
    return candidates[0]


def export_format(format: str, heads: Any = None, config: dict[str, Any] | None = None) -> ExportFormat:
    """The :class:`ExportFormat` named ``format``, from the registry entry of the method that writes it (when
    several do, ``heads`` or a folder's ``config`` picks one; see :func:`_serving`).

    Raises:
        ValueError: no method writes ``format``.
    """
    methods = methods_of_format(format)
    return _serving([(method, method.export_formats()[format]) for method in methods], heads, config)[1]


def method_of_layout(layout: str, config: dict[str, Any] | None = None) -> HeadType | None:
    """The method whose heads a foreign engine layout holds (None: no method reads it); several read
    ``speculators``, and the folder's ``config`` decides as in :func:`export_format`."""
    methods = [method for method in HEAD_TYPES.values() if layout in method.layouts]
    if not methods:
        return None
    return _serving([(method, method.export_formats()[layout]) for method in methods], None, config)[0]


def detect_layout(config: dict[str, Any], tensor_names: set[str] | None = None) -> str | None:
    """The layout a ``config.json`` (and, when the config is silent, its tensor names) belongs to: ``"native"``, a
    format some method's registry entry lists (its own ``detect`` says), or None.

    A layout whose config names it wins over one recognised by its tensor names; a specific detector wins over one
    that claims a whole family of layouts.
    """
    if "head_type" in config and "specheads_version" in config:
        return "native"
    specs = [(name, spec) for method in HEAD_TYPES.values() for name, spec in method.export_formats().items()]
    for names in (None, tensor_names) if tensor_names is not None else (None,):
        matches = [
            (spec.fallback, name) for name, spec in specs if spec.detect is not None and spec.detect(config, names)
        ]
        if matches:
            return min(matches, key=lambda match: match[0])[1]
    return None


def public_names() -> dict[str, str]:
    """``{Name: module}`` of every method's public classes (each entry's ``public``), for lazy package exports."""
    names = {}
    for method in HEAD_TYPES.values():
        for path in method.public:
            module, _, name = path.partition(":")
            names[name] = module
    return names


def head_type_of(heads: Any) -> HeadType:
    """The registry entry of a heads module (by its config's ``head_type``)."""
    name = getattr(getattr(heads, "config", None), "head_type", None)
    if name not in HEAD_TYPES:
        raise ValueError(f"not a specheads heads module (head_type {name!r}); known: {sorted(HEAD_TYPES)}")
    return HEAD_TYPES[name]
