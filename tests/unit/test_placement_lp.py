"""The LP against a brute-force 0.1 grid over the fractions, and the search against enumeration."""

import functools
import itertools

import numpy as np
import pytest

import placement
from placement import WorkloadSpec, hardware_preset, model_preset, solve
from placement.choice import Choice
from placement.cost import predict
from placement.terms import build_terms
from placement.lp import solve_fractions
from placement.search import block_grid, budgets_for, cache_in_whole_layers, fraction_highs

MODELS = ("opt-6.7b", "opt-30b", "llama-2-13b", "llama-3-8b", "smollm2-135m",
          "deepseek-v3.2-attn")
HARDWARE = ("t4-flexgen", "rtx4090", "a100-40gb")


@functools.cache
def _triples(step: float = 0.1) -> np.ndarray:
    """Every (gpu, cpu, disk) split on the 0.1 grid."""
    ticks = np.round(np.arange(0, 1 + 1e-9, step), 10)
    return np.array([(a, b, round(1 - a - b, 10)) for a in ticks for b in ticks
                     if a + b <= 1 + 1e-9])


def _on_grid(expr) -> np.ndarray:
    """The affine form at every grid point, shape (weights, cache, activations) splits."""
    t = _triples()
    w, c, h = (t @ expr.coef[3 * g:3 * g + 3] for g in range(3))
    return expr.const + w[:, None, None] + c[None, :, None] + h[None, None, :]


def _grid_best_seconds(terms, budgets) -> float:
    """Fastest block time over every 0.1-grid point that fits (inf when none fits)."""
    fits = np.logical_and.reduce([_on_grid(row) <= budgets[name]
                                  for name, row in terms.memory.items()])
    pre = {k: _on_grid(a) for k, a in terms.prefill.items()}
    dec = {k: _on_grid(a) for k, a in terms.decode.items()}
    pre_s = np.maximum.reduce([pre["ctog"] + pre["dtoc"], pre["gtoc"] + pre["ctod"], pre["comp"]])
    dec_s = dec["ctog"] + np.maximum.reduce([dec["gtoc"], dec["dtoc"], dec["ctod"], dec["comp"], dec["routed"]])
    total = terms.num_layers * (pre_s + terms.num_decode_steps * dec_s)
    return float(total[fits].min()) if fits.any() else float("inf")


def _random_cases(count: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    while count:
        model = model_preset(MODELS[rng.integers(len(MODELS))])
        hw = hardware_preset(HARDWARE[rng.integers(len(HARDWARE))])
        weights = model.total_weight_bytes()
        # memory around the model size so that every tier matters
        hw = hw.with_memory(gpu_mem_bytes=int(weights * rng.uniform(0.05, 0.8)) + (1 << 30),
                            cpu_mem_bytes=int(weights * rng.uniform(0.2, 1.5)) + (2 << 30),
                            disk_bytes=int(weights * rng.uniform(0.5, 3.0)) + (4 << 30))
        workload = WorkloadSpec(prompt_len=int(rng.integers(16, 2048)),
                                gen_len=int(rng.integers(1, 256)))
        choice = Choice(gpu_batch_size=int(rng.choice([1, 4, 16, 64])),
                        num_gpu_batches=int(rng.choice([1, 2, 8])),
                        compress_weight=bool(rng.integers(2)), compress_cache=bool(rng.integers(2)),
                        cpu_attention=bool(rng.integers(2)))
        terms = build_terms(choice, model, hw, workload)
        budgets = budgets_for(hw, 0.9)
        grid_s = _grid_best_seconds(terms, budgets)
        if np.isfinite(grid_s):
            count -= 1
            yield model, hw, workload, choice, terms, budgets, grid_s


def test_lp_beats_the_brute_force_grid():
    for model, hw, workload, choice, terms, budgets, grid_s in _random_cases(20):
        solution = solve_fractions(terms, budgets)
        assert solution is not None, (model.name, choice)
        grid_tok_s = terms.tokens_per_block / grid_s
        lp_tok_s = terms.tokens_per_block / solution.total_s
        assert lp_tok_s >= grid_tok_s * 0.99, (model.name, hw.name, workload, choice)
        # the LP's fractions fit, and the cost model agrees with the LP objective
        x = solution.fractions
        for name, row in terms.memory.items():
            assert row(x) <= budgets[name] * (1 + 1e-6) + 1024
        from placement.cost import total_time
        assert total_time(terms, x) == pytest.approx(solution.total_s, rel=1e-6)


# the quick suite's grid: blocks up to 64 (44 of the 98 (batch size, batches) points); all of them: slow
@pytest.mark.parametrize("max_block", [64, pytest.param(512, marks=pytest.mark.slow)])
def test_search_finds_the_best_enumerated_choice(max_block):
    """Pruning never drops the optimum: compare with solving every grid point, its cache in whole
    layers per tier as the engine places it (and `solve` plans it)."""
    model = model_preset("llama-2-7b")
    hw = hardware_preset("rtx3090").with_memory(gpu_mem_bytes=8 << 30, cpu_mem_bytes=32 << 30)
    workload = WorkloadSpec(prompt_len=256, gen_len=64)
    plan = solve(model, hw, workload, allow_weight_compression=False, max_block_size=max_block)
    budgets = budgets_for(hw, 0.9)
    best = 0.0
    for (gbs, ngb), cache, cpu_attn, merge in itertools.product(block_grid(max_block), (False, True),
                                                                 (False, True), (False, True)):
        terms = build_terms(Choice(gpu_batch_size=gbs, num_gpu_batches=ngb, compress_cache=cache,
                                   cpu_attention=cpu_attn, merge_decode=merge), model, hw, workload)
        for highs in fraction_highs(placement.EngineCapabilities(), model):  # what the engine runs
            solution = solve_fractions(terms, budgets, [(0.0, high) for high in highs])
            if solution is not None:
                solution, _ = cache_in_whole_layers(solution, terms, budgets, highs)
            if solution is not None:
                best = max(best, terms.tokens_per_block / solution.total_s)
    assert plan.tokens_per_s == pytest.approx(best, rel=1e-6)
    assert predict(plan.policy, model, hw, workload).tokens_per_s == pytest.approx(
        plan.tokens_per_s, rel=1e-6)


def test_cache_can_be_kept_off_disk():
    model = placement.model_preset("opt-30b")
    hw = placement.hardware_preset("t4-flexgen")
    wl = placement.WorkloadSpec(prompt_len=512, gen_len=32)
    free = placement.solve(model, hw, wl, max_block_size=512,
                           capabilities=placement.EngineCapabilities.unrestricted())
    pinned = placement.solve(model, hw, wl, max_block_size=512,
                             capabilities=placement.EngineCapabilities(cache_on_disk=False))
    assert pinned.policy.cache.disk == 0
    assert pinned.tokens_per_s <= free.tokens_per_s * (1 + 1e-9)


@pytest.mark.parametrize("model, hardware", [("opt-30b", "t4-flexgen"), ("opt-175b", "t4-flexgen"),
                                             ("llama-3-8b", "rtx4090")])
def test_default_plans_are_what_the_engine_runs(model, hardware):
    """The reproductions of issue 13: activations on disk or split (a KV cache on disk runs)."""
    plan = solve(model_preset(model), hardware_preset(hardware), WorkloadSpec(prompt_len=512, gen_len=32))
    assert placement.EngineCapabilities().unsupported(plan.policy) == []
    assert plan.policy.activations.disk == 0
    assert max(plan.policy.activations.as_tuple()) == 1.0


def test_a_latent_cache_stays_off_disk():
    """The engine keeps an MLA latent cache (and a hybrid's DeltaNet state) in memory; a KV cache
    may go to disk."""
    from placement.affine import C_DISK

    assert all(h[C_DISK] == 0 for h in fraction_highs(placement.EngineCapabilities(), model_preset("deepseek-v3.2")))
    assert all(h[C_DISK] == 1 for h in fraction_highs(placement.EngineCapabilities(), model_preset("opt-30b")))


def test_unrestricted_capabilities_may_split_activations():
    caps = placement.EngineCapabilities.unrestricted()
    assert len(fraction_highs(caps)) == 1 and fraction_highs(caps)[0].min() == 1.0
    assert [list(h[6:]) for h in fraction_highs(placement.EngineCapabilities())] == [[1, 0, 0], [0, 1, 0]]
    args = (model_preset("opt-30b"), hardware_preset("t4-flexgen"), WorkloadSpec(prompt_len=512, gen_len=32))
    wider = solve(*args, capabilities=caps)
    assert wider.tokens_per_s >= solve(*args).tokens_per_s * (1 - 1e-9)  # a superset of placements
    split = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, weights=wider.policy.weights,
                             cache=wider.policy.cache, activations=placement.TierSplit(gpu=0.5, cpu=0.5, disk=0.0))
    assert placement.EngineCapabilities().unsupported(split) == ["activations split across tiers"]
    assert caps.unsupported(split) == []


def test_decode_mode_follows_the_caller_and_the_engine():
    model, hw = model_preset("opt-30b"), hardware_preset("t4-flexgen")
    wl = WorkloadSpec(prompt_len=512, gen_len=32)
    one_by_one = solve(model, hw, wl, allow_merged_decode=False)
    assert not one_by_one.policy.merge_decode or one_by_one.policy.num_gpu_batches == 1
    merged_only = placement.EngineCapabilities(per_micro_batch_decode=False)
    assert solve(model, hw, wl, capabilities=merged_only).policy.merge_decode
    with pytest.raises(ValueError, match="only runs merged decode"):
        solve(model, hw, wl, allow_merged_decode=False, capabilities=merged_only)
    with pytest.raises(ValueError, match="merged, per micro-batch"):
        placement.EngineCapabilities(merged_decode=False, per_micro_batch_decode=False)


def test_compression_the_user_asked_for_is_planned_with():
    """A user who asks for compressed weights (or cache) gets a plan priced with them on, not a
    plan priced without them that the engine then runs compressed."""
    model, hw = model_preset("opt-6.7b"), hardware_preset("t4-flexgen")
    wl = WorkloadSpec(prompt_len=64, gen_len=16)
    free = solve(model, hw, wl, max_block_size=64)
    for weight, cache in ((True, False), (False, True), (True, True)):
        plan = solve(model, hw, wl, max_block_size=64, require_weight_compression=weight,
                     require_cache_compression=cache)
        assert (plan.policy.compress_weight or not weight) and (plan.policy.compress_cache or not cache)
        assert plan.tokens_per_s <= free.tokens_per_s * (1 + 1e-9)  # a subset of the free search
        assert predict(plan.policy, model, hw, wl).tokens_per_s == pytest.approx(plan.tokens_per_s)
    with pytest.raises(ValueError, match="required but not allowed"):
        solve(model, hw, wl, allow_weight_compression=False, require_weight_compression=True)


def test_infeasible_without_a_disk_tier_asks_for_one_and_sizes_are_human():
    """No --offload-dir: the hint names the option, not 'more free space'; a budget of a few KiB
    is shown in KiB (it read '0.0 MiB')."""
    model = placement.model_preset("llama-2-7b")
    hw = placement.hardware_preset("t4-flexgen").with_memory(gpu_mem_bytes=1024, cpu_mem_bytes=2048, disk_bytes=1)
    with pytest.raises(placement.InfeasiblePlanError) as e:
        placement.solve(model, hw, placement.WorkloadSpec(prompt_len=64, gen_len=8))
    assert "give the plan a disk tier (--offload-dir DIR" in str(e.value) and "more free space" not in str(e.value)
    assert placement.format_bytes(1024) == "1.0 KiB" and placement.format_bytes(512) == "512 B"
