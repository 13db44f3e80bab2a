"""Ship trained EAGLE-3 heads as the embedded default model's heads (``heads="default"``).

    specheads train --config configs/default/eagle3.yaml
    specheads calibrate --base default --heads runs/default-eagle3/heads
    python scripts/ship_default_heads.py runs/default-eagle3/heads

Copies the head checkpoint (config.json, model.safetensors, the calibrated tree.json, eval.json and recipe.json)
into ``specheads/assets/default/eagle3/``, records the heads in ``manifest.json`` (recipe, held-out agreement, the
commands) and re-hashes every shipped file. Refuses heads that do not load on the default base, heads over 8 MB and
assets over 30 MB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "specheads" / "assets" / "default"
TARGET = ASSETS / "eagle3"
FILES = ("config.json", "model.safetensors", "tree.json", "eval.json", "recipe.json")
MAX_HEADS_BYTES = 8 * 2**20
MAX_ASSETS_BYTES = 30 * 2**20


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("heads", type=Path, help="trained (and calibrated) EAGLE-3 head checkpoint directory")
    parser.add_argument("--training", type=Path, help="JSON with training facts to record (steps, tokens, minutes)")
    args = parser.parse_args(argv)

    from specheads.heads import EagleHead, load_heads
    from specheads.loading import load_causal_lm

    # The base folder itself (not "default"): the manifest is what this script rewrites, so it may be stale here.
    heads = load_heads(args.heads, load_causal_lm(str(ASSETS / "base")))  # refuses heads made for another base
    if not isinstance(heads, EagleHead) or heads.config.version != 3:
        raise SystemExit(f"{args.heads} holds no EAGLE-3 head")
    missing = [name for name in FILES[:3] if not (args.heads / name).is_file()]
    if missing:
        raise SystemExit(f"{args.heads} lacks {missing}: train, then run specheads calibrate on it first")
    size = sum((args.heads / name).stat().st_size for name in FILES if (args.heads / name).is_file())
    if size > MAX_HEADS_BYTES:
        raise SystemExit(f"the heads are {size / 2**20:.2f} MB, over the {MAX_HEADS_BYTES / 2**20:.0f} MB limit")
    staging = TARGET.with_name(".eagle3.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name in FILES:
        if (args.heads / name).is_file():
            shutil.copy2(args.heads / name, staging / name)
    shutil.rmtree(TARGET, ignore_errors=True)
    staging.rename(TARGET)

    manifest_path = ASSETS / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    evaluation = json.loads((TARGET / "eval.json").read_text()) if (TARGET / "eval.json").is_file() else {}
    tree = json.loads((TARGET / "tree.json").read_text())
    manifest["heads"] = {
        "eagle3": {
            "path": "eagle3",
            "parameters": sum(p.numel() for p in heads.parameters()),
            "config": {k: v for k, v in json.loads((TARGET / "config.json").read_text()).items() if k != "base_model"},
            "heldout_agreement_with_base_greedy_by_depth": evaluation.get("agreement_with_base_greedy"),
            "calibrated": {k: tree.get(k) for k in ("choices", "dynamic", "expected_tau", "machine")},
            "training": json.loads(args.training.read_text()) if args.training else None,
            "commands": [
                "specheads train --config configs/default/eagle3.yaml",
                "specheads calibrate --base default --heads runs/default-eagle3/heads",
                "python scripts/ship_default_heads.py runs/default-eagle3/heads",
            ],
        }
    }
    files = {
        p.relative_to(ASSETS).as_posix(): sha256_file(p)
        for p in sorted(ASSETS.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }
    manifest["files"] = files
    manifest["total_bytes"] = sum((ASSETS / rel).stat().st_size for rel in files)
    if manifest["total_bytes"] > MAX_ASSETS_BYTES:
        raise SystemExit(f"assets would be {manifest['total_bytes'] / 2**20:.2f} MB, over the 30 MB limit")
    temporary = manifest_path.with_suffix(".tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    temporary.replace(manifest_path)
    print(f"shipped {TARGET} ({size / 2**20:.2f} MB); assets {manifest['total_bytes'] / 2**20:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
