"""Records to rows: fixed-length ``input_ids``, ``attention_mask`` and ``loss_mask`` (int32 ids, int8 masks).

:func:`layout` maps a table of records to rows with datasets' ``map``, in ``data.num_proc`` processes when the data
is large enough: documents are tokenised and followed by EOS, then packed into consecutive ``max_length`` windows or
padded one row per document; conversations are rendered, their assistant targets located
(:mod:`specheads.training.chat`), tokenised and padded one row per conversation, and those left without a target
token dropped. The layout rules are in :mod:`specheads.training.data`'s docstring.
"""

from __future__ import annotations

import json
import os
from typing import Any

import datasets
import numpy as np
from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from specheads.loading import pad_token_id
from specheads.training.chat import (
    Renderer,
    Skeleton,
    assistant_spans,
    cut_token_for,
    end_marker_of,
    skeleton_of,
    tokenize_with_targets,
)
from specheads.training.config import DataConfig
from specheads.training.errors import DataError

# Compact storage (ids < 2**31, masks 0/1); the trainer reads them with with_format("torch") and the train steps
# cast ids to int64 where torch needs them.
_FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "attention_mask": datasets.List(datasets.Value("int8")),
        "loss_mask": datasets.List(datasets.Value("int8")),
    }
)
_MAP_BATCH = 100  # records per tokenising batch: the progress bar moves every few hundred milliseconds
_RECORDS_PER_PROCESS = 256  # fewer records than this per process are tokenised in this process (no pool start-up)


def layout(
    table: datasets.Dataset, config: DataConfig, tokenizer: PreTrainedTokenizerBase, render: Renderer | None
) -> datasets.Dataset:
    """Tokenise the records of ``table`` into rows of ``_FEATURES``: packed windows or one padded row per record."""
    processes = max(1, min(config.num_proc, os.cpu_count() or 1, len(table) // _RECORDS_PER_PROCESS))
    common = dict(batched=True, batch_size=_MAP_BATCH, remove_columns=table.column_names)
    common["num_proc"] = processes if processes > 1 else None
    if render is not None:
        rows = _ConversationRows(render, tokenizer, config.max_length)
        return table.map(rows, features=_FEATURES, desc="tokenising conversations", **common)
    if not config.packing:
        return table.map(
            lambda batch: _padded_document_rows(batch["text"], tokenizer, config.max_length),
            features=_FEATURES,
            desc="tokenising documents",
            **common,
        )
    tokenized = table.map(
        lambda batch: {"ids": _document_ids(batch["text"], tokenizer)}, desc="tokenising documents", **common
    )
    # One batch over the whole table, so windows run across documents and only the final tail is dropped.
    return tokenized.map(
        lambda batch: _pack(batch["ids"], config.max_length),
        batched=True,
        batch_size=None,
        remove_columns=["ids"],
        features=_FEATURES,
        desc="packing windows",
    )


# ------------------------------------------------------------------------------------------------------------ documents


def _document_ids(texts: list[str], tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Token ids of each document followed by EOS (when the tokenizer has one and did not add it already)."""
    eos = tokenizer.eos_token_id
    # Documents longer than the model's window are expected: packing or truncation cuts them to max_length later, so
    # the tokenizer's "longer than the specified maximum sequence length" warning is noise here (verbose=False).
    encoded = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
    return [ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids for ids in encoded]


def _pack(documents: list[list[int]], max_length: int) -> dict[str, list[list[int]]]:
    stream = [token for ids in documents for token in ids]
    windows = [stream[start : start + max_length] for start in range(0, len(stream) - max_length + 1, max_length)]
    ones = [1] * max_length
    return {"input_ids": windows, "attention_mask": [ones] * len(windows), "loss_mask": [ones] * len(windows)}


def pad_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    pad = pad_token_id(tokenizer=tokenizer)
    return 0 if pad is None else pad  # padded positions carry no loss: any id will do


def _padded_arrays(ids: list[list[int]], targets: list[Any], max_length: int, pad_id: int) -> dict[str, np.ndarray]:
    """``[N, max_length]`` rows: ids (and targets) truncated to ``max_length``, then right-padded with ``pad_id``."""
    input_ids = np.full((len(ids), max_length), pad_id, dtype=np.int32)
    attention_mask = np.zeros((len(ids), max_length), dtype=np.int8)
    loss_mask = np.zeros((len(ids), max_length), dtype=np.int8)
    for row, (row_ids, row_targets) in enumerate(zip(ids, targets, strict=True)):
        length = min(len(row_ids), max_length)
        input_ids[row, :length] = row_ids[:length]
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = row_targets[:length]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def _padded_document_rows(
    texts: list[str], tokenizer: PreTrainedTokenizerBase, max_length: int
) -> dict[str, np.ndarray]:
    ids = _document_ids(texts, tokenizer)
    return _padded_arrays(ids, [[1] * len(row) for row in ids], max_length, pad_id_of(tokenizer))


# -------------------------------------------------------------------------------------------------------- conversations


class _ConversationRows:
    """The batched map function for conversations: render, locate the assistant targets, tokenise, pad.

    Skeletons are kept per sequence of roles (in each process: a few dozen sequences cover a ShareGPT file).
    """

    def __init__(self, render: Renderer, tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        self.render, self.tokenizer, self.max_length = render, tokenizer, max_length
        self.pad_id = pad_id_of(tokenizer)
        self.skeletons: dict[tuple[str, ...], Skeleton | None] = {}
        self.cut_token = cut_token_for(tokenizer, end_marker_of(render))

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, np.ndarray]:
        texts, spans = [], []
        for messages_json, where in zip(batch["messages"], batch["source"], strict=True):
            messages = json.loads(messages_json)
            try:
                text, targets = self.targets(messages, where)
            except DataError:
                raise
            except (TemplateError, ValueError, TypeError) as error:  # raise_exception() in templates, bad fields, ...
                raise DataError(f"{where}: the chat template failed on this conversation: {error}") from error
            if targets:
                texts.append(text)
                spans.append(targets)
        ids, masks = tokenize_with_targets(texts, spans, self.tokenizer, self.max_length, self.cut_token)
        keep = [index for index, mask in enumerate(masks) if mask.any()]
        return _padded_arrays([ids[i] for i in keep], [masks[i] for i in keep], self.max_length, self.pad_id)

    def targets(self, messages: list[dict[str, str]], where: str) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and its target spans: from its skeleton, else checked turn by turn."""
        roles = tuple(message["role"] for message in messages)
        if roles not in self.skeletons:
            self.skeletons[roles] = skeleton_of(roles, self.render, where)
        skeleton = self.skeletons[roles]
        text = self.render(messages, False)
        spans = skeleton.spans(text, messages) if skeleton is not None else None
        return (text, spans) if spans is not None else assistant_spans(messages, self.render, where)
