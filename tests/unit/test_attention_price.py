"""A layer's attention priced at the rate the machine profile measures the engine's attention at (by phase and
dtype), not at the GEMM peak: on a CPU the engine's exact per-query attention runs 5-20 GFLOP/s against a
100-1000 GFLOP/s GEMM, and SmolLM2's prompt sweeps and decode steps ran 1.3-2x their price without it."""

import dataclasses

import pytest
import torch

from placement import HardwareSpec, Policy, TierSplit, WorkloadSpec, hardware_preset, model_preset, predict
from flexlamps.hardware import attention_probe

ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
POLICY = Policy(gpu_batch_size=16, num_gpu_batches=2, weights=ON_GPU, cache=ON_GPU, activations=ON_GPU)
WORKLOAD = WorkloadSpec(prompt_len=64, gen_len=16)
RATE = 8e9  # FLOP/s, what the profile measured the engine's attention at here


def _model():
    return dataclasses.replace(model_preset("llama-2-7b"), dtype="fp32")


def _hardware(rates: dict) -> HardwareSpec:
    return dataclasses.replace(hardware_preset("t4-flexgen"), gpu_attention_flops_per_s=rates)


def test_prompt_attention_is_priced_at_the_measured_rate():
    model, base = _model(), _hardware({})
    measured = _hardware({"prompt": {"fp32": RATE}})
    flops = POLICY.block_size * WORKLOAD.prompt_len * model.attention_flops_per_query(WORKLOAD.prompt_len / 2)
    grew = (predict(POLICY, model, measured, WORKLOAD).prefill_layer_s["comp"]
            - predict(POLICY, model, base, WORKLOAD).prefill_layer_s["comp"])
    assert grew == pytest.approx(flops / RATE - flops / base.gpu_flops("fp32"), rel=1e-9)
    # a rate for another dtype or phase leaves it at the GEMM peak
    other = _hardware({"prompt": {"bf16": RATE}, "decode": {"fp32": RATE}})
    before = predict(POLICY, model, base, WORKLOAD)
    assert predict(POLICY, model, other, WORKLOAD).prefill_layer_s == before.prefill_layer_s


def test_decode_attention_is_priced_at_the_measured_rate_or_the_cache_read_whichever_is_slower():
    model, base = _model(), _hardware({})
    context = WORKLOAD.prompt_len + WORKLOAD.gen_len / 2
    flops = POLICY.block_size * model.attention_flops_per_query(context)
    slow = predict(POLICY, model, _hardware({"decode": {"fp32": RATE}}), WORKLOAD).decode_layer_s["comp"]
    assert slow - predict(POLICY, model, base, WORKLOAD).decode_layer_s["comp"] > 0.9 * flops / RATE
    fast = _hardware({"decode": {"fp32": 1e18}})  # faster than the cache read: the read's time stays
    assert predict(POLICY, model, fast, WORKLOAD).decode_layer_s == \
        predict(POLICY, model, base, WORKLOAD).decode_layer_s


def test_the_attention_rates_are_checked_and_travel_in_json():
    hw = _hardware({"prompt": {"fp32": RATE, "bf16": 2 * RATE}, "decode": {"fp32": RATE / 2}})
    assert HardwareSpec.from_json(hw.to_json()) == hw
    with pytest.raises(ValueError, match="gpu_attention_flops_per_s"):
        _hardware({"prefill": {"fp32": RATE}})
    with pytest.raises(ValueError, match="gpu_attention_flops_per_s"):
        _hardware({"prompt": {"int8": RATE}})
    with pytest.raises(ValueError, match="positive"):
        _hardware({"decode": {"fp32": 0.0}})


@pytest.mark.parametrize("phase", ["prompt", "decode"])
def test_the_probe_runs_the_engines_attention_through_its_cache(phase, monkeypatch):
    """Each step's attend writes its keys into a gpu-tier `TieredKVCache` layer and calls the engine's
    attention, at two sizes; their FLOPs are counted as the planner counts them."""
    calls = []
    real = attention_probe.TieredKVCache.attend

    def attend(self, layer, slots, positions, q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return real(self, layer, slots, positions, q, *args, **kwargs)

    monkeypatch.setattr(attention_probe.TieredKVCache, "attend", attend)
    p = attention_probe
    sizes = p.attention_steps(torch.device("cpu"), ("fp32",))[phase]["fp32"]
    for rows, (run, flops) in zip(p.PROMPT_ROWS if phase == "prompt" else p.DECODE_ROWS, sizes):
        calls.clear()
        tokens = p.PROMPT_TOKENS if phase == "prompt" else 1
        assert run().shape == (rows, tokens, p.HEADS * p.HEAD_DIM)
        assert calls == [(rows, tokens, p.HEADS, p.HEAD_DIM)]
        seen = tokens / 2 if phase == "prompt" else p.DECODE_KEYS + 1
        assert flops == rows * tokens * 4 * p.HEADS * p.HEAD_DIM * seen


def test_the_rate_is_the_slope_between_the_two_sizes_and_the_call_cost_its_intercept():
    assert attention_probe.slope_rate((1.0, 3.0), (1e9, 5e9)) == (2e9, 0.5)
    assert attention_probe.slope_rate((2.0, 2.0), (1e9, 4e9)) == (2e9, 0.0)  # noise: the larger size's own rate
    assert attention_probe.slope_rate((1.0, 2.0), (4e9, 5e9)) == (1e9, 0.0)  # never a negative fixed cost


def test_each_attention_call_pays_its_fixed_cost():
    """A prompt sweep's micro-batches and a decode step's calls each pay `gpu_attention_call_s` (in their
    dtype: fp32's exact path costs 3x bf16's native kernel a call on this project's Xeon)."""
    model = _model()
    rates = {"prompt": {"fp32": RATE}, "decode": {"fp32": RATE}}
    base = _hardware(rates)
    fixed = dataclasses.replace(base, gpu_attention_call_s={"prompt": {"fp32": 1e-3}, "decode": {"fp32": 2e-3}})
    one_by_one = dataclasses.replace(POLICY, merge_decode=False)  # 2 decode calls a layer
    for policy, decode_calls in ((POLICY, 1), (one_by_one, 2)):
        a, b = predict(policy, model, fixed, WORKLOAD), predict(policy, model, base, WORKLOAD)
        assert a.prefill_layer_s["comp"] - b.prefill_layer_s["comp"] == pytest.approx(2 * 1e-3)  # 2 micro-batches
        assert a.decode_layer_s["comp"] - b.decode_layer_s["comp"] == pytest.approx(decode_calls * 2e-3)
    other_dtype = dataclasses.replace(base, gpu_attention_call_s={"prompt": {"bf16": 1.0}})
    assert predict(POLICY, model, other_dtype, WORKLOAD).prefill_layer_s == \
        predict(POLICY, model, base, WORKLOAD).prefill_layer_s
    with pytest.raises(ValueError, match=">= 0"):
        dataclasses.replace(base, gpu_attention_call_s={"decode": {"fp32": -1.0}})
