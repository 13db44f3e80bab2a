"""Held-out evaluation during and after a run, on ``data.eval_paths`` or the ``data.heldout_fraction`` split.

:func:`evaluate` measures the heads' agreement with the base's greedy token through the method's evaluation, the
simulated tau of that agreement and, under joint training, the base's held-out loss with and without its changes.
Each evaluation is appended to ``evals.jsonl``: every ``log.eval_every`` steps (:func:`periodic_evaluation`) and at
the end (:func:`final_evaluation`, which writes ``eval.json`` beside the exported heads). With ``output.select=best``
the heads of the best evaluation so far are kept in ``best/`` and exported in place of the last step's when they beat
them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specheads.heads.checkpoint import CONFIG_NAME, WEIGHTS_NAME, atomic_write
from specheads.loading import load_tokenizer
from specheads.training.batches import collate_trimmed
from specheads.training.data import build_dataset
from specheads.training.evaluate import heldout_lm_loss, simulated_tau
from specheads.training.files import eval_data, expand_data_paths
from specheads.training.run_state import BEST, BEST_RECORD, EVALS, Run, write_json


def evaluate(run: Run, heads: torch.nn.Module) -> dict[str, Any] | None:
    """Held-out head agreement (``data.eval_paths`` or the ``data.heldout_fraction`` split); None without either."""
    config = run.config.data
    if not config.eval_paths and config.heldout_fraction <= 0:
        return None
    tokenizer = load_tokenizer(run.config.model.tokenizer or run.config.model.base)
    if config.eval_paths:
        dataset = build_dataset(eval_data(config), tokenizer)
    else:
        dataset = build_dataset(
            dataclasses.replace(config, paths=expand_data_paths(config.paths)), tokenizer, split="heldout"
        )
    loader = torch.utils.data.DataLoader(
        dataset.with_format("torch"), batch_size=run.config.train.batch_size, collate_fn=collate_trimmed
    )
    device = run.accelerator.device

    total = min(len(loader), config.eval_batches) if config.eval_batches else len(loader)

    def batches(desc: str = "evaluate") -> Any:
        bar = tqdm(loader, total=total, desc=desc, disable=not run.accelerator.is_main_process, leave=False)
        return ({key: value.to(device) for key, value in batch.items()} for batch in bar)

    base = run.accelerator.unwrap_model(run.base)
    was_training, base_was_training = heads.training, base.training
    heads.eval()
    base.eval()
    run.accelerator.print(f"held-out evaluation: {total} batches of {run.config.train.batch_size} rows")
    result = run.head_type.evaluate_fn()(base, heads, batches(), max_batches=config.eval_batches)
    if "agreement_by_rank" in result:
        result["simulated_tau"] = simulated_tau(result["agreement_by_rank"])
    if run.joint is not None:  # what joint training costs the base: held-out loss with and without its changes
        result["base_heldout_loss_fine_tuned"] = heldout_lm_loss(base, batches("base loss"), config.eval_batches)
        with run.joint.original(base):
            result["base_heldout_loss_original"] = heldout_lm_loss(
                base, batches("base loss, original"), config.eval_batches
            )
    heads.train(was_training)
    base.train(base_was_training)
    return result


def periodic_evaluation(run: Run) -> dict[str, Any] | None:
    """Evaluate the heads now (main process; the others wait), append the result to ``evals.jsonl``, log it and, with
    ``output.select=best``, keep these heads in ``best/`` when they beat every earlier evaluation."""
    accelerator = run.accelerator
    result = None
    if accelerator.is_main_process:
        heads = accelerator.unwrap_model(run.heads)
        result = evaluate(run, heads)
        if result is not None:
            record = _evaluation_record(run, result)
            with (run.output / EVALS).open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            accelerator.log(_evaluation_metrics(record), step=run.step)
            if run.config.output.select == "best" and _better_than_best(run, record):
                _keep_best(run, heads, result, record)
    accelerator.wait_for_everyone()
    return result


def final_evaluation(run: Run, target: Path) -> None:
    """Evaluate the heads exported in ``target`` (main process), append the result to ``evals.jsonl``, and write
    ``eval.json`` beside them, naming the step whose heads they are; print and log the agreement. With
    ``output.select=best``, the heads of the best evaluation replace the last step's in ``target`` when they beat
    them. Nothing without held-out data (see :func:`evaluate`)."""
    accelerator = run.accelerator
    evaluation = evaluate(run, accelerator.unwrap_model(run.heads))
    if evaluation is None:
        return
    record = _evaluation_record(run, evaluation)
    with (run.output / EVALS).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    if run.config.output.select == "best" and not _better_than_best(run, record):
        best = run.output / BEST
        kept = json.loads((best / BEST_RECORD).read_text())
        accelerator.print(
            f"output.select=best: the heads of step {kept['step']} ({run.config.output.select_by} "
            f"{_score(run, kept):.3f}) beat the last step's ({_score(run, record):.3f}); exporting them"
        )
        for name in (WEIGHTS_NAME, CONFIG_NAME):
            atomic_write(target / name, lambda path, source=best / name: shutil.copyfile(source, path))
        evaluation, record = json.loads((best / "eval.json").read_text()), kept
    evaluation["selected"] = {"step": record["step"], "rule": run.config.output.select}
    if run.config.output.select == "best":
        evaluation["selected"]["by"] = run.config.output.select_by
    write_json(target / "eval.json", evaluation)
    accelerator.print(
        "held-out agreement with the base's greedy token by head: "
        + ", ".join(f"{a:.3f}" for a in evaluation["agreement_with_base_greedy"])
    )
    if "simulated_tau" in evaluation:
        accelerator.print(
            "simulated tau (held-out agreement through the tree cost model): "
            + ", ".join(f"{name} {tau:.2f}" for name, tau in evaluation["simulated_tau"].items())
        )
    accelerator.log(
        {f"eval/head_{k}/agreement": a for k, a in enumerate(evaluation["agreement_with_base_greedy"])},
        step=run.step,
    )


def _evaluation_record(run: Run, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "step": run.step,
        "epoch": round(run.batches_seen / run.batches_per_epoch, 3),
        "tokens_seen": run.tokens_seen + run.pending[0] * run.accelerator.num_processes,
        "agreement_with_base_greedy": result["agreement_with_base_greedy"],
        "simulated_tau": result.get("simulated_tau"),
    }


def _evaluation_metrics(record: dict[str, Any]) -> dict[str, float]:
    metrics = {f"eval/head_{k}/agreement": a for k, a in enumerate(record["agreement_with_base_greedy"])}
    metrics.update({f"eval/tau_{name}": tau for name, tau in (record.get("simulated_tau") or {}).items()})
    return metrics


def _score(run: Run, record: dict[str, Any]) -> float:
    tau = record.get("simulated_tau") or {}
    return float(tau.get(run.config.output.select_by, -1.0))


def _better_than_best(run: Run, record: dict[str, Any]) -> bool:
    best = run.output / BEST / BEST_RECORD
    return not best.is_file() or _score(run, record) > _score(run, json.loads(best.read_text()))


def _keep_best(run: Run, heads: torch.nn.Module, result: dict[str, Any], record: dict[str, Any]) -> None:
    """Save ``heads`` as ``best/`` whole or not at all (a temporary folder renamed over the old one)."""
    target, staging = run.output / BEST, run.output / f".tmp-{BEST}"
    shutil.rmtree(staging, ignore_errors=True)
    heads.save_pretrained(staging)
    write_json(staging / "eval.json", result)
    write_json(staging / BEST_RECORD, record)
    previous = run.output / f".old-{BEST}"
    shutil.rmtree(previous, ignore_errors=True)
    if target.exists():
        os.replace(target, previous)
    os.replace(staging, target)
    shutil.rmtree(previous, ignore_errors=True)
