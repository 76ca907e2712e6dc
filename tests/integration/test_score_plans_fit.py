"""`LLM.score` with policy "auto" is planned for the scorer's own rows (packed rows after a
shared root, logits at every position) and keeps to them: a plan the planner calls feasible
scores within its budgets, equal to the in-memory scores (the reproduction: before, the plan
was made for the longest pair alone and the packed rows stopped with BudgetExceededError)."""

from unittest import mock

import placement
from flexlamps import LLM
from flexlamps.planning.dry_run import dry_run
from flexlamps.planning.target import BlockLengths, PlanTarget

CONTEXT = "the quick brown fox jumps over the lazy dog hello world"
CONTEXTS = [CONTEXT] * 4 + ["once upon a time", "hello"]
CONTINUATIONS = [" a", " the lazy dog", " world", " fox jumps", " there", " world hello"]


def test_an_auto_plan_scores_within_its_budgets(tiny_llama, tmp_path):
    hw = placement.hardware_preset("t4-flexgen")
    gpu_mem, cpu_mem = 440_000, 2_100_000  # the reproduction's: the packed rows needed 17228 bytes more
    with mock.patch("flexlamps.hardware.cache.machine_profile", lambda *a, **k: hw):
        llm = LLM(str(tiny_llama), gpu_mem=gpu_mem, cpu_mem=cpu_mem, offload_dir=str(tmp_path), cache_dir=False)
        got = llm.score(CONTEXTS, CONTINUATIONS)
    want = LLM(str(tiny_llama), device="cpu").score(CONTEXTS, CONTINUATIONS)
    assert [o.token_logprobs for o in got] == [o.token_logprobs for o in want]
    w = llm.run_plan.workload
    assert w.scoring and w.logits_per_row == w.prompt_len - w.prefix_len
    target = PlanTarget(config=llm.config, model=llm.model_spec, dtype=llm.dtype)
    lengths = BlockLengths(prompt_len=w.prompt_len, gen_len=w.gen_len, prefix_len=w.prefix_len,
                           logits_per_row=w.logits_per_row)
    run = dry_run(target, llm.policy, lengths, gpu_mem=gpu_mem, cpu_mem=cpu_mem)
    for tier, use in llm.executor.tier_use().items():
        assert use.peak_bytes <= run.peak_bytes[tier], (tier, use.peak_bytes, run.peak_bytes[tier])
    llm.close()
