"""Per-layer latent pools inside `placement.solve`: the miss envelope is the per-layer LP's
optimum, the plan's pools average its cache fraction and beat one fraction for every layer."""

import dataclasses

import numpy as np
import pytest
from scipy.optimize import linprog

import placement
from placement.latent_pools import LatentMissCurves, MissEnvelope, lower_hull
from tests.described import described
from flexlamps.models.presets import MODEL_CONFIGS

FRACTIONS = [0.05, 0.1, 0.2, 0.4, 0.7, 1.0]


def _curves(num_layers: int, seed: int = 0, source: str = "test") -> LatentMissCurves:
    """Convex decreasing curves, hot layers (few misses) to cold ones."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_layers):
        start, power = rng.uniform(0.02, 0.6), rng.uniform(1.0, 4.0)
        rows.append([float(start * ((1 - x) / (1 - FRACTIONS[0])) ** power) for x in FRACTIONS])
    return LatentMissCurves(source=source, pool_fractions=FRACTIONS, miss_fractions=rows)


def _per_layer_lp(envelope: MissEnvelope, c_gpu: float) -> float:
    """Mean misses with each layer's pool a variable: min mean(m_l), m_l >= every hull piece of
    layer l's curve at p_l, mean(p_l) = c_gpu, p_l in [floor, 1]."""
    num = envelope.num_layers
    rows, rhs = [], []
    for layer, (xs, ys) in enumerate(envelope.layer_points):
        hull = lower_hull(xs, ys)
        for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
            slope = (y2 - y1) / (x2 - x1)
            row = np.zeros(2 * num)
            row[layer], row[num + layer] = slope, -1.0
            rows.append(row)
            rhs.append(-(y1 - slope * x1))
    equality = np.concatenate([np.ones(num) / num, np.zeros(num)])[None]
    res = linprog(np.concatenate([np.zeros(num), np.ones(num) / num]), A_ub=np.array(rows), b_ub=rhs,
                  A_eq=equality, b_eq=[c_gpu], bounds=[(envelope.floor, 1.0)] * num + [(0, None)] * num,
                  method="highs")
    return res.fun


@pytest.mark.parametrize("seed", range(4))
def test_envelope_is_the_per_layer_lp_optimum(seed):
    envelope = MissEnvelope(_curves(7, seed), 7, floor=0.08)
    for c_gpu in (0.08, 0.13, 0.3, 0.55, 0.9, 1.0):
        pools = envelope.pools(c_gpu)
        assert np.mean(pools) == pytest.approx(c_gpu)
        assert all(envelope.floor - 1e-12 <= p <= 1 + 1e-12 for p in pools)
        # the LP over the hulls is a lower bound on any split; the envelope attains it
        assert envelope.value(c_gpu) == pytest.approx(_per_layer_lp(envelope, c_gpu), abs=1e-9)
        assert envelope.misses_at(tuple(pools)) == pytest.approx(envelope.value(c_gpu), abs=1e-9)
        assert envelope.misses_at(tuple(pools)) <= envelope.misses_at((c_gpu,) * 7) + 1e-9


def _config(num_layers: int = 6) -> dict:
    return dict(MODEL_CONFIGS["deepseek-v3.2-attn"], num_hidden_layers=num_layers, hidden_size=1024,
                num_attention_heads=16, q_lora_rank=256, intermediate_size=2048, vocab_size=4096)


def _model(num_layers: int = 6) -> placement.ModelSpec:
    return described(_config(num_layers), name="v32-small")[1]


def _hardware(curves=None, gpu_mem_bytes: int = 2 << 30):
    hw = placement.hardware_preset("a100-80gb").with_memory(gpu_mem_bytes=gpu_mem_bytes, cpu_mem_bytes=256 << 30)
    return dataclasses.replace(hw, latent_miss_curves=curves)


def test_solve_sizes_each_layers_pool_and_beats_one_fraction():
    """3 GiB: a 16384-token prompt's call holds a 268 MB attention mask (charged by the engine and,
    since one memory model, by the planner), so 2 GiB leaves no room for a block the cache outgrows."""
    from flexlamps.planning.dry_run import dry_run
    from flexlamps.planning.target import BlockLengths, PlanTarget

    model, workload = _model(), placement.WorkloadSpec(prompt_len=16384, gen_len=512)
    hardware = _hardware(_curves(6, seed=3, source="measured"), gpu_mem_bytes=3 << 30)
    plan = placement.solve(model, hardware, workload)
    pol = plan.policy
    assert 0 < pol.cache.gpu < 1 and pol.cache.disk == 0
    assert len(pol.latent_pools) == 6 and np.mean(pol.latent_pools) == pytest.approx(pol.cache.gpu)
    assert max(pol.latent_pools) > min(pol.latent_pools)  # the layers' pools differ
    assert plan.peak_bytes["gpu"] <= plan.budget_bytes["gpu"] * (1 + 1e-6)
    # the engine charges what the plan says, pools and all, within #47's 2% (measured: 0.95% more
    # on the gpu tier, the cpu tier's equal); without the mask the plan was 9% short
    target = PlanTarget(config=described(_config())[0], model=model)
    run = dry_run(target, pol, BlockLengths(prompt_len=workload.prompt_len, gen_len=workload.gen_len),
                  gpu_mem=hardware.gpu_mem_bytes, cpu_mem=hardware.cpu_mem_bytes)
    for tier in ("gpu", "cpu"):
        assert run.peak_bytes[tier] == pytest.approx(plan.peak_bytes[tier], rel=0.02), tier
    assert plan.peak_bytes["cpu"] >= model.num_layers * 16896 * pol.block_size * model.cache_bytes_per_token_per_layer()
    # evaluate charges the plan's own pools; one fraction for every layer copies more
    again = placement.evaluate(pol, model, hardware, workload)
    assert again.tokens_per_s == pytest.approx(plan.tokens_per_s, rel=1e-6)
    uniform = placement.evaluate(dataclasses.replace(pol, latent_pools=(pol.cache.gpu,) * 6), model, hardware,
                                 workload)
    assert plan.tokens_per_s > uniform.tokens_per_s * 1.001


def test_measured_curves_replace_ess_and_a_bigger_pool_budget_never_hurts():
    model, workload = _model(), placement.WorkloadSpec(prompt_len=16384, gen_len=512)
    hot = LatentMissCurves(source="hot", pool_fractions=FRACTIONS, miss_fractions=[[0.0] * 6] * 6)
    cold = LatentMissCurves(source="cold", pool_fractions=FRACTIONS,
                            miss_fractions=[[0.9, 0.8, 0.6, 0.3, 0.1, 0.0]] * 6)
    fast = placement.solve(model, _hardware(hot), workload)
    slow = placement.solve(model, _hardware(cold), workload)
    assert fast.tokens_per_s > slow.tokens_per_s
    assert fast.policy.cache.gpu <= slow.policy.cache.gpu + 1e-9  # no misses: the smallest pools do
    bigger = dataclasses.replace(_hardware(cold), gpu_mem_bytes=4 << 30)
    assert placement.solve(model, bigger, workload).tokens_per_s >= slow.tokens_per_s * (1 - 1e-9)


def test_profile_json_round_trips_the_curves():
    hw = _hardware(_curves(3, seed=1, source="measured on x"))
    again = placement.HardwareSpec.from_json(hw.to_json())
    assert again.latent_miss_curves == hw.latent_miss_curves
    with pytest.raises(ValueError, match="pool_fractions"):
        LatentMissCurves(source="bad", pool_fractions=[0.5, 0.2], miss_fractions=[[0.1, 0.0]])
