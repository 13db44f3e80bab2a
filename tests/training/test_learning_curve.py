"""scripts/learning_curve.py on a tiny run: points per record count, an evaluation per epoch, the table and plot."""

from __future__ import annotations

import json

from helpers import load_script, tiny_model, tiny_tokenizer


def test_the_curve_trains_each_point_evaluates_each_epoch_and_resumes(tmp_path, capsys) -> None:
    tiny_model("llama", seed=1, layers=2).save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    lines = [json.dumps({"text": f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 3}) for i in range(80)]
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    overrides = [
        f"model.base={tmp_path / 'base'}", f"data.paths=[{tmp_path / 'data.jsonl'}]", "data.format=jsonl",
        "data.packing=false", "data.max_length=48", "data.heldout_fraction=0.2", "data.eval_batches=2",
        "heads.type=medusa", "heads.num_heads=2", "train.batch_size=4", "train.lr=0.01", "output.save_every=0",
    ]  # fmt: skip
    args = ["--records", "8,24", "--epochs", "2", "--out", str(tmp_path / "curve"), *overrides]
    points = load_script("learning_curve").main(args)
    assert [(p["records"], p["epoch"]) for p in points] == [(8, 1), (8, 2), (24, 1), (24, 2)]
    assert points[0]["rows"] == 8 and points[2]["rows"] == 24
    assert points[2]["unique_tokens"] > 2 * points[0]["unique_tokens"]
    assert points[1]["tokens_seen"] > points[0]["tokens_seen"]
    assert all(p["simulated_tau"]["chain-3"] >= 1.0 and len(p["agreement"]) == 2 for p in points)
    curve = tmp_path / "curve"
    assert (curve / "curve.png").stat().st_size > 10_000
    assert (curve / "curve.md").read_text().count("\n") == 2 + len(points)
    # A second run reads the finished points instead of training them again.
    before = (curve / "records-8" / "heads" / "model.safetensors").stat().st_mtime_ns
    assert load_script("learning_curve").main(args) == points
    assert (curve / "records-8" / "heads" / "model.safetensors").stat().st_mtime_ns == before
    # --one-pass reads a run's evaluations as a line of their own (unique tokens = tokens seen), training nothing.
    passed = load_script("learning_curve").main(["--one-pass", str(curve / "records-24"), "--out", str(tmp_path / "o")])
    assert [p["unique_tokens"] for p in passed] == [p["tokens_seen"] for p in points[2:]]
    assert [p["agreement"] for p in passed] == [p["agreement"] for p in points[2:]]
    assert {p["series"] for p in passed} == {"one pass (records-24)"}
    assert (tmp_path / "o" / "curve.png").stat().st_size > 10_000
    assert "one pass (records-24)" in (tmp_path / "o" / "curve.md").read_text()
    assert (curve / "records-8" / "heads" / "model.safetensors").stat().st_mtime_ns == before
    # --points draws an earlier curve.json's points with the rest.
    earlier = ["--points", str(curve / "curve.json"), "--one-pass", str(curve / "records-24")]
    both = load_script("learning_curve").main([*earlier, "--out", str(tmp_path / "b")])
    assert both == passed + points


def _run(folder, tokens: list[int], agreement: float, init_from=None) -> None:
    folder.mkdir()
    tau = {"chain-3": 1.2, "tree-6": 1.3, "tree-16": 1.4}
    evals = [
        {
            "step": 10 * (i + 1),
            "tokens_seen": t,
            "agreement_with_base_greedy": [agreement + i / 100],
            "simulated_tau": tau,
        }
        for i, t in enumerate(tokens)
    ]
    (folder / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    (folder / "final_state.json").write_text(json.dumps({"step": 10 * len(tokens), "tokens_seen": tokens[-1] + 5}))
    (folder / "run_config.json").write_text(json.dumps({"train": {"init_from": init_from}}))


def test_a_run_that_continued_earlier_heads_extends_the_earlier_runs_line(tmp_path) -> None:
    _run(tmp_path / "first", [100, 200], 0.3)
    _run(tmp_path / "more", [40, 80], 0.5, init_from=str(tmp_path / "first" / "heads"))
    points = load_script("learning_curve").main(["--one-pass", str(tmp_path / "more"), "--out", str(tmp_path / "o")])
    assert [p["unique_tokens"] for p in points] == [100, 200, 245, 285]  # counted on from the first run's 205
    assert [p["agreement"][0] for p in points] == [0.3, 0.31, 0.5, 0.51]
    assert {p["series"] for p in points} == {"one pass (first + more)"}
    _run(tmp_path / "fresh", [40], 0.5, init_from=str(tmp_path / "elsewhere" / "heads"))  # no run folder there
    alone = load_script("learning_curve").main(["--one-pass", str(tmp_path / "fresh"), "--out", str(tmp_path / "f")])
    assert [(p["unique_tokens"], p["series"]) for p in alone] == [(40, "one pass (fresh)")]
