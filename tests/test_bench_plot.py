"""speedup.png: the bar chart says which colour is whose, and every bar carries its value."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specheads.bench_report import _plot_bars  # noqa: E402


def test_bars_have_a_legend_for_both_colours_and_value_labels() -> None:
    names = ["hf-greedy", "hf-prompt-lookup", "none", "eagle-dynamic-4-5-16"]
    rows = [
        {"name": n, "speedup": s, "speedup_per_prompt_iqr": [s - 0.1, s + 0.2]}
        for n, s in zip(names, [1, 1.7, 1.06, 1.4], strict=True)
    ]
    report = {"methods": rows, "base": {"name_or_path": "default"}, "max_new_tokens": 8, "prompts": 2}
    figure = _plot_bars(plt, report)
    axis = figure.axes[0]
    assert [t.get_text() for t in axis.get_legend().get_texts()] == ["transformers generate (hf-*)", "specheads"]
    assert {t.get_text() for t in axis.texts} == {"1.00x", "1.70x", "1.06x", "1.40x"}
    assert all(label.get_ha() == "right" for label in axis.get_xticklabels())  # long names do not overlap
    plt.close(figure)
