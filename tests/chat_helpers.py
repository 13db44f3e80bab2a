"""A character-level tokenizer with a BOS token and a small chat template, for conversation tests.

Its tokenizer adds BOS to raw text (as Llama's does) and its template writes BOS itself, so a rendering tokenised
with the tokenizer's special tokens would start with two: what the tests check never happens.
"""

from __future__ import annotations

import string

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# ChatML as SmolLM2, Qwen and others write it: the training-data tests' template.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BOS = "<bos>"
GENERATION_PROMPT = "assistant:"


def chat_tokenizer(vocab_size: int = 96, chat_template: str | None = CHAT_TEMPLATE):
    """Like ``helpers.tiny_tokenizer`` (0 = pad, 1 = EOS, the same character ids) with ``<bos>`` as the last id,
    added to raw text by the post-processor, and ``chat_template`` (None: no template)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    characters = list(string.ascii_letters + string.digits + " .,:;()[]_=+-*/#'\"\n")
    vocab = {"<pad>": 0, "<eos>": 1}
    for character in characters[: vocab_size - 3]:
        vocab[character] = len(vocab)
    while len(vocab) < vocab_size - 1:
        vocab[f"<extra_{len(vocab)}>"] = len(vocab)
    vocab[BOS] = vocab_size - 1
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token=BOS)
    tokenizer.chat_template = chat_template
    return tokenizer
