"""Hypothesis properties of `placement.solve`: monotone in memory, within budgets, clear failures."""

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from placement import EngineCapabilities, InfeasiblePlanError, WorkloadSpec, hardware_preset, model_preset, predict, solve
from placement.plan import ROW_LABELS
from placement.search import budgets_for

GiB = 1 << 30
MODELS = ("smollm2-135m", "opt-6.7b", "llama-2-7b", "llama-3-8b")
PROPERTY_SETTINGS = settings(max_examples=12, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
# the two solve-heavy properties: a few draws in the quick suite (~3 s a draw), the many marked slow
QUICK_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=4)
MANY_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=100)


@st.composite
def cases(draw):
    model = model_preset(draw(st.sampled_from(MODELS)))
    hw = hardware_preset(draw(st.sampled_from(("t4-flexgen", "rtx3090", "a100-40gb"))))
    hw = hw.with_memory(gpu_mem_bytes=int(draw(st.floats(0.25, 24)) * GiB),
                        cpu_mem_bytes=int(draw(st.floats(0.5, 64)) * GiB),
                        disk_bytes=int(draw(st.floats(1, 200)) * GiB))
    workload = WorkloadSpec(prompt_len=draw(st.integers(8, 1024)),
                            gen_len=draw(st.integers(1, 128)))
    knobs = draw(st.booleans())  # let the search turn compression / CPU attention on
    return model, hw, workload, dict(allow_weight_compression=knobs,
                                     allow_cache_compression=knobs, allow_cpu_attention=knobs,
                                     max_block_size=256)


def _solve_or_none(model, hw, workload, options):
    try:
        return solve(model, hw, workload, **options)
    except InfeasiblePlanError:
        return None


@QUICK_SETTINGS
@given(cases(), st.floats(1.0, 4.0), st.sampled_from(("gpu_mem_bytes", "cpu_mem_bytes")))
def test_more_memory_never_lowers_throughput(case, factor, tier):
    _check_more_memory_never_lowers_throughput(case, factor, tier)


@pytest.mark.slow
@MANY_SETTINGS
@given(cases(), st.floats(1.0, 4.0), st.sampled_from(("gpu_mem_bytes", "cpu_mem_bytes")))
def test_more_memory_never_lowers_throughput_100_cases(case, factor, tier):
    _check_more_memory_never_lowers_throughput(case, factor, tier)


def _check_more_memory_never_lowers_throughput(case, factor, tier):
    model, hw, workload, options = case
    before = _solve_or_none(model, hw, workload, options)
    assume(before is not None)
    bigger = hw.with_memory(**{tier: int(getattr(hw, tier) * factor)})
    after = solve(model, bigger, workload, **options)  # must not become infeasible
    # plans within the LP's noise (search._TIE, 1e-5) are a tie, won by the one that computes less
    assert after.tokens_per_s >= before.tokens_per_s * (1 - 2e-5)


@QUICK_SETTINGS
@given(cases())
def test_every_plan_fits_every_tier(case):
    _check_every_plan_fits_every_tier(case)


@pytest.mark.slow
@MANY_SETTINGS
@given(cases())
def test_every_plan_fits_every_tier_100_cases(case):
    _check_every_plan_fits_every_tier(case)


def _check_every_plan_fits_every_tier(case):
    model, hw, workload, options = case
    plan = _solve_or_none(model, hw, workload, options)
    assume(plan is not None)
    budgets = budgets_for(hw, 0.9)
    peaks = predict(plan.policy, model, hw, workload).peak_bytes
    for row, peak in peaks.items():
        assert peak <= budgets[row] * (1 + 1e-6) + 4096, (row, peak, budgets[row])
    for tier in ("gpu", "cpu", "disk"):
        assert plan.peak_bytes[tier] <= plan.budget_bytes[tier] * (1 + 1e-6) + 4096
    for split in (plan.policy.weights, plan.policy.cache, plan.policy.activations):
        assert min(split.as_tuple()) >= 0 and sum(split.as_tuple()) == pytest.approx(1.0)
    assert EngineCapabilities().unsupported(plan.policy) == []


@PROPERTY_SETTINGS
@given(st.sampled_from(MODELS), st.floats(0.01, 0.3), st.booleans())
def test_too_little_memory_raises_with_the_shortfall(name, share, knobs):
    model = model_preset(name)
    weights = model.total_weight_bytes()
    # all three tiers together hold only a share of the (uncompressed) weights
    hw = hardware_preset("rtx3090").with_memory(
        gpu_mem_bytes=int(weights * share / 3), cpu_mem_bytes=int(weights * share / 3),
        disk_bytes=int(weights * share / 3))
    with pytest.raises(InfeasiblePlanError) as failure:
        solve(model, hw, WorkloadSpec(prompt_len=64, gen_len=8), allow_weight_compression=knobs,
              allow_cache_compression=knobs, allow_cpu_attention=knobs)
    error = failure.value
    assert error.constraint in ROW_LABELS.values()
    assert error.shortfall_bytes > 0
    assert error.constraint in str(error) and "more than the" in str(error)
