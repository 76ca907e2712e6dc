"""Batch invariance (`flexlamps.models.blocks.weight_kind`): a sequence's output is the same bits
whatever runs beside it.

Drawn: a family and weight kind (dense, MoE, MLA with and without DSA's selection, hybrid DeltaNet;
float weights, 4-bit blocks, Q8_0, K-quants and the 5-bit form, MXFP4 experts, FP8 tiles), a dtype,
an executor (in memory, or offloaded by a placement over tight budgets), a batch (1-6 prompts of
mixed lengths, maybe sharing a prefix the batch face computes once), the batch size, greedy or
seeded sampling. Each prompt's tokens and the log-probability of each (a function of its whole
logits row) must equal those of the prompt run alone on the in-memory executor, bit for bit (an
offloaded batch included). Whatever kernels this machine runs take part
($FLEXLAMPS_NATIVE_KERNELS=0: torch's only), so the rule is checked on them.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import placement
from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from tests.checkpoint_zoo import CheckpointZoo

# family / weight kind -> a tiny checkpoint of it (tests/checkpoint_zoo.py)
MODELS = ("tiny:llama_gqa", "moe:qwen2_moe:narrow", "deepseek:deepseek_v3", "deepseek:deepseek_v32",
          "moe:deepseek_v2:narrow", "tiny:llama_gqa:fp8",
          "hybrid:qwen3_5_text",
          "hybrid:qwen3_next", "gguf:llama:Q4_0", "gguf:llama:Q8_0", "gguf:llama:Q4_K_M", "gguf:llama:Q5_1",
          "gguf:mixtral:Q8_0", "gguf:gpt_oss_mxfp4")
SHARED_PREFIX = 18  # tokens every prompt of a batch starts with, when drawn (generate reuses 16 or more)
NEW_TOKENS = 4
MAX_BATCH = 6


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(model, dtype, offloaded) -> a ready LLM, built on first use."""
    built = {}
    zoo = CheckpointZoo(tmp_path_factory.mktemp("invariance_zoo"))
    yield lambda *key: built[key] if key in built else built.setdefault(key, _engine(zoo, tmp_path_factory, *key))
    for llm in built.values():
        llm.close()


def _engine(zoo, tmp_path_factory, model: str, dtype: str, offloaded: bool):
    from flexlamps import LLM
    from tests.described import described
    from flexlamps.models.loading.registry import open_checkpoint

    path = zoo.path(model)
    budgets = {}
    if offloaded:  # the offload executor, its gpu tier short of the weights (in fp32) plus room to run
        weights = described(open_checkpoint(path).config)[1].total_weight_bytes() * 4
        budgets = dict(gpu_mem=weights // 2 + (8 << 20), cpu_mem=4 * weights + (64 << 20),
                       offload_dir=str(tmp_path_factory.mktemp("off")))
    # a preset machine: planning does not measure this one (the plan's shape is not what is tested)
    with mock.patch("flexlamps.hardware.cache.machine_profile", lambda *a, **k: placement.hardware_preset("rtx3090")):
        llm = LLM(str(path), dtype=dtype, max_batch_size=MAX_BATCH, cache_dir=False, **budgets)
        llm.prepare(prompt_len=SHARED_PREFIX + 24, gen_len=NEW_TOKENS, num_sequences=MAX_BATCH, prefix_len=0)
    return llm


@st.composite
def _cases(draw) -> dict:
    num = draw(st.integers(1, MAX_BATCH))
    return dict(model=draw(st.sampled_from(MODELS)), dtype=draw(st.sampled_from(("auto", "bfloat16", "float32"))),
                offloaded=draw(st.booleans()), lengths=draw(st.lists(st.integers(1, 24), min_size=num, max_size=num)),
                shared=draw(st.sampled_from((0, SHARED_PREFIX))), batch=draw(st.integers(1, MAX_BATCH)),
                sampled=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def _prompts(case: dict, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(case["seed"])
    prefix = torch.randint(3, vocab, (case["shared"],), generator=g).tolist()
    return [prefix + torch.randint(3, vocab, (n,), generator=g).tolist() for n in case["lengths"]]


def _params(case: dict, index: int) -> SamplingParams:
    """Greedy, or seeded sampling with a seed of the prompt's own (as generate's --seed derives it)."""
    sampled = dict(temperature=0.9, top_k=20, seed=case["seed"] + index) if case["sampled"] else {}
    return SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, logprobs=True, **sampled)


def _outputs(llm, prompts, params, batch: int):
    outs = generate(llm.executor, llm.tokenizer, prompts, params, max_batch=min(batch, llm.max_batch_size))
    return [(o.token_ids, o.logprobs) for o in outs]


def _check(engines, case: dict) -> None:
    llm = engines(case["model"], case["dtype"], case["offloaded"])
    prompts = _prompts(case, min(llm.config.vocab_size, llm.tokenizer.vocab_size))
    params = [_params(case, i) for i in range(len(prompts))]
    together = _outputs(llm, prompts, params, case["batch"])
    solo = engines(case["model"], case["dtype"], False)  # offloaded or not: the in-memory engine's bits
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        alone = _outputs(solo, [prompt], [p], 1)[0]
        assert together[i] == alone, (i, case)


# CI replays the same 12 draws (about a minute: the engines' loads); the slow one explores
@pytest.mark.slow
@pytest.mark.ci
@settings(max_examples=12, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_cases())
def test_a_row_is_the_same_bits_in_any_batch(engines, case):
    _check(engines, case)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_cases())
def test_a_row_is_the_same_bits_in_any_batch_200_cases(engines, case):
    _check(engines, case)
