"""The engine's own cost per decode step: step wall time minus the time spent inside base and draft forwards.

Every ``forward`` of the base and of the drafter's modules is wrapped with a timer; what remains of a step's wall
time is the engine's host work (packing inputs, masks, acceptance, commit, bookkeeping). On a CPU every kernel runs
inside the forward call, so the split is exact; on a GPU pass ``--sync`` so that queued kernels are not counted as
host time.

Usage::

    python scripts/engine_overhead.py [--methods eagle-chain-3,eagle-dynamic-4-5-16,none,eagle-chain-3+lookup-idle]
        [--batch-size 1 8]
        [--prompts 16] [--max-new-tokens 64] [--threads 1] [--package specheads] [--json out.json]

``--package`` names the package to import (a copy of another checkout under another name, for interleaved A/B
runs in one process: ``--package specheads,specheads_old`` with the copy on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class ForwardTimer:
    """Adds up the wall time spent inside the wrapped modules' ``forward`` (nested calls counted once)."""

    def __init__(self, sync: bool = False) -> None:
        self.total = 0.0
        self.depth = 0
        self.sync = sync

    def wrap(self, module: torch.nn.Module) -> None:
        for sub in module.modules():
            self._wrap_one(sub)

    def _wrap_one(self, module: torch.nn.Module) -> None:
        import torch

        original: Callable[..., Any] = module.forward

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return original(*args, **kwargs)
            self.depth += 1
            start = time.perf_counter()
            try:
                out = original(*args, **kwargs)
                if self.sync and torch.cuda.is_available():
                    torch.cuda.synchronize()
                return out
            finally:
                self.total += time.perf_counter() - start
                self.depth -= 1

        module.forward = timed


def _decoder(package: Any, method: str) -> tuple[Any, str | None]:
    """A decoder of the embedded default for one bench-style method name, and its tree.

    A ``+lookup`` suffix composes prompt lookup with the drafter (its defaults); ``+lookup-idle`` composes a lookup
    that proposes nothing (every match length gets 0 tokens): its index is kept and queried every step as by
    default, so the row's cost over the plain method is the composition's overhead where the lookup finds nothing.
    """
    method, _, lookup = method.partition("+")
    if lookup not in ("", "lookup", "lookup-idle"):
        raise SystemExit(f"unknown suffix +{lookup} (+lookup or +lookup-idle)")
    extra: dict[str, Any] = {}
    if lookup == "lookup":
        extra["prompt_lookup"] = True
    elif lookup == "lookup-idle":
        lookup_module = importlib.import_module(f"{package.__name__}.inference.lookup")
        extra["prompt_lookup"] = lookup_module.PromptLookup(tokens_by_match=(0,))
    if method == "none":
        return package.SpecDecoder.from_pretrained("default", method="none", **extra), None
    if method.startswith("eagle-"):
        return package.SpecDecoder.from_pretrained("default", heads="default", **extra), method.removeprefix("eagle-")
    if method == "prompt-lookup":
        return package.SpecDecoder.from_pretrained("default", method="prompt-lookup", **extra), None
    if method.startswith("draft-k"):
        decoder = package.SpecDecoder.from_pretrained(
            "default", draft_model="default", num_speculative_tokens=int(method.removeprefix("draft-k")), **extra
        )
        return decoder, None
    raise SystemExit(f"unknown method {method!r}")


def _drafter_modules(decoder: Any) -> list[torch.nn.Module]:
    import torch

    drafter = decoder.drafter
    return [
        m
        for m in (getattr(drafter, "head", None), getattr(drafter, "heads", None), getattr(drafter, "model", None))
        if isinstance(m, torch.nn.Module)
    ]


def measure(package_name: str, method: str, prompts: list[list[int]], batch: int, new_tokens: int, sync: bool) -> dict:
    package = importlib.import_module(package_name)
    decoder, tree = _decoder(package, method)
    timer = ForwardTimer(sync)
    timer.wrap(decoder.model)
    for module in _drafter_modules(decoder):
        timer.wrap(module)
    kwargs = {"tree": tree} if tree is not None else {}
    decoder.generate(prompts[:batch] if batch > 1 else prompts[0], max_new_tokens=8, **kwargs)  # warm-up
    timer.total = 0.0
    steps = tokens = 0
    start = time.perf_counter()
    for first in range(0, len(prompts) - batch + 1, batch):
        group = prompts[first : first + batch]
        out = decoder.generate(group if batch > 1 else group[0], max_new_tokens=new_tokens, **kwargs)
        outputs = out if batch > 1 else [out]
        steps += max(o.stats.steps for o in outputs)
        tokens += sum(len(o.new_tokens) for o in outputs)
    wall = time.perf_counter() - start
    return {
        "package": package_name,
        "method": method,
        "batch": batch,
        "steps": steps,
        "tokens_per_s": tokens / wall,
        "step_ms": 1000 * wall / steps,
        "forward_ms": 1000 * timer.total / steps,
        "host_ms": 1000 * (wall - timer.total) / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="eagle-chain-3,eagle-dynamic-4-5-16,none")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repeats; the median is reported")
    parser.add_argument("--package", default="specheads", help="comma-separated packages to interleave")
    parser.add_argument("--sync", action="store_true", help="synchronise CUDA at each forward's end (GPU runs)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch  # once the arguments are read: --help and a usage error answer without loading torch

    torch.set_num_threads(args.threads)
    packages = args.package.split(",")
    prompts_module = importlib.import_module(f"{packages[0]}.prompts")
    assets = importlib.import_module(f"{packages[0]}.assets")
    loading = importlib.import_module(f"{packages[0]}.loading")
    tokenizer = loading.load_tokenizer("default")
    records = prompts_module.load_prompts(assets.prompts_path(), tokenizer, limit=args.prompts)
    prompts = [prompts_module.prompt_token_ids(tokenizer, record) for record in records]
    results = []
    for batch in args.batch_size:
        for method in args.methods.split(","):
            runs: dict[str, list[dict]] = {p: [] for p in packages}
            for round_index in range(args.rounds):
                order = packages if round_index % 2 == 0 else packages[::-1]
                for package in order:
                    runs[package].append(measure(package, method, prompts, batch, args.max_new_tokens, args.sync))
            for package, measured in runs.items():
                row = dict(measured[0])
                for key in ("tokens_per_s", "step_ms", "forward_ms", "host_ms"):
                    row[key] = statistics.median(r[key] for r in measured)
                results.append(row)
                print(
                    f"{package:14s} {method:22s} batch {batch:2d}: {row['tokens_per_s']:7.1f} tok/s, step "
                    f"{row['step_ms']:6.2f} ms = forwards {row['forward_ms']:6.2f} + host {row['host_ms']:5.2f} ms",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
