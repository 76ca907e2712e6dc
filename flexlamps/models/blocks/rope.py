"""Rotary position embeddings: inverse frequencies (default, linear, llama3, yarn, longrope scaling) and
rotation. Dynamic NTK is not among them: transformers recomputes it from the longest sequence seen so
far, a state no step of ours could reproduce per request."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flexlamps.models.config import ModelConfig
from flexlamps.models.layer_config import ROPE_TYPES


@dataclass(frozen=True, eq=False)
class Rope:
    """One rotary embedding: `inv_freq` (dim / 2,), cos and sin times `factor` (YaRN, LongRoPE); a
    LongRoPE row whose step reaches past `long_from` positions turns with `long_inv_freq`."""
    inv_freq: torch.Tensor
    factor: float = 1.0
    long_inv_freq: torch.Tensor | None = None
    long_from: int = 0


def rope_for(dim: int, theta: float, scaling: dict | None, max_position: int) -> Rope:
    """The rotary embedding of `dim` rotated dims; ValueError naming an unknown rope type."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = scaling["rope_type"] if scaling is not None else "default"
    if kind == "default":
        return Rope(inv)
    if kind == "linear":
        return Rope(inv / scaling["factor"])
    if kind == "llama3":
        return Rope(_llama3_inverse_frequencies(inv, scaling))
    if kind == "yarn":
        factor = scaling.get("factor") or max_position / scaling["original_max_position_embeddings"]
        s = {**scaling, "factor": factor}
        return Rope(_yarn_inverse_frequencies(inv, dim, theta, s), yarn_attention_factor(s))
    if kind == "longrope":
        return _longrope(dim, theta, scaling, max_position)
    raise ValueError(f"rope type {kind!r} is not supported ({', '.join(ROPE_TYPES)} are)")


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """`cfg`'s inverse frequencies over its head_dim (MLA: the rotary width)."""
    return rope_for(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position).inv_freq


def _llama3_inverse_frequencies(inv: torch.Tensor, s: dict) -> torch.Tensor:
    """llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended."""
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / lo, inv / factor, inv)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / hi) & (wavelen <= old_ctx / lo)
    return torch.where(medium, blended, scaled)


def _longrope(dim: int, theta: float, s: dict, max_position: int) -> Rope:
    """LongRoPE (Phi-3): per-dim factors, the short ones up to `original_max_position_embeddings`
    positions, the long ones past them (as transformers switches on the step's length), cos and sin
    times sqrt(1 + log(factor) / log(original)) (or the config's attention_factor)."""
    old_ctx = s["original_max_position_embeddings"]
    factor = s.get("factor") or max_position / old_ctx
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old_ctx))
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim

    def inv(ext) -> torch.Tensor:
        if len(ext) != dim // 2:
            raise ValueError(f"longrope factors hold {len(ext)} values; the rotary width {dim} needs {dim // 2}")
        return 1.0 / (torch.tensor(ext, dtype=torch.float32) * theta ** shape)

    return Rope(inv(s["short_factor"]), float(attention_factor), inv(s["long_factor"]), old_ctx)


def _yarn_inverse_frequencies(inv: torch.Tensor, d: int, theta: float, s: dict) -> torch.Tensor:
    """YaRN (DeepSeek-V3's long context): fast-rotating dims kept, slow ones divided by
    `factor`, a linear ramp between the dims that turn beta_fast and beta_slow times over the
    original context."""
    factor, old_ctx = s["factor"], s["original_max_position_embeddings"]

    def dim_of(rotations: float) -> float:
        return d * math.log(old_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.get("beta_fast") or 32), dim_of(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep), 0: interpolate (divide by factor)
    return (inv / factor) * (1 - keep) + inv * keep


def rope_attention_factor(cfg: ModelConfig) -> float:
    """The factor YaRN multiplies cos and sin by (1 when not YaRN)."""
    s = cfg.rope_scaling
    if s is None or s["rope_type"] != "yarn":
        return 1.0
    return yarn_attention_factor(s)


def yarn_attention_factor(s: dict) -> float:
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(s["factor"], s["mscale"]) / mscale(s["factor"], s["mscale_all_dim"])
    return mscale(s["factor"])


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    """cos, sin of shape (n, T, head_dim) for integer positions (n, T); computed in fp32 on the
    positions' device (`inv_freq`, made on the CPU, is copied there: once a step, not a layer).
    `inv_freq` (dim / 2,) for every row, or (n, dim / 2) a row."""
    inv = inv_freq.to(positions.device)
    freqs = positions.to(torch.float32)[..., None] * (inv[None, None, :] if inv.dim() == 1 else inv[:, None, :])
    emb = torch.cat((freqs, freqs), dim=-1)
    if scale != 1.0:
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (n, T, heads, d) whose rotary pairs are interleaved, (x0, x1), (x2, x3), ...
    (DeepSeek's layout); the output is in half-split order, as transformers returns it."""
    half = cos.shape[-1] // 2
    cos, sin = cos[:, :, None, :half], sin[:, :, None, :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * cos - odd * sin, odd * cos + even * sin), dim=-1)


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    """(cos, signed sin) of shape (n, T, 1, head_dim) for `rotate_half_split`, made once per step:
    the sin's first half negated, which folds rotate-half's negation into the table."""
    cos, sin = rope_cos_sin(inv_freq, positions, dtype, scale)
    half = sin.shape[-1] // 2
    sin[..., :half].neg_()
    return cos[:, :, None], sin[:, :, None]


def step_tables(rope: Rope, positions: torch.Tensor, dtype: torch.dtype):
    """`rope_tables` of `rope` for a step's positions (n, T); LongRoPE picks each row's frequencies
    by how far that row's step reaches (transformers: the step's longest sequence), so a row's
    rotation never depends on the other rows."""
    inv = rope.inv_freq
    if rope.long_inv_freq is not None:
        long_rows = (positions.amax(dim=1) + 1 > rope.long_from).cpu()[:, None]
        inv = torch.where(long_rows, rope.long_inv_freq[None], rope.inv_freq[None])
    return rope_tables(inv, positions, dtype, rope.factor)


def rotate_half_split(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`apply_rope(x, cos, sin)` bit for bit, in four ops, from `rope_tables`' (cos, signed sin):
    x * cos + (x2, x1) * (-sin1, sin2), as x * cos + (-x2, x1) * (sin1, sin2) (negation is exact).
    x (n, T, heads, head_dim) may be a strided view (q and k of one projection rotated at once)."""
    swapped = x.roll(x.shape[-1] // 2, -1)  # (x2, x1), one op
    return (x * cos).add_(swapped.mul_(signed_sin))


def rotate_interleaved_split(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x (n, T, heads, d) rotated with its rotary pairs interleaved, (x0, x1), (x2, x3), ..., from
    `rope_tables`' (cos, signed sin); the output is in half-split order (the pairs' first elements,
    then their second), which turns q and k alike, so their products are transformers'."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], signed_sin[..., half:]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * c - odd * s, odd * c + even * s), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (n, T, heads, head_dim) by the half-split convention HF LLaMA uses."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
