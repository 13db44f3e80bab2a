"""Test helpers: tiny causal LMs of several architectures built in process, and stub drafters."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel

from specheads.inference.drafters import Drafter

ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2")


def tiny_config(
    arch: str,
    vocab_size: int = 96,
    hidden: int = 32,
    layers: int = 2,
    max_positions: int = 256,
    intermediate: int | None = None,
):
    """A transformers config of a tiny model of the given architecture (MLP inner size ``intermediate``, default
    2 x hidden; GPT-2's default, 4 x hidden)."""
    common = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    if arch == "gpt2":
        return transformers.GPT2Config(
            n_embd=hidden, n_layer=layers, n_head=4, n_positions=max_positions, n_inner=intermediate, **common
        )
    decoder = dict(
        hidden_size=hidden,
        intermediate_size=intermediate or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        **common,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**decoder)
    if arch == "qwen2":
        return transformers.Qwen2Config(**decoder)
    if arch == "mistral":
        return transformers.MistralConfig(sliding_window=None, **decoder)
    raise ValueError(arch)


def tiny_model(arch: str = "llama", seed: int = 0, logit_scale: float = 1.0, **config_kwargs) -> PreTrainedModel:
    """A randomly initialised tiny model in eval mode; ``logit_scale`` sharpens its output distribution."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kwargs)).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            head = model.get_output_embeddings()
            if head.weight is model.get_input_embeddings().weight:
                model.config.tie_word_embeddings = False
                head.weight = torch.nn.Parameter(head.weight.detach().clone())
            head.weight.mul_(logit_scale)
    # No EOS by default, so reference generations run to max_new_tokens; tests that need EOS pass it explicitly.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def is_namespace_package(module: ModuleType) -> bool:
    """Whether ``module`` is a namespace package: a folder without ``__init__.py`` found on ``sys.path``, no code."""
    spec = getattr(module, "__spec__", None)
    return getattr(module, "__file__", None) is None and (spec is None or spec.origin in (None, "namespace"))


def require(module: str, install: str, strict_env: str = "SPECHEADS_REQUIRE_SPECULATORS") -> ModuleType:
    """Import the optional dependency ``module``, or skip the test saying what it needs ("needs ..."), or fail it
    where the environment variable ``strict_env`` is "1" (CI: a missing package is a failure there).

    An import that finds only a namespace package is a missing dependency, not the package: pytest's prepend import
    mode puts test folders on ``sys.path``, so without z-lab's ``dflash`` installed, ``import dflash`` finds the test
    folder ``tests/methods/dflash``. Such a stand-in is dropped from ``sys.modules``.
    """
    try:
        imported = importlib.import_module(module)
        if is_namespace_package(imported):
            del sys.modules[module]
            folders = list(getattr(imported, "__path__", []))
            raise ImportError(f"{module!r} is only a folder without code on sys.path ({folders}), not the package")
    except ImportError as error:
        if os.environ.get(strict_env) == "1":
            pytest.fail(f"{module} is required here ({strict_env}=1) but cannot be imported: {error}")
        pytest.skip(f"needs {module} ({error}); install it with: {install}")
    return imported


def greedy_reference(model: PreTrainedModel, prompt: torch.Tensor, max_new_tokens: int, eos_token_id=None):
    """transformers' own greedy output, the invariant every drafter must reproduce."""
    return model.generate(
        prompt,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=0,
        attention_mask=torch.ones_like(prompt),
    )


class _StubDrafter(Drafter):
    """Test drafters: the base class declares every hook they do not need."""


class OracleTreeDrafter(_StubDrafter):
    """A tree drafter for tests: one branch of a static tree carries the base's true greedy continuation.

    At each depth a random rank is chosen to hold the correct token; every other node gets a wrong token. The
    accepted path therefore wanders through the tree (non-contiguous cache slots) and stops where the tree ends.
    With ``wrong_after`` the correct branch stops after that many depths (a forced rejection).
    """

    name = "oracle-tree"

    def __init__(self, base: PreTrainedModel, tree, seed: int = 0, wrong_after: int | None = None) -> None:
        self.base = base
        self.tree = tree
        self.generator = torch.Generator().manual_seed(seed)
        self.wrong_after = wrong_after

    def propose(self, state, request):
        from specheads.inference.state import Proposal

        tree = self.tree.truncated(request.max_depth)
        if tree.num_nodes == 0:
            return None
        depth = tree.max_depth
        sequence = state.sequence(0)[None]
        truth = self.base.generate(
            sequence, do_sample=False, max_new_tokens=depth, pad_token_id=0, attention_mask=torch.ones_like(sequence)
        )[0, sequence.shape[1] :].tolist()
        max_rank = max(tree.ranks)
        chosen = torch.randint(0, max_rank + 1, (depth,), generator=self.generator).tolist()
        vocab = self.base.get_output_embeddings().weight.shape[0]
        tokens = []
        for path in tree.choices:
            d = len(path)
            on_branch = all(path[i] == chosen[i] for i in range(d))
            if self.wrong_after is not None and d > self.wrong_after:
                on_branch = False
            correct = truth[d - 1]
            token = correct if on_branch else (correct + 1 + path[-1]) % vocab
            tokens.append(token)
        return Proposal(tokens=torch.tensor([tokens]), tree=tree, draft_probs=None)


class RandomTreeDrafter(_StubDrafter):
    """Deterministic (q = None) random candidates on a static tree, for the sampling invariant."""

    name = "random-tree"

    def __init__(self, tree, vocab_size: int, seed: int = 0) -> None:
        self.tree = tree
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def propose(self, state, request):
        from specheads.inference.state import Proposal

        tree = self.tree.truncated(request.max_depth)
        if tree.num_nodes == 0:
            return None
        tokens = torch.empty(tree.num_nodes, dtype=torch.long)
        for node in range(tree.num_nodes + 1):  # siblings get distinct tokens
            children = tree.children[node]
            if children:
                picks = torch.randperm(self.vocab_size, generator=self.generator)[: len(children)]
                tokens[torch.tensor(children) - 1] = picks
        # The same candidates for every row: each row's output is the base's distribution whatever was proposed.
        return Proposal(tokens=tokens[None].expand(state.batch_size, -1), tree=tree, draft_probs=None)


def tiny_tokenizer(vocab_size: int = 96):
    """A character-level fast tokenizer of exactly ``vocab_size`` tokens (0 = pad, 1 = EOS), built in process."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    characters = list(string.ascii_letters + string.digits + " .,:;()[]_=+-*/#'\"\n")
    vocab = {"<pad>": 0, "<eos>": 1}
    for character in characters[: vocab_size - 2]:
        vocab[character] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def base_samples(base: PreTrainedModel, rows: int = 16, new_tokens: int = 60, seed: int = 0) -> torch.Tensor:
    """``[rows, 4 + new_tokens]`` sequences the base samples from random 4-token prompts (training data for heads)."""
    vocab = base.get_output_embeddings().weight.shape[0]
    prompts = torch.randint(2, vocab, (rows, 4), generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    with torch.no_grad():
        return base.generate(
            prompts, do_sample=True, max_new_tokens=new_tokens, pad_token_id=0, attention_mask=torch.ones_like(prompts)
        )


def train_eagle_head(base: PreTrainedModel, sequences: torch.Tensor, steps: int = 120, **head_kwargs):
    """A few seconds of EAGLE-3-style training (3 unrolled steps, self-distillation) on the base's own samples.

    Random heads almost never agree with a random base; these do often enough that multi-token commits happen.
    """
    from specheads.heads import EagleHead
    from specheads.methods.eagle.losses import draft_cross_entropy, eagle_targets

    torch.manual_seed(0)
    head = EagleHead.from_base(base, **head_kwargs)
    draft_ids = head.draft_token_ids() if head.config.reduced_vocab else None
    with torch.no_grad():  # the base is frozen: one forward gives every feature and target
        out = base(sequences, output_hidden_states=True)
    features = [out.hidden_states[index] for index in head.hidden_state_layers]
    loss_mask = torch.ones_like(sequences)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(steps):
        _, logits = head(sequences, features, None, steps=3)
        loss = sum(
            0.8**step
            * draft_cross_entropy(step_logits, *eagle_targets(out.logits, sequences, loss_mask, step, draft_ids))
            for step, step_logits in enumerate(logits)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


def train_block_head(base: PreTrainedModel, sequences: torch.Tensor, steps: int = 60, lr: float = 3e-3, **head_kwargs):
    """A few seconds of block-drafter training (the trainer's own loss, every position an anchor) on the base's
    samples, so that its drafts are plausible and get both accepted and rejected."""
    from specheads.methods.dflash.config import DFlashHeadsConfig
    from specheads.methods.dflash.heads import DFlashHead
    from specheads.methods.dflash.train import block_losses, depth_hidden, depth_targets, previous_tokens

    torch.manual_seed(0)
    head = DFlashHead.from_base(base, **head_kwargs)
    config = head.config
    section = DFlashHeadsConfig(variant=config.variant, block_size=config.block_size, markov_rank=config.markov_rank)
    with torch.no_grad():
        out = base(sequences, output_hidden_states=True)
    features = [out.hidden_states[index] for index in head.hidden_state_layers]
    ones = torch.ones_like(sequences)
    anchors = torch.arange(sequences.shape[1] - config.block_size)[None].expand(sequences.shape[0], -1)
    used = torch.ones_like(anchors, dtype=torch.bool)
    tokens, teacher_positions, valid = depth_targets(head, sequences, ones, ones, anchors, used)
    teacher = out.logits[torch.arange(sequences.shape[0])[:, None, None], teacher_positions]
    previous = previous_tokens(head, sequences, anchors) if head.markov_head is not None else None
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    for _ in range(steps):
        hidden = depth_hidden(head, head(sequences, features, anchors))
        logits = head.slot_logits(hidden, previous)
        confidence = head.confidence_logits(hidden, previous) if head.confidence_head is not None else None
        flat = None if confidence is None else confidence.flatten(0, 1)
        loss, _ = block_losses(section, head, logits.flatten(0, 1), teacher.flatten(0, 1), tokens.flatten(0, 1),
                               valid.flatten(0, 1), flat)  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


def train_medusa_heads(base: PreTrainedModel, sequences: torch.Tensor, steps: int = 80, **head_kwargs):
    """Medusa heads fitted for a few seconds to the base's own greedy continuation (head k: token t + 2 + k)."""
    from specheads.heads import MedusaHeads

    torch.manual_seed(0)
    heads = MedusaHeads.from_base(base, **head_kwargs)
    with torch.no_grad():
        out = base(sequences, output_hidden_states=True)
    hidden, labels = out.hidden_states[-1], sequences
    optimizer = torch.optim.Adam(heads.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = heads(hidden)  # [K, B, T, V]
        loss = sum(
            torch.nn.functional.cross_entropy(logits[k, :, : -(k + 2)].flatten(0, 1), labels[:, k + 2 :].flatten())
            for k in range(logits.shape[0])
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return heads.eval()


def load_script(name: str) -> ModuleType:
    """The module of ``scripts/<name>.py`` (the scripts are not a package), registered under ``name`` while it runs
    so that dataclasses can look their module up."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
