"""The offloaded latent cache (cpu records, gpu indexer keys, LRU pools) equals the in-memory
sparse path bit for bit, for every pool size from the whole context down to one step's top-k."""

import pytest
import torch

from flexlamps.engine.executors.step import Step
from flexlamps.engine.caches.latent import DenseLatentCache
from flexlamps.engine.caches.latent_offload import OffloadedLatentCache
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from offload.budget import BudgetExceededError, TierBudget

PROMPT_LENS, DECODE_STEPS = (10, 6), 64
CAPACITY = max(PROMPT_LENS) + DECODE_STEPS


@pytest.fixture(scope="module")
def v32(deepseek_models):
    reader = open_checkpoint(deepseek_models["deepseek_v32"])
    return reader.config, InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32)


def _budgets(gpu=1 << 30, cpu=1 << 30):
    return {"gpu": TierBudget("gpu", gpu), "cpu": TierBudget("cpu", cpu)}


def _run(ex, cache) -> list[torch.Tensor]:
    """Two prompts of different lengths prefilled in one padded step (as `generate` groups
    them: the shorter row's tail is written, then overwritten by its decode), then greedy
    decode together."""
    longest = max(PROMPT_LENS)
    ids = torch.randint(2, ex.cfg.vocab_size, (2, longest), generator=torch.Generator().manual_seed(5))
    out = ex.forward_steps(cache, [Step(ids, torch.arange(longest).expand(2, longest), torch.tensor([0, 1]))])[0]
    logits = [out]
    slots, pos = torch.tensor([0, 1]), torch.tensor(PROMPT_LENS)
    tokens = out[torch.arange(2), pos - 1].argmax(-1)[:, None].cpu()
    for _ in range(DECODE_STEPS):
        out = ex.forward_steps(cache, [Step(tokens, pos[:, None], slots)])[0]
        logits.append(out)
        tokens, pos = out[:, -1].argmax(-1)[:, None].cpu(), pos + 1
    return logits


@pytest.mark.parametrize("fp8", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_offloaded_equals_in_memory_for_every_pool_size(v32, fp8):
    cfg, ex = v32
    expected = _run(ex, DenseLatentCache(cfg, 2, CAPACITY, torch.float32, fp8=fp8))
    topk = cfg.mla.index_topk
    misses = {}
    for pool in (CAPACITY, 2 * topk, topk):
        budgets = _budgets()
        cache = OffloadedLatentCache(cfg, 2, CAPACITY, torch.float32, budgets, torch.device("cpu"),
                                     [pool] * cfg.num_layers, fp8=fp8)
        got = _run(ex, cache)
        assert all(torch.equal(g, e) for g, e in zip(got, expected)), f"pool {pool}"
        misses[pool] = sum(cache.stats["misses"])
        assert budgets["gpu"].used_bytes == cache.nbytes - budgets["cpu"].used_bytes
        cache.release()
        assert budgets["gpu"].used_bytes == 0 == budgets["cpu"].used_bytes
    assert misses[topk] > misses[2 * topk] >= misses[CAPACITY]


def test_per_layer_pools_from_a_policy_equal_in_memory(v32):
    """The planner's per-layer pools (Policy.latent_pools) reach the cache layer by layer."""
    from flexlamps.engine.caches.latent import new_latent_cache

    cfg, ex = v32
    expected = _run(ex, DenseLatentCache(cfg, 2, CAPACITY, torch.float32))
    fractions = tuple(1.0 if layer % 2 else 0.0 for layer in range(cfg.num_layers))  # whole, one step's top-k
    cache = new_latent_cache(cfg, 2, CAPACITY, torch.float32, gpu_fraction=0.5, budgets=_budgets(),
                             device=torch.device("cpu"), layer_fractions=fractions)
    assert [p.pool_entries for p in cache.pools] == [CAPACITY if f else cfg.mla.index_topk for f in fractions]
    got = _run(ex, cache)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    with pytest.raises(ValueError, match="latent_pools has 1 layers"):
        new_latent_cache(cfg, 2, CAPACITY, torch.float32, gpu_fraction=0.5, budgets=_budgets(),
                         device=torch.device("cpu"), layer_fractions=(0.5,))


def test_pool_smaller_than_a_step_is_refused(v32):
    cfg, _ = v32
    with pytest.raises(ValueError, match="one step's working set"):
        OffloadedLatentCache(cfg, 1, 32, torch.float32, _budgets(), torch.device("cpu"),
                             [cfg.mla.index_topk - 1] * cfg.num_layers)


def test_budgets_are_enforced(v32):
    cfg, _ = v32
    with pytest.raises(BudgetExceededError, match="gpu tier budget exceeded"):
        OffloadedLatentCache(cfg, 4, 1024, torch.float32, _budgets(gpu=1 << 12), torch.device("cpu"),
                             [16] * cfg.num_layers)


def test_generate_with_an_offloaded_latent_cache_equals_plain(deepseek_models, tmp_path):
    import json

    from click.testing import CliRunner

    from flexlamps.cli import main

    prompts = tmp_path / "in.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in
                               enumerate(["the quick brown fox", "hello", "numbers 1 2 3 4 5 6"])))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({
        "gpu_batch_size": 2, "num_gpu_batches": 2, "weights": {"gpu": 0.5, "cpu": 0.5, "disk": 0},
        "cache": {"gpu": 0.25, "cpu": 0.75, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0}}))
    common = ["generate", "--no-progress", "--model", str(deepseek_models["deepseek_v32"]), "--prompts",
              str(prompts), "--max-new-tokens", "24", "--ignore-eos", "--threads", "1"]
    plain = CliRunner().invoke(main, common + ["--out", str(tmp_path / "plain.jsonl")], catch_exceptions=False)
    assert plain.exit_code == 0, plain.output
    off = CliRunner().invoke(main, common + ["--out", str(tmp_path / "off.jsonl"), "--gpu-mem", "4MiB",
                                             "--cpu-mem", "64MiB", "--policy", str(policy)], catch_exceptions=False)
    assert off.exit_code == 0, off.output
    assert "policy: block 2 x 2" in off.output and "cache gpu 25%" in off.output and "peak gpu tier" in off.output
    # a policy with the planner's per-layer pools (Policy.latent_pools) runs them, printed, same text
    policy.write_text(json.dumps({
        "gpu_batch_size": 2, "num_gpu_batches": 2, "weights": {"gpu": 0.5, "cpu": 0.5, "disk": 0},
        "cache": {"gpu": 0.5, "cpu": 0.5, "disk": 0}, "activations": {"gpu": 1, "cpu": 0, "disk": 0},
        "latent_pools": [0.25, 1.0, 0.25]}))
    layered = CliRunner().invoke(main, common + ["--out", str(tmp_path / "layered.jsonl"), "--gpu-mem", "4MiB",
                                                 "--cpu-mem", "64MiB", "--policy", str(policy)], catch_exceptions=False)
    assert layered.exit_code == 0, layered.output
    assert "latent pools per layer (share of the context on the gpu tier): 25% 100% 25%" in layered.output
    texts = [[json.loads(line)["text"] for line in open(tmp_path / f"{name}.jsonl")]
             for name in ("plain", "off", "layered")]
    assert texts[0] == texts[1] == texts[2]


def _teacher_forced(ex, cache, tokens: torch.Tensor):
    """Prefill, then decode the given tokens (n, DECODE_STEPS) whatever the logits say, so runs
    whose logits differ by rounding stay on one path."""
    longest = max(PROMPT_LENS)
    ids = torch.randint(2, ex.cfg.vocab_size, (2, longest), generator=torch.Generator().manual_seed(5))
    logits = [ex.forward_steps(cache, [Step(ids, torch.arange(longest).expand(2, longest), torch.tensor([0, 1]))])[0]]
    slots, pos = torch.tensor([0, 1]), torch.tensor(PROMPT_LENS)
    for step in range(DECODE_STEPS):
        logits.append(ex.forward_steps(cache, [Step(tokens[:, step:step + 1], pos[:, None], slots)])[0])
        pos = pos + 1
    return logits


def _recording_picks(monkeypatch, module):
    """Record every decode step's selection made through `module.select_topk`."""
    from flexlamps.models.blocks import mla

    picks = []

    def select(scores, visible, topk):
        indices, valid = mla.select_topk(scores, visible, topk)
        if scores.shape[1] == 1:
            picks.append(indices.masked_fill(~valid, -1))
        return indices, valid

    monkeypatch.setattr(module, "select_topk", select)
    return picks


def _check_overlapped_misses(reader, device: str, pool_size: str, monkeypatch) -> None:
    """Overlapped decoding (misses copied while attention runs over the hits, merged by
    log-sum-exp) picks the same top-k as the in-memory path on `device` and its fp32 logits
    stay within OVERLAP_LOGIT_TOLERANCE of them, for 64 teacher-forced steps."""
    from flexlamps.engine.caches import latent, latent_offload
    from flexlamps.engine.caches.latent_offload import OVERLAP_LOGIT_TOLERANCE

    cfg = reader.config
    ex = InMemoryExecutor(cfg, read_all(reader, torch.float32), torch.float32, device)
    tokens = torch.randint(2, cfg.vocab_size, (2, DECODE_STEPS), generator=torch.Generator().manual_seed(9))
    expected_picks = _recording_picks(monkeypatch, latent)
    expected = _teacher_forced(ex, DenseLatentCache(cfg, 2, CAPACITY, torch.float32, device), tokens)
    pool = {"everything": CAPACITY, "two steps": 2 * cfg.mla.index_topk, "one step": cfg.mla.index_topk}[pool_size]
    got_picks = _recording_picks(monkeypatch, latent_offload)
    cache = OffloadedLatentCache(cfg, 2, CAPACITY, torch.float32, _budgets(), torch.device(device),
                                 [pool] * cfg.num_layers, overlap=True)
    got = _teacher_forced(ex, cache, tokens)
    del got_picks[:cfg.num_layers]  # the prefill's pool warm-up selections
    assert len(got_picks) == len(expected_picks) == DECODE_STEPS * cfg.num_layers
    assert all(torch.equal(g, e) for g, e in zip(got_picks, expected_picks))
    worst = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    assert worst <= OVERLAP_LOGIT_TOLERANCE, worst
    assert torch.equal(got[0], expected[0])  # prefill runs unsplit: the same bits
    if pool_size != "everything":
        assert sum(cache.stats["misses"]) > 0 and cache.stats["h2d_bytes"] > 0
    cache.release()


POOL_SIZES = ["everything", "two steps", "one step"]


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_overlapped_misses_stay_within_the_stated_tolerance(deepseek_models, pool_size, monkeypatch):
    _check_overlapped_misses(open_checkpoint(deepseek_models["deepseek_v32"]), "cpu", pool_size, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_cuda_overlapped_misses_stay_within_the_stated_tolerance(deepseek_models, pool_size, monkeypatch):
    """On CUDA the misses come from pinned staging on a copy stream, joined by an event."""
    _check_overlapped_misses(open_checkpoint(deepseek_models["deepseek_v32"]), "cuda", pool_size, monkeypatch)


@pytest.mark.gpu
def test_cuda_offloaded_equals_in_memory(deepseek_models):
    """The exact mode on CUDA: the offloaded latent cache equals the in-memory one there, bit for bit."""
    reader = open_checkpoint(deepseek_models["deepseek_v32"])
    ex = InMemoryExecutor(reader.config, read_all(reader, torch.float32), torch.float32, "cuda")
    expected = _run(ex, DenseLatentCache(reader.config, 2, CAPACITY, torch.float32, "cuda"))
    for pool in (CAPACITY, reader.config.mla.index_topk):
        cache = OffloadedLatentCache(reader.config, 2, CAPACITY, torch.float32, _budgets(), torch.device("cuda"),
                                     [pool] * reader.config.num_layers)
        assert all(torch.equal(g, e) for g, e in zip(_run(ex, cache), expected)), f"pool {pool}"
        cache.release()


def test_the_offload_executor_passes_the_overlap_choice_on(deepseek_models):
    from flexlamps.engine.executors.offloaded import OffloadExecutor
    from flexlamps.models.description import model_spec
    from placement import Policy, TierSplit

    reader = open_checkpoint(deepseek_models["deepseek_v32"])
    on_gpu = TierSplit(gpu=1.0, cpu=0.0, disk=0.0)
    policy = Policy(gpu_batch_size=2, num_gpu_batches=1, weights=on_gpu, activations=on_gpu,
                    cache=TierSplit(gpu=0.3, cpu=0.7, disk=0.0))
    for overlap in (False, True):
        ex = OffloadExecutor(reader, policy, model_spec=model_spec(reader.config),
                             gpu_mem=1 << 28, cpu_mem=1 << 28, overlap_latent_misses=overlap)
        cache = ex.new_cache(2, CAPACITY)
        assert (cache._copies is not None) == overlap
        cache.release()
        ex.close()
