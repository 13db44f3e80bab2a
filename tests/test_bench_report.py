"""report.md's exactness column: which rows are judged, and against what."""

from __future__ import annotations

import pytest

from specheads.bench_report import markdown_table


def _row(name: str, matches: bool, tau: float | None = None) -> dict:
    return {
        "name": name,
        "tokens_per_s": 10.0,
        "speedup": 1.0,
        "speedup_per_prompt_median": 1.0,
        "speedup_per_prompt_iqr": [1.0, 1.0],
        "mean_accepted_length": tau,
        "acceptance_rate_by_position": [],
        "matches_greedy": matches,
    }


def _report(reference: str, rows: list[dict]) -> dict:
    return {
        "base": {"name_or_path": "tiny", "parameters": 1e6, "dtype": "torch.bfloat16"},
        "prompts": 1,
        "repeats": 1,
        "max_new_tokens": 8,
        "machine": {"processor": "x86_64", "torch_threads": 1, "date": "today"},
        "exact_reference": reference,
        "methods": rows,
        "by_category": {"writing": rows},
        "categories": {"writing": 1},
    }


def _cells(text: str, name: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {name} |") and "x |" in line)
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.parametrize("hf_equal", [False, True])
def test_transformers_rows_are_another_kernel_not_a_failure_against_the_engines_own_decoding(hf_equal: bool) -> None:
    rows = [_row("hf-greedy", hf_equal), _row("none", True, 1.0), _row("eagle", False, 2.0)]
    text = markdown_table(_report("none", rows))
    assert _cells(text, "hf-greedy")[-1] == ("same" if hf_equal else "another kernel")
    assert _cells(text, "none")[-1] == "yes"
    assert _cells(text, "eagle")[-1] == "NO"  # a specheads row that parts from the reference is still a failure
    category = next(line for line in text.splitlines() if line.startswith("| hf-greedy | 1.00x"))
    assert "not none's output" not in category
    assert "not none's output" in next(line for line in text.splitlines() if line.startswith("| eagle | 1.00x"))


def test_against_transformers_greedy_every_row_is_judged() -> None:
    rows = [_row("hf-greedy", True), _row("hf-assisted", False), _row("none", True, 1.0)]
    text = markdown_table(_report("hf-greedy", rows))
    assert _cells(text, "hf-greedy")[-1] == "yes"
    assert _cells(text, "hf-assisted")[-1] == "NO"
