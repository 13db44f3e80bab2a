"""Test session set-up: offline hub, offline trackers, one thread."""

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

from helpers import tiny_model  # noqa: E402

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
