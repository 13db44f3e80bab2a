"""Prompt files: JSONL, one object per line with ``"prompt"`` (str) and an optional ``"id"``.

ShareGPT-style ``"conversations"`` (a list of ``{"from"|"role", "value"|"content"}`` turns) are accepted too when a
tokenizer with a chat template is given: the prompt is the conversation up to its last user turn, rendered with the
template and the generation prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


class PromptFileError(ValueError):
    """A prompts file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: ``text`` is what the model is given.

    Attributes:
        id: the record's ``"id"`` (its 0-based index among the prompts when absent), as a string.
        text: the prompt text; for a ``"conversations"`` record, the conversation rendered with the chat template.
        conversation: for a ``"conversations"`` record, its ``(role, content)`` turns up to the last user turn
            (roles ``user``, ``assistant``, ``system``); None for a plain ``"prompt"`` record.
    """

    id: str
    text: str
    conversation: tuple[tuple[str, str], ...] | None = None


def load_prompts(
    path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None, limit: int | None = None
) -> list[Prompt]:
    """Read a JSONL prompts file.

    Args:
        path: the file.
        tokenizer: needed only for ``"conversations"`` records (its chat template renders them).
        limit: keep the first ``limit`` prompts.

    Raises:
        PromptFileError: the file is missing or empty, or a line is not a JSON object with a usable prompt.
    """
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompts file {path} does not exist")
    prompts: list[Prompt] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            line = decode_utf8(raw, f"{path}:{number}")
            if not line.strip():
                continue
            prompts.append(_parse_line(line, f"{path}:{number}", len(prompts), tokenizer))
            if limit is not None and len(prompts) >= limit:
                break
    if not prompts:
        raise PromptFileError(f"prompts file {path} holds no prompts")
    return prompts


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text, or a ``ValueError`` naming ``where`` and the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptFileError(
            f"{where} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); convert it first, "
            "e.g. iconv -f latin1 -t utf-8"
        ) from None


def _parse_line(line: str, where: str, index: int, tokenizer: PreTrainedTokenizerBase | None) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise PromptFileError(f"{where}: not valid JSON ({error.msg})") from error
    if not isinstance(record, dict):
        raise PromptFileError(f"{where}: each line must be a JSON object with a 'prompt' field")
    prompt_id = str(record.get("id", index))
    if "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str) or not text:
            raise PromptFileError(f"{where}: 'prompt' must be a non-empty string")
        return Prompt(prompt_id, text)
    if "conversations" in record:
        messages = _conversation_messages(record["conversations"], where, tokenizer)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return Prompt(prompt_id, text, tuple((m["role"], m["content"]) for m in messages))
    raise PromptFileError(f"{where}: no 'prompt' (or 'conversations') field")


def _conversation_messages(turns: object, where: str, tokenizer: PreTrainedTokenizerBase | None) -> list[dict]:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise PromptFileError(f"{where}: 'conversations' need a tokenizer with a chat template")
    if not isinstance(turns, list) or not turns:
        raise PromptFileError(f"{where}: 'conversations' must be a non-empty list of turns")
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise PromptFileError(f"{where}: every turn must be an object")
        role = _ROLES.get(str(turn.get("from", turn.get("role", ""))))
        content = turn.get("value", turn.get("content"))
        if role is None or not isinstance(content, str):
            raise PromptFileError(f"{where}: a turn needs 'from'/'role' (human, gpt, user, ...) and 'value'/'content'")
        messages.append({"role": role, "content": content})
    while messages and messages[-1]["role"] != "user":
        messages.pop()
    if not messages:
        raise PromptFileError(f"{where}: the conversation has no user turn")
    return messages
