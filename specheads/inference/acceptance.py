"""Acceptance rules: which drafted tokens of a verified tree to keep, and which token the base adds after them.

Every rule is a pure function with the same signature over one row of the batch::

    rule(p_logits, tokens, tree, q, sampling, generator, options) -> AcceptResult

* ``p_logits [N + 1, V]``: the target (base) logits at each tree node; row i predicts the child of node i.
* ``tokens [N + 1]``: the token of each node (``tokens[0]`` is the root, already committed).
* ``q [N, V] | None``: the draft distribution each node's token was drawn from (row i - 1 for node i); None when the
  drafter proposes deterministically (top-k heads, prompt lookup), which counts as a one-hot proposal.

Only ``greedy`` and ``rejection`` are lossless; ``typical``, ``threshold`` and ``alpha`` trade quality for speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specheads.inference.sampling import SamplingParams, probabilities, sample, warp_logits
from specheads.inference.trees import TreeBuffers


@dataclass(frozen=True)
class AcceptanceOptions:
    """Parameters of the lossy rules (keyword arguments of ``SpecDecoder.generate``)."""

    posterior_threshold: float = 0.09  # typical: epsilon
    posterior_alpha: float = 0.3  # typical: delta
    acceptance_threshold: float = 0.1  # threshold
    alpha: float = 0.9  # alpha


@dataclass
class AcceptResult:
    """Outcome of one verification.

    Attributes:
        path: accepted node indices from the root's child downwards (the root itself excluded).
        next_token: the token the base contributes after the accepted path (bonus or correction).
        accepted: the tokens of ``path`` when the rule read them on the host anyway (else None: the engine reads
            them).
    """

    path: list[int]
    next_token: int
    accepted: list[int] | None = None


AcceptanceRule = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        TreeBuffers,
        "torch.Tensor | None",
        SamplingParams,
        "torch.Generator | None",
        AcceptanceOptions,
    ],
    AcceptResult,
]


def greedy(
    p_logits: torch.Tensor,
    tokens: torch.Tensor,
    tree: TreeBuffers,
    q: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    options: AcceptanceOptions,
) -> AcceptResult:
    """Accept the longest path whose every token is the base's argmax at its parent (lossless at temperature 0).

    This is exact-match verification as in Medusa's greedy mode and transformers' assisted generation.
    """
    return _greedy_walk(torch.stack((p_logits.argmax(dim=-1), tokens.to(p_logits.device))).tolist(), tree)


def greedy_batch(p_logits: torch.Tensor, tokens: torch.Tensor, trees: list[TreeBuffers | None]) -> list[AcceptResult]:
    """:func:`greedy` for every row of a batch at once, with one transfer to the host for the whole step.

    Args:
        p_logits: ``[B, W, V]`` target logits of every row's (padded) tree.
        tokens: ``[B, W]`` node tokens (root first).
        trees: each row's tree, or None for a row that drafted nothing (its next token is the argmax at its root).
    """
    host = torch.stack((p_logits[:, : tokens.shape[1]].argmax(dim=-1), tokens.to(p_logits.device))).tolist()
    return [_greedy_walk(pair, tree) for *pair, tree in zip(host[0], host[1], trees, strict=True)]


def _greedy_walk(pair: list[list[int]], tree: TreeBuffers | None) -> AcceptResult:
    """The greedy path of one tree on the host: ``pair`` is (the base's argmax at each node, each node's token)."""
    target, node_tokens = pair
    node, path = 0, []
    children = () if tree is None else tree.children
    while True:
        wanted = target[node]
        child = next((c for c in children[node] if node_tokens[c] == wanted), None) if children else None
        if child is None:
            return AcceptResult(path, wanted, [node_tokens[c] for c in path])
        path.append(child)
        node = child


def rejection(
    p_logits: torch.Tensor,
    tokens: torch.Tensor,
    tree: TreeBuffers,
    q: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    options: AcceptanceOptions,
) -> AcceptResult:
    """Lossless speculative sampling over a tree (recursive multi-candidate rejection sampling).

    At each node the children are tried in order: child x drawn from q is accepted with probability
    ``min(1, p'(x) / q(x))``; on rejection the target becomes the residual ``p' = norm(max(p' - q, 0))``
    (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318; SpecInfer, arXiv 2305.09781).
    A deterministic child (``q is None``) is a one-hot proposal: accepted with probability ``p'(x)``, after which x
    is removed from the residual. When no child is accepted, the next token is sampled from the residual; after a
    leaf, from the target itself (the bonus token). The output distribution equals sampling from the base.
    """
    p = probabilities(p_logits, sampling)  # [N + 1, V]
    node_tokens = tokens.tolist()
    node, path = 0, []
    while True:
        residual = p[node]
        accepted_child = None
        for child in tree.children[node]:
            x = node_tokens[child]
            q_child = None if q is None else q[child - 1]
            q_x = 1.0 if q_child is None else max(float(q_child[x]), 1e-20)
            if float(torch.rand((), generator=generator, device=p.device)) < min(1.0, float(residual[x]) / q_x):
                accepted_child = child
                break
            if q_child is None:
                residual = residual.clone()
                residual[x] = 0.0
            else:
                residual = (residual - q_child).clamp_min(0.0)
            total = float(residual.sum())
            # A residual of zero mass can only come from rounding (p == q); p itself is then the right fallback.
            residual = residual / total if total > 0 else p[node]
        if accepted_child is None:
            return AcceptResult(path, int(sample(residual, generator)))
        path.append(accepted_child)
        node = accepted_child


def rejection_chain(
    p_logits: torch.Tensor,
    tokens: torch.Tensor,
    tree: TreeBuffers,
    q: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    options: AcceptanceOptions,
) -> AcceptResult:
    """:func:`rejection` for a chain, on the device with one transfer to the host (as gpt-fast's speculative step).

    Draft token x_j (node j) is accepted when ``u_j < p_{j-1}(x_j) / q_{j-1}(x_j)`` (q one-hot: ``p_{j-1}(x_j)``);
    all ratios and uniforms are drawn at once and the first rejection is found on the device. The next token is
    drawn from every node's residual at once (``norm(max(p - q, 0))``, or p with the draft token removed for a
    one-hot draft; p itself after the leaf), and the host keeps the one at the first rejection: the other draws
    are discarded, so the output distribution is exactly the sequential rule's.
    """
    if not tree.is_chain:
        return rejection(p_logits, tokens, tree, q, sampling, generator, options)
    count = tree.num_nodes
    p = probabilities(p_logits, sampling)  # [N + 1, V]
    drafts = tokens[1:, None]  # [N, 1]
    p_x = p[:-1].gather(1, drafts)[:, 0]  # [N]
    if q is None:
        ratio = p_x
        residual = p[:-1].scatter(1, drafts, 0.0)
    else:
        ratio = p_x / q.gather(1, drafts)[:, 0].clamp_min(1e-20)
        residual = (p[:-1] - q).clamp_min(0.0)
    total = residual.sum(dim=-1, keepdim=True)
    # A residual of zero mass can only come from rounding (p == q); p itself is then the right fallback.
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p[:-1])
    uniforms = torch.rand(count, generator=generator, device=p.device)
    accepted = uniforms < ratio.clamp_max(1.0)
    draws = sample(torch.cat([residual, p[-1:]]), generator)  # [N + 1]: the next token after each stop
    host = torch.cat([accepted.long(), draws, tokens[1:].to(draws.device)]).tolist()
    rejected = next((j for j in range(count) if not host[j]), count)
    kept = host[2 * count + 1 : 2 * count + 1 + rejected]
    return AcceptResult(list(range(1, rejected + 1)), host[count + rejected], kept)


def typical(
    p_logits: torch.Tensor,
    tokens: torch.Tensor,
    tree: TreeBuffers,
    q: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    options: AcceptanceOptions,
) -> AcceptResult:
    """Medusa's typical acceptance (lossy): accept x if ``p(x) > min(epsilon, delta * exp(-H(p)))``.

    Cai et al. 2024 (arXiv 2401.10774), section 2.3.1, with epsilon = ``posterior_threshold`` and delta =
    ``posterior_alpha``. The longest path of accepted tokens wins; the next token is sampled from p restricted to the
    tokens that pass the same criterion. At temperature 0 this is the greedy rule, as in Medusa.
    """
    if sampling.greedy:
        return greedy(p_logits, tokens, tree, q, sampling, generator, options)
    p = warp_logits(p_logits, sampling).softmax(dim=-1)  # [N + 1, V]
    entropy = -(p * p.clamp_min(1e-20).log()).sum(dim=-1)  # [N + 1]
    cutoff = torch.minimum(
        torch.full_like(entropy, options.posterior_threshold), options.posterior_alpha * torch.exp(-entropy)
    )  # [N + 1]
    parents = torch.tensor(tree.parents[1:], dtype=torch.long, device=p_logits.device)
    p_child = p[parents, tokens[1:]]  # [N] target probability of each node's token at its parent
    path = _longest_path(p_child > cutoff[parents], tree)
    last = path[-1] if path else 0
    passing = p[last] > cutoff[last]
    passing[p[last].argmax()] = True
    restricted = torch.where(passing, p[last], torch.zeros_like(p[last]))
    return AcceptResult(path, int(sample(restricted / restricted.sum(), generator)))


def threshold(
    p_logits: torch.Tensor,
    tokens: torch.Tensor,
    tree: TreeBuffers,
    q: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    options: AcceptanceOptions,
) -> AcceptResult:
    """Accept a drafted token when the verifier gives it probability > ``acceptance_threshold`` (lossy).

    The longest such path wins; the next token is the verifier's (sampled, or its argmax at temperature 0). At
    temperature 0 the probabilities are the plain softmax of the logits.
    """
    p = _criterion_probs(p_logits, sampling)
    parents = torch.tensor(tree.parents[1:], dtype=torch.long, device=p_logits.device)
    path = _longest_path(p[parents, tokens[1:]] > options.acceptance_threshold, tree)
    return AcceptResult(path, _verifier_token(p_logits, path, sampling, generator))


def alpha(
    p_logits: torch.Tensor,
    tokens: torch.Tensor,
    tree: TreeBuffers,
    q: torch.Tensor | None,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    options: AcceptanceOptions,
) -> AcceptResult:
    """Accept a drafted token x when ``q(x) >= alpha * p(x)`` (lossy), with q the draft's probability of its token.

    Only a drafter that reports its probabilities (the draft model at temperature > 0) can be judged this way. A
    deterministic proposal (heads' top-k, prompt lookup, greedy drafts) has q(x) = 1, which would pass every draft
    unverified, so it is refused. The next token is the verifier's.

    Raises:
        ValueError: ``q`` is None.
    """
    if q is None and tree.num_nodes:
        raise ValueError(
            "acceptance='alpha' compares the draft's probability of each token with the base's; these drafts carry "
            "no draft probabilities (deterministic proposals would all pass unverified). Use it with a draft model "
            "at temperature > 0, or use 'typical' or 'threshold'"
        )
    p = _criterion_probs(p_logits, sampling)
    parents = torch.tensor(tree.parents[1:], dtype=torch.long, device=p_logits.device)
    q_x = q[:, :].gather(1, tokens[1:, None])[:, 0] if tree.num_nodes else torch.ones(0, device=p.device)
    path = _longest_path(q_x >= options.alpha * p[parents, tokens[1:]], tree)
    return AcceptResult(path, _verifier_token(p_logits, path, sampling, generator))


def _criterion_probs(p_logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    if sampling.greedy:
        return p_logits.float().softmax(dim=-1)
    return warp_logits(p_logits, sampling).softmax(dim=-1)


def _verifier_token(
    p_logits: torch.Tensor, path: list[int], sampling: SamplingParams, generator: torch.Generator | None
) -> int:
    last = path[-1] if path else 0
    return int(sample(probabilities(p_logits[last], sampling), generator))


def _longest_path(node_ok: torch.Tensor, tree: TreeBuffers) -> list[int]:
    """The longest root-to-node path of nodes that all pass (``node_ok [N]`` for nodes 1..N); first wins ties."""
    if tree.num_nodes == 0:
        return []
    ok = torch.cat([torch.ones(1, dtype=torch.bool), node_ok.bool().cpu()])  # [N + 1], root always passes
    valid = tree.paths >= 0  # [P, D + 1]
    passing = ok[tree.paths.clamp_min(0)] & valid
    lengths = passing.long().cumprod(dim=1).sum(dim=1) - 1  # drafted nodes accepted along each path
    best = int(lengths.argmax())
    return tree.paths[best, 1 : 1 + int(lengths[best])].tolist()


ACCEPTANCE_RULES: dict[str, AcceptanceRule] = {
    "greedy": greedy,
    "rejection": rejection,
    "typical": typical,
    "threshold": threshold,
    "alpha": alpha,
}
LOSSLESS_RULES = frozenset({"greedy", "rejection"})


def resolve_rule(name: str, sampling: SamplingParams) -> str:
    """Resolve ``"auto"`` and check that the rule exists and fits the temperature."""
    if name == "auto":
        return "greedy" if sampling.greedy else "rejection"
    if name not in ACCEPTANCE_RULES:
        raise ValueError(f"unknown acceptance rule {name!r}; choose one of {['auto', *ACCEPTANCE_RULES]}")
    if name == "greedy" and not sampling.greedy:
        raise ValueError("acceptance='greedy' is exact only at temperature=0; use 'rejection' (lossless sampling)")
    return name
