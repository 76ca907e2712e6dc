"""Rotary position embeddings: inverse frequencies (default, linear, llama3, yarn scaling) and rotation."""

from __future__ import annotations

import math

import torch

from flexlamps.models.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = cfg.rope_scaling
    if s is None:
        return inv
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    if s["rope_type"] == "yarn":
        return _yarn_inverse_frequencies(inv, d, cfg.rope_theta, s)
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_ctx / lo, inv / factor, inv)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / hi) & (wavelen <= old_ctx / lo)
    return torch.where(medium, blended, scaled)


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
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.get("mscale") and s.get("mscale_all_dim"):
        return mscale(s["factor"], s["mscale"]) / mscale(s["factor"], s["mscale_all_dim"])
    return mscale(s["factor"])


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    """cos, sin of shape (n, T, head_dim) for integer positions (n, T); computed in fp32 on the
    positions' device (`inv_freq`, made on the CPU, is copied there: once a step, not a layer)."""
    freqs = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)[None, None, :]
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


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """(cos, signed sin) of shape (n, T, 1, head_dim) for `rotate_half_split`, made once per step:
    the sin's first half negated, which folds rotate-half's negation into the table."""
    cos, sin = rope_cos_sin(inv_freq, positions, dtype)
    half = sin.shape[-1] // 2
    sin[..., :half].neg_()
    return cos[:, :, None], sin[:, :, None]


def rotate_half_split(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`apply_rope(x, cos, sin)` bit for bit, in four ops, from `rope_tables`' (cos, signed sin):
    x * cos + (x2, x1) * (-sin1, sin2), as x * cos + (-x2, x1) * (sin1, sin2) (negation is exact).
    x (n, T, heads, head_dim) may be a strided view (q and k of one projection rotated at once)."""
    swapped = x.roll(x.shape[-1] // 2, -1)  # (x2, x1), one op
    return (x * cos).add_(swapped.mul_(signed_sin))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (n, T, heads, head_dim) by the half-split convention HF LLaMA uses."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
