"""Native head checkpoints: ``config.json`` + ``model.safetensors``, bound to one base model by a fingerprint.

Loading never unpickles: only safetensors are read, and a ``.bin``/``.pt`` file is refused with a message that says
how to convert it. Files are written to a temporary name and renamed, so a crash never leaves a checkpoint that
looks complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from specheads.loading import vocab_size

SPECHEADS_FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
FLOAT32_EXACT_INTEGERS = 2**24  # float32 holds every integer up to here, and not every one above


class HeadCheckpointError(ValueError):
    """A head checkpoint that cannot be loaded (missing, corrupt, pickled, or made for another base)."""


def base_model_info(base: PreTrainedModel) -> dict[str, Any]:
    """What a head checkpoint records about its base: names, dimensions and a fingerprint."""
    config = base.config
    return {
        "name_or_path": getattr(config, "_name_or_path", "") or "",
        "architectures": list(getattr(config, "architectures", None) or [type(base).__name__]),
        "hidden_size": int(base.get_output_embeddings().weight.shape[1]),
        "vocab_size": vocab_size(base),
        "num_hidden_layers": int(getattr(config, "num_hidden_layers", 0) or 0),
        "fingerprint": fingerprint(base),
        "weight_sample": weight_sample(base),
    }


def weight_sample(base: PreTrainedModel, size: int = 32, fused: bool = True) -> list[float]:
    """A fixed, evenly spaced sample of the base's output-embedding weights (fp32 values).

    Args:
        base: the base model.
        size: how many weights (fewer when the lm_head has fewer elements).
        fused: which rounding of earlier fingerprints to reproduce on small bases (see :func:`sample_indices`).
    """
    weight = base.get_output_embeddings().weight.detach().flatten()
    index = torch.tensor(sample_indices(weight.numel(), size, fused), dtype=torch.long, device=weight.device)
    return [round(value, 6) for value in weight[index].float().cpu().tolist()]


def sample_indices(numel: int, size: int = 32, fused: bool = True) -> list[int]:
    """``min(size, numel)`` increasing indices into ``numel`` elements, evenly spaced, the first and last included.

    Exact integer arithmetic at any size. Earlier versions took ``torch.linspace(0, numel - 1, size).long()`` in
    float32, whose rounding makes some indices differ from ``i * (numel - 1) // (size - 1)`` and, above 2**24
    elements, could push the last one to ``numel`` (an IndexError on real vocabularies). Up to 2**24 elements the
    float32 indices are reproduced exactly, so fingerprints recorded then stay valid: PyTorch's CPU kernel takes
    ``step * i`` below the halfway index and ``end - step * (size - 1 - i)`` from it, rounded once (a fused
    multiply-add, its AVX2/AVX512 kernels) or twice (``fused=False``, its kernels without FMA). Above 2**24 elements
    the indices are ``i * (numel - 1) // (size - 1)``.

    Args:
        numel: the number of elements sampled.
        size: the number of indices wanted.
        fused: the float32 rounding to reproduce up to 2**24 elements (True: fused multiply-adds).

    Returns:
        the indices, ``[0, ..., numel - 1]``.
    """
    count = min(size, numel)
    if count <= 1:
        return [0] * count
    if numel > FLOAT32_EXACT_INTEGERS:
        return [i * (numel - 1) // (count - 1) for i in range(count)]
    end = Fraction(numel - 1)  # exact in float32 up to 2**24
    step = _float32(end / (count - 1))
    half = count // 2
    indices = []
    for i in range(count):
        if i < half:
            value = _float32(step * i)
        else:
            back = step * (count - 1 - i)
            value = _float32(end - (back if fused else _float32(back)))
        indices.append(int(value))  # .long() truncates
    return indices


def _float32(value: Fraction) -> Fraction:
    """The float32 nearest to ``value`` (ties to even), exactly; ``value`` is >= 0 and in float32's normal range."""
    if value == 0:
        return value
    exponent = value.numerator.bit_length() - value.denominator.bit_length()  # 2**(e - 1) < value < 2**(e + 1)
    if value < Fraction(2) ** exponent:
        exponent -= 1
    unit = Fraction(2) ** (exponent - 23)  # float32 has 24 significant bits
    return round(value / unit) * unit  # round() of a Fraction rounds half to even


def fingerprint(base: PreTrainedModel) -> str:
    """A short hash of the base's architecture and of a fixed sample of its output-embedding weights."""
    config = base.config
    shape = {
        "model_type": getattr(config, "model_type", None),
        "hidden_size": int(base.get_output_embeddings().weight.shape[1]),
        "vocab_size": vocab_size(base),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
    }
    digest = hashlib.sha256(json.dumps({"shape": shape, "sample": weight_sample(base)}, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def check_base(expected: dict[str, Any], base: PreTrainedModel, where: str) -> None:
    """Raise :class:`HeadCheckpointError` naming the first field that differs between ``expected`` and ``base``.

    The fingerprint hash must match exactly, except when the recorded weight sample matches within bf16/fp16
    rounding: the same base loaded in another dtype is the same base. The sample may also be the one earlier
    versions took on a CPU without fused multiply-adds (:func:`sample_indices`).
    """
    actual = base_model_info(base)
    if expected.get("fingerprint") != actual["fingerprint"] and "weight_sample" in expected:
        recorded = expected["weight_sample"]
        if _same_sample(recorded, actual["weight_sample"]) or _same_sample(recorded, weight_sample(base, fused=False)):
            actual["fingerprint"] = expected["fingerprint"]
    for field in ("hidden_size", "vocab_size", "num_hidden_layers", "architectures", "fingerprint"):
        if field in expected and expected[field] != actual[field]:
            raise HeadCheckpointError(
                f"{where} was trained for another base model: base_model.{field} is {expected[field]!r} in the "
                f"checkpoint but {actual[field]!r} for this base ({actual['name_or_path'] or 'in memory'}; heads "
                f"were made for {expected.get('name_or_path') or 'an unnamed base'})"
            )


def _same_sample(recorded: list[float], current: list[float]) -> bool:
    """Whether two weight samples are the same weights, up to bf16/fp16 rounding."""
    recorded_values, current_values = torch.tensor(recorded), torch.tensor(current)
    return recorded_values.shape == current_values.shape and torch.allclose(
        recorded_values, current_values, rtol=1e-2, atol=1e-4
    )


def save_checkpoint(directory: str | Path, config: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> None:
    """Write ``config.json`` and ``model.safetensors`` atomically (weights first, config last)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in state_dict.items()}
    atomic_write(directory / WEIGHTS_NAME, lambda path: save_file(tensors, str(path), metadata={"format": "pt"}))
    text = json.dumps({"specheads_version": SPECHEADS_FORMAT_VERSION, **config}, indent=2) + "\n"
    atomic_write(directory / CONFIG_NAME, lambda path: path.write_text(text))


def read_checkpoint(directory: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read a native head checkpoint; refuse pickles and say what is wrong with anything else."""
    directory = Path(directory)
    if directory.is_file():
        if directory.suffix in PICKLE_SUFFIXES:
            raise HeadCheckpointError(_pickle_message(directory))
        raise HeadCheckpointError(f"{directory} is a file; give the head checkpoint directory")
    if not directory.is_dir():
        raise HeadCheckpointError(f"head checkpoint {directory} does not exist")
    config_path, weights_path = directory / CONFIG_NAME, directory / WEIGHTS_NAME
    if not weights_path.is_file():
        pickles = [p for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise HeadCheckpointError(_pickle_message(pickles[0]))
        raise HeadCheckpointError(f"{directory} holds no {WEIGHTS_NAME}")
    if not config_path.is_file():
        raise HeadCheckpointError(f"{directory} holds no {CONFIG_NAME}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise HeadCheckpointError(f"{config_path} is not valid JSON: {error}") from error
    if not isinstance(config, dict) or "head_type" not in config:
        raise HeadCheckpointError(
            f"{config_path} is neither a specheads head config (no 'head_type') nor an engine layout specheads "
            "imports (eagle3, speculators, eagle, medusa)"
        )
    try:
        tensors = load_file(str(weights_path))
    except Exception as error:  # safetensors raises its own error types for truncated or corrupt files
        raise HeadCheckpointError(f"{weights_path} is not a readable safetensors file: {error}") from error
    return config, tensors


def _pickle_message(path: Path) -> str:
    return (
        f"{path} is a pickle-based file; specheads never unpickles checkpoints (arbitrary code execution). Convert "
        "it once in a trusted environment: torch.load it, build the heads, and call heads.save_pretrained(dir)"
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(target: str | Path, write: Callable[[Path], Any]) -> None:
    """Write a file so that ``target`` is either absent, the old file, or the complete new one: never partial.

    The one place where specheads writes checkpoint files (head checkpoints, the trainer's state and recipe files,
    the pretraining script's checkpoints): ``write(path)`` fills a temporary file in ``target``'s folder, which then
    gets the permissions a plain new file would get (umask respected) and is renamed onto ``target``. The temporary
    file is removed if ``write`` raises.

    Args:
        target: the file to (re)place; its folder must exist.
        write: called once with the temporary path to write, e.g. ``lambda path: path.write_text(text)``.
    """
    target = Path(target)
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    temporary = Path(name)
    try:
        write(temporary)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600 files; a checkpoint is as readable as any file
        os.replace(temporary, target)
    finally:
        if temporary.exists():
            temporary.unlink()


def config_from_checkpoint(config_class: type, config: dict[str, Any], where: str, kind: str) -> Any:
    """Build a head config dataclass from a checkpoint's ``config.json``; unknown keys and bad values are errors."""
    fields = {k: v for k, v in config.items() if k != "specheads_version"}
    unknown = sorted(set(fields) - set(config_class.__dataclass_fields__))
    if unknown:
        raise HeadCheckpointError(f"{where}: unknown {kind} config keys {unknown}")
    try:
        return config_class(**fields)
    except (TypeError, ValueError) as error:
        raise HeadCheckpointError(f"{where}: {error}") from error


def load_module_state(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Load ``tensors`` into ``module`` exactly: a missing or an extra tensor, or one of another shape, is an error.

    ``module`` was built from the checkpoint's ``config.json``; a tensor of another shape in ``model.safetensors``
    means the two files disagree (an edited config), and the error names the tensor, both shapes and the config
    fields whose value is the disagreeing dimension.
    """
    expected = module.state_dict()
    for name, tensor in tensors.items():
        if name in expected and tuple(tensor.shape) != tuple(expected[name].shape):
            raise HeadCheckpointError(_shape_mismatch(module, where, name, tuple(expected[name].shape), tensor))
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise HeadCheckpointError(
            f"{where}: tensors do not match the config (missing {missing[:4]}, unexpected {unexpected[:4]})"
        )


def _shape_mismatch(
    module: torch.nn.Module, where: str, name: str, expected: tuple[int, ...], tensor: torch.Tensor
) -> str:
    """The message for a tensor whose shape is not the one ``config.json`` implies, naming the likely config field."""
    found = tuple(tensor.shape)
    message = (
        f"{Path(where) / WEIGHTS_NAME}: tensor {name!r} has shape {list(found)}, but {Path(where) / CONFIG_NAME} "
        f"describes heads whose {name!r} has shape {list(expected)}; the two files disagree"
    )
    config = getattr(module, "config", None)
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
    sizes = {key: value for key, value in fields.items() if isinstance(value, int) and not isinstance(value, bool)}
    suspects = []
    if len(expected) == len(found):
        for size, actual in zip(expected, found, strict=True):
            if size != actual:
                suspects += [
                    f"{key} is {value} (the weights have {actual})" for key, value in sizes.items() if value == size
                ]
    if suspects:
        message += f". Was {CONFIG_NAME} edited? In it, {'; '.join(dict.fromkeys(suspects))}"
    return message


class DraftHeads(torch.nn.Module):
    """What every method's heads module shares: a config dataclass, a native checkpoint, and binding to its base.

    Subclasses set ``config_class`` (the dataclass saved as ``config.json``, with ``base_model``, the fingerprint of
    the base the heads were made for), ``family`` (how messages name them) and ``bound_as`` (how a fingerprint error
    names them), keep their config in ``self.config``, and override :meth:`bind_base` to read what they need of the
    base (an embedding, an lm_head) and :meth:`check_loaded` to check what a state dict alone cannot.
    """

    config_class: type
    family: str = "draft"
    bound_as: str = "these heads"

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the native checkpoint: ``config.json`` + ``model.safetensors`` (no base weights), atomically."""
        save_checkpoint(directory, dataclasses.asdict(self.config), self.state_dict())

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], tensors: dict[str, torch.Tensor], where: str) -> DraftHeads:
        """Heads from a read checkpoint (see :func:`read_checkpoint`); ``where`` names it in errors."""
        heads = cls(config_from_checkpoint(cls.config_class, config, where, cls.family))
        load_module_state(heads, tensors, where)
        heads.check_loaded(where)
        return heads

    def check_loaded(self, where: str) -> None:
        """Raise :class:`HeadCheckpointError` when loaded weights are inconsistent in a way shapes do not show."""

    def attach_base(self, base_model: PreTrainedModel) -> None:
        """Check that the heads were made for this base (its fingerprint), then bind them to it."""
        check_base(self.config.base_model, base_model, self.bound_as)
        self.bind_base(base_model)

    def bind_base(self, base_model: PreTrainedModel) -> None:
        """Read what the heads use of the base, without checking the fingerprint (e.g. a merged Medusa-2 model).

        By default the heads keep the base itself, read at every step through :meth:`base_model_of`; a list keeps
        the frozen base out of this module's parameters and state.
        """
        self._base = [base_model]

    def base_model_of(self) -> PreTrainedModel:
        """The base bound with :meth:`attach_base` / :meth:`bind_base`.

        Raises:
            RuntimeError: no base is bound yet.
        """
        base = getattr(self, "_base", [None])[0]
        if base is None:
            raise RuntimeError(f"{self.bound_as} needs attach_base(base_model) before use")
        return base
