"""``python -m specheads.train --config recipe.yaml [key.sub=value ...]``: the entry point for ``accelerate launch``.

accelerate launch -m specheads.train --config configs/default/medusa1.yaml train.steps=200
accelerate launch --multi_gpu --num_processes 2 -m specheads.train --config ...
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of :class:`specheads.options.TrainOptions`: --config, --threads, --dtype and the overrides."""
    from specheads.options import TrainOptions, add_options

    add_options(parser, TrainOptions)


def run(config_path: str | None, overrides: Sequence[str], threads: int | None = None, dtype: str | None = None) -> int:
    """Train as the recipe says and return the exit code: 0 when the heads are written, or when this run already
    finished (nothing changes; raise ``train.steps`` to continue it); 130 / 143 after SIGINT / SIGTERM, with a
    checkpoint of the last finished step and one line on stderr instead of a traceback.

    ``dtype``: the base's dtype, as the override ``model.dtype=...`` (None: the recipe's).
    ``threads``: torch's CPU threads; None takes the cores other processes leave idle, divided among the launch's
    processes (``LOCAL_WORLD_SIZE``), as every specheads command does (spinning OpenMP threads on busy cores run
    several times slower).
    """
    from specheads.training.checkpoints import finished_run
    from specheads.training.config import load_config
    from specheads.training.trainer import TrainingInterrupted, train

    overrides = [*overrides, f"model.dtype={dtype}"] if dtype is not None else list(overrides)
    config = load_config(config_path, overrides)
    _set_threads(threads)
    finished = finished_run(config)
    if finished is not None:
        print(f"{finished.parent} holds this run, complete: heads in {finished} (raise train.steps to train further)")
        return 0
    try:
        heads_dir = train(config)
    except TrainingInterrupted as interrupted:  # the current step was finished and checkpointed
        print(f"specheads train: {interrupted}", file=sys.stderr)
        return interrupted.exit_code
    except KeyboardInterrupt:  # before the first step or after the last: the last complete checkpoint is kept
        print("specheads train: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        _shutdown_distributed()
    print(f"heads written to {heads_dir}")
    return 0


def _set_threads(threads: int | None) -> None:
    import os

    import torch

    from specheads import machine

    if threads is None:
        local_processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        idle = machine.measure_load().idle_cores
        threads = max(1, min(torch.get_num_threads(), idle // local_processes))
    torch.set_num_threads(threads)


def _shutdown_distributed() -> None:
    """Tear the process group down explicitly: left to interpreter exit, a gloo group can hang a rank forever."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank reaches teardown before any leaves
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specheads.train", description="Train draft heads on a frozen base.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args.config, args.overrides, args.threads, args.dtype)
    except (ValueError, FileNotFoundError) as error:
        print(f"specheads train: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
