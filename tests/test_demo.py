"""specheads demo, end to end on the shipped default model and its shipped EAGLE-3 heads (Medusa trained briefly)."""

from __future__ import annotations

import pytest

from specheads import demo

pytestmark = pytest.mark.slow  # the whole demo, every method


def test_demo_runs_and_every_method_matches_greedy(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(demo, "CACHE", tmp_path)
    quick = [item for item in demo.DEMO_TRAINING if not item.startswith(("train.steps", "data.limit"))]
    monkeypatch.setattr(demo, "DEMO_TRAINING", [*quick, "train.steps=3", "data.limit=8"])
    assert demo.run_demo(max_new_tokens=16) == 0
    output = capsys.readouterr().out
    assert "all texts identical: yes" in output
    for name in ("hf-greedy", "none", "draft-adaptive", "prompt-lookup", "medusa-", "eagle-"):
        assert name in output
    assert (tmp_path / "medusa" / "heads" / "model.safetensors").is_file()
    assert demo.run_demo(max_new_tokens=8) == 0  # the second run reuses the cached heads
    assert "reusing" in capsys.readouterr().out
