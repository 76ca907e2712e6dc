"""A MoE layer's per-step costs on the CPU: routed tokens grouped per expert in one sort, a
prompt's 16-bit expert products in fp32 where torch's 16-bit GEMM is slow, and the executor's
per-step peak figures computed once per layer (bench: `scripts/bench_moe.py --small`)."""

import pytest
import torch

import placement
from flexlamps.engine.executors.charges import PlacementCharges
from flexlamps.engine.executors.weight_store import WeightStore
from flexlamps.models.blocks import moe
from flexlamps.models.blocks.linear import linear
from flexlamps.models.blocks.weight_kind import KINDS, Phase, WeightKind
from flexlamps.models.moe_config import MoEConfig

from tests.described import described
from tests.unit.test_expert_groups import SMALL_MOE


def test_tokens_are_grouped_per_expert_in_token_order_as_a_scan_per_expert_finds_them():
    indices = torch.randint(0, 16, (40, 1)).expand(-1, 4) + torch.arange(4) * 3 % 16  # distinct per row
    indices = indices % 16
    told = {}
    groups = moe.routed_picks(type("W", (), {"routed_to": lambda self, t: told.update(t)})(), indices)
    assert [e for e, _ in groups] == sorted(set(indices.flatten().tolist()))
    for expert, pick in groups:
        tokens, slots = torch.where(indices == expert)
        # routed_sum's token rows are pick // k
        assert torch.equal(pick // 4, tokens) and torch.equal(pick, tokens * 4 + slots)
        assert told[expert] == len(tokens)


@pytest.mark.parametrize("phase", [Phase.PROMPT, Phase.DECODE])
def test_a_rows_expert_product_is_the_same_bits_alone_or_among_others(phase):
    torch.manual_seed(0)
    w = torch.randn(96, 768).bfloat16()
    x = torch.randn(9, 768).bfloat16()
    together = moe.expert_linear(x, w, phase)
    for i in (0, 4, 8):
        assert torch.equal(moe.expert_linear(x[i:i + 1], w, phase), together[i:i + 1])
        assert torch.equal(moe.expert_linear(x[i:i + 3], w, phase), together[i:i + 3])
    if phase is Phase.DECODE:  # decode keeps the dense kind's product
        assert torch.equal(together, linear(x, w))
    else:  # a prompt's: fp32 products summed in fp32, rounded once
        exact = (x.double() @ w.double().T)
        assert (together.double() - exact).abs().max() <= (exact.abs().max() * 2 ** -7)


def test_the_sweeps_peak_scans_the_weights_once_per_layer(monkeypatch):
    on_cpu = placement.TierSplit(gpu=0.0, cpu=1.0, disk=0.0)
    policy = placement.Policy(gpu_batch_size=4, num_gpu_batches=1, weights=on_cpu, cache=on_cpu,
                              activations=on_cpu)
    config, spec = described(SMALL_MOE)
    charges, fresh = (PlacementCharges.on_paper(config, policy, torch.bfloat16, model_spec=spec, device_type="cpu")
                      for _ in range(2))
    charges.sweep_gpu_peak([(4, 1, 20)])
    expected = fresh.sweep_gpu_peak([(4, 1, 21)])
    scans = []
    monkeypatch.setattr(WeightStore, "form", lambda self, spec: scans.append(spec) or "dense")
    assert charges.sweep_gpu_peak([(4, 1, 21)]) == expected and charges.call_copies(3, 1) == 0
    assert scans == []  # a decode step asks again for every layer: nothing scanned again


@pytest.mark.parametrize("phase", [Phase.PROMPT, Phase.DECODE])
def test_a_coded_expert_is_multiplied_in_the_tokens_phase_not_the_one_its_2d_rows_suggest(phase, monkeypatch):
    """An expert's gathered tokens are 2-d (one row a token): a prompt's must still reach the
    weight's kind as PROMPT (4-bit codes have a prompt kernel), for plain and gpt-oss experts."""
    seen = []

    class Coded:
        shape = (8, 16)

    class Recording(WeightKind):
        def product(self, w, x, phase_):
            seen.append(phase_)
            return torch.zeros(*x.shape[:-1], w.shape[0], dtype=x.dtype)

    monkeypatch.setitem(KINDS, Coded, Recording())
    x = torch.randn(5, 16)
    moe.expert_linear(x, Coded(), phase)
    cfg = MoEConfig(num_experts=1, num_experts_per_token=1, num_shared_experts=0, moe_intermediate_size=8,
                    moe_layers=(True,), router="topk_softmax", experts="clamped_swiglu")
    w = {f"experts.0.{p}": Coded() for p in ("gate_proj", "up_proj", "down_proj")}
    w.update({f"experts.0.{p}": None for p in ("gate_bias", "up_bias", "down_bias")})
    moe._expert(x, w, 0, cfg, phase)
    assert seen == [phase] * 4


class _ReadyInOrder(dict):
    """Experts' weights whose `ready_first` hands the experts out in a given order (as weights
    read on demand do: those here first)."""

    def __init__(self, weights: dict, order: list[int]):
        super().__init__(weights)
        self.order = order

    def ready_first(self, experts):
        assert sorted(experts) == sorted(self.order)
        yield from self.order


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_decode_step_sums_its_experts_to_the_same_bits_in_any_order_it_computes_them(native, dtype, monkeypatch):
    if not native:  # torch's ops: the expert, then the weighted index_add_
        monkeypatch.setattr(moe, "decode_expert_kernel", lambda: None)
    cfg = MoEConfig(num_experts=8, num_experts_per_token=3, num_shared_experts=0, moe_intermediate_size=48,
                    moe_layers=(True,))
    gen = torch.Generator().manual_seed(3)
    weights = {f"experts.{e}.{m}": (torch.randn(shape, generator=gen) * 0.3).to(dtype)
               for e in range(8) for m, shape in (("gate_proj", (48, 64)), ("up_proj", (48, 64)), ("down_proj", (64, 48)))}
    flat = torch.randn(5, 64, generator=gen).to(dtype)
    routing = torch.randn(5, 8, generator=gen).softmax(-1)
    pick_weights, indices = routing.topk(3, dim=-1)
    in_order = moe.routed_sum(weights, flat, pick_weights, indices, cfg, Phase.DECODE)
    experts = sorted(set(indices.flatten().tolist()))
    for order in (experts[::-1], experts[1::2] + experts[0::2]):
        got = moe.routed_sum(_ReadyInOrder(weights, order), flat, pick_weights, indices, cfg, Phase.DECODE)
        assert torch.equal(got.view(torch.int16), in_order.view(torch.int16))
