"""``specheads demo``: speculative decoding on the embedded default code model, with nothing to configure."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from specheads import assets
from specheads.bench import build_methods, run_bench, summarize
from specheads.loading import load_causal_lm, load_tokenizer
from specheads.machine import LoadMeter, busy_warning, set_torch_threads
from specheads.methods.eagle.names import KIND as EAGLE_DYNAMIC
from specheads.prompts import load_prompts

DEMO_DRAFT_K = (
    8  # draft-adaptive: up to 8 drafts, stopping when the draft is unsure (fastest draft row in BENCHMARKS.md)
)
DEMO_TREE = "chain-3"  # the Medusa tree the demo decodes with
DEMO_EAGLE_TREE = EAGLE_DYNAMIC  # the shipped EAGLE-3 heads decode with their calibrated EAGLE-2 dynamic tree
REPEATS = 3
CACHE = Path(os.environ.get("SPECHEADS_CACHE", Path.home() / ".cache" / "specheads")) / "demo"
# A short Medusa-1 run that fits the demo's budget on a 2-core CPU; the full recipe is configs/default/medusa1.yaml.
DEMO_TRAINING = [
    "model.base=default",
    "data.paths=[default-corpus:train]",
    "data.max_length=128",
    "data.limit=400",
    "heads.type=medusa",
    "heads.num_heads=3",
    "train.batch_size=8",
    "train.lr=2e-3",
    "train.warmup_steps=10",
    "train.steps=300",
    "train.max_minutes=2.0",
    "output.save_every=0",
    "log.tracker=none",
    "train.overwrite=true",
]


def run_demo(max_new_tokens: int = 128, prompt_index: int = 0, threads: int | None = None, dtype: str = "auto") -> int:
    """Complete one held-out prompt with plain decoding, the draft model, prompt lookup, Medusa and EAGLE-3 heads.

    ``dtype``: the base's and draft's dtype (``"auto"``: the embedded default's float32; in bf16 the outputs are
    compared with the engine's own bf16 decoding, see :mod:`specheads.inference.attention`).

    Returns:
        0 when every method produced exactly the base's greedy text, 1 otherwise.
    """
    console = Console()
    started = time.perf_counter()
    prompts = load_prompts(assets.prompts_path())
    if not 0 <= prompt_index < len(prompts):
        raise ValueError(
            f"--prompt-index must lie in [0, {len(prompts) - 1}] (the shipped prompts), got {prompt_index}"
        )
    prompt = prompts[prompt_index]
    note = busy_warning(set_torch_threads(threads), torch.get_num_threads())
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    tokenizer = load_tokenizer("default")
    base = load_causal_lm("default", dtype=dtype)
    draft = load_causal_lm("default", dtype=base.dtype, role="draft")
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

    heads = [("medusa", demo_heads(console, base)), *shipped_eagle_heads(console, base)]
    methods = build_methods(
        base,
        draft,
        draft_ks=(DEMO_DRAFT_K,),
        only=["none", "draft-adaptive", "prompt-lookup", *(label for label, _ in heads)],
        heads=heads,
        trees={"medusa": (DEMO_TREE,), "eagle": (DEMO_EAGLE_TREE,)},
    )
    meter = LoadMeter().start()
    run_bench(methods, [prompt], tokenizer, max_new_tokens, repeats=REPEATS, progress=True)
    during = meter.stop()
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
    note = busy_warning(during, torch.get_num_threads(), "while the timed runs ran")
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    identical = all(row["matches_greedy"] for row in rows)
    console.print(
        f"all texts identical: {'yes' if identical else 'NO'}; demo took "
        f"{time.perf_counter() - started:.0f}s. Full benchmark: specheads bench --base default "
        f"--draft-model default --out bench-out"
    )
    return 0 if identical else 1


def demo_heads(console: Console, base: torch.nn.Module) -> torch.nn.Module:
    """Medusa heads for the default base: cached from an earlier demo run, or trained now within ~3 minutes."""
    from specheads.heads import HeadCheckpointError, load_heads
    from specheads.training.config import load_config
    from specheads.training.trainer import train

    heads_dir = CACHE / "medusa" / "heads"
    if (heads_dir / "model.safetensors").is_file():
        try:
            heads = load_heads(heads_dir, base)
            console.print(f"Medusa heads: reusing {heads_dir} (delete it to retrain)")
            return heads
        except HeadCheckpointError as error:
            console.print(f"Medusa heads in {heads_dir} do not fit this base ({error}); retraining")
    console.print(f"Medusa heads: training {heads_dir.parent} for at most 2 minutes (once; reused afterwards)")
    config = load_config(None, [*DEMO_TRAINING, f"output.dir={heads_dir.parent}"])
    return load_heads(train(config), base)


def shipped_eagle_heads(console: Console, base: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The EAGLE-3 heads shipped for the default base (none when this install lacks them)."""
    from specheads.heads import HeadCheckpointError, load_heads

    try:
        heads = load_heads(assets.resolve("default", role="eagle3"), base)
    except (HeadCheckpointError, assets.MissingAssetsError) as error:
        console.print(f"EAGLE-3 heads: not available ({error}); skipping the eagle row")
        return []
    console.print("EAGLE-3 heads: shipped with the default model (configs/default/eagle3.yaml)")
    return [("eagle", heads)]


def _describe(model: torch.nn.Module) -> str:
    config = model.config
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return f"{params:.1f}M params, {config.num_hidden_layers} layers, hidden {config.hidden_size}"


def _heldout_loss(info: dict, part: str) -> str:
    value = info.get("models", {}).get(part, {}).get("heldout_loss_nats_per_token")
    return f"{value:.3f}" if isinstance(value, (int, float)) else "?"
