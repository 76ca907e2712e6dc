"""The engine's attention as a layer runs it, timed for the planner: a `TieredKVCache` layer on the gpu
tier attending one step (its keys written, the rows read back, the mask, the exact per-query product of
`blocks.attention`), at a prompt's and a decode step's shapes, each at two sizes: the rate is the slope
between them (what the FLOPs of a row more cost), the call's fixed cost the intercept. On a CPU the slope
runs 8-25 GFLOP/s where the GEMM peak the planner priced attention at is 100-1000, and a call costs
~0.25 ms in fp32 (0.08 in bf16, the native kernel) before its first FLOP, which no probe timed (the layer
overhead's attends with a stand-in) (docs/performance.md, "SmolLM2's planner accuracy taken apart")."""

import torch

from flexlamps.engine.caches.tiered import TieredKVCache
from flexlamps.models.config import ModelConfig
from offload.budget import TierBudget

# a common head geometry (Llama-3.2-1B's head size, GQA by 4). The rate moves with it: SmolLM2's 9/3 heads ran
# a prompt within 5% of these, a decode step of 32 rows over 72 keys at ~half the rate (3 against 8 GFLOP/s fp32,
# thread CPU time); at this probe's own sizes 12-16% slower, which moved SmolLM2's eight priced policies 0.1-1.2%
# (plan50, docs/figures.md): not worth a profile that knows the model's heads
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64
# a prompt micro-batch: 2 and 8 prompts of 64 tokens, no cache before them
PROMPT_ROWS, PROMPT_TOKENS = (2, 8), 64
# a decode step: 8 and 32 rows, one query each over 64 cached keys (a short context: the engine pads the keys
# to whole blocks of 128, so a longer one runs faster per FLOP and is priced slow, never fast)
DECODE_ROWS, DECODE_KEYS = (8, 32), 64


def _step(dtype: torch.dtype, device: torch.device, rows: int, tokens: int, past: int):
    """A callable running one layer's attend of `rows` rows of `tokens` queries after `past` cached
    positions, and its FLOPs as the planner counts them (`ModelSpec.attention_flops_per_query`: a
    prompt's queries see half its tokens on average)."""
    cfg = ModelConfig(arch="decoder", model_type="llama", vocab_size=64, hidden_size=HEADS * HEAD_DIM,
                      num_layers=1, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                      intermediate_size=64, max_position=past + tokens + 1)
    budgets = {tier: TierBudget(tier, 1 << 40) for tier in ("gpu", "cpu")}
    cache = TieredKVCache(cfg, rows, past + tokens, dtype, ["gpu"], budgets, device)
    gen = torch.Generator().manual_seed(0)

    def heads(n: int, t: int, count: int) -> torch.Tensor:
        return torch.randn(n, t, count, HEAD_DIM, generator=gen).to(device=device, dtype=dtype)

    slots = torch.arange(rows, device=device)
    if past:  # the cached keys, written by a prompt step
        before = torch.arange(past, device=device).expand(rows, past).contiguous()
        keys = heads(rows, past, KV_HEADS)
        cache.attend(0, slots, before, heads(rows, past, HEADS), keys, keys)
    positions = (past + torch.arange(tokens, device=device)).expand(rows, tokens).contiguous()
    q, k, v = heads(rows, tokens, HEADS), heads(rows, tokens, KV_HEADS), heads(rows, tokens, KV_HEADS)
    geometry = cache.step_geometry(slots, positions)  # once a step, shared by its layers: not timed
    seen = tokens / 2 if not past else past + tokens
    flops = rows * tokens * 4.0 * HEADS * HEAD_DIM * seen
    return (lambda: cache.attend(0, slots, positions, q, k, v, geometry=geometry)), flops


def attention_steps(device: torch.device, dtypes: tuple[str, ...]) -> dict[str, dict[str, list[tuple]]]:
    """{phase: {dtype: [(run one layer's attend, its FLOPs) at the smaller size, at the larger]}}."""
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    return {"prompt": {d: [_step(torch_dtypes[d], device, rows, PROMPT_TOKENS, 0) for rows in PROMPT_ROWS]
                       for d in dtypes},
            "decode": {d: [_step(torch_dtypes[d], device, rows, 1, DECODE_KEYS) for rows in DECODE_ROWS]
                       for d in dtypes}}


def slope_rate(seconds: tuple[float, float], flops: tuple[float, float]) -> tuple[float, float]:
    """(FLOP/s, seconds a call) from two sizes' (seconds, FLOPs): the slope between them (what a row more
    costs) and the intercept (a call's fixed cost, at least 0); where noise made the larger size no slower
    than the smaller, its own rate and no fixed cost."""
    extra_s = seconds[1] - seconds[0]
    if extra_s <= 0:
        return flops[1] / seconds[1], 0.0
    rate = (flops[1] - flops[0]) / extra_s
    return rate, max(0.0, seconds[0] - flops[0] / rate)
