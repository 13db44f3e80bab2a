"""A real consumer: vLLM's ``speculators`` library loads our speculators-format export with its own
``from_pretrained`` and computes the same draft logits as specheads from the same base hidden states.

speculators 0.9.0 pins older transformers/datasets than this project, so it is installed with ``--no-deps`` (see the
README's test command and ``.ci/run``). Without it the test is skipped, naming why, except where
``SPECHEADS_REQUIRE_SPECULATORS=1`` (CI), where a missing package is a failure.
"""

from __future__ import annotations

import pytest
import torch
from helpers import require, tiny_model

from specheads import EagleHead
from specheads.export import export_heads

INSTALL = "pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 && pip install -e '.[speculators]'"


def _speculators():
    return require("speculators", INSTALL)


def _one_step(model, hidden_states: tuple, layers: list[int], ids: torch.Tensor) -> tuple[torch.Tensor, list]:
    """speculators' one-step draft logits (captured at its lm_head) and tokens from the base's ``hidden_states``.

    speculators pairs the feature of position t with token t + 1 (its collator shifts; forward does not).
    """
    captured = {}
    hook = model.lm_head.register_forward_hook(lambda module, args, output: captured.setdefault("logits", output))
    try:
        tokens = model(
            hidden_states=torch.cat([hidden_states[i] for i in layers], dim=-1)[:, :-1],
            input_ids=ids[:, 1:],
            document_ids=torch.zeros_like(ids[:, 1:]),
            position_ids=torch.arange(ids.shape[1] - 1)[None],
            ttt_steps=1,
        )
    finally:
        hook.remove()
    return captured["logits"], tokens


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_speculators_loads_the_export_and_drafts_the_same_logits(tmp_path, norm_before_residual: bool) -> None:
    speculators = _speculators()
    base = tiny_model("llama", seed=3, vocab_size=96, layers=4)
    base.save_pretrained(tmp_path / "base")  # speculators reads the verifier's config, embedding, norm and lm_head
    torch.manual_seed(0)
    head = EagleHead.from_base(
        base,
        version=3,
        layer_ids=[3, 1, 2],  # unsorted on purpose: engines concatenate in layer order, the export permutes fc
        draft_vocab_size=48,
        token_counts=torch.rand(96),
        norm_before_residual=norm_before_residual,
    )
    with torch.no_grad():  # norms start at one: make every tensor matter
        for parameter in head.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    out = tmp_path / "speculators"
    export_heads(head, out, "speculators", base_model=base, base_name=str(tmp_path / "base"))

    config = speculators.SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "eager"  # the saved default (flex attention) is slow on CPU
    model = speculators.SpeculatorModel.from_pretrained(str(out), config=config).eval()
    assert type(model).__name__ == "Eagle3DraftModel"
    assert model.config.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    assert bool(model.config.norm_before_residual) is norm_before_residual
    # speculators' loading is lenient (a missing tensor is re-initialised): every tensor must be the exported one.
    from safetensors.torch import load_file

    written = load_file(str(out / "model.safetensors"))
    state = model.state_dict()
    assert set(written) <= set(state)
    assert set(state) - set(written) == {"verifier_lm_head.weight", "verifier_norm.weight"}
    for name, tensor in written.items():
        assert torch.equal(state[name], tensor), name

    ids = torch.randint(2, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden_states = base(ids, output_hidden_states=True).hidden_states
        ours = head(ids, [hidden_states[i] for i in head.hidden_state_layers], steps=1)[1][0]  # [1, 11, 48]
        logits, tokens = _one_step(model, hidden_states, [1, 2, 3], ids)
    torch.testing.assert_close(logits, ours, atol=1e-5, rtol=0)
    assert torch.equal(head.to_target(tokens[0].flatten()), head.to_target(ours.argmax(-1).flatten()))


def test_a_checkpoint_speculators_writes_imports_into_specheads(tmp_path) -> None:
    speculators = _speculators()
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    from specheads import load_heads

    base = tiny_model("llama", seed=4, vocab_size=96, layers=4)
    base.save_pretrained(tmp_path / "base")
    layer = LlamaConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=64, max_position_embeddings=256, tie_word_embeddings=False,
    )  # fmt: skip
    config = speculators.Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=40,
        norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[1, 2, 3],
        speculators_config=speculators.SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=speculators.VerifierConfig(
                name_or_path=str(tmp_path / "base"), architectures=["LlamaForCausalLM"]
            ),
        ),
    )
    draft = speculators.Eagle3DraftModel(config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in draft.named_parameters():
            parameter.copy_((1.0 if "norm" in name else 0.0) + 0.2 * torch.randn(parameter.shape, generator=generator))
        draft.embed_tokens.weight.copy_(base.get_input_embeddings().weight)  # what load_verifier_weights does
        keep = torch.randperm(96, generator=generator)[:40].sort().values
        draft.t2d.zero_()
        draft.t2d[keep] = True
        draft.d2t.copy_(keep - torch.arange(40))
    draft.save_pretrained(str(tmp_path / "draft"))

    with pytest.warns(UserWarning, match="without a fingerprint"):
        head = load_heads(tmp_path / "draft", base)
    assert head.config.layer_ids == [1, 2, 3] and head.config.draft_vocab_size == 40
    assert torch.equal(head.draft_token_ids(), keep)
    draft.config.transformer_layer_config._attn_implementation = "eager"
    draft = speculators.Eagle3DraftModel.from_pretrained(str(tmp_path / "draft"), config=draft.config).eval()
    ids = torch.randint(2, 96, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        states = base(ids, output_hidden_states=True).hidden_states
        ours = head(ids, [states[i] for i in (1, 2, 3)], steps=1)[1][0]
        logits, _ = _one_step(draft, states, [1, 2, 3], ids)
    torch.testing.assert_close(logits, ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("fc_norm", "norm_output", "norm_before_fc"),
    [(True, True, False), (True, False, False), (False, True, False), (False, False, True), (False, True, True)],
)
def test_speculators_runs_eagle31_norms_as_specheads_does(
    tmp_path, fc_norm: bool, norm_output: bool, norm_before_fc: bool
) -> None:
    """EAGLE 3.1's ``fc_norm`` (one norm per fused layer, permuted with fc's blocks), ``norm_output`` (the next step
    reads the normed output) and ``norm_before_fc`` (one norm over the concatenation, its blocks permuted with fc's)
    reach speculators, which drafts the same logits at every training-time-test step."""
    speculators = _speculators()
    base = tiny_model("llama", seed=5, vocab_size=96, layers=4)
    base.save_pretrained(tmp_path / "base")
    torch.manual_seed(0)
    head = EagleHead.from_base(
        base, version=3, layer_ids=[3, 1, 2], draft_vocab_size=48, token_counts=torch.rand(96), fc_norm=fc_norm,
        norm_output=norm_output, norm_before_fc=norm_before_fc,
    )  # fmt: skip
    with torch.no_grad():  # norms start at one: make every tensor matter, each fc_norm its own
        for parameter in head.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    out = tmp_path / "speculators"
    export_heads(head, out, "speculators", base_model=base, base_name=str(tmp_path / "base"))

    config = speculators.SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "eager"
    model = speculators.SpeculatorModel.from_pretrained(str(out), config=config).eval()
    assert (model.config.fc_norm, model.config.norm_output, model.config.norm_before_fc) == (
        fc_norm,
        norm_output,
        norm_before_fc,
    )
    assert (model.fc_norm is not None) is fc_norm and (model.input_norm is not None) is norm_before_fc
    ids = torch.randint(2, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    captured: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda module, args, output: captured.append(output))
    with torch.no_grad():
        states = base(ids, output_hidden_states=True).hidden_states
        ours = head(ids, [states[i] for i in head.hidden_state_layers], steps=3)[1]  # 3 x [1, 11, 48]
        try:
            model(
                hidden_states=torch.cat([states[i] for i in (1, 2, 3)], dim=-1)[:, :-1],
                input_ids=ids[:, 1:],
                document_ids=torch.zeros_like(ids[:, 1:]),
                position_ids=torch.arange(ids.shape[1] - 1)[None],
                ttt_steps=3,
            )
        finally:
            hook.remove()
    assert len(captured) == 3
    for step, (theirs, mine) in enumerate(zip(captured, ours, strict=True)):
        valid = mine.shape[1] - step  # the last `step` positions read padding past the sequence, differently
        # float32 rounding grows through three steps of a layer with noisy norms: 1e-4 of logits of size ~1-10
        torch.testing.assert_close(
            theirs[:, :valid],
            mine[:, :valid],
            atol=1e-4,
            rtol=0,
            msg=lambda detail, step=step: f"step {step}: {detail}",
        )
