"""``specheads demo``: speculative decoding on the embedded default code model, with nothing to configure."""

from __future__ import annotations

import time

import torch
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from specheads import assets
from specheads.bench import build_methods, run_bench, summarize
from specheads.loading import load_causal_lm, load_tokenizer
from specheads.prompts import load_prompts

DEMO_DRAFT_K = 3  # the best K of the default draft model in BENCHMARKS.md on this class of machine
REPEATS = 3


def run_demo(max_new_tokens: int = 128, prompt_index: int = 0, threads: int | None = None) -> int:
    """Complete one held-out prompt with plain decoding, the draft model and prompt lookup; print the comparison.

    Returns:
        0 when every method produced exactly the base's greedy text, 1 otherwise.
    """
    console = Console()
    started = time.perf_counter()
    if threads:
        torch.set_num_threads(threads)
    tokenizer = load_tokenizer("default")
    base = load_causal_lm("default")
    draft = load_causal_lm("default", role="draft")
    prompts = load_prompts(assets.prompts_path())
    prompt = prompts[prompt_index % len(prompts)]
    info = assets.manifest()
    console.print(
        Panel.fit(
            f"base: {_describe(base)}   draft: {_describe(draft)}\n"
            f"trained on this machine from the Python standard library; held-out loss "
            f"{_heldout_loss(info, 'base')} nats/token\n"
            f"prompt {prompt.id!r} (held out from training), {max_new_tokens} new tokens, temperature 0",
            title="specheads demo",
        )
    )
    console.print("[bold]prompt (last lines):[/bold]")
    console.print("\n".join(prompt.text.splitlines()[-8:]), markup=False, highlight=False)

    methods = build_methods(
        base, draft, draft_ks=(DEMO_DRAFT_K,), only=["none", f"draft-k{DEMO_DRAFT_K}", "prompt-lookup"]
    )
    run_bench(methods, [prompt], tokenizer, max_new_tokens, repeats=REPEATS, progress=False)
    rows = summarize(methods)

    completion = tokenizer.decode(methods[0].outputs[(0, 0)], skip_special_tokens=True)
    console.print("[bold]completion (identical for every method):[/bold]")
    console.print(completion, markup=False, highlight=False)
    table = Table(title=f"{REPEATS} interleaved runs each; speed-up = tokens/s over transformers generate")
    for column in ("method", "tokens/s", "speed-up", "tau", "identical to greedy"):
        table.add_column(column, justify="right" if column != "method" else "left")
    for row in rows:
        tau = "-" if row["mean_accepted_length"] is None else f"{row['mean_accepted_length']:.2f}"
        table.add_row(
            row["name"],
            f"{row['tokens_per_s']:.1f}",
            f"{row['speedup']:.2f}x",
            tau,
            "yes" if row["matches_greedy"] else "[red]NO[/red]",
        )
    console.print(table)
    identical = all(row["matches_greedy"] for row in rows)
    console.print(
        f"all texts identical: {'yes' if identical else 'NO'}; demo took "
        f"{time.perf_counter() - started:.0f}s. Full benchmark: specheads bench --base default "
        f"--draft-model default --out bench-out"
    )
    return 0 if identical else 1


def _describe(model: torch.nn.Module) -> str:
    config = model.config
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return f"{params:.1f}M params, {config.num_hidden_layers} layers, hidden {config.hidden_size}"


def _heldout_loss(info: dict, part: str) -> str:
    value = info.get("models", {}).get(part, {}).get("heldout_loss_nats_per_token")
    return f"{value:.3f}" if isinstance(value, (int, float)) else "?"
