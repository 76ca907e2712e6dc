"""An augmented run computes each request the same way whatever shares its iterations (#43):
its prompt and returned API tokens in the prompt phase however the token budget chunks them (a
one-token chunk too, padded to a two-column prompt step), its sampled tokens in the decode phase.
So its logits are the same bits beside other requests as alone, on any machine whose kernels
keep each phase's arithmetic per row, also where the two phases' kernels differ (a 4-bit or int8
weight's decode and prompt kernels on a CPU with a fast dense GEMM for x's dtype)."""

from collections import defaultdict

import pytest
import torch

from flexlamps.api import LLM
from flexlamps.engine.augmented.engine import AugmentedEngine, StepClock
from flexlamps.engine.augmented.reference import uninterrupted_tokens
from flexlamps.engine.augmented.run import AgentsConfig, run_policy_on_engine
from flexlamps.sched.cost_model import CostModel
from flexlamps.sched.request import RequestSpec, Segment
from flexlamps.workloads.tokenized import tokenize_requests
from tests.checkpoint_zoo import CheckpointZoo

BLOCK = 4
BUDGET = 8  # tokens an iteration: a 9-token prompt alone runs as chunks of 8 and 1


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return LLM(str(CheckpointZoo(tmp_path_factory.mktemp("zoo")).path("gguf:llama:Q4_0")), dtype="bfloat16")


def _specs(neighbours: int) -> list[RequestSpec]:
    """Requests of 9 (and 17, 25) prompt tokens, each calling an API that returns 1, 3 or 5
    tokens; `neighbours` requests of other lengths arrive first and share the budget."""
    own = [RequestSpec(f"r{i}", 9 + 8 * i, (Segment(3, "qa", 0.02, 1 + 2 * i), Segment(4)), arrival_time=0.0)
           for i in range(3)]
    others = [RequestSpec(f"n{i}", 3 + 2 * i, (Segment(2, "qa", 0.01, 2), Segment(5)), arrival_time=0.0)
              for i in range(neighbours)]
    return others + own


def _recorder(monkeypatch, executor):
    """Per request, position -> the phase its token was last computed in (a step one column wide
    is a decode; fcfs discards a cache at each call, so most are recomputed), and the logits each
    of its tokens was sampled from."""
    phases, logits, current = defaultdict(dict), defaultdict(list), {}
    forward, forward_steps = AugmentedEngine._forward, executor.forward_steps

    def steps(cache, step_list):
        for group, step in zip(current["groups"], step_list):
            phase = "prompt" if step.input_ids.shape[1] > 1 else "decode"
            for (rid, n), positions in zip(group, step.positions.tolist()):
                phases[rid].update((p, phase) for p in positions[:n])
        return forward_steps(cache, step_list)

    def recording(engine, groups, out):
        current["groups"] = groups
        per_group = forward(engine, groups, out)
        for group, rows in zip(groups, per_group):
            logits.update((rid, logits[rid] + [row.clone()]) for (rid, _), row in zip(group, rows[:, 0])
                          if rid in out.sampling)
        return per_group

    monkeypatch.setattr(AugmentedEngine, "_forward", recording)
    monkeypatch.setattr(executor, "forward_steps", steps)
    return phases, logits


def _run(llm, neighbours: int):
    cfg = llm.config
    reqs = tokenize_requests(_specs(neighbours), cfg.vocab_size, set(cfg.eos_token_ids) | {0, 1})
    per_block = BLOCK * cfg.kv_bytes_per_token(2)
    config = AgentsConfig(gpu_kv_bytes=64 * per_block, cpu_swap_bytes=8 * per_block, block_size=BLOCK,
                          max_num_seqs=8, max_num_batched_tokens=BUDGET)
    cost = CostModel(overhead_s=0.02, weights_read_s=0.0, prefill_per_token_s=1e-4, decode_per_seq_s=1e-3,
                     kv_read_per_token_s=1e-6, swap_bytes_per_s=1e9, kv_bytes_per_token=cfg.kv_bytes_per_token(2),
                     gpu_kv_tokens=64 * BLOCK, cpu_swap_tokens=8 * BLOCK, max_model_len=128)
    with pytest.MonkeyPatch.context() as monkeypatch:
        phases, logits = _recorder(monkeypatch, llm.executor)
        res = run_policy_on_engine(llm.executor, reqs, "fcfs", config, cost, clock=StepClock(0.01), check=True)
    return res.tokens, phases, logits, reqs


def test_a_request_is_computed_alike_beside_any_neighbours(llm):
    tokens, phases, logits, reqs = _run(llm, 0)
    tokens_beside, phases_beside, logits_beside, _ = _run(llm, 3)
    prompts = {r.spec.request_id: len(r.prompt_ids) for r in reqs}
    for rid in tokens:
        prompt = prompts[rid]
        assert phases[rid] == phases_beside[rid], rid
        assert all(phases[rid][p] == "prompt" for p in range(prompt)), rid  # a 1-token chunk of it too
        assert tokens_beside[rid] == tokens[rid], rid
        assert all(torch.equal(a, b) for a, b in zip(logits_beside[rid], logits[rid], strict=True)), rid
    # both equal each request generated alone, each pending chunk fed at once
    assert tokens == uninterrupted_tokens(llm.executor, reqs)
