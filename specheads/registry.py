"""One registry of methods with trained drafters: each entry names everything about one method, which lives in its
own folder (``specheads/methods/<name>/``: recipe section, heads module, drafter, training step and evaluation).

The entry also states what the rest of specheads asks of a method: the export formats it writes, the engine layouts
whose folders load as it, its draft-cost model for ``calibrate``, whether it grows dynamic trees, whether it can
train jointly with the base. The decoder, CLI, trainer, calibration and export look a method up in its entry and read
these fields rather than comparing its name; a new method is a folder and an entry. Two method-specific things still
live outside the folders: the grown tree kinds (EAGLE-2's ``"dynamic"``, DDTree's ``"ddtree"``), which the engine,
calibration and export name, and Medusa-2's joint LoRA training (``lora.*``, ``StepContext.joint``) in the trainer.

Entries name their parts as ``"module:attribute"`` strings resolved on first use (as torchtune's ``_component_``
configs do), so that the registry (read by ``specheads --help``) imports neither torch nor the method's code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this registry for its --help: torch loads only when a command needs it
    import torch

# What a head module's ``forward(..., readout=fn)`` calls instead of computing logits: ``fn(index, inputs, weight,
# bias)`` with ``F.linear(inputs, weight, bias)`` the logits of head / draft step ``index``; its results are returned.
Readout = Callable[[int, "torch.Tensor", "torch.Tensor", "torch.Tensor | None"], Any]


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
    """

    name: str
    weights: str
    write: Callable[..., tuple[dict[str, Any], dict[str, Any], dict[str, str], list[str]]] | None = None
    export: Callable[..., Any] | None = None
    read: Callable[..., Any] | None = None
    check: Callable[[dict[str, Any], dict[str, Any], Any], None] | None = None
    detect: Callable[[dict[str, Any], set[str] | None], bool] | None = None
    fallback: bool = False
    suffix: str = ""
    check_file: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True)
class HeadType:
    """Where everything about one head type lives.

    Attributes:
        name: ``head_type`` in checkpoints, ``heads.type`` in recipes and the decoding ``method``.
        module: the ``nn.Module`` class (``from_base``, ``from_checkpoint``, ``save_pretrained``, ``attach_base``).
        recipe: the dataclass of the recipe's ``heads`` section.
        build: ``build(base, section, dataset) -> heads``: fresh heads for training.
        train_step: ``train_step(context, batch) -> StepResult``: the loss and metrics of one micro-batch, base in
            the loop (:class:`specheads.training.step.StepContext`: step, epoch, recipe section, the base, the
            heads); the trainer resolves it once per run.
        evaluate: ``evaluate(base, heads, batches, max_batches) -> dict``: held-out agreement with the base's
            greedy token per depth (``agreement_with_base_greedy``, ``agreement_by_rank``, ...).
        drafter: ``drafter(heads) -> Drafter``.
        bench_trees: the trees ``specheads bench`` decodes these heads with by default (rows ``<type>-<tree>``).
        formats: the export formats (``specheads export --format``) these heads are written in.
        layouts: the engine layouts (as :func:`specheads.heads.foreign.foreign_format` names them) whose folders
            load as these heads.
        draft_cost: ``"module:function"``, ``function(heads) -> ms``: the cost of one draft level, which calibration
            adds per tree depth (None: drafting costs the same at any depth, e.g. one forward of all heads).
        trees: ``"module:attribute"``, the method's tree family (:class:`specheads.inference.trees.TreeFamily`):
            the trees its drafter grows beyond static ones, which calibration times and records (default: static
            trees only).
        grows: the ``tree=`` names the drafter grows (``"dynamic"``, ``"ddtree"``), the family's ``kinds`` kept
            here so that refusals can name the methods without importing them.
        joint_training: the recipe may train the base with the heads (``lora.enabled``, Medusa-2).
        public: ``"module:Name"`` of the method's public classes (heads, their config, drafter), which ``specheads``
            and ``specheads.heads`` export under ``Name``.
        exports: ``"module:attribute"``, a ``{format: ExportFormat}`` mapping (:class:`ExportFormat`): how each of
            ``formats`` is written, read, checked and recognised.
    """

    name: str
    module: str
    recipe: str
    build: str
    train_step: str
    evaluate: str
    drafter: str
    bench_trees: tuple[str, ...] = ()
    formats: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()
    draft_cost: str | None = None
    trees: str = "specheads.inference.trees:STATIC"
    grows: tuple[str, ...] = ()
    joint_training: bool = False
    exports: str | None = None
    public: tuple[str, ...] = ()

    def module_class(self) -> type:
        return _resolve(self.module)

    def recipe_section(self) -> type:
        return _resolve(self.recipe)

    def build_heads(self, base: Any, section: Any, dataset: Any) -> Any:
        return _resolve(self.build)(base, section, dataset)

    def train_step_fn(self) -> Callable[..., Any]:
        """The method's ``train_step(context, batch) -> StepResult`` (imported on first use)."""
        return _resolve(self.train_step)

    def evaluate_fn(self) -> Any:
        return _resolve(self.evaluate)

    def make_drafter(self, heads: Any, **kwargs: Any) -> Any:
        return _resolve(self.drafter)(heads, **kwargs)

    def export_formats(self) -> dict[str, Any]:
        """``{format: ExportFormat}`` of this method (empty when it exports nothing)."""
        return {} if self.exports is None else dict(_resolve(self.exports))

    def tree_family(self) -> Any:
        """The method's :class:`~specheads.inference.trees.TreeFamily`."""
        return _resolve(self.trees)

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
        evaluate="specheads.training.evaluate:head_agreement",
        drafter="specheads.methods.medusa.drafter:MedusaDrafter",
        bench_trees=("chain-2", "chain-3", "binary-7"),
        formats=("medusa",),
        layouts=("medusa",),
        exports="specheads.methods.medusa.export:FORMATS",
        joint_training=True,
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
        bench_trees=("chain-3", "chain-5", "binary-7", "dynamic", "dynamic-4-5-16", "auto"),
        formats=("eagle3", "speculators", "eagle", "gguf"),
        layouts=("eagle3", "speculators", "eagle"),
        exports="specheads.methods.eagle.export:FORMATS",
        draft_cost="specheads.methods.eagle.drafter:measure_draft_cost",
        trees="specheads.methods.eagle.drafter:TREES",
        grows=("dynamic",),
        public=(
            "specheads.methods.eagle.heads:EagleHead",
            "specheads.methods.eagle.heads:EagleConfig",
            "specheads.methods.eagle.drafter:EagleDrafter",
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
        trees="specheads.methods.dflash.drafter:TREES",
        grows=("ddtree",),
        public=(
            "specheads.methods.dflash.heads:DFlashHead",
            "specheads.methods.dflash.heads:DFlashConfig",
            "specheads.methods.dflash.drafter:DFlashDrafter",
        ),
    ),
}


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


def methods_growing(kind: str) -> list[str]:
    """The methods whose drafters grow ``tree=kind`` trees (their entries' ``grows``)."""
    return [name for name, method in HEAD_TYPES.items() if kind in method.grows]


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
