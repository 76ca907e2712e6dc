"""Measure a sparse-attention MLA model's latent-pool miss curves (what `flexlamps profile
--model` stores for the planner): a short greedy decode on the model, run once per pool size
through the engine's own offloaded latent cache, whose counters give each layer's misses.

So the curve is exactly what the engine does: its LRU pools warmed with the prefill's last
selection (as ESS warms them), new tokens pooled for free where an entry is spare, a record
selected for the first time a miss. Per layer, the share of the selected entries that missed
during decode, by pool size as a fraction of the context. The prompts are random token ids
(seeded): the profile has no text to read.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flexlamps.engine.caches.latent_offload import OffloadedLatentCache
from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.step import Step
from flexlamps.models.loading.checkpoint import read_all
from flexlamps.models.loading.registry import open_checkpoint
from offload.budget import TierBudget
from placement.latent_pools import LatentMissCurves

POOL_FRACTIONS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)
_UNLIMITED = 1 << 62  # the measurement runs in memory; no tier budget applies


def _decode(ex: InMemoryExecutor, cache, prompts: torch.Tensor, decode_steps: int) -> None:
    """Prefill the prompts (one per slot), then greedy decode."""
    num, length = prompts.shape
    slots = torch.arange(num)
    out = ex.forward_steps(cache, [Step(prompts, torch.arange(length).expand(num, length), slots)])[0]
    tokens, pos = out[:, -1].argmax(-1)[:, None], torch.full((num,), length)
    for _ in range(decode_steps):
        out = ex.forward_steps(cache, [Step(tokens, pos[:, None], slots)])[0]
        tokens, pos = out[:, -1].argmax(-1)[:, None], pos + 1


def pool_sizes(context: int, topk: int) -> list[int]:
    """The pool sizes measured: POOL_FRACTIONS of the context, at least one step's top-k."""
    return sorted({min(context, max(topk, round(f * context))) for f in POOL_FRACTIONS})


def miss_rates(ex: InMemoryExecutor, prompts: torch.Tensor, decode_steps: int, pool: int) -> list[float]:
    """Per layer, the share of selected entries that missed a pool of `pool` entries."""
    cfg = ex.cfg
    budgets = {tier: TierBudget(tier, _UNLIMITED) for tier in ("gpu", "cpu")}
    cache = OffloadedLatentCache(cfg, prompts.shape[0], prompts.shape[1] + decode_steps, torch.float32, budgets,
                                 torch.device("cpu"), [pool] * cfg.num_layers)
    with torch.inference_mode():
        _decode(ex, cache, prompts, decode_steps)
    rates = [1.0 - hit for hit in cache.hit_rate()]
    cache.release()
    return rates


def measure_latent_miss_curves(model: str | Path, *, prompt_len: int = 512, decode_steps: int = 32,
                               num_seqs: int = 2, seed: int = 0) -> LatentMissCurves:
    """Miss curves of `model` (an HF folder of a sparse-attention MLA model) from a short decode."""
    reader = open_checkpoint(model)
    cfg = reader.config
    if cfg.mla is None or not cfg.mla.has_indexer:
        raise ValueError(f"{model}: latent miss curves need a sparse-attention MLA model (DeepSeek-V3.2); "
                         f"this is {cfg.model_type}")
    prompt_len = max(1, min(prompt_len, cfg.max_position - decode_steps))
    context = prompt_len + decode_steps
    ex = InMemoryExecutor(cfg, read_all(reader, torch.float32), torch.float32)
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, cfg.vocab_size, (num_seqs, prompt_len), generator=generator)
    sizes = pool_sizes(context, cfg.mla.index_topk)
    by_size = [miss_rates(ex, prompts, decode_steps, size) for size in sizes]
    return LatentMissCurves(
        source=f"measured on {Path(str(model)).name}: {num_seqs} random prompts of {prompt_len} tokens, "
               f"{decode_steps} decode steps through the engine's pools",
        pool_fractions=[size / context for size in sizes],
        miss_fractions=[[rates[layer] for rates in by_size] for layer in range(cfg.num_layers)])
