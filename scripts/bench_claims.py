"""The design notes' numbers, measured on the embedded default model and on this machine.

Four claims, each checked with what it is about:

1. Draft length: "K=1 ~1.1x, K=5 2-3x and optimal, K=10 diminishing". The shipped draft model with a chain of K
   (``draft-k{K}``, temperature 0, greedy acceptance) and the shipped EAGLE-3 heads with ``chain-K`` for comparison,
   against transformers' greedy ``generate`` (``hf-greedy``), all interleaved in one process by ``specheads.bench``.
2. The alpha rule (accept x when q(x) >= alpha * p(x)) at alpha 0.99 / 0.9 / 0.7 with the draft model at
   temperature 0.8, next to ``rejection`` (lossless) and ``typical`` / ``threshold`` at two settings each: acceptance
   rate, tau, tokens/s over transformers' own sampling, and how far the output moves from the base's distribution:
   the base's mean log-likelihood of the generated text on the default model, and the exact total-variation distance
   of the first two tokens on a tiny model, by enumeration (cross-checked against the engine by Monte Carlo).
3. A tiny draft against a better one: "tiny draft ~1.5x, good draft ~2.5x". No larger draft was trained (CPU time);
   the zero-training ladder is the base cut to its first layers (+ final norm + lm_head, "self-speculative") and the
   base itself as its own draft (acceptance 1, as costly as the base), next to the shipped 0.9M draft and the EAGLE-3
   heads (1.2M parameters, reading the base's features).
4. The typical and threshold rules side by side with alpha (part of 2).

Usage::

    python scripts/bench_claims.py --limit 40 --max-new-tokens 128 --threads 1 --out claims.json   # ~17 min
    python scripts/bench_claims.py --from-json claims.json   # the tables and verdicts again

Prints markdown tables and one verdict line per claim; ``--out`` gets every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=40, help="held-out prompts (of 67)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write every number here (JSON)")
    parser.add_argument("--self-layers", default="2,3,5", help="truncated-base drafts (layers kept), comma-separated")
    parser.add_argument("--sampling-k", type=int, default=3, help="draft chain length at temperature > 0")
    parser.add_argument("--mc-samples", type=int, default=20000, help="Monte-Carlo seeds per rule (0: skip)")
    parser.add_argument("--tiny-prompts", type=int, default=15, help="random prompts besides [3, 5, 7] for exact TV")
    parser.add_argument("--skip-default", action="store_true", help="only the tiny-model part (for quick checks)")
    parser.add_argument("--from-json", help="measure nothing: print the tables and verdicts of a saved --out file")
    args = parser.parse_args(argv)
    for name in ("limit", "max_new_tokens", "threads", "sampling_k"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


if __name__ == "__main__":  # --help and a usage error answer before the imports below load torch
    parse_args()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel  # noqa: E402

from specheads import SpecDecoder, assets  # noqa: E402
from specheads.bench import (  # noqa: E402
    BenchMethod,
    GroupRun,
    build_methods,
    machine_info,
    model_info,
    run_bench,
    summarize,
)
from specheads.inference.drafters import DraftModelDrafter, NoDrafter  # noqa: E402
from specheads.inference.oracle import chi_square_p  # noqa: E402
from specheads.loading import load_causal_lm, load_tokenizer  # noqa: E402
from specheads.metrics import SpecStats  # noqa: E402
from specheads.prompts import load_prompts  # noqa: E402

DRAFT_KS = (1, 3, 5, 8, 10)
LADDER_KS = (1, 3)
TEMPERATURE = 0.8


@dataclass(frozen=True)
class RuleSetting:
    """One acceptance rule with its parameters (keyword arguments of ``SpecDecoder.generate``)."""

    name: str
    acceptance: str
    params: dict[str, float] = field(default_factory=dict)

    @property
    def lossless(self) -> bool:
        return self.acceptance == "rejection"


RULES = (
    RuleSetting("rejection", "rejection"),
    RuleSetting("alpha 0.99", "alpha", {"alpha": 0.99}),
    RuleSetting("alpha 0.9", "alpha", {"alpha": 0.9}),
    RuleSetting("alpha 0.7", "alpha", {"alpha": 0.7}),
    RuleSetting("typical 0.09/0.3", "typical", {"posterior_threshold": 0.09, "posterior_alpha": 0.3}),
    RuleSetting("typical 0.3/0.55", "typical", {"posterior_threshold": 0.3, "posterior_alpha": 0.55}),
    RuleSetting("threshold 0.1", "threshold", {"acceptance_threshold": 0.1}),
    RuleSetting("threshold 0.3", "threshold", {"acceptance_threshold": 0.3}),
)


# ---------------------------------------------------------------------------------------------------------- models
def truncated_base(layers: int) -> PreTrainedModel:
    """The default base cut to its first ``layers`` decoder layers, with its own final norm and lm_head (no
    training): a self-speculative draft."""
    path = assets.resolve("default", role="base")
    return AutoModelForCausalLM.from_pretrained(path, num_hidden_layers=layers).eval()


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def acceptance_rate(stats: SpecStats) -> float | None:
    """Accepted drafted tokens / drafted tokens (chains: the drafted depth is the number of drafted tokens)."""
    drafted = sum(stats.drafted_depths)
    return sum(stats.accepted_drafts) / drafted if drafted else None


# ------------------------------------------------------------------------------- part 1: greedy, K sweep, drafts
def greedy_methods(
    base: PreTrainedModel,
    draft: PreTrainedModel,
    heads: torch.nn.Module,
    ladder: dict[str, PreTrainedModel],
) -> tuple[list[BenchMethod], dict[str, dict[str, Any]]]:
    """``hf-greedy``, ``none``, the K sweep (draft model and EAGLE chains) and the draft ladder, as bench rows.

    Returns the methods and, per row name, what the row is (drafter, parameters, K).
    """
    names = ["none", *(f"draft-k{k}" for k in DRAFT_KS)]
    trees = {"eagle": [f"chain-{k}" for k in DRAFT_KS]}
    methods = build_methods(
        base, draft, draft_ks=DRAFT_KS, only=[*names, "eagle"], heads=[("eagle", heads)], trees=trees
    )
    info: dict[str, dict[str, Any]] = {"hf-greedy": {"drafter": "-", "k": 0}, "none": {"drafter": "-", "k": 0}}
    for k in DRAFT_KS:
        info[f"draft-k{k}"] = {"drafter": "draft 0.9M", "parameters": parameters(draft), "k": k}
        info[f"eagle-chain-{k}"] = {"drafter": "EAGLE-3 heads", "parameters": parameters(heads), "k": k}
    for label, model in ladder.items():
        rows = build_methods(base, model, draft_ks=LADDER_KS, only=[f"draft-k{k}" for k in LADDER_KS])[1:]
        for k, method in zip(LADDER_KS, rows, strict=True):
            method.name = f"{label}-k{k}"
            info[method.name] = {"drafter": label, "parameters": parameters(model), "k": k}
        methods.extend(rows)
    return methods, info


def greedy_rows(methods: list[BenchMethod], info: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The bench summary of every row, with the overall acceptance rate and the time per verification step."""
    rows = []
    for method, row in zip(methods, summarize(methods), strict=True):
        runs = method.runs[1]
        row.update(info[method.name])
        row["acceptance_rate"] = acceptance_rate(runs.stats) if method.has_stats else None
        row["ms_per_step"] = 1000.0 * sum(runs.seconds) / runs.stats.steps if runs.stats.steps else None
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- part 2: sampling on the default
def prompt_seed(ids: torch.Tensor) -> int:
    """A seed fixed by the prompt, so every method samples each prompt with the same seed."""
    return zlib.crc32(str(ids.tolist()).encode())


def hf_sample_runner(model: PreTrainedModel, temperature: float):  # noqa: ANN201 - a bench RunFn
    """transformers' own ``generate(do_sample=True)`` (no top-k / top-p), one prompt at a time."""

    def run(group: list[torch.Tensor], max_new_tokens: int) -> GroupRun:
        (ids,) = group
        torch.manual_seed(prompt_seed(ids))
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=model.generation_config.pad_token_id,
        )
        tokens = out[0, ids.shape[1] :].tolist()
        eos = model.generation_config.eos_token_id
        if eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
        return GroupRun([tokens])

    return run


def spec_sample_runner(decoder: SpecDecoder, **kwargs: Any):  # noqa: ANN201 - a bench RunFn
    def run(group: list[torch.Tensor], max_new_tokens: int) -> GroupRun:
        (ids,) = group
        out = decoder.generate(ids, max_new_tokens=max_new_tokens, seed=prompt_seed(ids), **kwargs)
        return GroupRun([out.new_tokens], out.stats, out.stats.steps)

    return run


def sampling_methods(base: PreTrainedModel, draft: PreTrainedModel, k: int, temperature: float) -> list[BenchMethod]:
    """``hf-sample`` (the reference), plain sampling through the engine, then the draft model under every rule."""
    methods = [
        BenchMethod("hf-sample", hf_sample_runner(base, temperature)),
        BenchMethod("none", spec_sample_runner(SpecDecoder(base, NoDrafter()), temperature=temperature), True),
    ]
    decoder = SpecDecoder(base, DraftModelDrafter(draft, k))
    for rule in RULES:
        run = spec_sample_runner(decoder, temperature=temperature, acceptance=rule.acceptance, **rule.params)
        methods.append(BenchMethod(rule.name, run, has_stats=True))
    return methods


@torch.inference_mode()
def log_likelihoods(
    base: PreTrainedModel, encoded: list[torch.Tensor], outputs: dict[tuple[int, int], list[int]], temperature: float
) -> dict[int, tuple[float, float, int]]:
    """Per prompt index: the base's mean log-probability per generated token, raw (temperature 1) and at
    ``temperature``, and the token count; one base forward over prompt + continuation each."""
    scores = {}
    for (_, index), tokens in sorted(outputs.items()):
        if not tokens:
            continue
        prompt = encoded[index]
        ids = torch.cat([prompt, torch.tensor([tokens])], dim=1)
        logits = base(ids).logits[0, prompt.shape[1] - 1 : -1].float()  # [n, V]: row i predicts tokens[i]
        target = torch.tensor(tokens)[:, None]
        raw = logits.log_softmax(dim=-1).gather(1, target).mean()
        tempered = (logits / temperature).log_softmax(dim=-1).gather(1, target).mean()
        scores[index] = (float(raw), float(tempered), len(tokens))
    return scores


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return mean, se


def sampling_rows(
    methods: list[BenchMethod], base: PreTrainedModel, encoded: list[torch.Tensor], temperature: float
) -> list[dict[str, Any]]:
    """Bench summary + acceptance rate + the base's log-likelihood of each method's text (and the paired difference
    from ``hf-sample``'s, prompt by prompt)."""
    scores = {m.name: log_likelihoods(base, encoded, m.outputs, temperature) for m in methods}
    reference = scores["hf-sample"]
    rows = []
    for method, row in zip(methods, summarize(methods), strict=True):
        runs = method.runs[1]
        own = scores[method.name]
        common = sorted(set(own) & set(reference))
        rule = next((r for r in RULES if r.name == method.name), None)
        row.pop("matches_greedy")
        row["lossless"] = rule is None or rule.lossless
        row["acceptance_rate"] = acceptance_rate(runs.stats) if method.has_stats else None
        row["loglik_raw"] = mean_and_se([own[i][0] for i in own])
        row["loglik_tempered"] = mean_and_se([own[i][1] for i in own])
        row["loglik_raw_minus_hf_sample"] = mean_and_se([own[i][0] - reference[i][0] for i in common])
        row["mean_length"] = statistics.fmean(own[i][2] for i in own)
        rows.append(row)
    return rows


# ------------------------------------------------------------------------ part 3: exact TV on a tiny model pair
def tiny_pair(vocab: int = 32, logit_scale: float = 20.0, seed: int = 0) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A random 2-layer Llama base (vocabulary ``vocab``, hidden 32) with its lm_head scaled by ``logit_scale`` (a
    peaky distribution), and its first layer as the draft (same embeddings, final norm and lm_head)."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    base = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        base.lm_head.weight.mul_(logit_scale)
    draft = LlamaForCausalLM(LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})).eval()
    draft.load_state_dict({name: base.state_dict()[name] for name in draft.state_dict()})
    for model in (base, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return base, draft


@torch.inference_mode()
def next_token_probs(model: PreTrainedModel, prompt: list[int], temperature: float) -> torch.Tensor:
    """``[V + 1, V]``: row 0 the distribution after ``prompt``, row 1 + t the one after ``prompt + [t]``
    (softmax of logits / temperature, float64)."""
    vocab = model.config.vocab_size
    contexts = torch.tensor([prompt + [0]] + [prompt + [t] for t in range(vocab)])  # [V + 1, T + 1]
    logits = model(contexts).logits.double()  # [V + 1, T + 1, V]
    first = logits[0, -2]  # after the prompt alone
    return (torch.cat([first[None], logits[1:, -1]]) / temperature).softmax(dim=-1)


def rule_decision(rule: RuleSetting, p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For one node: ``(accept [V], fallback [V])``: the probability that a drafted token x is accepted (0/1 for the
    lossy rules) and the distribution the rule samples from when the node's drafted child is rejected.

    Written from the rules' definitions (``specheads/inference/acceptance.py``, API.md), not by calling them.
    """
    if rule.acceptance == "rejection":  # Leviathan et al.: min(1, p/q), residual norm(max(p - q, 0))
        residual = (p - q).clamp_min(0.0)
        fallback = residual / residual.sum() if residual.sum() > 0 else p  # p == q: never rejected
        return torch.minimum(torch.ones_like(p), p / q.clamp_min(1e-300)), fallback
    if rule.acceptance == "alpha":  # q(x) >= alpha p(x); the verifier's token from p
        return (q >= rule.params["alpha"] * p).double(), p
    if rule.acceptance == "threshold":  # p(x) > threshold; the verifier's token from p
        return (p > rule.params["acceptance_threshold"]).double(), p
    if rule.acceptance == "typical":  # p(x) > min(eps, delta exp(-H(p))); next token from p restricted the same way
        entropy = -(p * p.clamp_min(1e-300).log()).sum()
        cutoff = min(rule.params["posterior_threshold"], rule.params["posterior_alpha"] * float(torch.exp(-entropy)))
        passing = p > cutoff
        passing[p.argmax()] = True
        restricted = torch.where(passing, p, torch.zeros_like(p))
        return (p > cutoff).double(), restricted / restricted.sum()
    raise ValueError(rule.acceptance)


def first_token_of_step(rule: RuleSetting, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``[V]``: the first token a speculative step emits at a node, enumerated over its drafted child x ~ q: x when
    accepted, else a draw from the rule's fallback."""
    accept, fallback = rule_decision(rule, p, q)
    emitted = torch.zeros_like(p)
    for x in range(p.shape[0]):  # every draft token, weight q(x)
        emitted[x] += q[x] * accept[x]
        emitted += q[x] * (1 - accept[x]) * fallback
    return emitted


def enumerate_two_tokens(rule: RuleSetting, p: torch.Tensor, q: torch.Tensor) -> dict[str, Any]:
    """The exact distribution ``[V, V]`` of the first two output tokens of speculative decoding with a chain of 2.

    ``p``, ``q``: ``[V + 1, V]`` from :func:`next_token_probs` (row 0 at the prompt, row 1 + t after token t). Step 1
    drafts x1 ~ q(.|prompt), x2 ~ q(.|prompt x1), every one of the V^2 draft sequences with weight q(x1) q(x2|x1):
    both accepted -> (x1, x2); only x1 -> (x1, fallback at x1); x1 rejected -> y1 from the fallback at the root, and
    the second token is the first token of step 2 at (prompt y1), which drafts again from q. Also the exact expected
    number of drafts step 1 accepts.
    """
    vocab = p.shape[1]
    accept_root, fallback_root = rule_decision(rule, p[0], q[0])
    joint = torch.zeros(vocab, vocab, dtype=p.dtype)
    expected_accepted = 0.0
    step_two = torch.stack([first_token_of_step(rule, p[1 + y], q[1 + y]) for y in range(vocab)])  # [V, V]
    for x1 in range(vocab):
        accept_next, fallback_next = rule_decision(rule, p[1 + x1], q[1 + x1])
        weights = q[0, x1] * q[1 + x1]  # [V]: q(x1) q(x2 | x1) for every x2
        both = weights * accept_root[x1] * accept_next  # [V]
        joint[x1] += both  # (x1, x2)
        joint[x1] += (weights * accept_root[x1] * (1 - accept_next)).sum() * fallback_next  # (x1, fallback)
        joint += (weights * (1 - accept_root[x1])).sum() * fallback_root[:, None] * step_two  # (y1, step 2)
        expected_accepted += float((weights * accept_root[x1] * (1 + accept_next)).sum())
    return {"joint": joint, "expected_accepted": expected_accepted}


def base_two_tokens(p: torch.Tensor) -> torch.Tensor:
    """``[V, V]``: the base's own P(y1) P(y2 | y1)."""
    return p[0][:, None] * p[1:]


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def monte_carlo(
    decoder: SpecDecoder,
    prompt: list[int],
    rule: RuleSetting,
    seeds: range,
    batch: int,
    temperature: float,
) -> torch.Tensor:
    """``[V, V]`` counts of the first two tokens the engine emits with each of ``seeds``, decoded ``batch`` rows at a
    time (``max_new_tokens=3``: a chain of 2 in the first step; each row draws what it would draw alone)."""
    vocab = decoder.model.config.vocab_size
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    for first in range(seeds.start, seeds.stop, batch):
        seeds_now = list(range(first, min(first + batch, seeds.stop)))
        outputs = decoder.generate(
            [prompt] * len(seeds_now),
            max_new_tokens=3,
            seed=seeds_now,
            temperature=temperature,
            acceptance=rule.acceptance,
            eos_token_id=[],
            **rule.params,
        )
        for output in outputs:
            counts[output.new_tokens[0], output.new_tokens[1]] += 1
    return counts


def sampling_noise_tv(probs: torch.Tensor, samples: int, draws: int = 20) -> float:
    """Mean TV between ``probs`` and the empirical distribution of ``samples`` draws from it (noise alone)."""
    generator = torch.Generator().manual_seed(0)
    flat = probs.flatten().float()
    tvs = []
    for _ in range(draws):
        drawn = torch.multinomial(flat, samples, replacement=True, generator=generator)
        empirical = torch.bincount(drawn, minlength=flat.numel()).double() / samples
        tvs.append(total_variation(empirical, flat.double()))
    return statistics.fmean(tvs)


def tiny_tv(samples: int, prompts: int, temperature: float) -> dict[str, Any]:
    """Exact TV per rule on the tiny pair (prompt [3, 5, 7] and ``prompts`` random ones), and the Monte-Carlo check of
    the enumeration through ``SpecDecoder.generate`` on the first prompt."""
    base, draft = tiny_pair()
    vocab = base.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    prompt_list = [[3, 5, 7]] + [torch.randint(2, vocab, (4,), generator=generator).tolist() for _ in range(prompts)]
    pq = [(next_token_probs(base, p, temperature), next_token_probs(draft, p, temperature)) for p in prompt_list]
    decoder = SpecDecoder(base, DraftModelDrafter(draft, 2))
    base_entropy = [float(-(p[0] * p[0].log()).sum()) for p, _ in pq]
    result: dict[str, Any] = {
        "vocab": vocab,
        "base_parameters": parameters(base),
        "draft_parameters": parameters(draft),
        "prompts": prompt_list,
        "base_entropy_first_token": statistics.fmean(base_entropy),
        "tv_base_draft_first_token": statistics.fmean(total_variation(p[0], q[0]) for p, q in pq),
        "samples": samples,
        "rules": [],
    }
    for index, rule in enumerate(RULES):
        enumerated = [enumerate_two_tokens(rule, p, q) for p, q in pq]
        tvs = [total_variation(e["joint"], base_two_tokens(p)) for e, (p, _) in zip(enumerated, pq, strict=True)]
        row = {
            "rule": rule.name,
            "tv_first_prompt": tvs[0],
            "tv_mean": statistics.fmean(tvs),
            "tv_max": max(tvs),
            "mass": float(enumerated[0]["joint"].sum()),
            "acceptance_rate_exact": statistics.fmean(e["expected_accepted"] / 2 for e in enumerated),
        }
        if samples:
            start = time.perf_counter()
            seeds = range(index * samples, (index + 1) * samples)  # each rule its own seeds: independent checks
            counts = monte_carlo(decoder, prompt_list[0], rule, seeds, min(samples, 2000), temperature)
            empirical = counts / counts.sum()
            row["monte_carlo"] = {
                "seconds": time.perf_counter() - start,
                "tv_to_enumerated": total_variation(empirical, enumerated[0]["joint"]),
                "tv_noise_expected": sampling_noise_tv(enumerated[0]["joint"], samples),
                "chi_square_p": chi_square_p(counts, enumerated[0]["joint"]),
                "tv_to_base": total_variation(empirical, base_two_tokens(pq[0][0])),
            }
        result["rules"].append(row)
    result["batched_rows_equal_alone"] = batched_equals_alone(decoder, prompt_list[0], temperature)
    return result


def batched_equals_alone(decoder: SpecDecoder, prompt: list[int], temperature: float, seeds: int = 8) -> bool:
    """The Monte Carlo decodes many seeds in one batch: check that a row draws what it draws alone."""
    kwargs = dict(max_new_tokens=3, temperature=temperature, acceptance="alpha", alpha=0.9, eos_token_id=[])
    batched = decoder.generate([prompt] * seeds, seed=list(range(seeds)), **kwargs)
    alone = [decoder.generate(prompt, seed=seed, **kwargs).new_tokens for seed in range(seeds)]
    return [out.new_tokens for out in batched] == alone


# --------------------------------------------------------------------------------------------------- verdicts
def _row(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(row for row in rows if row["name"] == name)


def required_tau(rows: list[dict[str, Any]], name: str, target: float) -> float:
    """tau a drafter with this row's cost per step would need for ``target`` x hf-greedy."""
    hf_ms_per_token = 1000.0 / _row(rows, "hf-greedy")["tokens_per_s"]
    return target * _row(rows, name)["ms_per_step"] / hf_ms_per_token


def per_token_acceptance(tau: float, k: int) -> float | None:
    """The i.i.d. per-token acceptance a with 1 + a + ... + a^K = tau on a chain of K (None: tau > K + 1)."""
    if tau > k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if sum(middle**i for i in range(k + 1)) < tau else (low, middle)
    return low


def _needs(greedy: list[dict[str, Any]], k: int, target: float) -> str:
    tau = required_tau(greedy, f"draft-k{k}", target)
    rate = per_token_acceptance(tau, k)
    reach = "out of reach" if rate is None else f"a per-token acceptance of {rate:.2f}"
    return f"{target:g}x at K={k} would need tau {tau:.1f} (at most {k + 1}) at this draft's cost per step: {reach}"


def verdicts(greedy: list[dict[str, Any]], sampling: list[dict[str, Any]], tiny: dict[str, Any]) -> list[str]:
    """One line per claim: true / false / partly, with the numbers."""
    rows = {k: _row(greedy, f"draft-k{k}") for k in DRAFT_KS}
    speed = {k: row["speedup"] for k, row in rows.items()}
    tau = {k: row["mean_accepted_length"] for k, row in rows.items()}
    eagle = {k: _row(greedy, f"eagle-chain-{k}")["speedup"] for k in DRAFT_KS}
    plain = _row(greedy, "none")["speedup"]
    best_k = max(speed, key=speed.get)
    best_eagle = max(eagle, key=eagle.get)
    k1 = "true" if abs(speed[1] - 1.1) <= 0.1 else "false"
    k5_range, k5_best = 2.0 <= speed[5] <= 3.0, best_k == 5
    k5 = "true" if k5_range and k5_best else "partly" if k5_range or k5_best else "false"
    gain_8_10 = tau[10] - tau[8]
    k10 = "true" if speed[10] < speed[best_k] and gain_8_10 < tau[5] - tau[3] else "false"
    return [
        f"K=1 ~1.1x: {k1} ({speed[1]:.2f}x hf-greedy, tau {tau[1]:.2f}; {speed[1] / plain:.2f}x the engine's own "
        f"plain decoding, which is {plain:.2f}x hf-greedy).",
        f"K=5 2-3x and optimal: {k5} (K=5 {speed[5]:.2f}x, tau {tau[5]:.2f}, acceptance "
        f"{rows[5]['acceptance_rate']:.2f}; best K={best_k} at {speed[best_k]:.2f}x; {_needs(greedy, 5, 2.0)}). "
        f"EAGLE-3 chains: best K={best_eagle} at {eagle[best_eagle]:.2f}x, K=5 {eagle[5]:.2f}x.",
        f"K=10 diminishing: {k10} (K=10 {speed[10]:.2f}x, tau {tau[10]:.2f} vs {tau[8]:.2f} at K=8: +{gain_8_10:.2f} "
        f"tokens per step for two more draft forwards; EAGLE-3 K=10 {eagle[10]:.2f}x against {eagle[best_eagle]:.2f}x "
        f"at K={best_eagle}).",
        *_draft_verdict(greedy),
        *_rule_verdicts(sampling, tiny),
    ]


def _draft_verdict(greedy: list[dict[str, Any]]) -> list[str]:
    tiny = max((r for r in greedy if r["drafter"] == "draft 0.9M"), key=lambda r: r["speedup"])
    others = [r for r in greedy if r["drafter"] not in ("-", "draft 0.9M", "EAGLE-3 heads")]
    best_other = max(others, key=lambda r: r["speedup"])
    eagle = max((r for r in greedy if r["drafter"] == "EAGLE-3 heads"), key=lambda r: r["speedup"])
    # A perfect draft (every token accepted) with the 0.9M draft's cost per step: tau = K + 1 at the same step time.
    ceiling = {k: (k + 1) / required_tau(greedy, f"draft-k{k}", 1.0) for k in DRAFT_KS}
    best_k = max(ceiling, key=ceiling.get)
    tiny_verdict = "true" if abs(tiny["speedup"] - 1.5) <= 0.15 else "false"
    good_verdict = "true" if max(eagle["speedup"], best_other["speedup"]) >= 2.25 else "false"
    return [
        f"tiny draft ~1.5x: {tiny_verdict} (best {tiny['name']} {tiny['speedup']:.2f}x, acceptance "
        f"{tiny['acceptance_rate']:.2f}).",
        f"good draft ~2.5x: {good_verdict} for every draft available here (no better draft model was trained; the "
        f"best zero-training one, {best_other['name']}, {best_other['speedup']:.2f}x at acceptance "
        f"{best_other['acceptance_rate']:.2f}; the EAGLE-3 heads, 1.2M parameters reading the base's features, "
        f"{eagle['name']} {eagle['speedup']:.2f}x at acceptance {eagle['acceptance_rate']:.2f}). A perfect draft "
        f"costing what the 0.9M draft costs per step would reach at most {ceiling[best_k]:.2f}x (K={best_k}); "
        f"{_needs(greedy, best_k, 2.5)}.",
    ]


def _rule_verdicts(sampling: list[dict[str, Any]], tiny: dict[str, Any]) -> list[str]:
    rejection = _row(sampling, "rejection")
    tv = {row["rule"]: row["tv_mean"] for row in tiny["rules"]}
    lines = []
    for rule in RULES[1:]:
        row = _row(sampling, rule.name)
        shift, se = row["loglik_raw_minus_hf_sample"]
        lines.append(
            f"{rule.name}: acceptance {row['acceptance_rate']:.2f} (rejection {rejection['acceptance_rate']:.2f}), "
            f"{row['speedup']:.2f}x hf sampling (rejection {rejection['speedup']:.2f}x), exact two-token TV "
            f"{tv[rule.name]:.3f} on the tiny pair (rejection {tv['rejection']:.1e}), base log-likelihood of its "
            f"text {shift:+.3f} +- {se:.3f} nats/token from the base's own samples."
        )
    return lines


# --------------------------------------------------------------------------------------------------- markdown
def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def greedy_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| method | drafter | params | K | tokens/s | speed-up | per-prompt median [IQR] | tau | acceptance | "
        "acceptance by depth | draft / verify ms per step | matches greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        low, high = row["speedup_per_prompt_iqr"]
        depth = row["acceptance_rate_by_position"]
        params = f"{row['parameters'] / 1e6:.2f}M" if row.get("parameters") else "-"
        split = (
            "-"
            if row["draft_ms_per_step"] is None
            else f"{row['draft_ms_per_step']:.2f} / {row['verify_ms_per_step']:.2f}"
        )
        lines.append(
            f"| {row['name']} | {row['drafter']} | {params} | {row['k'] or '-'} | {row['tokens_per_s']:.1f} | "
            f"{row['speedup']:.2f}x | {row['speedup_per_prompt_median']:.2f} [{low:.2f}, {high:.2f}] | "
            f"{_f(row['mean_accepted_length'])} | {_f(row['acceptance_rate'])} | "
            f"{' '.join(f'{r:.2f}' for r in depth) if depth else '-'} | {split} | "
            f"{'yes' if row['matches_greedy'] else 'NO'} |"
        )
    return lines


def sampling_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| method | lossless | tokens/s | x hf-sample | tau | acceptance | base log-lik (nats/token) | "
        "vs hf-sample (paired) | mean length |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mean, se = row["loglik_raw"]
        shift, shift_se = row["loglik_raw_minus_hf_sample"]
        lines.append(
            f"| {row['name']} | {'yes' if row['lossless'] else 'no'} | {row['tokens_per_s']:.1f} | "
            f"{row['speedup']:.2f}x | {_f(row['mean_accepted_length'])} | {_f(row['acceptance_rate'])} | "
            f"{mean:.3f} +- {se:.3f} | {shift:+.3f} +- {shift_se:.3f} | {row['mean_length']:.1f} |"
        )
    return lines


def tiny_table(tiny: dict[str, Any]) -> list[str]:
    lines = [
        "| rule | exact TV, prompt 0 | exact TV, mean / max over prompts | exact acceptance | Monte Carlo: TV to "
        "enumerated (noise alone) | chi-square p | MC TV to base |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in tiny["rules"]:
        mc = row.get("monte_carlo")
        check = "-" if mc is None else f"{mc['tv_to_enumerated']:.4f} ({mc['tv_noise_expected']:.4f})"
        p_value = "-" if mc is None else f"{mc['chi_square_p']:.3f}"
        to_base = "-" if mc is None else f"{mc['tv_to_base']:.4f}"
        lines.append(
            f"| {row['rule']} | {row['tv_first_prompt']:.3g} | {row['tv_mean']:.3f} / {row['tv_max']:.3f} | "
            f"{row['acceptance_rate_exact']:.3f} | {check} | {p_value} | {to_base} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    tiny = report["tiny"]
    lines = [
        f"{report['prompts']} held-out prompts, {report['max_new_tokens']} new tokens, {report['threads']} thread(s), "
        f"{report['machine']['date']}, load {report['load_before']} before / {report['load_after']} after, "
        f"{report['seconds']:.0f} s",
        "",
        "Temperature 0 (greedy acceptance), speed-up over hf-greedy:",
        "",
        *greedy_table(report["greedy"]),
        "",
        f"Temperature {report['temperature']}, draft model chain-{report['sampling_k']}, speed-up over transformers' "
        "own sampling (hf-sample), seed fixed per prompt:",
        "",
        *sampling_table(report["sampling"]),
        "",
        f"Tiny pair (vocabulary {tiny['vocab']}, base {tiny['base_parameters']} parameters, draft = its first layer; "
        f"base entropy {tiny['base_entropy_first_token']:.2f} nats, TV(p, q) {tiny['tv_base_draft_first_token']:.3f} "
        f"at the first token; {len(tiny['prompts'])} prompts; Monte Carlo {tiny['samples']} seeds on prompt 0; "
        f"batched rows equal alone: {tiny['batched_rows_equal_alone']}), chain of 2, temperature "
        f"{report['temperature']}:",
        "",
        *tiny_table(tiny),
        "",
        "Verdicts:",
        "",
        *(f"- {line}" for line in report["verdicts"]),
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------- main
def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def measure_default(args: argparse.Namespace) -> dict[str, Any]:
    """Parts 1 and 2 on the embedded default model."""
    tokenizer = load_tokenizer("default")
    prompts = load_prompts(assets.prompts_path(), tokenizer, limit=args.limit)
    encoded = [torch.tensor([tokenizer(p.text)["input_ids"]], dtype=torch.long) for p in prompts]
    eagle = SpecDecoder.from_pretrained("default", heads="default")
    base, heads = eagle.model, eagle.drafter.head
    draft = load_causal_lm("default", role="draft")
    ladder = {f"self-{n}L": truncated_base(n) for n in (int(x) for x in args.self_layers.split(",") if x.strip())}
    ladder["base-as-draft"] = base
    methods, info = greedy_methods(base, draft, heads, ladder)
    start = time.perf_counter()
    run_bench(methods, prompts, tokenizer, args.max_new_tokens, progress=False)
    greedy = greedy_rows(methods, info)
    greedy_seconds = time.perf_counter() - start
    print(json.dumps({"greedy_seconds": greedy_seconds}), flush=True)
    start = time.perf_counter()
    sampled = sampling_methods(base, draft, args.sampling_k, TEMPERATURE)
    run_bench(sampled, prompts, tokenizer, args.max_new_tokens, progress=False)
    sampling = sampling_rows(sampled, base, encoded, TEMPERATURE)
    return {
        "prompts": len(prompts),
        "base": model_info(base, "default"),
        "draft": model_info(draft, "default (draft)"),
        "greedy": greedy,
        "greedy_seconds": greedy_seconds,
        "sampling": sampling,
        "sampling_seconds": time.perf_counter() - start,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.from_json:  # the verdicts are recomputed from the saved numbers
        report = json.loads(Path(args.from_json).read_text())
        report["verdicts"] = verdicts(report["greedy"], report["sampling"], report["tiny"])
        print(markdown(report))
        return
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # the truncated bases' unused-weights report
    start, load_before = time.perf_counter(), load_average()
    report: dict[str, Any] = {
        "args": vars(args),
        "commit": git_commit(),
        "machine": machine_info(),
        "load_before": load_before,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "temperature": TEMPERATURE,
        "sampling_k": args.sampling_k,
        "prompts": 0,
    }
    report["tiny"] = tiny_tv(args.mc_samples, args.tiny_prompts, TEMPERATURE)
    report["tiny_seconds"] = time.perf_counter() - start
    print(json.dumps({"tiny_seconds": report["tiny_seconds"]}), flush=True)
    if not args.skip_default:
        report.update(measure_default(args))
        report["verdicts"] = verdicts(report["greedy"], report["sampling"], report["tiny"])
    else:
        report.update(greedy=[], sampling=[], verdicts=[])
    report["load_after"] = load_average()
    report["seconds"] = time.perf_counter() - start
    text = markdown(report) if not args.skip_default else "\n".join(tiny_table(report["tiny"])) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
