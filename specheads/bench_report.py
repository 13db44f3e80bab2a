"""``specheads bench``'s report as a reader sees it: ``report.md`` (a table of the methods per batch size, a speed-up
summary, a per-category table) and ``speedup.png``, both made from the report :func:`specheads.bench.bench_report`
returns. Torch-free: the report is plain data."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specheads.extras import install_hint
from specheads.machine import BUSY_CORES


def write_report(report: dict[str, Any], out_dir: str | Path) -> list[str]:
    """Write ``report.json``, ``report.md`` and ``speedup.png`` (with matplotlib, the ``plot`` extra) into
    ``out_dir``; returns the names written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown_table(report))
    try:
        plot_speedups(report, out / "speedup.png")
    except ImportError:
        print(f"speedup.png not written: matplotlib is not installed ({install_hint('matplotlib')})", file=sys.stderr)
        return ["report.json", "report.md"]
    return ["report.json", "report.md", "speedup.png"]


def markdown_table(report: dict[str, Any]) -> str:
    """``report.md``: one table of the methods per batch size, after a speed-up summary when there are several."""
    lines = [
        f"base: {report['base']['name_or_path']} ({report['base']['parameters'] / 1e6:.2f}M parameters)"
        + (
            f"; draft: {report['draft']['name_or_path']} ({report['draft']['parameters'] / 1e6:.2f}M)"
            if report.get("draft")
            else ""
        ),
        f"{report['prompts']} prompts{_turns_note(report)} x {report['repeats']} repeats, "
        f"{report['max_new_tokens']} new tokens, "
        f"temperature 0; {report['base'].get('dtype', '?').removeprefix('torch.')}; "
        f"{report['machine']['processor']}, {report['machine']['torch_threads']} threads, {report['machine']['date']}",
    ]
    reference = report.get("exact_reference", "hf-greedy")
    if reference != "hf-greedy":
        plain = next((row for row in report["methods"] if row["name"] == reference), None)
        equal = plain.get("outputs_equal_to_hf_greedy") if plain else None
        lines.append(
            f"exactness: 'matches greedy' compares every row with {reference} (this engine's one-token decoding, "
            "batch-invariant); transformers' greedy, through another attention kernel, is another function"
            + (f": {equal[0]} of its {equal[1]} outputs equal {reference}'s" if equal else "")
        )
    during = report["machine"].get("load_during")
    if during and during["busy"] >= BUSY_CORES:
        lines.append(
            f"note: other processes used {during['busy']:.1f} of {during['cores']} cores while this ran; "
            "timings are unreliable"
        )
    if "by_batch_size" not in report:
        lines += ["", *_method_table(report["methods"], False, reference), *_category_section(report)]
        return "\n".join(lines) + "\n"
    sizes = report["batch_sizes"]
    lines.append(
        f"batch sizes {', '.join(map(str, sizes))}: consecutive groups of prompts decoded in one call; tokens/s = "
        "the group's new tokens / the call's wall time; speed-up over hf-greedy (transformers' batched generate, "
        "left padding) at the same batch size"
    )
    lines += [f"note: {note}" for note in report["notes"]]
    lines += ["", "## speed-up by batch size", "", *_summary_table(report["by_batch_size"], sizes)]
    for size in sizes:
        rows = report["by_batch_size"][str(size)]
        lines += ["", f"## batch size {size}", "", *_method_table(rows, size > 1, reference)]
    lines += _category_section(report)
    return "\n".join(lines) + "\n"


def _turns_note(report: dict[str, Any]) -> str:
    """`` (160 turns: ...)`` for a multi-turn prompt set, else nothing."""
    if "turns" not in report:
        return ""
    reference = report.get("exact_reference", "hf-greedy")
    return f" ({report['turns']} turns, each after {reference}'s answer to the previous one)"


def _category_section(report: dict[str, Any]) -> list[str]:
    """The per-category table (rows = methods, columns = categories, cells = speed-up / tau), when there is one."""
    by_category = report.get("by_category")
    if not by_category:
        return []
    names = list(by_category)
    size = report.get("batch_sizes", [1])[0]
    reference = report.get("exact_reference", "hf-greedy")
    parted = " (NOT greedy)" if reference == "hf-greedy" else f" (not {reference}'s output)"
    cells: dict[tuple[str, str], str] = {}
    for category, rows in by_category.items():
        for row in rows:
            tau = row["mean_accepted_length"]
            text = f"{row['speedup']:.2f}x" + ("" if tau is None else f" / {tau:.2f}")
            judged = row["matches_greedy"] or _another_function(row["name"], reference)
            cells[category, row["name"]] = text + ("" if judged else parted)
    methods = list(dict.fromkeys(row["name"] for rows in by_category.values() for row in rows))
    lines = [
        "",
        "## by category",
        "",
        "speed-up over hf-greedy on the category's prompts / tau (every turn)"
        + ("" if size == 1 else f", batch size {size}"),
        "",
        "| method | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for method in methods:
        lines.append(f"| {method} | " + " | ".join(cells.get((c, method), "-") for c in names) + " |")
    counts = report.get("categories", {})
    lines.append("| prompts | " + " | ".join(str(counts.get(c, "-")) for c in names) + " |")
    return lines


def _summary_table(by_size: dict[str, list[dict[str, Any]]], sizes: Sequence[int]) -> list[str]:
    """Rows = methods, columns = batch sizes, cells = speed-up; the last row gives hf-greedy's tokens/s."""
    names = list(dict.fromkeys(row["name"] for size in sizes for row in by_size[str(size)]))
    speedups = {(str(size), row["name"]): row["speedup"] for size in sizes for row in by_size[str(size)]}
    lines = [
        "| method | " + " | ".join(f"batch {size}" for size in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for name in names:
        cells = [f"{speedups[str(s), name]:.2f}x" if (str(s), name) in speedups else "-" for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    greedy = [f"{by_size[str(size)][0]['tokens_per_s']:.1f}" for size in sizes]
    lines.append("| hf-greedy tokens/s | " + " | ".join(greedy) + " |")
    return lines


def _another_function(name: str, reference: str) -> bool:
    """Whether row ``name`` is transformers' generate while exactness is judged against this engine's own decoding
    (bf16/fp16): another attention kernel, so its output is not expected to equal the reference's."""
    return reference != "hf-greedy" and name.startswith("hf-")


def _method_table(rows: list[dict[str, Any]], batched: bool, reference: str = "hf-greedy") -> list[str]:
    """The per-method table at one batch size (per group and per batched step when ``batched``); ``reference`` is
    the row every other row's output is compared with (transformers' rows are not judged against this engine's own
    decoding: "another kernel")."""
    per_call = "per-group" if batched else "per-prompt"
    step = "batched step" if batched else "step"
    lines = [
        f"| method | tokens/s | speedup | {per_call} speedup median [IQR] | tau | acceptance by depth | "
        f"draft / verify ms per {step} | matches greedy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        tau = "-" if row["mean_accepted_length"] is None else f"{row['mean_accepted_length']:.2f}"
        rates = row["acceptance_rate_by_position"]
        rates_text = "-" if not rates else " ".join(f"{r:.2f}" for r in rates)
        low, high = row["speedup_per_prompt_iqr"]
        draft_ms, verify_ms = row.get("draft_ms_per_step"), row.get("verify_ms_per_step")
        split = "-" if draft_ms is None else f"{draft_ms:.2f} / {verify_ms:.2f}"
        matches = "yes" if row["matches_greedy"] else "NO"
        if _another_function(row["name"], reference):
            matches = "same" if row["matches_greedy"] else "another kernel"
        elif row["matches_greedy"] and row.get("matches_batched_greedy") is False:
            matches = "yes (unbatched)"
        lines.append(
            f"| {row['name']} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x | "
            f"{row['speedup_per_prompt_median']:.2f} [{low:.2f}, {high:.2f}] | {tau} | {rates_text} | {split} | "
            f"{matches} |"
        )
    return lines


def plot_speedups(report: dict[str, Any], path: Path) -> None:
    """Bars of the speed-ups at one batch size; lines of speed-up against batch size when there are several."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several = len(report.get("batch_sizes", [])) > 1
    figure = _plot_by_batch_size(plt, report) if several else _plot_bars(plt, report)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_bars(plt: Any, report: dict[str, Any]) -> Any:
    rows = report["methods"]
    names = [row["name"] for row in rows]
    speedups = [row["speedup"] for row in rows]
    low = [row["speedup"] - min(row["speedup_per_prompt_iqr"][0], row["speedup"]) for row in rows]
    high = [max(row["speedup_per_prompt_iqr"][1], row["speedup"]) - row["speedup"] for row in rows]
    transformers_color, specheads_color = "#999999", "#1f77b4"
    colors = [transformers_color if name.startswith("hf-") else specheads_color for name in names]
    figure, axis = plt.subplots(figsize=(max(7, 0.9 * len(rows)), 4.5))
    bars = axis.bar(names, speedups, color=colors, yerr=[low, high], capsize=3)
    axis.bar_label(bars, labels=[f"{value:.2f}x" for value in speedups], label_type="center", color="white", fontsize=7)
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in (transformers_color, specheads_color)]
    axis.legend(handles, ["transformers generate (hf-*)", "specheads"], fontsize=8, loc="upper left")
    axis.set_ylabel("speed-up over hf-greedy (tokens/s ratio)")
    size = report.get("batch_sizes", [1])[0]
    axis.set_title(
        f"{report['base']['name_or_path']}: {report['max_new_tokens']} new tokens, "
        f"{report['prompts']} prompts"
        + (f", batch size {size}" if size > 1 else "")
        + f" (bars: total; whiskers: per-{'group' if size > 1 else 'prompt'} IQR)",
        fontsize=9,
    )
    plt.setp(axis.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor", fontsize=8)
    axis.set_ylim(0, max(max(speedups) + max(high, default=0.0), 1.0) * 1.15)
    return figure


def _plot_by_batch_size(plt: Any, report: dict[str, Any]) -> Any:
    sizes = report["batch_sizes"]
    by_size = report["by_batch_size"]
    names = list(dict.fromkeys(row["name"] for size in sizes for row in by_size[str(size)]))
    figure, axis = plt.subplots(figsize=(8, 4.5))
    axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="hf-greedy (batched generate)")
    hf_markers = iter("s^vD")
    for name in names[1:]:  # names[0] is hf-greedy, the dashed line
        points = [(size, row["speedup"]) for size in sizes for row in by_size[str(size)] if row["name"] == name]
        style = dict(color="#777777", marker=next(hf_markers, "x")) if name.startswith("hf-") else dict(marker="o")
        axis.plot(*zip(*points, strict=True), label=name, **style)
    axis.set_xscale("log", base=2)
    axis.set_xticks(sizes, [str(size) for size in sizes])
    axis.set_xlabel("batch size")
    axis.set_ylabel("speed-up over hf-greedy at the same batch size")
    axis.set_title(
        f"{report['base']['name_or_path']}: {report['max_new_tokens']} new tokens, {report['prompts']} prompts",
        fontsize=9,
    )
    axis.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure
