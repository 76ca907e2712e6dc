"""4-bit weights on the offload engine: kept 4-bit on every tier (the disk files hold the packed
int4 layout), computed as the in-memory engine computes the same `Int4Weight`s (bit for bit,
fp32 and bf16, the fused kernel for few rows and the dense path for many), charged as held,
and an offload folder written in another form is rebuilt, never read."""

import pytest
import torch

from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors import weight_store
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.blocks.coded_weights import prompts_take_codes
from flexlamps.models.blocks.linear import INT4_DENSE_FROM_ROWS
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from placement import CompressionSpec, Policy, TierSplit
from quant import dequantize, quantize
from quant.int4_weight import Int4Weight

GiB = 2**30
ON_GPU = TierSplit(gpu=1, cpu=0, disk=0)
MOSTLY_DISK = TierSplit(gpu=0.1, cpu=0.2, disk=0.7)


def _policy(weights=MOSTLY_DISK):
    return Policy(gpu_batch_size=2, num_gpu_batches=2, weights=weights, cache=ON_GPU, activations=ON_GPU,
                  compress_weight=True)


def _same_compression(reader, ex, dtype, device="cpu"):
    """The in-memory engine (on `device`) on the weights the offload executor was given: Int4Weights where it
    keeps them (the in-memory engine stacks q/k/v and gate/up itself), other matrices as their
    4-bit group-wise form dequantized (what the executor computes with)."""
    weights = {}
    for spec in weight_specs(reader.config):
        w = reader.read(spec, dtype)
        if spec.role == "linear":
            w = Int4Weight.quantize(w, 32, dtype) if ex.stored_weights.is_int4(spec) else dequantize(quantize(w, ex.qcfg))
        weights[spec.name] = w.to(device)
    return InMemoryExecutor(reader.config, weights, dtype, device)


def _steps(reader):
    """A short prefill (the fused kernel), a long one (the dense path) and a decode."""
    ids = torch.randint(2, reader.config.vocab_size, (8, 40), generator=torch.Generator().manual_seed(0))
    long_rows = 4 * 40
    assert 2 * 12 < INT4_DENSE_FROM_ROWS <= long_rows
    return [Step(ids[:2, :12], torch.arange(12).expand(2, 12), torch.tensor([0, 1])),
            Step(ids[2:6], torch.arange(40).expand(4, 40), torch.tensor([2, 3, 4, 5])),
            Step(ids[6:, :1], torch.zeros(2, 1, dtype=torch.long), torch.tensor([6, 7]))]


@pytest.mark.parametrize("kind, dtype, weights", [
    ("llama3_scaled", torch.float32, MOSTLY_DISK), ("llama3_scaled", torch.bfloat16, MOSTLY_DISK),
    ("qwen2", torch.bfloat16, MOSTLY_DISK),  # q/k/v biases stacked with their matrices
    ("llama_gqa", torch.bfloat16, ON_GPU),  # gate/up not whole kernel tiles, down not whole groups
])
def test_4bit_offloaded_equals_the_in_memory_engine_bit_for_bit(tiny_models, tmp_path, kind, dtype, weights):
    reader = open_checkpoint(tiny_models[kind])
    # both engines on the CPU: bit identity is the CPU's guarantee (the CUDA test below has a tolerance)
    ex = OffloadExecutor(reader, _policy(weights), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off", dtype=dtype,
                         device=torch.device("cpu"))
    plain = _same_compression(reader, ex, dtype)
    steps = _steps(reader)
    ref = plain.forward_steps(plain.new_cache(8, 48), steps)
    got = ex.forward_steps(ex.new_cache(8, 48), steps)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    fetched, staged = ex.store.fetch(ex.layer_names[0])
    ex.store.release(staged)
    assert any(isinstance(w, Int4Weight) for w in fetched.values())
    ex.close()


def test_4bit_generation_with_merged_decode_equals_the_in_memory_engine(tiny_models, tmp_path):
    reader = open_checkpoint(tiny_models["llama3_scaled"])
    ex = OffloadExecutor(reader, _policy(), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off",
                         dtype=torch.bfloat16)
    plain = _same_compression(reader, ex, torch.bfloat16)
    ids = [reader.tokenizer.encode(p) for p in ["hello world", "the quick brown fox", "1 2 3 4", "a"]]
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (6, 3, 8, 5)]
    expected = [o.token_ids for o in generate(plain, reader.tokenizer, ids, params, max_batch=4)]
    got = [o.token_ids for o in generate(ex, reader.tokenizer, ids, params, max_batch=4, micro_batch=2)]
    assert got == expected
    ex.close()


def test_tiers_hold_4bit_bytes_and_are_charged_what_they_hold(tiny_models, tmp_path):
    reader = open_checkpoint(tiny_models["llama3_scaled"])
    ex = OffloadExecutor(reader, _policy(TierSplit(gpu=0.3, cpu=0.3, disk=0.4)), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB,
                         offload_dir=tmp_path / "off", dtype=torch.bfloat16)
    folder = tmp_path / "off" / "flexlamps-offload"
    matrices = [s for s in ex.specs if s.layer is not None and s.role == "linear"]  # tables: in pieces
    for spec in matrices:
        tier = ex.tiers[spec.name]
        parts = [n for n in ex.store._tier if n == spec.name or n.startswith(spec.name + "::")]
        parts = [n for n in parts if n not in ex.store._qparts]
        if tier == "disk":
            held = sum((folder / (n.replace("/", "_") + ".dat")).stat().st_size for n in parts)
        else:
            held = sum(ex.store._resident[n].numel() * ex.store._resident[n].element_size() for n in parts)
        assert held == ex.weights.stored[spec.name], (spec.name, tier, held)
        if ex.stored_weights.is_int4(spec) and tier != "gpu":  # what the planner prices, plus the group size
            assert held == spec.numel * CompressionSpec(num_bits=4).weight_bytes_per_element(2) + 4
            assert held == spec.numel * (0.5 + 2 * 2 / 32) + 4  # 4 bits, a bf16 scale and zero per 32
    on_disk = [s for s in matrices if ex.tiers[s.name] == "disk"]
    assert on_disk and all(ex.stored_weights.is_int4(s) for s in on_disk)
    ex.close()


def test_a_folder_written_in_another_4bit_form_is_rebuilt(tiny_models, tmp_path, monkeypatch):
    reader = open_checkpoint(tiny_models["llama3_scaled"])

    def run():
        ex = OffloadExecutor(reader, _policy(), model_spec=model_spec(reader.config),
                             gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off",
                             dtype=torch.bfloat16)
        ex.close()
        return ex.reused_disk

    with monkeypatch.context() as m:
        m.setattr(weight_store, "int4_format_tag", lambda device: "int4-v0|an older layout")
        assert not run()
    assert not run()  # another form: rebuilt (its files deleted as its index lists them)
    assert run()
    leftovers = {p.name for p in (tmp_path / "off" / "flexlamps-offload").iterdir()}
    assert all(not name.endswith(".tmp") for name in leftovers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_chunks_share_one_dequantization_per_layer_and_equal_the_in_memory_engine(
        tiny_models, tmp_path, monkeypatch, dtype):
    reader = open_checkpoint(tiny_models["llama3_scaled"])
    ex = OffloadExecutor(reader, _policy(), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off", dtype=dtype,
                         device=torch.device("cpu"))  # bit identity: the CPU's guarantee
    plain = _same_compression(reader, ex, dtype)
    ids = torch.randint(2, reader.config.vocab_size, (8, 40), generator=torch.Generator().manual_seed(1))
    chunks = [Step(ids[a:a + 4], torch.arange(40).expand(4, 40), torch.arange(a, a + 4)) for a in (0, 4)]
    assert all(s.input_ids.numel() >= INT4_DENSE_FROM_ROWS for s in chunks)
    ref = plain.forward_steps(plain.new_cache(8, 48), chunks)
    calls = []
    real = Int4Weight.dequantize
    monkeypatch.setattr(Int4Weight, "dequantize", lambda self, *a, **k: calls.append(self.shape) or real(self, *a, **k))
    cache = ex.new_cache(8, 48)
    held = ex.budgets["gpu"].used_bytes
    got = ex.forward_steps(cache, chunks)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    assert ex.budgets["gpu"].used_bytes == held  # the dense copies' charge freed with them
    fetched, staged = ex.store.fetch(ex.layer_names[0])
    ex.store.release(staged)
    per_layer = sum(isinstance(w, Int4Weight) for w in fetched.values())
    assert per_layer
    if not prompts_take_codes(torch.empty(1, dtype=dtype)):  # the dense GEMM: dequantized once a sweep
        assert len(calls) == per_layer * reader.config.num_layers  # not once a chunk
    else:  # prompts run on the codes (bf16 without a fast bf16 GEMM, or on AMX tiles): nothing dequantized
        assert not calls
    ex.close()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["llama3_scaled", "qwen2"])
def test_on_cuda_4bit_offloaded_equals_the_in_memory_engine(tiny_models, tmp_path, kind):
    """On CUDA the 4-bit weights load from pinned buffers on the copy stream and are multiplied
    by tinygemm for few rows: the in-memory engine on the same weights, on the GPU, gives the
    same logits (to bf16 rounding: the engines stack q/k/v and gate/up differently)."""
    reader = open_checkpoint(tiny_models[kind])
    cuda = torch.device("cuda")
    ex = OffloadExecutor(reader, _policy(), model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off",
                         dtype=torch.bfloat16, device=cuda)
    plain = _same_compression(reader, ex, torch.bfloat16, cuda)
    steps = _steps(reader)
    ref = plain.forward_steps(plain.new_cache(8, 48), steps)
    for _ in range(2):  # the second sweep reuses pinned buffers and allocator blocks
        got = ex.forward_steps(ex.new_cache(8, 48), steps)
        for a, b in zip(ref, got):
            a = a.float().cpu()  # logits come back on the CPU from both engines
            assert (a - b.float()).abs().max().item() <= 2 ** -6 * a.abs().max().item()
    ex.close()
