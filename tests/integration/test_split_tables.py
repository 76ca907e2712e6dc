"""Embedding tables and output heads cut by vocab rows across gpu / cpu / disk: each tier holds
its planned share of the rows, and generation equals the in-memory engine's exactly (fp32)."""

import pytest
import torch

from flexlamps.engine.batch.generate import generate
from flexlamps.engine.batch.sampling import SamplingParams
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.offloaded import OffloadExecutor
from flexlamps.engine.executors.placement_map import place_weights
from flexlamps.engine.executors.step import Step
from flexlamps.models.description import model_spec
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.config import ModelConfig
from flexlamps.models.loading.registry import open_checkpoint
from flexlamps.models.weight_specs import weight_specs
from placement import Policy, TierSplit

GiB = 2**30
ON_GPU = TierSplit(gpu=1, cpu=0, disk=0)
THREE_TIERS = TierSplit(gpu=0.3, cpu=0.3, disk=0.4)


def _check_pieces(pieces, num_rows: int) -> None:
    assert [p.tier for p in pieces] == ["gpu", "cpu", "disk"]
    assert pieces[0].start == 0 and pieces[-1].stop == num_rows
    assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))
    for piece, share in zip(pieces, (THREE_TIERS.gpu, THREE_TIERS.cpu, THREE_TIERS.disk)):
        assert abs(piece.num_rows - share * num_rows) <= 1


# untied head (LLaMA), tied head (Qwen2), OPT (tied, learned positions)
@pytest.mark.parametrize("kind", ["llama_gqa", "qwen2", "opt"])
def test_split_tables_generate_exactly_as_in_memory(tiny_models, kind, tmp_path):
    reader = open_checkpoint(tiny_models[kind])
    vocab = reader.config.vocab_size
    plain = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=2, weights=THREE_TIERS, cache=ON_GPU, activations=ON_GPU)
    # on the CPU, as the in-memory engine: bit identity is the CPU's guarantee (cuBLAS picks kernels by shape)
    ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                         gpu_mem=GiB, cpu_mem=GiB, offload_dir=tmp_path / "off", dtype=torch.float32,
                         device=torch.device("cpu"))
    ex.sweep.head_chunk_rows = 40  # several vocab chunks in every piece
    assert set(ex.table_pieces) == ({"embed_tokens", "lm_head"} if kind == "llama_gqa" else {"embed_tokens"})
    for pieces in ex.table_pieces.values():
        _check_pieces(pieces, vocab)
        assert all(ex.store.tier_of(p.name) == p.tier for p in pieces)
    # prompts whose tokens fall in every piece of the embedding table
    ids = torch.arange(2, vocab, 6)[:48].reshape(4, 12)
    assert all(((ids >= p.start) & (ids < p.stop)).any() for p in ex.table_pieces["embed_tokens"])
    steps = [Step(ids[:2], torch.arange(12).expand(2, 12), torch.tensor([0, 1])),
             Step(ids[2:, :7], torch.arange(7).expand(2, 7), torch.tensor([2, 3]))]
    expected = plain.forward_steps(plain.new_cache(4, 16), steps)
    got = ex.forward_steps(ex.new_cache(4, 16), steps)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in (6, 3, 8, 5)]
    prompts = ids.tolist()
    ref = generate(plain, reader.tokenizer, prompts, params, max_batch=4, micro_batch=2)
    out = generate(ex, reader.tokenizer, prompts, params, max_batch=4, micro_batch=2)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    ex.close()


def test_each_tier_holds_its_share_when_the_head_is_large():
    """The shape that once overshot: an untied head larger than the cpu tier's share of all
    the weights. Cut by rows, every tier holds its share to within one layer tensor."""
    cfg = ModelConfig.from_hf(dict(model_type="llama", hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                                   vocab_size=128256, tie_word_embeddings=False))
    split = TierSplit(gpu=0.5, cpu=0.06, disk=0.44)
    placed = place_weights(cfg, split)
    specs = weight_specs(cfg)
    total = sum(s.numel for s in specs)
    largest = max(s.numel for s in specs if s.layer is not None)
    head = next(s for s in specs if s.name == "lm_head")
    assert head.numel > split.cpu * total  # whole, it would not fit the cpu share
    held = dict.fromkeys(("gpu", "cpu", "disk"), 0)
    for s in specs:
        for piece in placed.pieces_of(s):
            held[piece.tier] += s.numel // s.shape[0] * piece.num_rows
    assert sum(held.values()) == total
    for tier in held:
        assert abs(held[tier] - getattr(split, tier) * total) <= largest, (tier, held, total)


def _held(cfg, placed) -> dict[str, int]:
    held = dict.fromkeys(("gpu", "cpu", "disk"), 0)
    for s in weight_specs(cfg):
        for piece in placed.pieces_of(s):
            held[piece.tier] += s.numel // s.shape[0] * piece.num_rows
    return held


def test_a_moe_head_keeps_its_disk_share_in_memory_and_the_coldest_experts_give_it_back():
    """A MoE model reads its head whole every step and a routed expert only when routed: the head's
    disk share goes to the cpu tier, each layer moving as many bytes of its last (coldest) experts
    to disk, so every tier still holds its share to within one expert; the embedding table, read
    by rows, keeps the split. Memory tiers that hold no experts beyond the dense parts: the split."""
    from flexlamps.engine.executors.expert_weights import expert_index

    cfg = ModelConfig.from_hf(dict(model_type="qwen3_moe", hidden_size=256, intermediate_size=512,
                                   moe_intermediate_size=128, num_experts=32, num_experts_per_tok=4,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   vocab_size=8000, tie_word_embeddings=False))
    split = TierSplit(gpu=0.05, cpu=0.25, disk=0.7)
    placed = place_weights(cfg, split)
    specs = weight_specs(cfg)
    total = sum(s.numel for s in specs)
    one_expert = 3 * 256 * 128
    assert [p.tier for p in placed.pieces["lm_head"]] == ["gpu", "cpu"]  # none on disk
    assert "disk" in [p.tier for p in placed.pieces["embed_tokens"]]
    held = _held(cfg, placed)
    for tier in held:
        assert abs(held[tier] - getattr(split, tier) * total) <= one_expert, (tier, held, total)
    for s in specs:  # the dense parts stay in memory; on disk only experts, the last of each layer
        if s.layer is not None and expert_index(s.local_name) is None:
            assert placed.tiers[s.name] != "disk", s.name
    tight = TierSplit(gpu=0.01, cpu=0.01, disk=0.98)  # memory for less than the dense parts
    assert "disk" in [p.tier for p in place_weights(cfg, tight).pieces["lm_head"]]
