"""Test session set-up: offline hub, offline trackers, one thread; the fixtures tests in several folders share."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Before datasets is imported anywhere: tokenised-row caches of the tests go to a temporary folder, not the user's.
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="specheads-tests-datasets-")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], True)

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import PreTrainedModel  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
# Tiny models gain nothing from more threads, and one thread keeps the suite from thrashing on a shared machine.
torch.set_num_threads(int(os.environ.get("SPECHEADS_TEST_THREADS", "1")))

from helpers import base_samples, tiny_model, train_eagle_head, train_medusa_heads  # noqa: E402

# CI sets SPECHEADS_REQUIRE_ALL=1: a test skipped for a missing dependency ("needs ..." reasons) is then a failure,
# so that CI cannot pass by skipping what it must run. Skips for another machine ("no CUDA device here") stay skips.
REQUIRE_ALL = os.environ.get("SPECHEADS_REQUIRE_ALL") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        if reason.startswith("needs "):
            report.outcome = "failed"
            report.longrepr = f"SPECHEADS_REQUIRE_ALL=1: a required test was skipped: {reason}"


@pytest.fixture(scope="session")
def llama() -> PreTrainedModel:
    return tiny_model("llama")


VOCAB = 96


# The export and import tests (tests/export/) and EAGLE's GGUF draft tests (tests/methods/eagle/) share these, trained
# once per session.
@pytest.fixture(scope="session")
def base() -> PreTrainedModel:
    """A tiny Llama base with 8 layers, so that EAGLE-3's default feature layers are distinct."""
    return tiny_model("llama", seed=1, vocab_size=VOCAB, layers=8, logit_scale=4.0)


@pytest.fixture(scope="session")
def trained(base) -> dict[str, torch.nn.Module]:
    """Heads of every exported type, trained for a few seconds on the base's own samples, so that decoding with them
    accepts multi-token runs."""
    sequences = base_samples(base)
    counts = torch.bincount(sequences.flatten(), minlength=VOCAB)
    return {
        "eagle3": train_eagle_head(base, sequences, version=3, draft_vocab_size=64, token_counts=counts),
        "eagle3-full": train_eagle_head(base, sequences, steps=60, version=3),
        "eagle1": train_eagle_head(base, sequences, version=1, fc_bias=False),
        "eagle1-bias": train_eagle_head(base, sequences, steps=60, version=1),
        "medusa": train_medusa_heads(base, sequences, num_heads=3),
        "medusa-shared": train_medusa_heads(base, sequences, num_heads=3, share_lm_head=True),
    }
