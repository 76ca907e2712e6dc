"""The planner prices a MoE decode step's reads as the engine runs them: its expert cache's hits,
replayed over routing traced on the user's prompts (`placement.expert_hits`), and a disk that
holds routed experts only where the placement leaves nothing else there."""

import dataclasses

import pytest

import placement
from tests.described import described
from placement.choice import Choice
from placement.expert_hits import batched_steps, expert_hit_rate, held_out_kinds
from placement.layer_sizes import layer_sizes
from placement.layer_time import unread_input_rows
from placement.routing import RoutingProfile

# a Qwen3-MoE shape: 4 layers of 16 experts of 3 x 512 x 256 bf16 (768 KiB each), top-2
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2, head_dim=64, intermediate_size=1024, moe_intermediate_size=256,
                 num_experts=16, num_experts_per_tok=2, vocab_size=4096, torch_dtype="bfloat16")
ALL = {j: set(range(16)) for j in range(4)}


def _profile(traces) -> RoutingProfile:
    return RoutingProfile(16, 2, traces=[[{str(j): experts for j, experts in step.items()} for step in steps]
                                         for steps in traces])


def test_a_sequence_that_keeps_its_experts_hits_once_they_fit():
    """Every step routes to the same two experts a layer: with room for the four layers' eight
    (and nothing to stage), every decode read hits; with no room, none."""
    steps = [{j: [1, 2] for j in range(4)}] * 6
    profile = _profile([steps])
    assert expert_hit_rate(profile, 1, 8, ALL, 4) == 1.0
    assert expert_hit_rate(profile, 1, 0, ALL, 4) == 0.0
    assert expert_hit_rate(profile, 1, 8, {j: set() for j in range(4)}, 4) == 0.0  # nothing of the cached kind


def test_the_layer_just_run_gives_way_first():
    """Room for one layer's pair beyond a layer's staging (4 of the sweep's 8): the engine's rule
    drops the layer just run, so some layer's pair survives each sweep and hits, where dropping
    the least recent would drop the next layer's every time and never hit (here 10 of 28 decode
    reads hit); room for all eight: every decode read hits."""
    steps = [{j: [4 * j, 4 * j + 1] for j in range(4)}] * 8
    assert expert_hit_rate(_profile([steps]), 1, 4, ALL, 4) == pytest.approx(10 / 28)
    assert expert_hit_rate(_profile([steps]), 1, 8, ALL, 4) == 1.0


def test_a_batch_reads_the_union_of_its_sequences_experts():
    a = [{0: [1]}, {0: [2]}]
    b = [{0: [3]}, {0: [2]}, {0: [5]}]
    groups = batched_steps(_profile([a, b]), 2)
    assert groups == [[{0: {1, 3}}, {0: {2}}, {0: {5}}]]
    assert batched_steps(_profile([a]), 3) == [[{0: {1}}, {0: {2}}]]  # cycled to fill the batch


def test_a_batch_beyond_the_traced_sequences_shares_the_room_instead_of_repeating_them():
    """Two traced sequences, each keeping its own pair of experts: a batch of 2 with room for both
    pairs hits on every decode read; a batch of 4 (twice the traces) gets each traced sequence half
    the room per sequence, as four distinct sequences would, not the repeated pairs' free hits."""
    a = [{0: [1, 2]}] * 5
    b = [{0: [3, 4]}] * 5
    profile = _profile([a, b])
    assert expert_hit_rate(profile, 2, 4, ALL, 4) == 1.0
    assert expert_hit_rate(profile, 4, 4, ALL, 4) == expert_hit_rate(profile, 2, 2, ALL, 4) < 1.0


def test_the_output_heads_rows_between_steps_take_the_room_they_need():
    """Room for every layer's pair while the layers run, for two pairs between steps (the head's
    staged rows take the rest): the last layers' pairs give way, the first two layers' hit."""
    steps = [{j: [4 * j, 4 * j + 1] for j in range(4)}] * 8
    assert expert_hit_rate(_profile([steps]), 1, 8, ALL, 4, between_steps=8) == 1.0
    assert expert_hit_rate(_profile([steps]), 1, 8, ALL, 4, between_steps=4) == pytest.approx(0.5)


def test_a_sequence_meets_the_experts_other_sequences_placed():
    """Two traced sequences, each keeping its own pair of layer 0's experts, 12 of 16 experts on the
    slow tier: by their own counts both pairs sit on the fast tier and no slow read is priced; the
    engine runs prompts the profile did not trace, so each is replayed with the experts placed by
    the other's counts: its pair is on the slow tier, read once, then cached."""
    a, b = [{0: [14, 15]}] * 6, [{0: [12, 13]}] * 6
    counts = [0] * 12 + [6] * 4
    profile = RoutingProfile(16, 2, tokens=12, counts={"0": counts}, traces=_profile([a, b]).traces)
    kinds = held_out_kinds(profile, [0], lambda _: 12)
    assert kinds([0]) == {0: set(range(2, 16)) - {12, 13}} and kinds([1]) == {0: set(range(2, 14))}
    assert kinds([0, 1]) == {0: set(range(12))}  # no other trace: the profile's counts
    assert expert_hit_rate(profile, 1, 2, kinds, 4) == 1.0
    # a batch of both is replayed a trace at a time with half the room each: their pairs placed by the other's counts
    assert expert_hit_rate(profile, 2, 4, kinds, 4) == expert_hit_rate(profile, 1, 2, kinds, 4)
    assert expert_hit_rate(profile, 2, 2, kinds, 4) == expert_hit_rate(profile, 1, 1, kinds, 4) < 1.0
    assert expert_hit_rate(profile, 1, 2, kinds([0, 1]), 4) == 0.0


def _model(traces=None):
    spec = described(QWEN3_MOE)[1]
    return dataclasses.replace(spec, routing=_profile(traces) if traces else None)


def _disk_bytes_per_step(model, disk_share: float, batch: int = 1) -> float:
    hw = dataclasses.replace(placement.hardware_preset("rtx4090"), gpu_mem_bytes=1 << 20)  # no room to cache
    policy = placement.Policy(gpu_batch_size=batch, num_gpu_batches=1, cache=placement.TierSplit(gpu=1, cpu=0, disk=0),
                              weights=placement.TierSplit.clipped(0.0, 1 - disk_share, disk_share),
                              activations=placement.TierSplit(gpu=1, cpu=0, disk=0))
    plan = placement.predict(policy, model, hw, placement.WorkloadSpec(prompt_len=16, gen_len=8))
    return plan.decode_layer_s["dtoc"] * hw.disk_read_bytes_per_s


def test_a_disk_of_experts_only_is_read_as_routed():
    """Half the weights on disk: all of it experts (the dense parts and the head fit the cpu
    tier first), a decode step reads the routed share of them (2 of 16); with every weight on
    disk the dense parts and the head are read whole too."""
    model = _model()
    layer = layer_sizes(Choice(gpu_batch_size=1, num_gpu_batches=1), model,
                         placement.WorkloadSpec(prompt_len=16, gen_len=8))
    assert 0.5 * layer.weight_stored < layer.experts_stored
    assert _disk_bytes_per_step(model, 0.5) == pytest.approx(0.5 * layer.weight_stored * 2 / 16, rel=1e-9)
    everything = _disk_bytes_per_step(model, 1.0)
    assert everything == pytest.approx(layer.weight_stored - layer.experts_stored * 14 / 16
                                       - unread_input_rows(model, 1), rel=1e-9)


def test_traced_routing_that_repeats_is_priced_with_the_cache_hits():
    """The same disk share, the cache given room for every expert: a sequence that routes to the
    same experts step after step reads nearly nothing off disk once they are cached; without
    traces every routed read is priced."""
    steps = [{j: [3, 9] for j in range(4)}] * 8
    traced, untraced = _model([steps]), _model()
    hw = placement.hardware_preset("rtx4090")  # 24 GB: room for every expert
    policy = placement.Policy(gpu_batch_size=1, num_gpu_batches=1, cache=placement.TierSplit(gpu=1, cpu=0, disk=0),
                              weights=placement.TierSplit.clipped(0.0, 0.5, 0.5),
                              activations=placement.TierSplit(gpu=1, cpu=0, disk=0))
    workload = placement.WorkloadSpec(prompt_len=16, gen_len=8)
    with_hits = placement.predict(policy, traced, hw, workload)
    without = placement.predict(policy, untraced, hw, workload)
    assert with_hits.decode_layer_s["dtoc"] == pytest.approx(0.0, abs=1e-12)
    assert without.decode_layer_s["dtoc"] > 0
    plan = placement.evaluate(policy, traced, hw, workload)
    assert plan.decode_s == pytest.approx(with_hits.decode_s, rel=1e-9)  # a plan prices it as predict does


def test_each_routed_expert_multiplies_at_the_rate_of_its_own_tokens():
    """A decode call of 8 rows sends each of its ~10 distinct experts 1-2 tokens: on a machine whose
    GEMMs run 4x slower at 1-2 rows than at 8, the experts' FLOPs cost 4x, the rest of the layer
    does not (a flat table: no difference)."""
    model = _model()
    policy = placement.Policy(gpu_batch_size=8, num_gpu_batches=1, cache=placement.TierSplit(gpu=1, cpu=0, disk=0),
                              weights=placement.TierSplit(gpu=1, cpu=0, disk=0),
                              activations=placement.TierSplit(gpu=1, cpu=0, disk=0))
    workload = placement.WorkloadSpec(prompt_len=16, gen_len=8)
    base = placement.hardware_preset("rtx4090")

    def comp(slow_rows: float) -> float:
        table = {"bf16": {"1": slow_rows, "2": slow_rows, "8": 4e10, "64": 4e10}}
        hw = dataclasses.replace(base, gpu_gemm_flops_by_rows=table)
        return placement.predict(policy, model, hw, workload).decode_layer_s["comp"]

    assert 1 < placement.expert_compute.tokens_per_expert(model, 8) < 2
    flops = 8 * 2 * placement.expert_compute.expert_flops_per_token(model)  # 8 tokens, top-2
    assert comp(1e10) - comp(4e10) == pytest.approx(flops * (1 / 1e10 - 1 / 4e10), rel=1e-9)
