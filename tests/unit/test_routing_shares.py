"""The routing profile's arithmetic: expected distinct experts a step reads, hottest-first order."""

import pytest

from placement.routing import RoutingProfile


def test_uniform_routing_reads_k_experts_for_one_token_and_all_for_many():
    r = RoutingProfile.uniform(32, 2)
    assert r.expected_distinct(0, 1) == pytest.approx(2.0)
    assert r.expected_distinct(0, 8) == pytest.approx(32 * (1 - (1 - 2 / 32) ** 8))
    assert r.expected_distinct(0, 10_000) == pytest.approx(32.0)
    assert r.expert_order(0) == list(range(32))


def test_skewed_routing_reads_fewer_experts_and_orders_the_hot_ones_first():
    counts = [50, 30, 10, 10]  # 50 tokens, 2 picks each
    r = RoutingProfile(4, 2, 50, {"3": counts})
    assert r.pick_shares(3) == [1.0, 0.6, 0.2, 0.2]
    assert r.expert_order(3) == [0, 1, 2, 3]
    assert r.expected_distinct(3, 4) < RoutingProfile.uniform(4, 2).expected_distinct(3, 4)
    assert r.pick_shares(0) == [0.5] * 4  # an unmeasured layer: uniform
    assert RoutingProfile.from_json(r.to_json()) == r


@pytest.mark.parametrize("args, match", [((4, 5), "5 experts per token of 4"),
                                         ((4, 2, 10, {"0": [1, 2]}), "layer 0 has 2 counts")])
def test_bad_profiles_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        RoutingProfile(*args)


def test_the_planner_reads_only_the_experts_a_decode_step_routes_to():
    """Weights on disk: a decode step at batch 1 reads the layer but its 30 unpicked experts
    (top-2 of 32), a block of 64 tokens about all of them."""
    import placement
    from tests.described import described

    _, moe = described(dict(model_type="mixtral", hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=2, intermediate_size=1024, num_local_experts=32,
                            num_experts_per_tok=2, vocab_size=32000, torch_dtype="bfloat16"))
    hw = placement.hardware_preset("rtx4090")
    disk = placement.TierSplit(gpu=0.0, cpu=0.0, disk=1.0)
    on_gpu = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)

    def disk_read_s(block: int) -> float:
        policy = placement.Policy(gpu_batch_size=block, num_gpu_batches=1, weights=disk, cache=on_gpu,
                                  activations=on_gpu)
        return placement.predict(policy, moe, hw, placement.WorkloadSpec(prompt_len=8, gen_len=4)).decode_layer_s["dtoc"]

    experts_s = moe.routed_expert_bytes_per_layer() / hw.disk_read_bytes_per_s
    read_share = {1: 2 / 32, 64: 1 - (30 / 32) ** 64}  # of the experts, expected under uniform routing
    rows_s = 63 * 1024 * 2 / 4 / hw.disk_read_bytes_per_s  # 63 more input embedding rows, spread over 4 layers
    assert disk_read_s(64) - disk_read_s(1) == pytest.approx(experts_s * (read_share[64] - read_share[1]) + rows_s)
    assert experts_s * (1 - read_share[1]) > 0.5 * disk_read_s(1)  # the unpicked experts were most of a step


def _mixtral_spec(routing=None):
    import dataclasses

    from tests.described import described

    _, spec = described(dict(model_type="mixtral", hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
                             num_key_value_heads=2, intermediate_size=1024, num_local_experts=32,
                             num_experts_per_tok=2, vocab_size=32000, torch_dtype="bfloat16"))
    return dataclasses.replace(spec, routing=routing)


def _skewed(layers=4):
    """Every layer: experts 0-3 take 90% of the picks (1000 tokens, 2 picks each)."""
    row = [450] * 4 + [200 // 28] * 28
    row[4] += 2000 - sum(row)
    return RoutingProfile(32, 2, 1000, {str(j): list(row) for j in range(layers)})


def test_a_measured_profile_prices_the_distinct_experts_a_batch_reads():
    """At batch 8 uniform routing reads 13 of 32 experts a layer; this skewed profile about 6:
    the planner's disk reads per decode step follow the profile, not the uniform formula."""
    import placement

    uniform, skewed = _mixtral_spec(), _mixtral_spec(_skewed())
    assert uniform.expected_experts(8) == pytest.approx(32 * (1 - (30 / 32) ** 8))
    assert skewed.expected_experts(8) == pytest.approx(_skewed().expected_distinct(0, 8))
    assert skewed.expected_experts(8) < 0.6 * uniform.expected_experts(8)
    assert skewed.expected_experts(1) == pytest.approx(2.0)  # one token: k experts, whatever the skew
    disk = placement.TierSplit(gpu=0.0, cpu=0.0, disk=1.0)
    on_gpu = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=8, num_gpu_batches=1, weights=disk, cache=on_gpu, activations=on_gpu)
    hw, workload = placement.hardware_preset("rtx4090"), placement.WorkloadSpec(prompt_len=8, gen_len=4)
    reads = {name: placement.predict(policy, spec, hw, workload).decode_layer_s["dtoc"] * hw.disk_read_bytes_per_s
             for name, spec in (("uniform", uniform), ("skewed", skewed))}
    expert = uniform.routed_expert_bytes_per_layer() / 32
    assert reads["uniform"] - reads["skewed"] == pytest.approx(
        expert * (uniform.expected_experts(8) - skewed.expected_experts(8)), rel=1e-6)


def test_solve_plans_with_the_profile_and_predicts_more_for_a_skewed_one():
    import placement

    hw = placement.hardware_preset("rtx4090").with_memory(gpu_mem_bytes=200 * 2**20, cpu_mem_bytes=300 * 2**20)
    workload = placement.WorkloadSpec(prompt_len=16, gen_len=16)
    plans = {name: placement.solve(spec, hw, workload, max_block_size=8)
             for name, spec in (("uniform", _mixtral_spec()), ("skewed", _mixtral_spec(_skewed())))}
    assert plans["skewed"].tokens_per_s > plans["uniform"].tokens_per_s


def test_a_profile_of_another_model_is_refused():
    with pytest.raises(ValueError, match="routing profile is for 2 of 8 experts"):
        _mixtral_spec(RoutingProfile.uniform(8, 2))
