#!/usr/bin/env bash
# One command for a machine with one CUDA GPU, in under 8 minutes, installing nothing from the network:
#
#   scripts/gpu_check.sh [OUT_DIR]          (default OUT_DIR: gpu-check-out)
#
# Run it from the repository root in the environment the README's test command built (with a CUDA build of torch).
# Steps, each under its own time limit, each logged to OUT_DIR/<step>.log; a failed step does not stop the others:
#   1. tests      the gpu-marked tests: the greedy invariant in fp32 and bf16 for every drafter, batched rows,
#                 rejection sampling and the acceptance rules on the device, held-out evaluation on the device
#   2. train      a short EAGLE-3 head training run with accelerate on the GPU (default model and corpus)
#   3. calibrate  specheads calibrate --device cuda on the heads of step 2 (tree.json records the device)
#   4. bench      specheads bench --device cuda on the default model, draft model and shipped EAGLE-3 heads
#   5. verify     the verify cost curve (1 to 64 query tokens) of a randomly initialised ~1.1B-parameter Llama, bf16
# and then one summary table. The exit code is the number of failed steps.
#
# SPECHEADS_CHECK_DEVICE=cpu runs the same steps on the CPU (a dry run of the script itself; there pass TRAIN_STEPS=10
# and a smaller model: VERIFY_ARGS="--hidden 256 --layers 2 --intermediate 688 --vocab 8192 --dtype float32").
set -uo pipefail

OUT="${1:-gpu-check-out}"
DEVICE="${SPECHEADS_CHECK_DEVICE:-cuda}"
PYTHON="${PYTHON:-python}"
VERIFY_ARGS="${VERIFY_ARGS:-}"
TRAIN_STEPS="${TRAIN_STEPS:-60}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false SPECHEADS_TEST_DEVICE="$DEVICE"
mkdir -p "$OUT"
: > "$OUT/steps.tsv"

if [ "$DEVICE" = cuda ] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA device ($("$PYTHON" -c 'import torch; print(torch.__version__)' 2>&1));" \
        "install a CUDA build of torch, or run with SPECHEADS_CHECK_DEVICE=cpu" >&2
    exit 1
fi

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log, record status and duration
    local name="$1" limit="$2"
    shift 2
    local started=$SECONDS
    echo "== $name (limit ${limit}s): $*"
    timeout --signal=INT --kill-after=20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - started))" >> "$OUT/steps.tsv"
    tail -n 3 "$OUT/$name.log"
}

step tests 150 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/tests.xml" tests
step train 100 accelerate launch --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
    $([ "$DEVICE" = cpu ] && echo --cpu) -m specheads.train --config configs/default/eagle3.yaml \
    "output.dir=$OUT/train" train.steps="$TRAIN_STEPS" train.warmup_steps=5 data.limit=2000 output.save_every=30 \
    train.max_minutes=1.5 train.overwrite=true log.every=10
step calibrate 90 specheads calibrate --base default --heads "$OUT/train/heads" --device "$DEVICE" --batches 5 \
    --new-tokens 48
step bench 100 specheads bench --base default --draft-model default --heads default --device "$DEVICE" --limit 12 \
    --max-new-tokens 128 --methods hf-assisted,none,draft-adaptive,prompt-lookup,eagle --trees eagle=chain-3,dynamic \
    --out "$OUT/bench"
# shellcheck disable=SC2086  # VERIFY_ARGS is a list of options
step verify 60 "$PYTHON" scripts/verify_cost_curve.py --device "$DEVICE" --json "$OUT/verify.json" $VERIFY_ARGS

"$PYTHON" - "$OUT" <<'EOF'
"""One summary table of the steps and what each measured."""
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])


def read(path):
    try:
        return json.loads((out / path).read_text())
    except (OSError, ValueError):
        return None


def tests():
    try:
        suite = ET.parse(out / "tests.xml").getroot().find("testsuite")
    except (OSError, ET.ParseError):
        return "no junit report"
    total, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
    return f"{total - failed - int(suite.get('skipped'))} passed, {failed} failed, {suite.get('skipped')} skipped"


def train():
    state = read("train/final_state.json")
    if not state:
        return "no final_state.json"
    agreement = (read("train/heads/eval.json") or {}).get("agreement_with_base_greedy")
    shown = f", held-out agreement with the base by depth {[round(a, 3) for a in agreement]}" if agreement else ""
    return f"{state['step']} steps on {state['world_size']} process(es){shown}"


def calibrate():
    tree = read("train/heads/tree.json")
    if not tree:
        return "no tree.json"
    best = max(tree["measured"], key=lambda row: row["tokens_per_s"])
    return (
        f"device {tree['machine']['device']}; best {best['nodes']}-node tree {best['tokens_per_s']:.0f} tokens/s, "
        f"tau {best['tau']:.2f}"
    )


def bench():
    report = read("bench/report.json")
    if not report:
        return "no report.json"
    rows = [f"{r['name']} {r['speedup']:.2f}x{'' if r['matches_greedy'] else ' (NOT greedy)'}" for r in report["methods"]]
    greedy = report["methods"][0]["tokens_per_s"]
    return f"hf-greedy {greedy:.0f} tokens/s; " + ", ".join(rows[1:])


def verify():
    curve = read("verify.json")
    if not curve:
        return "no verify.json"
    ms = {int(k): v for k, v in curve["ms_by_query_tokens"].items()}
    return f"{curve['parameters'] / 1e9:.2f}B {curve['dtype']}: " + ", ".join(
        f"q={q} {ms[q]:.1f} ms ({ms[q] / ms[1]:.2f}x)" for q in sorted(ms)
    )


details = {"tests": tests, "train": train, "calibrate": calibrate, "bench": bench, "verify": verify}
print("\n| step | status | seconds | result |\n|---|---|---|---|")
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, seconds = line.split("\t")
    status = "ok" if rc == "0" else ("TIMEOUT" if rc in ("124", "130", "137") else f"FAILED (exit {rc})")
    print(f"| {name} | {status} | {seconds} | {details[name]()} |")
EOF
exit "$(awk -F'\t' '$2 != 0' "$OUT/steps.tsv" | wc -l)"
