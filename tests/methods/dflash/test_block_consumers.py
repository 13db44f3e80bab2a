"""Real consumers of block-drafter exports: speculators 0.9.0 loads our ``speculators`` DFlash and DSpark exports and
computes the same block logits (and confidence); z-lab's ``dflash`` 0.1.0 loads our native ``dflash`` export,
computes the same block logits and decodes losslessly with its own ``spec_generate``. Both are installed with
``--no-deps`` (their pins are older than this project's); without them the tests skip, naming why, except where
``SPECHEADS_REQUIRE_SPECULATORS=1`` (CI), where a missing package is a failure.
"""

from __future__ import annotations

import pytest
import torch
from helpers import greedy_reference, require, tiny_model
from safetensors.torch import load_file

from specheads import load_heads
from specheads.export import export_heads
from specheads.methods.dflash.heads import DFlashHead

INSTALL = "pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 dflash==0.1.0"
VOCAB, LAYERS, BLOCK, LENGTH = 96, 6, 4, 20


def _require(module: str):  # noqa: ANN202
    return require(module, INSTALL)


def _head(base, variant: str) -> DFlashHead:  # noqa: ANN001
    torch.manual_seed(0)
    head = DFlashHead.from_base(base, variant=variant, layer_ids=[1, 3, 5], num_layers=2, block_size=BLOCK,
                                mask_token_id=VOCAB - 1, markov_rank=8)  # fmt: skip
    with torch.no_grad():  # norms start at one and the Markov bias at zero: make every tensor matter
        for parameter in head.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return head


def _our_block_logits(head: DFlashHead, ids: torch.Tensor, hidden_states: tuple, anchors: torch.Tensor):  # noqa: ANN202
    """``[N, S, V]`` logits (and ``[N, S]`` confidence logits) of every slot of the block at each anchor."""
    features = [hidden_states[i] for i in head.hidden_state_layers]
    hidden = head(ids, features, anchors[None])[0]  # [N, S, h]
    previous = ids[0, anchors[:, None] + torch.arange(BLOCK)]  # slot k's previous token: the one at a + k
    logits = head.slot_logits(hidden, previous if head.markov_head is not None else None)
    confidence = head.confidence_logits(hidden, previous) if head.confidence_head is not None else None
    return logits, confidence


@pytest.mark.parametrize("variant", ["dflash", "dspark"])
def test_speculators_loads_the_block_export_and_computes_the_same_block_logits(tmp_path, variant: str) -> None:
    speculators = _require("speculators")
    from speculators.losses import eager, resolve_loss_config

    module = __import__(f"speculators.models.{variant}.core", fromlist=["compute_metrics"])
    base = tiny_model("llama", seed=3, vocab_size=VOCAB, layers=LAYERS)
    base.save_pretrained(tmp_path / "base")  # speculators reads the verifier's embedding, norm and lm_head
    head = _head(base, variant)
    out = tmp_path / "speculators"
    export_heads(head, out, "speculators", base_model=base, base_name=str(tmp_path / "base"))

    config = speculators.SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "eager"  # the saved default (flex attention) compiles
    model = speculators.SpeculatorModel.from_pretrained(str(out), config=config).eval()
    assert type(model).__name__ == {"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}[variant]
    assert model.config.aux_hidden_state_layer_ids == [1, 3, 5] and model.config.mask_token_id == VOCAB - 1
    assert model.config.sample_from_anchor is (variant == "dspark")
    written = load_file(str(out / "model.safetensors"))
    state = model.state_dict()
    unwritten = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    assert set(state) - set(written) == unwritten and set(written) <= set(state)
    for name, tensor in written.items():
        assert torch.equal(state[name], tensor), name

    ids = torch.randint(1, VOCAB - 1, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    captured = {}
    original = module.compute_metrics

    def capture(logits, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        captured["logits"] = logits
        if variant == "dspark":
            captured["confidence"] = args[1]
        return original(logits, *args, **kwargs)

    module.compute_metrics = capture
    try:
        with torch.no_grad():
            hidden_states = base(ids, output_hidden_states=True).hidden_states
            kwargs = {"loss_config": resolve_loss_config("kl_div", "eager"), "max_anchors": LENGTH - BLOCK}
            if variant == "dspark":
                kwargs["tv_loss_fn"] = eager.tv_loss
            model(
                hidden_states=torch.cat([hidden_states[i] for i in (1, 3, 5)], dim=-1),
                input_ids=ids,
                loss_mask=torch.ones(1, LENGTH),
                verifier_last_hidden_states=hidden_states[-1],
                document_ids=torch.zeros(1, LENGTH, dtype=torch.long),
                **kwargs,
            )
            anchors = torch.arange(LENGTH - BLOCK)  # every valid position is an anchor, sorted
            ours, confidence = _our_block_logits(head, ids, hidden_states, anchors)
    finally:
        module.compute_metrics = original
    theirs = captured["logits"].view(LENGTH - BLOCK, BLOCK, VOCAB)
    first = 0 if variant == "dspark" else 1  # DFlash's slot 0 is the anchor and predicts nothing
    torch.testing.assert_close(theirs[:, first:], ours[:, first:], atol=1e-5, rtol=0)
    if variant == "dspark":
        torch.testing.assert_close(captured["confidence"].view(LENGTH - BLOCK, BLOCK), confidence, atol=1e-5, rtol=0)


def test_a_block_drafter_speculators_writes_imports_into_specheads(tmp_path) -> None:
    speculators = _require("speculators")
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import Qwen3Config

    base = tiny_model("llama", seed=4, vocab_size=VOCAB, layers=LAYERS)
    base.save_pretrained(tmp_path / "base")
    layer = Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
    )  # fmt: skip
    layer._attn_implementation = "eager"
    config = DSparkSpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=VOCAB, block_size=BLOCK, aux_hidden_state_layer_ids=[2, 4],
        mask_token_id=0, markov_rank=8, sliding_window_non_causal=True,
        speculators_config=speculators.SpeculatorsConfig(
            algorithm="dspark", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=BLOCK)],
            default_proposal_method="greedy",
            verifier=speculators.VerifierConfig(
                name_or_path=str(tmp_path / "base"), architectures=["LlamaForCausalLM"]
            ),
        ),
    )  # fmt: skip
    draft = DSparkDraftModel(config)
    draft.load_verifier_weights()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in draft.named_parameters():
            if not name.startswith(("embed_tokens", "lm_head", "verifier")):
                noise = 0.2 * torch.randn(parameter.shape, generator=generator)
                parameter.copy_((1.0 if "norm" in name else 0.0) + noise)
    draft.save_pretrained(str(tmp_path / "draft"))

    with pytest.warns(UserWarning, match="without a fingerprint"):
        head = load_heads(tmp_path / "draft", base)
    assert isinstance(head, DFlashHead) and head.config.variant == "dspark" and head.config.layer_ids == [2, 4]
    state = draft.state_dict()
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_zlab_dflash_loads_the_native_export_and_decodes_losslessly(tmp_path) -> None:
    dflash = _require("dflash")
    base = tiny_model("llama", seed=5, vocab_size=VOCAB, layers=LAYERS)
    head = _head(base, "dflash")
    out = tmp_path / "native"
    export_heads(head, out, "dflash", base_model=base)
    model = dflash.DFlashDraftModel.from_pretrained(str(out)).eval()
    assert model.target_layer_ids == [0, 2, 4] and model.block_size == BLOCK and model.mask_token_id == VOCAB - 1

    ids = torch.randint(1, VOCAB - 1, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden_states = base(ids, output_hidden_states=True).hidden_states
        anchors = torch.tensor([1, 7, LENGTH - BLOCK])
        ours, _ = _our_block_logits(head, ids, hidden_states, anchors)
        for row, anchor in enumerate(anchors.tolist()):
            block = head.block_inputs(ids[:, anchor])  # [1, S]
            hidden = model(
                target_hidden=dflash.extract_context_feature(hidden_states, model.target_layer_ids)[:, :anchor],
                noise_embedding=base.get_input_embeddings()(block),
                position_ids=torch.arange(anchor + BLOCK)[None],
            )
            theirs = model.compute_logits(hidden[:, 1:], base.get_output_embeddings())[0]
            torch.testing.assert_close(theirs, ours[row, 1:], atol=1e-5, rtol=0)

        prompt = ids[:, :9]
        generated = model.spec_generate(target=base, input_ids=prompt, max_new_tokens=24, stop_token_ids=None,
                                        temperature=0.0)  # fmt: skip
    assert generated[0].tolist() == greedy_reference(base, prompt, 24)[0].tolist()
