"""FP8 checkpoints' matrices kept in FP8 (codes + tile scales) on every tier and upcast per call:
the same logits as dequantizing them at load, in memory and offloaded, at about half the bytes
of bf16, and the dry run charges what the executor charges."""

import pytest
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import keeps_fp8, read_all
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from placement import Policy, TierSplit
from quant.fp8 import Fp8Weight
from quant.fp8_layout import fp8_weight_bytes
from tests.checkpoints import to_fp8_checkpoint
from tests.property.test_plan_engine_agreement import _run_at_once

ON_GPU = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
SPLITS = {"gpu_cpu_disk": TierSplit(gpu=0.3, cpu=0.4, disk=0.3), "disk": TierSplit(gpu=0.0, cpu=0.0, disk=1.0)}
PROMPT_LEN, DECODE_STEPS = 10, 6


@pytest.fixture(scope="module")
def fp8_models(deepseek_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8_models")
    return {kind: to_fp8_checkpoint(deepseek_models[kind], root / kind) and root / kind
            for kind in ("deepseek_v3", "deepseek_v32")}


def _run(ex, vocab: int) -> list[torch.Tensor]:
    """A two-row prefill, then greedy decode steps: the logits of each."""
    ids = torch.randint(2, vocab, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    cache, slots = ex.new_cache(2, PROMPT_LEN + DECODE_STEPS), torch.arange(2)
    out = [ex.forward_steps(cache, [Step(ids, torch.arange(PROMPT_LEN).expand(2, -1), slots)])[0]]
    for pos in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        tokens = out[-1][:, -1].argmax(-1)[:, None]
        out.append(ex.forward_steps(cache, [Step(tokens, torch.full((2, 1), pos), slots)])[0])
    return out


def _layer_bytes(weights: dict) -> int:
    return sum(w.nbytes for name, w in weights.items() if name.startswith("layers."))


@pytest.mark.parametrize("kind", ["deepseek_v3", "deepseek_v32"])
def test_kept_fp8_equals_dequantized_at_load(fp8_models, kind):
    reader = open_checkpoint(fp8_models[kind])
    dense, kept = read_all(reader, torch.float32), read_all(reader, torch.float32, fp8_in_place=True)
    fp8 = [s for s in weight_specs(reader.config) if isinstance(kept[s.name], Fp8Weight)]
    assert fp8 and all(keeps_fp8(s) for s in fp8)
    # V3's MoE router is bf16 in the file, as DeepSeek ships it; V3.2's indexer head weights are
    # FP8 in these test files and stay FP8 (role "router", upcast per call like the rest)
    assert {s.role for s in fp8} == {"linear", "absorbed"} | ({"router"} if kind == "deepseek_v32" else set())
    assert not any(s.name.endswith(".router") for s in fp8)
    # a byte a value and one fp32 scale a 128x128 tile, against 4 bytes a value
    assert sum(kept[s.name].nbytes for s in fp8) == sum(fp8_weight_bytes(*s.shape) for s in fp8)
    plain, in_place = (InMemoryExecutor(reader.config, w, torch.float32) for w in (dense, kept))
    assert in_place.tier_use()["gpu"].used_bytes == sum(w.nbytes for w in kept.values())
    assert _layer_bytes(kept) < 0.3 * _layer_bytes(dense)
    assert all(torch.equal(a, b) for a, b in zip(_run(plain, reader.config.vocab_size),
                                                   _run(in_place, reader.config.vocab_size)))


def test_bf16_kept_fp8_is_about_half_of_bf16(fp8_models):
    reader = open_checkpoint(fp8_models["deepseek_v3"])
    dense, kept = read_all(reader, torch.bfloat16), read_all(reader, torch.bfloat16, fp8_in_place=True)
    assert 0.5 < _layer_bytes(kept) / _layer_bytes(dense) < 0.6  # norms and the router stay bf16
    assert all(torch.equal(a, b) for a, b in zip(
        _run(InMemoryExecutor(reader.config, dense, torch.bfloat16), reader.config.vocab_size),
        _run(InMemoryExecutor(reader.config, kept, torch.bfloat16), reader.config.vocab_size)))


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_offloaded_fp8_equals_in_memory(fp8_models, split, tmp_path):
    reader = open_checkpoint(fp8_models["deepseek_v32"])
    expected = _run(InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32),
                    reader.config.vocab_size)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=SPLITS[split], cache=ON_GPU, activations=ON_GPU)
    for reused in (False, True):  # the second run reads the offload folder the first wrote
        ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                             gpu_mem=64 << 20, cpu_mem=64 << 20, offload_dir=tmp_path / "off",
                             dtype=torch.float32, device=torch.device("cpu"))  # bit identity: the CPU's guarantee
        try:
            assert ex.reused_disk == reused
            on_disk = [s for s in ex.specs if ex.weights.is_fp8(s) and ex.tiers[s.name] == "disk"]
            assert on_disk, "no FP8 matrix went to disk"
            for spec in on_disk:  # the folder holds the codes, a byte each
                assert ex.store.disk.nbytes(f"{spec.name}::fp8.codes") == spec.numel
            resident = sum(ex.weights.stored[n] for n, tier in ex.tiers.items() if tier != "disk")
            assert sum(ex.tier_use()[t].used_bytes for t in ("gpu", "cpu")) == resident
            got = _run(ex, reader.config.vocab_size)
        finally:
            ex.close()
        assert all(torch.equal(a, b) for a, b in zip(expected, got)), (split, reused)


def test_dry_run_charges_what_the_fp8_executor_charges(fp8_models, tmp_path):
    from flexlamps.engine.batch.generate import generate
    from flexlamps.engine.batch.sampling import SamplingParams
    from flexlamps.planning.dry_run import dry_run
    from flexlamps.planning.target import BlockLengths
    from tests.described import plan_target

    reader = open_checkpoint(fp8_models["deepseek_v3"])
    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=SPLITS["gpu_cpu_disk"], cache=ON_GPU,
                    activations=ON_GPU)
    budget, prompt_len, gen_len = 64 << 20, 16, 4
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=budget, cpu_mem=budget, offload_dir=tmp_path / "off",
                         dtype=torch.float32)
    ex.store.submit = _run_at_once  # prefetches land while a layer computes, as the dry run assumes
    ids = torch.randint(2, reader.config.vocab_size, (4, prompt_len), generator=torch.Generator().manual_seed(0))
    try:
        generate(ex, reader.tokenizer, ids.tolist(), [SamplingParams(max_new_tokens=gen_len, ignore_eos=True)] * 4,
                 max_batch=4, micro_batch=2, reuse_prefix=False)
    finally:
        ex.close()
    run = dry_run(plan_target(reader.config, torch.float32), policy,
                  BlockLengths(prompt_len=prompt_len, gen_len=gen_len), gpu_mem=budget, cpu_mem=budget)
    fp8 = [s for s in ex.specs if ex.weights.is_fp8(s)]
    assert fp8 and ex.charges.call_copies(1, 1) > 0
    assert run.peak_bytes["disk"] == sum(ex.weights.stored[n] for n, t in ex.tiers.items() if t == "disk")
    for tier in ("gpu", "cpu"):
        measured = ex.budgets[tier].peak_bytes
        assert measured <= run.peak_bytes[tier] <= 1.1 * measured, (tier, measured, run.peak_bytes[tier])
