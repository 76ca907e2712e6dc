"""The planner prices a MoE layer's routed experts at the rates the profile measured the engine's expert
product at, per phase (`HardwareSpec.gpu_expert_flops_by_rows`): on an AVX2 CPU a prompt's tokens on bf16
experts multiply in fp32, several times the bf16 GEMM's rate, while decode stays bf16. Priced at the bf16
GEMM's rate (before), a prompt-heavy MoE job's measured/predicted was 9.12."""

import dataclasses

import pytest
import torch

import placement
from flexlamps.hardware import expert_probes
from flexlamps.models.blocks.weight_kind import Phase
from placement.expert_compute import expert_flops_per_token, tokens_per_expert
from tests.described import described

# a Qwen3-MoE shape: 4 layers of 16 experts of 3 x 512 x 256 bf16, top-2
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=64, intermediate_size=1024, moe_intermediate_size=256,
                 num_experts=16, num_experts_per_tok=2, vocab_size=4096, torch_dtype="bfloat16")
ON_GPU = placement.TierSplit(gpu=1, cpu=0, disk=0)
WORKLOAD = placement.WorkloadSpec(prompt_len=32, gen_len=8)
BF16_GEMM = 2e9  # a flat bf16 GEMM table: the layer's other matrices cost the same at any rows
PROMPT_EXPERTS, DECODE_EXPERTS = 8e9, 1e9


def _cpu(expert_tables=None, int4_tables=None) -> placement.HardwareSpec:
    """A CPU-only machine whose bf16 GEMMs run BF16_GEMM at every row count."""
    flat = {"bf16": {"1": BF16_GEMM, "4096": BF16_GEMM}}
    return dataclasses.replace(placement.hardware_preset("rtx4090"), gpu_is_host=True, gpu_layer_overhead_s=0.0,
                               gpu_gemm_flops_by_rows=flat, gpu_gemm_flops_by_rows_resident=flat,
                               gpu_expert_flops_by_rows=expert_tables or {},
                               gpu_int4_expert_flops_by_rows=int4_tables or {})


def _terms(hw, **policy) -> placement.Plan:
    model = described(QWEN3_MOE)[1]
    pol = placement.Policy(gpu_batch_size=16, num_gpu_batches=1, weights=ON_GPU, cache=ON_GPU, activations=ON_GPU,
                           **policy)
    return model, placement.predict(pol, model, hw, WORKLOAD)


def _expert_flops(model, rows: int) -> float:
    return rows * model.num_experts_per_token * expert_flops_per_token(model) * model.moe_layer_share


def test_each_phase_prices_its_experts_at_the_rate_measured_for_it():
    """Prompt experts at the prompt rate, decode experts at the decode rate, the rest of the layer at the
    bf16 GEMM's: the difference from a profile without expert tables is exactly the experts' FLOPs
    over each rate, per phase (before, both phases' experts cost the bf16 GEMM's rate)."""
    tables = {"prompt": {"bf16": {"4": PROMPT_EXPERTS, "256": PROMPT_EXPERTS}},
              "decode": {"bf16": {"1": DECODE_EXPERTS, "64": DECODE_EXPERTS}}}
    model, before = _terms(_cpu())
    _, after = _terms(_cpu(tables))
    prompt_rows, decode_rows = 16 * WORKLOAD.prompt_len, 16
    prompt_delta = _expert_flops(model, prompt_rows) * (1 / PROMPT_EXPERTS - 1 / BF16_GEMM)
    decode_delta = _expert_flops(model, decode_rows) * (1 / DECODE_EXPERTS - 1 / BF16_GEMM)
    assert after.prefill_layer_s["comp"] - before.prefill_layer_s["comp"] == pytest.approx(prompt_delta, rel=1e-9)
    assert after.decode_layer_s["comp"] - before.decode_layer_s["comp"] == pytest.approx(decode_delta, rel=1e-9)
    assert prompt_delta < 0 < decode_delta  # the prompt's experts got cheaper, the decode's dearer


def test_the_rate_is_read_at_the_tokens_one_expert_gets():
    """A call of 16 decode rows gives each of its distinct experts ~2 tokens: the table is read there,
    not at the call's 16 rows."""
    model = described(QWEN3_MOE)[1]
    own = tokens_per_expert(model, 16)
    assert 1 < own < 4
    slow_few = {"decode": {"bf16": {"1": 1e9, "4": 1e9, "16": 8e9}}}
    _, before = _terms(_cpu())
    _, plan = _terms(_cpu(slow_few))
    slower = _expert_flops(model, 16) * (1 / 1e9 - 1 / BF16_GEMM)
    assert plan.decode_layer_s["comp"] - before.decode_layer_s["comp"] == pytest.approx(slower, rel=1e-9)


def test_4bit_experts_take_the_4bit_table():
    """Compressed experts are priced from the 4-bit experts' table, not the plain one."""
    plain = {"prompt": {"bf16": {"4": PROMPT_EXPERTS}}, "decode": {"bf16": {"1": DECODE_EXPERTS}}}
    fast_int4 = {"prompt": {"bf16": {"4": 4 * PROMPT_EXPERTS}}, "decode": {"bf16": {"1": 4 * DECODE_EXPERTS}}}
    model, slow = _terms(_cpu(plain, {"prompt": {"bf16": {"4": PROMPT_EXPERTS}},
                                      "decode": {"bf16": {"1": DECODE_EXPERTS}}}), compress_weight=True)
    _, fast = _terms(_cpu(plain, fast_int4), compress_weight=True)
    saved = _expert_flops(model, 16) * (1 / DECODE_EXPERTS - 1 / (4 * DECODE_EXPERTS))
    assert slow.decode_layer_s["comp"] - fast.decode_layer_s["comp"] == pytest.approx(saved, rel=1e-9)


def test_tables_round_trip_and_bad_ones_are_refused():
    hw = _cpu({"prompt": {"bf16": {"4": 1e9}}}, {"decode": {"bf16": {"1": 2e9}}})
    assert placement.HardwareSpec.from_json(hw.to_json()) == hw
    for bad in ({"prefill": {"bf16": {"4": 1e9}}}, {"prompt": {"int8": {"4": 1e9}}}, {"prompt": {"bf16": {"0": 1e9}}},
                {"prompt": {"bf16": {"4": -1.0}}}):
        with pytest.raises(ValueError, match="gpu_expert_flops_by_rows"):
            _cpu(bad)


def test_the_probe_times_the_engines_expert_loop_in_both_phases(monkeypatch):
    """The profile's rates come from `moe.routed_sum` in each phase (the engine's own loop over a layer's
    experts, so a faster product moves the profile), each expert given each of the phase's row counts."""
    seen = []
    engine_loop = expert_probes.routed_sum

    def spy(w, flat, weights, indices, cfg, phase):
        seen.append((phase, flat.shape[0] // cfg.num_experts))
        assert indices.unique(return_counts=True)[1].tolist() == [flat.shape[0] // cfg.num_experts] * cfg.num_experts
        return engine_loop(w, flat, weights, indices, cfg, phase)

    monkeypatch.setattr(expert_probes, "routed_sum", spy)
    table = expert_probes.measure_expert_products(torch.device("cpu"), 64, 32, 1 << 16, 0.01, ("bf16",))
    for phase in Phase:
        assert sorted(int(r) for r in table[phase.value]["bf16"]) == list(expert_probes.EXPERT_ROWS[phase])
        assert {rows for p, rows in seen if p is phase} == set(expert_probes.EXPERT_ROWS[phase])
    assert all(rate > 0 for tables in table.values() for rates in tables.values() for rate in rates.values())


def test_4bit_experts_priced_whole_are_not_dequantized_again():
    """Where the 4-bit experts' table prices them (their products with whatever the engine does to their
    codes), the layer's dequantization terms count its other matrices only: a slower dequantization
    costs the same with or without routed experts in the layer's bytes (the attention's share alone)."""
    int4 = {"prompt": {"bf16": {"4": PROMPT_EXPERTS}}, "decode": {"bf16": {"1": DECODE_EXPERTS}}}

    def prefill_comp(tables, dequant_bytes_per_s: float) -> float:
        hw = dataclasses.replace(_cpu(int4_tables=tables), gpu_int4_dequant_bytes_per_s=dequant_bytes_per_s,
                                 gpu_dequant_matrix_s=0.0)
        return _terms(hw, compress_weight=True)[1].prefill_layer_s["comp"]

    model = described(QWEN3_MOE)[1]
    dense_share = model.weight_bytes_touched_per_layer(0) / model.weight_bytes_per_layer()
    assert 0 < dense_share < 0.5
    without = prefill_comp({}, 1e9) - prefill_comp({}, 2e9)  # every matrix dequantized (no table)
    whole = prefill_comp(int4, 1e9) - prefill_comp(int4, 2e9)
    assert without > 0
    assert whole == pytest.approx(without * dense_share, rel=1e-9)
