"""Weight quantizer backends: groupwise4/8, nf4/fp4 (bitsandbytes where it runs), none."""
from __future__ import annotations

import builtins

import pytest
import torch

from quant import QuantBackendUnavailable, compress_state_dict, get_weight_quantizer
from quant.backends import WEIGHT_QUANTIZERS, _load_bitsandbytes
from quant.state_dict import decompress_state_dict, is_linear_weight, state_dict_nbytes

# bitsandbytes imports torch.jit.script_method, deprecated in torch 2.13; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def _bnb_runs() -> bool:
    try:
        _load_bitsandbytes("nf4", torch.device("cpu"))
        return True
    except QuantBackendUnavailable:
        return False


def test_groupwise_and_none():
    w = torch.randn(128, 96, dtype=torch.float16)
    dense = get_weight_quantizer("none")
    assert dense.dequantize(dense.quantize(w)) is w or torch.equal(dense.dequantize(dense.quantize(w)), w)
    errors = {}
    for name in ("groupwise4", "groupwise8"):
        q = get_weight_quantizer(name)
        back = q.dequantize(q.quantize(w))
        assert back.shape == w.shape and back.dtype == w.dtype
        errors[name] = (back.float() - w.float()).abs().mean().item()
    assert errors["groupwise8"] < errors["groupwise4"] / 8


@pytest.mark.parametrize("name", ["nf4", "fp4"])
def test_bitsandbytes_round_trip_where_it_runs(name):
    if not _bnb_runs():
        with pytest.raises(QuantBackendUnavailable, match="bitsandbytes"):
            get_weight_quantizer(name)
        return
    w = torch.randn(128, 96, dtype=torch.float16)
    q = get_weight_quantizer(name)
    c = q.quantize(w)
    back = q.dequantize(c)
    assert back.shape == w.shape and back.dtype == w.dtype
    assert (back.float() - w.float()).abs().mean() < 0.15 * w.float().abs().mean()
    assert c.nbytes == w.numel() // 2 + 4 * w.numel() // 64  # 4-bit codes + fp32 absmax per 64
    assert torch.equal(q.dequantize(c.to("cpu")), back)


def test_missing_bitsandbytes_says_what_to_install(monkeypatch):
    real_import = builtins.__import__

    def no_bnb(name, *args, **kwargs):
        if name.startswith("bitsandbytes"):
            raise ImportError("No module named 'bitsandbytes'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    with pytest.raises(QuantBackendUnavailable, match="pip install"):
        get_weight_quantizer("nf4")


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="groupwise4"):
        get_weight_quantizer("int3")
    assert set(WEIGHT_QUANTIZERS) == {"groupwise4", "groupwise8", "nf4", "fp4", "none"}


def test_compress_state_dict_picks_linear_weights_only():
    w = torch.randn(64, 32, dtype=torch.float16)
    weights = {
        "model.layers.0.self_attn.q_proj.weight": w,
        "model.layers.0.self_attn.q_proj.bias": torch.zeros(64),
        "model.layers.0.input_layernorm.weight": torch.ones(32),
        "model.embed_tokens.weight": w,
        "lm_head.weight": w,
        "blk.0.ffn_up.weight": w,
        "blk.0.attn_norm.weight": torch.ones(32),
        "token_embd.weight": w,
        "output.weight": w,
    }
    compressed = compress_state_dict(weights)
    kept_dense = {k for k, v in compressed.items() if isinstance(v, torch.Tensor)}
    assert set(compressed) - kept_dense == {"model.layers.0.self_attn.q_proj.weight", "blk.0.ffn_up.weight"}
    assert state_dict_nbytes(compressed) < state_dict_nbytes(weights)
    dense = decompress_state_dict(compressed)
    assert dense.keys() == weights.keys() and dense["blk.0.ffn_up.weight"].shape == w.shape
    assert not is_linear_weight("x.weight", torch.zeros(4, 4, dtype=torch.int8))


def test_compress_state_dict_with_a_backend():
    q = get_weight_quantizer("groupwise8")
    out = compress_state_dict({"a.weight": torch.randn(64, 8)}, quantize_fn=q.quantize)
    assert out["a.weight"].config.bits == 8
