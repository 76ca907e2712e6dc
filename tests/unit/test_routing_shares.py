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
    from flexlamps.models.description import model_spec_from_hf

    moe = model_spec_from_hf(dict(model_type="mixtral", hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
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
    assert disk_read_s(64) - disk_read_s(1) == pytest.approx(experts_s * (read_share[64] - read_share[1]))
    assert experts_s * (1 - read_share[1]) > 0.5 * disk_read_s(1)  # the unpicked experts were most of a step
