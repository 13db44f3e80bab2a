"""The learning curve of a recipe: held-out agreement and simulated tau against unique training tokens and epochs.

    python scripts/learning_curve.py --config configs/smollm2-135m/eagle3.yaml --records 600,1500,3000,6000 \\
        --epochs 3 --out runs/smollm2-135m-curve [key=value overrides]

For each ``--records`` N the recipe trains on the first N records of its training split (``data.limit``; the
held-out split is the same for every point) for ``--epochs`` epochs, evaluating held-out agreement after every
epoch (``log.eval_every`` = one epoch of steps). Each point is a resumable run in ``OUT/records-N``: run the same
command again after any stop and finished points are read, not retrained. Writes ``curve.json`` (every
evaluation), ``curve.md`` (the table) and ``curve.png`` (depth-1 agreement and simulated tau against unique
tokens, one line per epoch).

``--one-pass RUN`` (repeatable) adds the evaluations of a finished or running one-epoch run (``train.epochs=1`` with
``log.eval_every``) as a line of its own: up to each evaluation every training token was new, so its tokens seen are
its unique tokens. Those points come from one learning-rate schedule, read mid-way: they show what more unique data
gives within one pass, not what a shorter run that finished its schedule would reach. A run that continued an
earlier one-pass run's heads on new data (``train.init_from``) extends that run's line. ``--points CURVE_JSON``
(repeatable) adds the points of an earlier ``curve.json`` (a run on another machine, or one whose folder is gone).
With ``--one-pass`` or ``--points`` alone (``--records`` omitted) nothing is trained.

Unique tokens are the real tokens of the training rows (prompt and answer, after truncation to ``data.max_length``);
tokens seen are unique tokens times epochs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specheads.training.config import RecipeConfig


def point_config(args: argparse.Namespace, records: int, steps_per_epoch: int | None = None) -> RecipeConfig:
    from specheads.training.config import load_config

    overrides = [
        f"data.limit={records}",
        "train.steps=null",
        f"train.epochs={args.epochs}",
        f"output.dir={Path(args.out) / f'records-{records}'}",
        *args.overrides,
    ]
    if steps_per_epoch is not None:
        overrides.append(f"log.eval_every={steps_per_epoch}")
    return load_config(args.config, overrides)


def training_rows(config: RecipeConfig) -> tuple[int, int, int]:
    """Rows, unique real tokens and unique target tokens of a recipe's training split."""
    from specheads.loading import load_tokenizer
    from specheads.training.data import build_dataset
    from specheads.training.files import expand_data_paths

    data = dataclasses.replace(config.data, paths=expand_data_paths(config.data.paths))
    rows = build_dataset(data, load_tokenizer(config.model.tokenizer or config.model.base)).with_format("torch")
    tokens = targets = 0
    for start in range(0, len(rows), 1024):
        chunk = rows[start : start + 1024]
        tokens += int(chunk["attention_mask"].sum())
        targets += int((chunk["attention_mask"] * chunk["loss_mask"]).sum())
    return len(rows), tokens, targets


def run_point(args: argparse.Namespace, records: int) -> list[dict[str, Any]]:
    """Train (or resume, or read) one point; its evaluations, one per epoch."""
    from specheads.training.run_state import EVALS
    from specheads.training.trainer import train

    config = point_config(args, records)
    rows, tokens, targets = training_rows(config)
    batches = rows // config.train.batch_size  # the loader drops a last short batch
    # as the trainer counts: an epoch's left-over micro-batches make one more step
    steps_per_epoch = max(1, math.ceil(batches / config.train.grad_accumulation))
    config = point_config(args, records, steps_per_epoch)
    train(config)
    lines = (Path(config.output.dir) / EVALS).read_text().splitlines()
    evaluations = {}
    for line in lines:  # a step evaluated twice (a run stopped between evaluation and checkpoint) counts once
        record = json.loads(line)
        evaluations[record["step"]] = record
    return [
        {
            "records": records,
            "rows": rows,
            "unique_tokens": tokens,
            "unique_targets": targets,
            "epoch": round(record["step"] / steps_per_epoch, 2),
            "step": record["step"],
            "tokens_seen": record["tokens_seen"],
            "agreement": record["agreement_with_base_greedy"],
            "simulated_tau": record["simulated_tau"],
        }
        for record in sorted(evaluations.values(), key=lambda r: r["step"])
    ]


def one_pass_points(run: Path) -> list[dict[str, Any]]:
    """The evaluations of a one-epoch run, each a point whose unique tokens are the tokens it had seen.

    A run that continued the heads of an earlier one-epoch run on other data (``train.init_from`` naming that run's
    ``heads``) continues its line: the earlier run's points come first, and this run's tokens count on from the
    earlier run's last."""
    from specheads.training.run_state import EVALS

    earlier_run = _continued_run(run)
    earlier = one_pass_points(earlier_run) if earlier_run is not None else []
    offset = _tokens_trained(earlier_run) if earlier_run is not None else 0
    evaluations = {}
    for line in (run / EVALS).read_text().splitlines():
        record = json.loads(line)
        evaluations[record["step"]] = record
    name = f"one pass ({' + '.join(_chain(run))})"
    return [{**point, "series": name} for point in earlier] + [
        {
            "records": None,
            "series": name,
            "rows": None,
            "unique_tokens": offset + record["tokens_seen"],
            "unique_targets": record.get("targets_seen"),
            "epoch": 1,
            "step": record["step"],
            "tokens_seen": offset + record["tokens_seen"],
            "agreement": record["agreement_with_base_greedy"],
            "simulated_tau": record["simulated_tau"],
        }
        for record in sorted(evaluations.values(), key=lambda r: r["step"])
    ]


def _continued_run(run: Path) -> Path | None:
    """The run folder whose exported heads ``run`` started from (``train.init_from``), when it is a run folder."""
    from specheads.training.run_state import EVALS, RUN_CONFIG

    recorded = run / RUN_CONFIG
    init = json.loads(recorded.read_text()).get("train", {}).get("init_from") if recorded.is_file() else None
    return Path(init).parent if init and (Path(init).parent / EVALS).is_file() else None


def _tokens_trained(run: Path) -> int:
    """The tokens a finished run trained on (its final state; else its last evaluation's)."""
    from specheads.training.run_state import EVALS, FINAL_STATE

    final = run / FINAL_STATE
    if final.is_file() and "tokens_seen" in (state := json.loads(final.read_text())):
        return int(state["tokens_seen"])
    return int(json.loads((run / EVALS).read_text().splitlines()[-1])["tokens_seen"])


def _chain(run: Path) -> list[str]:
    earlier = _continued_run(run)
    return [*(_chain(earlier) if earlier is not None else []), run.name]


def series(point: dict[str, Any]) -> str:
    return point.get("series") or f"epoch {round(point['epoch'])}"


def table(points: list[dict[str, Any]]) -> str:
    lines = [
        "| records | unique tokens | epoch | tokens seen | agreement by depth 1-5 | chain-3 tau | tree-6 tau "
        "| tree-16 tau |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for point in points:
        agreement = " ".join(f"{a:.3f}" for a in point["agreement"])
        tau = point["simulated_tau"]
        lines.append(
            f"| {point['records'] or series(point)} | {point['unique_tokens'] / 1e6:.2f}M | {point['epoch']:g} | "
            f"{point['tokens_seen'] / 1e6:.2f}M | {agreement} | {tau['chain-3']:.2f} | {tau['tree-6']:.2f} | "
            f"{tau['tree-16']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(points: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in sorted({series(point) for point in points}):
        chosen = sorted((p for p in points if series(p) == name), key=lambda p: p["unique_tokens"])
        x = [p["unique_tokens"] / 1e6 for p in chosen]
        left.plot(x, [p["agreement"][0] for p in chosen], marker="o", label=name)
        right.plot(x, [p["simulated_tau"]["tree-6"] for p in chosen], marker="o", label=f"tree-6, {name}")
        right.plot(
            x,
            [p["simulated_tau"]["chain-3"] for p in chosen],
            marker="x",
            linestyle="--",
            label=f"chain-3, {name}",
        )
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for axis, label in ((left, "held-out depth-1 agreement"), (right, "simulated tau")):
        axis.set_xscale("log")
        axis.xaxis.set_major_formatter(plain)
        axis.xaxis.set_minor_formatter(plain)
        axis.set_xlabel("unique training tokens (millions)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    for axis in (left, right):  # below the axes, after the layout: inside them a legend covered a curve
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17))
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="the recipe (default: none, the overrides alone)")
    parser.add_argument("--records", default="", help="comma-separated record counts, one point each")
    parser.add_argument(
        "--one-pass", action="append", default=[], metavar="RUN", help="a one-epoch run's evaluations as a line"
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--points", action="append", default=[], metavar="CURVE_JSON", help="an earlier curve.json")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides for every point")
    args = parser.parse_args(argv)
    # imported once the arguments are read: --help and a usage error answer without loading torch
    import torch

    if not (args.records or args.one_pass or args.points):
        parser.error("give --records, --one-pass or --points")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    points = []
    for records in (int(value) for value in args.records.split(",") if value):
        points += run_point(args, records)
        (out / "curve.json").write_text(json.dumps({"config": args.config, "points": points}, indent=2) + "\n")
    for run in args.one_pass:
        points += one_pass_points(Path(run))
    for path in args.points:
        points += json.loads(Path(path).read_text())["points"]
    (out / "curve.json").write_text(json.dumps({"config": args.config, "points": points}, indent=2) + "\n")
    (out / "curve.md").write_text(table(points))
    name = Path(args.config).name if args.config else "recipe"
    plot(points, out / "curve.png", f"{name}: held-out agreement and simulated tau")
    print(table(points))
    return points


if __name__ == "__main__":
    main()
