"""Where held-out agreement is lost: a draft's agreement with the base, by depth, split by the kind of position, and
a paired bootstrap interval between two heads scored on the same held-out rows.

A position is scored at depth d + 1 as in the method's own evaluation (EAGLE: the draft unrolled d steps along the
data, where the data's tokens at depths 1..d are the base's greedy tokens): :func:`scored_positions`. Each scored
position then falls into groups:

* ``copy`` / ``novel``: whether the base's token there continues an n-gram already in the answer (the token that
  followed the latest earlier occurrence of the longest 4- or 3-token suffix, looked up within the answer only, is
  the base's token: a model-free prompt-lookup rule would get it right; :func:`ngram_continuations`);
* ``in_vocab`` / ``off_vocab``: whether the base's token is in the head's draft vocabulary (off it, the head can
  never propose it);
* ``p1 [lo, hi)``: the base's own top-1 probability there (:data:`CONFIDENCE_BINS`).

It also counts how many positions the base itself predicts with top-1 probability above one half, and keeps every
row's (hits, positions) per depth, so that two heads can be compared with :func:`paired_bootstrap`: rows are the
unit of resampling, since the positions of one chat are correlated (loops).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

CONFIDENCE_BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)  # the base's top-1 probability, bins [lo, hi) (the last one closed)
CONFIDENT = 0.5  # "the base is sure": top-1 probability above this


def ngram_continuations(ids: Sequence[int], start: int = 0, min_n: int = 3, max_n: int = 4) -> list[int]:
    """Per position i, the token a longest-suffix n-gram rule predicts there, or -1.

    The rule looks at the ``n`` tokens before i (``n = max_n`` down to ``min_n``, the first that matches) and
    predicts the token that followed their latest earlier occurrence. Only tokens at or after ``start`` (the answer)
    count: the suffix and its earlier occurrence must both lie there.

    Example: ``ids = [5, 6, 7, 8, 5, 6, 7, 9]``, ``min_n = 3``: position 7 follows ``[5, 6, 7]``, seen at 0..2 and
    followed by 8, so the rule predicts 8 there; every other position gets -1.
    """
    latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
    predicted = [-1] * len(ids)
    for i in range(start, len(ids)):
        for n in range(max_n, min_n - 1, -1):
            if i - n >= start:
                earlier = latest[n].get(tuple(ids[i - n : i]))
                if earlier is not None:
                    predicted[i] = ids[earlier]
                    break
        for n in range(min_n, max_n + 1):  # i's own suffixes become history for later positions
            if i - n >= start:
                latest[n][tuple(ids[i - n : i])] = i
    return predicted


@dataclass
class Positions:
    """The positions scored at one draft depth, as parallel ``[P]`` tensors."""

    row: torch.Tensor  # the batch row
    target: torch.Tensor  # the sequence index of the predicted token (t + 1 + depth)
    wanted: torch.Tensor  # the base's greedy token there
    hit: torch.Tensor  # bool: the draft's top-1 is the base's token


def scored_positions(
    input_ids: torch.Tensor, valid_tokens: torch.Tensor, greedy: torch.Tensor, drafted: Sequence[torch.Tensor]
) -> list[Positions]:
    """The positions each depth is scored at, as :func:`~specheads.methods.eagle.train.eagle_agreement` scores them.

    Args:
        input_ids: ``[B, T]`` the rows.
        valid_tokens: ``[B, T]`` bool, the tokens that count (loss mask and attention mask).
        greedy: ``[B, T]`` the base's greedy token after each position (the argmax of its logits there).
        drafted: per depth, ``[B, T - 1]`` the draft's top-1 *target* id at each position t (depth d + 1 predicts
            token t + 2 + d).

    Returns:
        One :class:`Positions` per depth (fewer if the rows are too short). Depth d + 1 counts position t where token
        t + 2 + d is valid and the data's tokens t + 2 .. t + 1 + d are the base's own (the draft's path).
    """
    length = input_ids.shape[1]
    on_path = torch.ones_like(input_ids[:, :-1], dtype=torch.bool)  # [B, T - 1]
    scored = []
    for step, top in enumerate(drafted):
        count = length - 2 - step  # positions t whose target t + 2 + step lies inside the row
        if count <= 0:
            break
        wanted = greedy[:, 1 + step : 1 + step + count]  # [B, count]
        valid = on_path[:, :count] & valid_tokens[:, 2 + step :].bool()
        row, position = valid.nonzero(as_tuple=True)
        hit = top[:, :count][row, position] == wanted[row, position]
        scored.append(Positions(row, position + 2 + step, wanted[row, position], hit))
        on_path[:, :count] &= input_ids[:, 2 + step :] == wanted  # the next depth is fed the data's token
    return scored


@dataclass
class Tally:
    hits: int = 0
    positions: int = 0

    @property
    def agreement(self) -> float:
        return self.hits / self.positions if self.positions else float("nan")


def confidence_bin(probability: float, bins: Sequence[float] = CONFIDENCE_BINS) -> str:
    """The name of the bin ``[lo, hi)`` holding ``probability`` (the last bin includes its upper edge)."""
    for low, high in zip(bins[:-1], bins[1:], strict=True):
        if low <= probability < high or (high == bins[-1] and probability == high):
            return f"p1 [{low:.1f}, {high:.1f})"
    raise ValueError(f"probability {probability} lies outside the bins {list(bins)}")


@dataclass
class StratifiedAgreement:
    """Agreement by depth and group over held-out rows, added a batch at a time (:meth:`add`).

    Attributes:
        groups: per depth, group name -> :class:`Tally`.
        rows: per row added, per depth, ``(hits, positions)`` (for :func:`paired_bootstrap`).
        confident: the base's top-1 probability above :data:`CONFIDENT`, over the depth-1 positions.
    """

    depth: int
    groups: list[dict[str, Tally]] = field(default_factory=list)
    rows: list[list[tuple[int, int]]] = field(default_factory=list)
    confident: Tally = field(default_factory=Tally)

    def __post_init__(self) -> None:
        self.groups = self.groups or [{} for _ in range(self.depth)]

    def add(
        self,
        input_ids: torch.Tensor,
        valid_tokens: torch.Tensor,
        p_top1: torch.Tensor,
        scored: Sequence[Positions],
        t2d: torch.Tensor | None,
    ) -> None:
        """Count one batch.

        Args:
            input_ids: ``[B, T]`` the rows.
            valid_tokens: ``[B, T]`` bool, the tokens that count (the answer).
            p_top1: ``[B, T]`` the base's top-1 probability after each position.
            scored: the batch's :func:`scored_positions`.
            t2d: ``[V]`` bool, the draft vocabulary (None: the whole vocabulary).
        """
        continuations = []
        for row in range(input_ids.shape[0]):
            answer = valid_tokens[row].nonzero()
            start = int(answer[0]) if answer.numel() else input_ids.shape[1]
            continuations.append(ngram_continuations(input_ids[row].tolist(), start))
        row_tallies = [[Tally() for _ in range(self.depth)] for _ in range(input_ids.shape[0])]
        for depth, positions in enumerate(scored[: self.depth]):
            columns = (positions.row, positions.target, positions.wanted, positions.hit)
            for row, target, wanted, hit in zip(*(column.tolist() for column in columns), strict=True):
                confidence = float(p_top1[row, target - 1])  # the base's probability of its token at `target`
                names = ["all", "copy" if continuations[row][target] == wanted else "novel"]
                names.append("in_vocab" if t2d is None or bool(t2d[wanted]) else "off_vocab")
                names.append(confidence_bin(confidence))
                for name in names:
                    tally = self.groups[depth].setdefault(name, Tally())
                    tally.hits += hit
                    tally.positions += 1
                row_tallies[row][depth].hits += hit
                row_tallies[row][depth].positions += 1
                if depth == 0:
                    self.confident.hits += confidence > CONFIDENT
                    self.confident.positions += 1
        self.rows += [[(t.hits, t.positions) for t in tallies] for tallies in row_tallies]

    def summary(self) -> dict:
        """``{"depths": [{group: {"agreement", "positions", "share"}}], "base_top1_above_half": float,
        "rows": int}``; a group's share is its part of the depth's positions."""
        depths = []
        for groups in self.groups:
            total = groups.get("all", Tally()).positions
            depths.append(
                {
                    name: {
                        "agreement": tally.agreement,
                        "positions": tally.positions,
                        "share": tally.positions / total if total else float("nan"),
                    }
                    for name, tally in sorted(groups.items(), key=lambda item: _group_order(item[0]))
                }
            )
        return {"depths": depths, "base_top1_above_half": self.confident.agreement, "rows": len(self.rows)}


GROUPS = ("all", "copy", "novel", "in_vocab", "off_vocab")  # then the confidence bins, in order


def _group_order(name: str) -> tuple[int, str]:
    return (GROUPS.index(name), name) if name in GROUPS else (len(GROUPS), name)


def paired_bootstrap(
    first: Sequence[tuple[int, int]],
    second: Sequence[tuple[int, int]],
    rounds: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(difference, low, high)``: agreement of ``second`` minus that of ``first`` over the same rows, and its
    percentile interval, resampling rows with replacement (the same rows for both heads: a paired comparison).

    Args:
        first, second: per row, ``(hits, positions)`` of each head at one depth (:attr:`StratifiedAgreement.rows`).
        rounds: bootstrap resamples.
        level: the interval's coverage.
        seed: the resampling seed (the interval is reproducible).

    Raises:
        ValueError: the rows differ in number or in positions (not the same held-out set), or none is scored.
    """
    hits_a, positions_a = torch.tensor(first, dtype=torch.float64).reshape(-1, 2).unbind(dim=1)
    hits_b, positions_b = torch.tensor(second, dtype=torch.float64).reshape(-1, 2).unbind(dim=1)
    if positions_a.shape != positions_b.shape or not torch.equal(positions_a, positions_b):
        raise ValueError("the two heads were not scored on the same positions: a paired interval needs the same rows")
    if not positions_a.sum() > 0:
        raise ValueError("no scored positions")
    difference = float((hits_b.sum() - hits_a.sum()) / positions_a.sum())
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(positions_a), (rounds, len(positions_a)), generator=generator)  # [rounds, rows]
    counts = positions_a[picks].sum(dim=1).clamp_min(1)
    differences = (hits_b[picks].sum(dim=1) - hits_a[picks].sum(dim=1)) / counts
    tail = (1 - level) / 2
    low, high = torch.quantile(differences, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return difference, low, high
