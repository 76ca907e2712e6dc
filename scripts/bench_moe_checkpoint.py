"""The MoE bench's model: a random Qwen3-MoE-shaped checkpoint in bf16, written once into a cache
folder as an HF safetensors folder (what flexlamps and Accelerate load) and as a GGUF of the same
weights under llama.cpp's qwen3moe names (what llama.cpp loads), and reused after.

Full: Qwen3-30B-A3B's layer (hidden 2048, 128 experts of width 768, top-8, 32 query / 4 KV heads
of 128) in 4 layers with a 32768-token vocabulary: 5.1 GB. Small: a 55 MB model of the same kind
(8 layers of 32 experts, top-4),
for a quick check. Tensors are written one at a time, so building needs no more memory than the
largest one (a layer's stacked experts, 400 MB, for the GGUF).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

SHAPES = {
    "full": dict(hidden_size=2048, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                 moe_intermediate_size=768, intermediate_size=6144, num_experts=128, num_experts_per_tok=8,
                 vocab_size=32768),
    "small": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  moe_intermediate_size=128, intermediate_size=512, num_experts=32, num_experts_per_tok=4,
                  vocab_size=4096),
}
SHARD_BYTES = 1 << 30
_STD = 0.02  # initializer_range: activations stay O(1) through the layers


def hf_config(size: str) -> dict:
    s = SHAPES[size]
    return dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", torch_dtype="bfloat16",
                max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1e6, norm_topk_prob=True,
                decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False, attention_bias=False,
                bos_token_id=0, eos_token_id=1, **s)


def _tensor_shapes(cfg: dict):
    """(HF name, shape) of every tensor, in the order an HF checkpoint lists a layer's."""
    h, f, hd = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield from ((p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                    (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                    (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
                    (p + "mlp.gate.weight", (cfg["num_experts"], h)))
        for e in range(cfg["num_experts"]):
            x = p + f"mlp.experts.{e}."
            yield from ((x + "gate_proj.weight", (f, h)), (x + "up_proj.weight", (f, h)),
                        (x + "down_proj.weight", (h, f)))
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (cfg["vocab_size"], h)


def _random(name: str, shape, gen: torch.Generator) -> torch.Tensor:
    if len(shape) == 1:  # norms: ones, as trained models' are near
        return torch.ones(shape, dtype=torch.bfloat16)
    return (torch.randn(shape, generator=gen) * _STD).to(torch.bfloat16)


def _write_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer over tokens "t0" ... (the bench feeds token ids; loaders want one)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t2"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t0", "eos_token": "t1"}))


def build_hf(folder: Path, size: str, seed: int = 0) -> Path:
    """The HF folder (config, tokenizer, safetensors shards and their index), unless complete."""
    from safetensors.torch import save_file

    if (folder / "model.safetensors.index.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(size)
    gen = torch.Generator().manual_seed(seed)
    shard, shard_bytes, weight_map, shards = {}, 0, {}, []

    def flush():
        name = f"model-{len(shards) + 1:05d}.safetensors"
        save_file(shard, str(folder / (name + ".tmp")), metadata={"format": "pt"})
        os.replace(folder / (name + ".tmp"), folder / name)
        shards.append(name)
        weight_map.update({k: name for k in shard})

    for name, shape in _tensor_shapes(cfg):
        shard[name] = _random(name, shape, gen)
        shard_bytes += shard[name].numel() * 2
        if shard_bytes >= SHARD_BYTES:
            flush()
            shard, shard_bytes = {}, 0
    if shard:
        flush()
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    _write_tokenizer(folder, cfg["vocab_size"])
    total = sum((folder / s).stat().st_size for s in shards)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))  # last: marks it complete
    return folder


_GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
               "mlp.gate.weight": "ffn_gate_inp.weight"}


def _gguf_tensors(folder: Path, cfg: dict):
    """(GGUF name, numpy array: bf16 bits as uint16, norms f32) in llama.cpp's qwen3moe layout, experts
    stacked (E, out, in)."""
    from safetensors import safe_open

    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    handles = {s: safe_open(str(folder / s), "pt") for s in set(index.values())}

    def get(name):
        t = handles[index[name]].get_tensor(name)
        if t.dim() == 1:  # norms in f32, as llama.cpp's converter writes them (its ops take no bf16 there)
            return t.float().numpy()
        return t.view(torch.int16).numpy().view(np.uint16)

    yield "token_embd.weight", get("model.embed_tokens.weight")
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for hf_name, gguf_name in _GGUF_LAYER.items():
            yield f"blk.{i}.{gguf_name}", get(p + hf_name)
        for proj in ("gate", "up", "down"):
            yield f"blk.{i}.ffn_{proj}_exps.weight", np.stack(
                [get(p + f"mlp.experts.{e}.{proj}_proj.weight") for e in range(cfg["num_experts"])])
    yield "output_norm.weight", get("model.norm.weight")
    yield "output.weight", get("lm_head.weight")


def _gguf_metadata(w, cfg: dict) -> None:
    a = "qwen3moe"
    for key, value in (("context_length", cfg["max_position_embeddings"]), ("embedding_length", cfg["hidden_size"]),
                       ("block_count", cfg["num_hidden_layers"]), ("feed_forward_length", cfg["intermediate_size"]),
                       ("attention.head_count", cfg["num_attention_heads"]),
                       ("attention.head_count_kv", cfg["num_key_value_heads"]),
                       ("attention.key_length", cfg["head_dim"]), ("attention.value_length", cfg["head_dim"]),
                       ("expert_count", cfg["num_experts"]), ("expert_used_count", cfg["num_experts_per_tok"]),
                       ("expert_feed_forward_length", cfg["moe_intermediate_size"])):
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_float32(f"{a}.rope.freq_base", cfg["rope_theta"])
    w.add_tokenizer_model("none")  # token ids only: the bench never tokenizes text
    w.add_uint32(f"{a}.vocab_size", cfg["vocab_size"])  # what llama.cpp sizes a "none" vocabulary by
    w.add_token_list([f"t{i}" for i in range(cfg["vocab_size"])])


def build_gguf(folder: Path, path: Path) -> Path:
    """The same weights as a bf16 GGUF (written tensor by tensor), unless already there."""
    import gguf

    if path.exists():
        return path
    cfg = json.loads((folder / "config.json").read_text())
    tmp = path.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "qwen3moe")
    _gguf_metadata(w, cfg)
    for name, array in _gguf_tensors(folder, cfg):  # shapes first: the header lists every tensor
        kind = gguf.GGMLQuantizationType.BF16 if array.dtype == np.uint16 else gguf.GGMLQuantizationType.F32
        w.add_tensor_info(name, array.shape, array.dtype, array.nbytes, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, array in _gguf_tensors(folder, cfg):
        w.write_tensor_data(array)
    w.close()
    os.replace(tmp, path)
    return path
