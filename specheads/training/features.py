"""An offline cache of the frozen base's features, written once and reused across epochs, runs and head types.

Training heads on a frozen base runs the base forward on every micro-batch, again each epoch and again for every
head type trained on the same data. The cache stores, for every training row, the base's hidden states at the
layers the heads read (EAGLE-3's fused low/middle/high layers) and its final hidden state (what the lm_head reads:
Medusa's input, and the targets, recomputed through the frozen lm_head and the base's own logit transform instead
of stored: ``V`` floats a token would not fit on any disk; a base whose transform the cache does not know to
reproduce exactly is refused, see :func:`logit_transform`). Shards are bf16 safetensors of ``rows_per_shard``
rows each, cut to the longest real row of the shard.

Layout of ``DIR``::

    index.json              base fingerprint, layer ids, data fingerprint, rows, rows_per_shard, hidden size
    rows.json               a short sha256 of every row's ids and masks, in order
    shard-00000.safetensors input_ids int32 [n, T], attention_mask / loss_mask int8 [n, T],
                            hidden.<layer> bf16 [n, T, H] for each cached layer (the last one is the final state)

Writing is resumable: every shard is written under a temporary name and renamed (an existing shard is complete),
and a cache whose ``index.json`` names another base, other layers or other data is refused rather than mixed. A
cache whose first rows are this data's rows (``rows.json`` holds a digest of every row: the data of a run on
``data.limit`` records of the data the cache was written for) serves them without writing anything, so the points
of a learning curve share one cache; and data whose first rows are the cache's (a distillation file that grew) grows
the cache: only the new rows go through the base.
Reading is by memory-mapped safetensors; a row is returned cut to its real length and batches are right-padded by
:func:`collate_padded`.

Training steps and every method's held-out evaluation read the base through one :class:`BaseView` a batch, built
from a forward or from a cached batch alike: hidden states by layer, the teacher and the greedy tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from specheads.heads.checkpoint import atomic_write, fingerprint
from specheads.training.losses import TeacherLogits, projected_top_k

INDEX = "index.json"
ROWS = "rows.json"  # the digest of every cached row, in order
ROWS_PER_SHARD = 64
_ROW_COLUMNS = ("input_ids", "attention_mask", "loss_mask")


class FeatureCacheError(ValueError):
    """A feature cache that does not belong to this base, these layers or this data."""


def rows_fingerprint(dataset: Any, chunk: int = 1024) -> str:
    """sha256 over the token ids and masks of every row, in order: the identity of the tokenised training data."""
    digest = hashlib.sha256()
    for start in range(0, len(dataset), chunk):
        rows = dataset[start : start + chunk]
        for name in _ROW_COLUMNS:
            digest.update(torch.as_tensor(rows[name]).to(torch.int32).numpy().tobytes())
    return digest.hexdigest()


def row_digests(dataset: Any, chunk: int = 1024) -> list[str]:
    """A short sha256 of every row's ids and masks, in order: which rows a cache holds, so that a cache of more rows
    can serve data whose rows are its first ones (a run on ``data.limit`` records of the same data)."""
    digests = []
    for start in range(0, len(dataset), chunk):
        rows = dataset[start : start + chunk]
        columns = [torch.as_tensor(rows[name]).to(torch.int32) for name in _ROW_COLUMNS]
        for index in range(len(columns[0])):
            digest = hashlib.sha256()
            for column in columns:
                digest.update(column[index].numpy().tobytes())
            digests.append(digest.hexdigest()[:16])
    return digests


def cache_identity(base: torch.nn.Module, layers: Sequence[int], data_fingerprint: str, rows: int) -> dict[str, Any]:
    """What a cache must match to be reused: the base's fingerprint, the layers, the tokenised data."""
    return {
        "base_fingerprint": fingerprint(base),
        "layers": [int(layer) for layer in layers],
        "data_fingerprint": data_fingerprint,
        "rows": int(rows),
        "hidden_size": int(base.config.hidden_size),
    }


def write_feature_cache(
    base: torch.nn.Module,
    dataset: Any,
    layers: Sequence[int],
    directory: str | Path,
    data_fingerprint: str,
    batch_size: int = 8,
    rows_per_shard: int = ROWS_PER_SHARD,
    progress: bool = True,
) -> Path:
    """Run the base over ``dataset`` once and write the features of ``layers`` (hidden_states indices); shards
    already on disk are kept. Returns the cache directory.

    Args:
        base: the frozen base (eval mode).
        dataset: rows with ``input_ids``, ``attention_mask``, ``loss_mask`` (torch format), in training order.
        layers: ``hidden_states`` indices to keep; the last hidden state (index ``num_hidden_layers``) is added.
        directory: the cache directory.
        data_fingerprint: identifies the tokenised rows (e.g. datasets' ``Dataset._fingerprint``).

    Raises:
        FeatureCacheError: the directory holds a cache of another base, other layers or other data; or the base
            transforms its logits in a way the cached teacher cannot reproduce (see :func:`logit_transform`).
    """
    logit_transform(base)  # refused before the base runs over the data, not when training reads the cache
    directory = Path(directory)
    final_layer = int(base.config.num_hidden_layers)
    layers = sorted({*(int(layer) for layer in layers), final_layer})
    identity = {**cache_identity(base, layers, data_fingerprint, len(dataset)), "rows_per_shard": rows_per_shard}
    digests = row_digests(dataset)
    identity = _check_or_write_index(directory, identity, digests)
    if identity["rows"] > len(dataset):  # a cache of more rows, ours first: read it, never write into it
        CachedFeatures(directory, rows=len(dataset))  # raises when shards of our rows are missing
        return directory
    layers = identity["layers"]
    shards = math.ceil(len(dataset) / rows_per_shard)
    todo = [shard for shard in range(shards) if not _shard_path(directory, shard).is_file()]
    device = base.get_output_embeddings().weight.device
    bar = tqdm(total=len(dataset), desc="feature cache", unit="row", disable=not progress)
    bar.update(len(dataset) - sum(_shard_rows(shard, len(dataset), rows_per_shard) for shard in todo))
    for shard in todo:
        start = shard * rows_per_shard
        rows = dataset[start : min(start + rows_per_shard, len(dataset))]
        tensors = _shard_features(base, rows, layers, batch_size, device)
        atomic_write(_shard_path(directory, shard), lambda path, tensors=tensors: save_file(tensors, str(path)))
        bar.update(len(rows["input_ids"]))
    bar.close()
    return directory


def _shard_rows(shard: int, rows: int, rows_per_shard: int) -> int:
    return min(rows_per_shard, rows - shard * rows_per_shard)


def _shard_path(directory: Path, shard: int) -> Path:
    return directory / f"shard-{shard:05d}.safetensors"


def _check_or_write_index(directory: Path, identity: dict[str, Any], digests: list[str]) -> dict[str, Any]:
    """The cache's identity: the recorded one when it matches (a cache of more layers serves fewer, a cache of more
    rows whose first rows are these serves them), else written."""
    path = directory / INDEX
    if path.is_file():
        recorded = json.loads(path.read_text())
        if set(identity["layers"]) <= set(recorded.get("layers", [])):
            identity = {**identity, "layers": recorded["layers"]}
        recorded_rows = int(recorded.get("rows", 0))
        if recorded_rows > identity["rows"] and _recorded_digests(directory)[: len(digests)] == digests:
            identity = {**identity, "rows": recorded["rows"], "data_fingerprint": recorded["data_fingerprint"]}
        elif (
            recorded_rows < identity["rows"]
            and {**recorded, "rows": identity["rows"], "data_fingerprint": identity["data_fingerprint"]} == identity
            and _recorded_digests(directory) == digests[:recorded_rows]
        ):
            _grow(directory, recorded, identity, digests)  # data that grew: its first rows are the cache's
            return identity
        if recorded != identity:
            differing = sorted(key for key in identity if recorded.get(key) != identity[key])
            raise FeatureCacheError(
                f"{directory} holds a feature cache of other {', '.join(differing)}; give another data.feature_cache "
                "directory or delete this one"
            )
        return identity
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / ROWS, lambda target: target.write_text(json.dumps(digests) + "\n"))
    atomic_write(path, lambda target: target.write_text(json.dumps(identity, indent=2) + "\n"))
    return identity


def _grow(directory: Path, recorded: dict[str, Any], identity: dict[str, Any], digests: list[str]) -> None:
    """Make the cache of ``recorded`` rows the cache of the grown data: its last shard, when it holds fewer rows
    than a shard, is removed (it is written again with the rows that now follow), then the row list and the index
    are rewritten (the index last). The shards before stay as they are."""
    per_shard = int(recorded["rows_per_shard"])
    rows = int(recorded["rows"])
    if rows % per_shard:
        _shard_path(directory, rows // per_shard).unlink(missing_ok=True)
    atomic_write(directory / ROWS, lambda target: target.write_text(json.dumps(digests) + "\n"))
    atomic_write(directory / INDEX, lambda target: target.write_text(json.dumps(identity, indent=2) + "\n"))


def _recorded_digests(directory: Path) -> list[str]:
    path = directory / ROWS
    return json.loads(path.read_text()) if path.is_file() else []


@torch.inference_mode()
def _shard_features(
    base: torch.nn.Module, rows: dict[str, Any], layers: Sequence[int], batch_size: int, device: torch.device
) -> dict[str, torch.Tensor]:
    columns = {name: torch.as_tensor(rows[name]) for name in _ROW_COLUMNS}
    real = columns["attention_mask"].bool()
    length = int(real.any(dim=0).nonzero().max()) + 1 if real.any() else 1
    columns = {name: value[:, :length] for name, value in columns.items()}
    # Rows go through the base in batches of similar length, each cut to its longest row (right padding: no real
    # position sees a padded one), and are put back in order padded with zeros.
    lengths = real.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True)
    rows_count, hidden_size = len(order), int(base.config.hidden_size)
    hidden = {layer: torch.zeros(rows_count, length, hidden_size, dtype=torch.bfloat16) for layer in layers}
    for start in range(0, rows_count, batch_size):
        chosen = order[start : start + batch_size]
        width = max(int(lengths[chosen].max()), 1)
        ids = columns["input_ids"][chosen, :width].long().to(device)
        mask = columns["attention_mask"][chosen, :width].long().to(device)
        out = base(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
        for layer in layers:
            hidden[layer][chosen, :width] = out.hidden_states[layer].to(torch.bfloat16).cpu()
    tensors = {
        "input_ids": columns["input_ids"].to(torch.int32).contiguous(),
        "attention_mask": columns["attention_mask"].to(torch.int8).contiguous(),
        "loss_mask": columns["loss_mask"].to(torch.int8).contiguous(),
    }
    tensors.update({f"hidden.{layer}": values for layer, values in hidden.items()})
    return tensors


class CachedFeatures(torch.utils.data.Dataset):
    """The rows of a feature cache: ``input_ids``, ``attention_mask``, ``loss_mask`` and ``hidden.<layer>``, each
    cut to the row's real length (batch them with :func:`collate_padded`); ``rows``: only the first ones."""

    def __init__(self, directory: str | Path, rows: int | None = None) -> None:
        self.directory = Path(directory)
        index = self.directory / INDEX
        if not index.is_file():
            raise FeatureCacheError(f"{self.directory} is not a feature cache (no {INDEX})")
        self.identity = json.loads(index.read_text())
        self.rows = int(self.identity["rows"]) if rows is None else min(int(rows), int(self.identity["rows"]))
        self.rows_per_shard = int(self.identity["rows_per_shard"])
        self.layers = [int(layer) for layer in self.identity["layers"]]
        self._handles: dict[int, Any] = {}
        missing = [
            shard
            for shard in range(math.ceil(len(self) / self.rows_per_shard))
            if not _shard_path(self.directory, shard).is_file()
        ]
        if missing:
            raise FeatureCacheError(
                f"{self.directory} misses {len(missing)} shards (first: {missing[0]}); finish writing it (train on "
                "the data it was written for)"
            )

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        shard, row = divmod(int(index), self.rows_per_shard)
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = safe_open(str(_shard_path(self.directory, shard)), framework="pt")
        mask = handle.get_slice("attention_mask")[row]
        length = int(mask.nonzero().max()) + 1 if mask.any() else 1
        item = {name: handle.get_slice(name)[row, :length] for name in _ROW_COLUMNS}
        item.update({f"hidden.{layer}": handle.get_slice(f"hidden.{layer}")[row, :length] for layer in self.layers})
        return item

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers open their own handles
        return {**self.__dict__, "_handles": {}}


def collate_padded(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad rows of different lengths to the longest one (masks 0, ids 0, features 0) and stack them."""
    length = max(int(row["input_ids"].shape[0]) for row in rows)
    batch = {}
    for name in rows[0]:
        parts = []
        for row in rows:
            value = row[name]
            pad = length - value.shape[0]
            if pad:
                value = torch.cat([value, value.new_zeros((pad, *value.shape[1:]))])
            parts.append(value)
        batch[name] = torch.stack(parts)
    return batch


class CachedOutput:
    """What the train steps read from a base forward, served from a cached batch: ``hidden_states[layer]`` for the
    cached layers and ``logits``, computed on first use through the frozen lm_head from the final hidden state and
    the base's own logit transform (:func:`logit_transform`: soft-capping, a logit scale), as its forward does.

    Raises:
        FeatureCacheError: the base's logits cannot be reproduced from its final hidden state.
    """

    def __init__(self, base: torch.nn.Module, batch: dict[str, torch.Tensor]) -> None:
        self._base = base
        self._transform = logit_transform(base)
        self._final = int(base.config.num_hidden_layers)
        self._hidden = {
            int(name.split(".", 1)[1]): value for name, value in batch.items() if name.startswith("hidden.")
        }
        self._logits: torch.Tensor | None = None
        self.hidden_states = _LayerView(self._hidden, self._final)

    @property
    def logits(self) -> torch.Tensor:
        if self._logits is None:
            head = self._base.get_output_embeddings()
            with torch.no_grad():
                logits = head(self._hidden[self._final].to(head.weight.dtype))  # [B, T, V]
                self._logits = logits if self._transform is None else self._transform(logits)
        return self._logits


class _LayerView:
    def __init__(self, hidden: dict[int, torch.Tensor], final: int) -> None:
        self._hidden, self._final = hidden, final

    def __getitem__(self, layer: int) -> torch.Tensor:
        index = self._final + 1 + layer if layer < 0 else layer
        if index not in self._hidden:
            raise FeatureCacheError(
                f"hidden_states[{layer}] is not in the feature cache (it holds layers {sorted(self._hidden)}); write "
                "the cache with the layers these heads read"
            )
        return self._hidden[index].float()

    def __len__(self) -> int:
        return self._final + 1


def base_output(base: torch.nn.Module, batch: dict[str, torch.Tensor], full_logits: bool = True, **kwargs: Any) -> Any:
    """The base's output for a batch: from the feature cache when the batch carries cached hidden states, else one
    forward of the base with ``output_hidden_states=True`` (``kwargs`` go to that forward).

    ``full_logits=False``: the online forward skips the ``[B, T, V]`` logits (``logits_to_keep=1``) when
    :func:`teacher_logits` can rebuild what a loss needs from the final hidden state; the cached output computes its
    logits only when asked anyway.
    """
    if any(name.startswith("hidden.") for name in batch):
        return CachedOutput(base, batch)
    if not full_logits and projectable(base):
        kwargs = {**kwargs, "logits_to_keep": 1}
    return base(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True, **kwargs
    )


# Config fields of models whose logits are not a plain linear map of the final hidden state, with the values that
# leave the logits as they are (soft-capping is off only when unset: a cap of 1.0 is tanh).
_LOGIT_TRANSFORMS = {
    "final_logit_softcapping": (None,),
    "logit_scale": (None, 1.0),
    "output_multiplier_scale": (None, 1.0),
    "logits_scaling": (None, 1.0),
}

# The transforms transformers' causal-LM forwards apply to ``lm_head(final hidden state)``, by config field: the model
# types whose modeling file applies exactly this (the same operations in the same order, in the logits' dtype), and
# the operation. A field set on any other model type is a transform the feature cache does not know to reproduce.
_EXACT_TRANSFORMS: dict[str, tuple[frozenset[str], Callable[[torch.Tensor, float], torch.Tensor]]] = {
    # Gemma 2, Gemma 3's text model: logits / cap, tanh, * cap
    "final_logit_softcapping": (
        frozenset({"gemma2", "gemma3_text"}),
        lambda logits, cap: torch.tanh(logits / cap) * cap,
    ),
    # Cohere, Cohere 2: logits * logit_scale
    "logit_scale": (frozenset({"cohere", "cohere2"}), lambda logits, scale: logits * scale),
    # Granite and its MoE variants: logits / logits_scaling
    "logits_scaling": (
        frozenset({"granite", "granitemoe", "granitemoeshared", "granitemoehybrid"}),
        lambda logits, scale: logits / scale,
    ),
}


def _transform_fields(base: torch.nn.Module) -> dict[str, Any]:
    """The logit-transform fields the base's config sets to something other than the identity."""
    config = getattr(base, "config", None)
    return {
        name: getattr(config, name)
        for name, identity in _LOGIT_TRANSFORMS.items()
        if getattr(config, name, None) not in identity
    }


def logit_transform(base: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What the base's forward applies to ``lm_head(final hidden state)`` to give its logits (Gemma 2's
    soft-capping, Cohere's and Granite's logit scales), as one elementwise function; None when nothing.

    Raises:
        FeatureCacheError: the config sets a transform that is not known to be exactly this for its model type (or
            more than one): a cached teacher would train the heads against other logits than the base's, so the
            feature cache refuses the base.
    """
    fields = _transform_fields(base)
    if not fields:
        return None
    model_type = getattr(getattr(base, "config", None), "model_type", None)
    (name, value), *others = fields.items()
    types, transform = _EXACT_TRANSFORMS.get(name, (frozenset(), None))
    if others or model_type not in types:
        settings = ", ".join(f"{field}={setting}" for field, setting in fields.items())
        raise FeatureCacheError(
            f"the feature cache cannot reproduce this base's logits ({model_type} with {settings} on top of its "
            "lm_head); train with the base in the loop (leave data.feature_cache unset)"
        )
    return lambda logits: transform(logits, value)


def projectable(base: torch.nn.Module) -> bool:
    """Whether the base's logits are ``lm_head(hidden_states[-1])`` with a plain linear ``lm_head``, so that any of
    their columns can be computed alone (no soft-capping or logit scale on top)."""
    head = base.get_output_embeddings()
    return isinstance(head, torch.nn.Linear) and not _transform_fields(base)


@torch.no_grad()
def teacher_logits(base: torch.nn.Module, out: Any, columns: torch.Tensor | None) -> torch.Tensor:
    """The base's logits at every position, restricted to ``columns`` (a draft vocabulary; None: all of them).

    With a plain linear lm_head only those rows of it are multiplied with the final hidden state: a 6,144-token
    draft vocabulary of SmolLM2's 49,152 costs an eighth of the full projection, which at 576 hidden dimensions costs
    more than a training-time-test step of the head. The softmax over these columns is the teacher's distribution
    renormalised onto the draft vocabulary, which is what the losses read (:class:`TeacherLogits`).
    """
    if not projectable(base):
        logits = out.logits
        return logits if columns is None else logits[..., columns]
    head = base.get_output_embeddings()
    weight = head.weight if columns is None else head.weight[columns]
    bias = None if head.bias is None else (head.bias if columns is None else head.bias[columns])
    hidden = out.hidden_states[len(out.hidden_states) - 1]
    return torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias)


@torch.no_grad()
def teacher_greedy(base: torch.nn.Module, out: Any) -> torch.Tensor:
    """``[B, T]`` the base's greedy token after every position (the argmax of its logits there).

    With a plain linear lm_head (:func:`projectable`) the logits exist a chunk of positions at a time
    (:func:`~specheads.training.losses.projected_top_k`), never as ``[B, T, V]``; otherwise they are the output's own
    logits, which such a base's forward (or the cached teacher) builds whole anyway.
    """
    if not projectable(base):
        return out.logits.argmax(dim=-1)
    head = base.get_output_embeddings()
    hidden = out.hidden_states[len(out.hidden_states) - 1]
    return projected_top_k(hidden.to(head.weight.dtype), head.weight, head.bias, 1)[..., 0]


class BaseView:
    """The frozen base seen once for a batch: every way a training step or a held-out evaluation reads the base.

    Built by :meth:`of` from one forward of the base or from a feature-cache batch (:class:`CachedOutput`), so that
    a method never calls the base itself. ``hidden_states[layer]`` (or :meth:`hidden`) and :attr:`final` are the
    base's hidden states; :meth:`teacher` its logits over some columns and :meth:`greedy` its greedy tokens,
    projected from the final state through the lm_head with the base's own logit transform, the greedy tokens a
    chunk of positions at a time (:func:`teacher_logits`, :func:`teacher_greedy`); :attr:`logits` the whole
    ``[B, T, V]`` logits, for a loss that reads every column.
    """

    def __init__(self, base: torch.nn.Module, output: Any) -> None:
        self.base = base
        self.output = output  # a base forward's output, or a CachedOutput

    @classmethod
    def of(
        cls, base: torch.nn.Module, batch: dict[str, torch.Tensor], full_logits: bool = True, **kwargs: Any
    ) -> BaseView:
        """The view of ``batch`` (see :func:`base_output`: ``full_logits=False`` skips the forward's ``[B, T, V]``
        logits where :meth:`teacher` and :meth:`greedy` can rebuild them; ``kwargs`` go to the forward)."""
        return cls(base, base_output(base, batch, full_logits=full_logits, **kwargs))

    @property
    def hidden_states(self) -> Any:
        """The base's hidden states, indexed by layer (0: the embeddings; ``-1``: the final, normed state)."""
        return self.output.hidden_states

    def hidden(self, layer: int) -> torch.Tensor:
        """``[B, T, H]`` the base's hidden state at ``layer`` (a ``hidden_states`` index)."""
        return self.output.hidden_states[layer]

    @property
    def final(self) -> torch.Tensor:
        """``[B, T, H]`` the final hidden state, the one the lm_head reads."""
        return self.hidden(len(self.output.hidden_states) - 1)

    @property
    def logits(self) -> torch.Tensor:
        """``[B, T, V]`` the base's logits at every position (the forward's own; the cached teacher's otherwise)."""
        return self.output.logits

    def teacher(self, columns: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T, C]`` the base's logits restricted to ``columns`` (None: all ``V``; :func:`teacher_logits`)."""
        return teacher_logits(self.base, self.output, columns)

    def greedy(self) -> torch.Tensor:
        """``[B, T]`` the base's greedy token after every position, a chunk of positions at a time
        (:func:`teacher_greedy`)."""
        return teacher_greedy(self.base, self.output)

    def soft_teacher(self, rows: torch.Tensor | None = None, columns: torch.Tensor | None = None) -> TeacherLogits:
        """The base's distributions at the flat positions ``rows`` (into ``[B * T]``; None: all) over ``columns``
        (None: all ``V``) as soft targets for :func:`~specheads.training.losses.linear_cross_entropy`: projected
        from the final hidden state a chunk of positions at a time where the lm_head is a plain linear
        (:func:`projectable`), so that the ``[B, T, V]`` logits never exist; else read from the whole logits (the
        forward's, or the cached teacher's with the base's logit transform)."""
        if projectable(self.base):
            head = self.base.get_output_embeddings()
            return TeacherLogits(self.final.flatten(0, 1), rows, columns, projection=(head.weight, head.bias))
        return TeacherLogits(self.logits.flatten(0, 1), rows, columns)

    @torch.no_grad()
    def teacher_at(self, batch_index: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[*, V]`` the base's logits at ``(batch_index, positions)`` (broadcast index tensors): only those
        positions are projected through the lm_head where it is a plain linear (:func:`projectable`), else they
        are gathered from the whole logits."""
        if not projectable(self.base):
            return self.logits[batch_index, positions]
        head = self.base.get_output_embeddings()
        return head(self.final[batch_index, positions].to(head.weight.dtype))
