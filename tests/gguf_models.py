"""Tiny LLaMA GGUF files written for tests, and the logits an engine gives on them."""

from pathlib import Path

import numpy as np
import torch

from flexlamps.engine.executors.in_memory import InMemoryExecutor
from flexlamps.engine.executors.step import Step


def llama_gguf_writer(path: Path, *, hidden: int, ffn: int, layers: int, heads: int, kv_heads: int, vocab: int,
                      context: int = 128):
    """A `gguf.GGUFWriter` for a LLaMA of these sizes (`context`: its trained context, tokens) with its
    metadata and a made-up vocabulary written; the caller adds the tensors, then `finish_gguf`."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("embedding_length", hidden), ("block_count", layers), ("feed_forward_length", ffn),
                       ("attention.head_count", heads), ("attention.head_count_kv", kv_heads),
                       ("vocab_size", vocab), ("context_length", context)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    add_test_vocabulary(w, vocab)
    return w


def add_test_vocabulary(w, vocab: int) -> None:
    """A made-up byte-level BPE vocabulary of `vocab` tokens ("t", "0", "t0", "t3", "t4", ...; one
    merge): enough for the reader to build a tokenizer, so the file runs through `LLM` as a real one."""
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["t", "0", "t0"] + [f"t{i}" for i in range(3, vocab)])
    w.add_token_merges(["t 0"])


def finish_gguf(w, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def random_k_blocks(rng, rows: int, cols: int, type_name: str) -> np.ndarray:
    """Random raw bytes of a Q4_K, Q5_K or Q6_K tensor (every bit pattern of the codes and packed
    scales), with small positive fp16 super-block scales so the weights stay near +-1."""
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[type_name]
    raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    if type_name in ("Q4_K", "Q5_K"):  # d, dmin first
        raw[..., 0:2] = _fp16_bytes(rng.uniform(5e-4, 3e-3, rows * cols // 256)).reshape(rows, -1, 2)
        raw[..., 2:4] = _fp16_bytes(rng.uniform(5e-4, 3e-3, rows * cols // 256)).reshape(rows, -1, 2)
    else:  # d last; the 16 int8 sub-block scales before it
        raw[..., 208:210] = _fp16_bytes(rng.uniform(1e-4, 4e-4, rows * cols // 256)).reshape(rows, -1, 2)
    return raw.reshape(rows, -1)


def write_llama_gguf(path: Path, types, *, seed: int = 0, hidden: int, ffn: int, layers: int, heads: int,
                     kv_heads: int, vocab: int, context: int = 128) -> Path:
    """A LLaMA GGUF of random weights, each tensor of the ggml type `types(name, layer)` names (its
    llama.cpp name without `blk.i.` and `.weight`, e.g. "attn_v", "token_embd", "attn_norm"; layer
    None for the globals; None: f32). K-quant blocks are random bytes (`random_k_blocks`), other
    types the `gguf` package's quantization of N(0, 0.05) values (Q5_1 / Q4_1 rows offset apart,
    so their zero points matter); the embedding table is tied (no output.weight)."""
    import gguf
    from gguf.quants import quantize

    T = gguf.GGMLQuantizationType
    rng = np.random.default_rng(seed)
    w = llama_gguf_writer(path, hidden=hidden, ffn=ffn, layers=layers, heads=heads, kv_heads=kv_heads, vocab=vocab,
                          context=context)

    def add(name: str, layer: int | None, shape: tuple[int, ...]):
        qtype = types(name, layer)
        full = f"{name}.weight" if layer is None else f"blk.{layer}.{name}.weight"
        if qtype in ("Q4_K", "Q5_K", "Q6_K"):
            w.add_tensor(full, random_k_blocks(rng, *shape, qtype), raw_dtype=T[qtype])
            return
        data = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if qtype in ("Q5_1", "Q4_1"):  # rows of their own offsets: zero points that tell the rows apart
            data += rng.uniform(-0.1, 0.1, (shape[0], 1)).astype(np.float32)
        w.add_tensor(full, data if qtype is None else quantize(data, T[qtype]), raw_dtype=T[qtype] if qtype else None)

    add("token_embd", None, (vocab, hidden))
    add("output_norm", None, (hidden,))
    kv = kv_heads * hidden // heads
    for i in range(layers):
        add("attn_norm", i, (hidden,))
        add("ffn_norm", i, (hidden,))
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)),
                            ("ffn_down", (hidden, ffn))):
            add(name, i, shape)
    return finish_gguf(w, path)


def prefill_and_decode_logits(weights, reader, dtype, *, steps: int, feed=None, **executor_kw):
    """Prefill logits (2 x 12 rows), then `steps` decode steps fed `feed` (default: their own
    greedy tokens): (prefill logits, step logits, greedy tokens of every step)."""
    ex = InMemoryExecutor(reader.config, weights, dtype, **executor_kw)
    ids = torch.randint(0, reader.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = ex.new_cache(2, 12 + steps + 2)
    prefill = ex.forward_steps(cache, [Step(ids, torch.arange(12).expand(2, 12), torch.arange(2))])[0]
    outs, tokens = [], [prefill[:, -1].argmax(-1)]
    for i in range(steps):
        fed = tokens[-1] if feed is None else feed[i]
        out = ex.forward_steps(cache, [Step(fed[:, None], torch.full((2, 1), 12 + i), torch.arange(2))])[0]
        outs.append(out[:, -1])
        tokens.append(out[:, -1].argmax(-1))
    return prefill, torch.stack(outs), torch.stack(tokens)


def assert_as_good_as_a_bf16_copy(got, bf16_copy, ref) -> None:
    """`got` (from `prefill_and_decode_logits`, fed the reference's tokens) is within 10% of the
    largest reference logit and within twice a dense bf16 copy's own error, and its greedy picks
    agree with the reference at least as often as the copy's, less one."""
    for mine, copy, want in zip(got[:2], bf16_copy[:2], ref[:2]):
        err, copy_err = (mine - want).abs().max().item(), (copy - want).abs().max().item()
        assert err <= 0.1 * want.abs().max().item() and err <= 2 * copy_err, (err, copy_err)
    assert (got[2] == ref[2]).sum() >= (bf16_copy[2] == ref[2]).sum() - 1


def assert_cache_gives_back_the_same_weights(path: Path, cache_dir: Path) -> dict:
    """Loads `path` in bf16 with its blocks in place twice (the second from the weight cache):
    every weight comes back of the same kind and with the same values; returns the second load."""
    from flexlamps.models.loading.checkpoint import GGUFReader
    from flexlamps.models.loading.weight_cache import load_weights

    first, second = (load_weights(GGUFReader(path), torch.bfloat16, int4_in_place=True, cache_dir=cache_dir)
                     for _ in range(2))
    assert first.keys() == second.keys()
    for name, w in first.items():
        assert type(second[name]) is type(w), name
        plain = type(w) is torch.Tensor
        assert torch.equal(second[name] if plain else second[name].dequantize(), w if plain else w.dequantize()), name
    return second


def assert_gguf_is_the_hf_model(path: Path, folder: Path, cache_dir: Path, steps: int = 8) -> None:
    """The GGUF at `path` loads as the HF checkpoint in `folder` (float32): the same ModelConfig,
    every weight equal (a Gemma norm: its `1 + w`, the value its norm scales by), and bit-equal
    prefill and `steps` decode logits."""
    from flexlamps.models.loading.checkpoint import GGUFReader, read_all
    from flexlamps.models.loading.registry import open_checkpoint
    from flexlamps.models.weight_specs import weight_specs

    gguf_reader, hf_reader = GGUFReader(path, cache_dir=cache_dir), open_checkpoint(folder)
    differ = {f: (getattr(gguf_reader.config, f), getattr(hf_reader.config, f)) for f in vars(hf_reader.config)
              if getattr(gguf_reader.config, f) != getattr(hf_reader.config, f)}
    assert not differ, differ
    ours, want = read_all(gguf_reader, torch.float32), read_all(hf_reader, torch.float32)
    plus_one = hf_reader.config.decoder.norm_plus_one
    for spec in weight_specs(hf_reader.config):
        a, b = ours[spec.name], want[spec.name]
        if hasattr(b, "dequantize"):
            a, b = a.dequantize(), b.dequantize()
        if plus_one and spec.role == "norm":
            a, b = 1.0 + a, 1.0 + b
        assert torch.equal(a, b), spec.name
    got = prefill_and_decode_logits(ours, gguf_reader, torch.float32, steps=steps)
    ref = prefill_and_decode_logits(want, hf_reader, torch.float32, steps=steps)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
