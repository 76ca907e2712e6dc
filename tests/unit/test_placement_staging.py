"""A MoE model's staged weights: the planner's gpu rows charge what the engine's placement stages."""

import pytest
import torch

import placement
from flexlamps.engine.executors.charges import PlacementCharges
from flexlamps.models.blocks.decoder import DecoderForward
from placement.affine import fractions_of
from placement.cost import terms_of_policy
from placement.cost_memory import STACKED_PROJECTIONS, largest_called_matrix
from tests.described import described

MOE = dict(model_type="qwen2_moe", hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
           vocab_size=32000, max_position_embeddings=4096, torch_dtype="bfloat16", num_experts_per_tok=2,
           intermediate_size=1024, moe_intermediate_size=256, shared_expert_intermediate_size=1024, num_experts=32)
ON_GPU = placement.TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
PROMPT, NEW = 64, 8


@pytest.mark.parametrize("rows", [1, 2, 16])
@pytest.mark.parametrize("gpu", [0.0, 0.1, 0.3, 0.6, 0.9, 0.97])
def test_the_gpu_rows_stage_what_the_engines_placement_stages(gpu, rows):
    """Always-read tensors fill a layer's gpu share first and picked experts off the gpu tier are staged
    first: the planner priced both by the gpu fraction (15.6 MiB for the engine's 6.0 at 20% on the
    gpu, 2 decode rows; 2.8 for 6.0 at 90%)."""
    config, model = described(MOE)
    policy = placement.Policy(gpu_batch_size=rows, num_gpu_batches=1, cache=ON_GPU, activations=ON_GPU,
                              weights=placement.TierSplit(gpu=gpu, cpu=1 - gpu, disk=0.0))
    hw = placement.hardware_preset("rtx3090")
    workload = placement.WorkloadSpec(prompt_len=PROMPT, gen_len=NEW)
    terms, x = terms_of_policy(policy, model, hw, workload), fractions_of(policy)
    charges = PlacementCharges.on_paper(config, policy, torch.bfloat16, model_spec=model, device_type="cpu")
    store, layer = charges.store, 3  # a middle layer (the placement's rounding spread evenly)
    expert = max(charges.expert_staged[layer])  # placement is whole experts: the planner's share is continuous
    for row, steps in (("gpu_prefill", [(rows, PROMPT, PROMPT)]), ("gpu_decode", [(rows, 1, PROMPT + NEW - 1)])):
        engine = (store.staged(store.layer_names[layer]) + store.staged(store.layer_names[layer + 1])
                  + charges.staged_experts(layer, steps))
        planned = terms.staging.chord(row)(x) + terms.staging.extra(row, x)
        assert planned == pytest.approx(engine, abs=expert), row


def test_the_planner_stacks_the_projections_the_decoder_stacks():
    """A MoE layer's q/k/v run as one stacked matrix too: its 4-bit call's dense copy is three
    projections wide (the planner counted one; a 2-layer Qwen2-MoE plan then overran the gpu by 8 MB)."""
    assert set(STACKED_PROJECTIONS) == set(DecoderForward.FUSED_INT4.values())
    _, model = described(MOE)
    assert largest_called_matrix(model) == (1024 + 2 * 256) * 1024
