"""Rows to batches: each row's real length, the length-grouped sampler, and the collate that cuts the columns that
are padding in every row of a batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def row_lengths(dataset: Any, chunk: int = 4096) -> list[int]:
    """The real (attended) length of every row of a tokenised dataset."""
    lengths: list[int] = []
    for start in range(0, len(dataset), chunk):
        mask = torch.as_tensor(dataset[start : start + chunk]["attention_mask"])
        lengths.extend(mask.sum(dim=1).tolist())
    return lengths


class LengthGroupedSampler(torch.utils.data.Sampler):
    """A shuffled order of rows in which every ``batch_size`` consecutive rows have similar lengths (the trainer
    gives the global batch: accelerate deals consecutive per-process batches of one step to the processes).

    Each epoch (:meth:`set_epoch`, seeded by ``seed + epoch``, so a resumed run replays it) the rows are shuffled,
    cut into groups of ``group_batches`` batches, sorted by length within each group and cut into batches; the
    batches are then shuffled, except a last short one, which stays last (a loader with ``drop_last`` drops it). The
    loader cuts a batch to its longest row (:func:`collate_trimmed`), so grouping spends the step on real tokens:
    transformers' ``group_by_length`` does the same.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int = 0, group_batches: int = 50) -> None:
        self.lengths, self.batch_size, self.seed, self.group = lengths, batch_size, seed, batch_size * group_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        batches = []
        for start in range(0, len(order), self.group):
            group = sorted(order[start : start + self.group], key=lambda index: -self.lengths[index])
            batches += [group[i : i + self.batch_size] for i in range(0, len(group), self.batch_size)]
        tail = [batches.pop()] if batches and len(batches[-1]) < self.batch_size else []
        shuffled = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()] + tail
        return iter([index for batch in shuffled for index in batch])


def collate_trimmed(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack rows into a batch and cut the columns that are padding in every row.

    Rows are right-padded to ``data.max_length``; chats are often much shorter, and every padded column would cost
    a base forward and the heads' work for nothing. Padding is masked out of attention and loss, and no real
    position attends to a later one, so cutting it changes no result.
    """
    batch = torch.utils.data.default_collate(rows)
    mask = batch.get("attention_mask")
    if mask is None or mask.dim() != 2 or mask.shape[1] == 0:
        return batch
    length = int(mask.any(dim=0).nonzero().max()) + 1 if mask.any() else mask.shape[1]
    if length == mask.shape[1]:
        return batch
    return {
        key: value[:, :length] if isinstance(value, torch.Tensor) and value.dim() >= 2 else value
        for key, value in batch.items()
    }
