"""GGUF checkpoints of random weights in a decoder's shape: the benchmarks' fp16 files to run
against llama.cpp, and the tests' small files in any ggml block type (the one writer of both).

A `Shape` is an architecture ("llama" or "qwen2") and its sizes; `SHAPES` names a few real
models' (TinyLlama-1.1B, Llama-3.2-1B, Qwen2.5-0.5B, SmolLM2-360M), and `parse_shape` takes one of
them with any size overridden ("qwen2.5-0.5b:vocab=32002,layers=4"), so a benchmark runs shapes
nobody tuned for: grouped-query attention, head dims apart from hidden / heads, q/k/v biases,
input sizes that are not multiples of 256 (llama-quantize then falls back from the K-quants to
Q5_0 / Q8_0 for those matrices) and row counts that are not multiples of a kernel's tile.

`write_random_gguf` writes one tensor at a time, so a 1B checkpoint is written in a few hundred MB
of memory: values as a `Values` recipe draws them (`BENCH`: N(0, 0.05) matrices in fp16, norms near
1; `SMALL_NORMAL`: every tensor N(0, 0.05) in f32, the tests' files), matrices in the ggml type a
`types` hook names (K-quants as random blocks, others quantized by `gguf`), the embedding table
tied to the head. Tests import it from here (scripts do not import tests/).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Shape:
    """A decoder's architecture and sizes (head_dim 0: hidden / heads)."""
    arch: str
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 0
    qkv_bias: int = 0
    rope_theta: float = 10000.0
    context: int = 2048

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads


SHAPES = {
    "tinyllama-1.1b": Shape("llama", 2048, 5632, 22, 32, 4, 32000),
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 128256, rope_theta=500000.0),
    "qwen2.5-0.5b": Shape("qwen2", 896, 4864, 24, 14, 2, 151936, qkv_bias=1, rope_theta=1000000.0),
    "smollm2-360m": Shape("llama", 960, 2560, 32, 15, 5, 49152, rope_theta=100000.0),
}
ARCHS = ("llama", "qwen2")


def parse_shape(text: str) -> tuple[str, Shape]:
    """A file-name-safe label and the Shape of "NAME" or "NAME:field=value,...". Raises ValueError
    in one line naming the wrong part and what is allowed."""
    name, _, overrides = text.partition(":")
    if name not in SHAPES:
        raise ValueError(f"--shape {text}: no shape named {name!r} (there are {', '.join(SHAPES)})")
    fields = {f.name: f.type for f in dataclasses.fields(Shape)}
    changes = {}
    for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        if key not in fields or key == "arch" and value not in ARCHS:
            raise ValueError(f"--shape {text}: {item!r} is not a field=value of {', '.join(fields)} "
                             f"(arch one of {', '.join(ARCHS)})")
        try:
            changes[key] = value if key == "arch" else float(value) if key == "rope_theta" else int(value)
        except ValueError:
            raise ValueError(f"--shape {text}: {key} takes a number, got {value!r}") from None
    shape = dataclasses.replace(SHAPES[name], **changes)
    if shape.heads % shape.kv_heads or shape.hidden % 32 or shape.ffn % 32:
        raise ValueError(f"--shape {text}: heads must be a multiple of kv_heads, hidden and ffn of 32 (GGUF blocks)")
    label = name + "".join(f"-{k}{v}" for k, v in changes.items())
    return label, shape


def _tensors(shape: Shape):
    """(name, numpy shape, bias or norm) of every tensor, in the file's order."""
    s, q, kv = shape, shape.heads * shape.dim, shape.kv_heads * shape.dim
    yield "token_embd.weight", (s.vocab, s.hidden), False
    yield "output_norm.weight", (s.hidden,), True
    for i in range(s.layers):
        mats = [("attn_q", (q, s.hidden)), ("attn_k", (kv, s.hidden)), ("attn_v", (kv, s.hidden)),
                ("attn_output", (s.hidden, q)), ("ffn_gate", (s.ffn, s.hidden)), ("ffn_up", (s.ffn, s.hidden)),
                ("ffn_down", (s.hidden, s.ffn))]
        yield f"blk.{i}.attn_norm.weight", (s.hidden,), True
        yield f"blk.{i}.ffn_norm.weight", (s.hidden,), True
        for name, dims in mats:
            yield f"blk.{i}.{name}.weight", dims, False
            if s.qkv_bias and name in ("attn_q", "attn_k", "attn_v"):
                yield f"blk.{i}.{name}.bias", dims[:1], True


def _bench_values(rng, name: str, dims: tuple[int, ...]) -> np.ndarray:
    """Norms near 1 and biases small (f32), matrices N(0, 0.05) in fp16."""
    if name.endswith("norm.weight"):
        return (1.0 + 0.05 * rng.standard_normal(dims)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.02 * rng.standard_normal(dims)).astype(np.float32)
    return (rng.standard_normal(dims, dtype=np.float32) * 0.05).astype(np.float16)


def _small_normal_values(rng, name: str, dims: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(dims) * 0.05).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Values:
    """How a file's values are drawn: `draw(rng, file name, dims)`, held as `matrix_dtype` where a
    matrix stays unquantized (vectors: f32)."""
    draw: Callable[..., np.ndarray]
    matrix_dtype: type


BENCH = Values(_bench_values, np.float16)
SMALL_NORMAL = Values(_small_normal_values, np.float32)
K_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def random_k_blocks(rng, rows: int, cols: int, type_name: str) -> np.ndarray:
    """Random raw bytes of a Q4_K, Q5_K or Q6_K tensor (every bit pattern of the codes and packed
    scales), with small positive fp16 super-block scales so the weights stay near +-1."""
    raw = rng.integers(0, 256, (rows, cols // 256, K_BLOCK_BYTES[type_name]), dtype=np.uint8)
    if type_name in ("Q4_K", "Q5_K"):  # d, dmin first
        raw[..., 0:2] = _fp16_bytes(rng.uniform(5e-4, 3e-3, rows * cols // 256)).reshape(rows, -1, 2)
        raw[..., 2:4] = _fp16_bytes(rng.uniform(5e-4, 3e-3, rows * cols // 256)).reshape(rows, -1, 2)
    else:  # d last; the 16 int8 sub-block scales before it
        raw[..., 208:210] = _fp16_bytes(rng.uniform(1e-4, 4e-4, rows * cols // 256)).reshape(rows, -1, 2)
    return raw.reshape(rows, -1)


def _stored(rng, name: str, dims: tuple[int, ...], qtype: str | None, values: Values) -> np.ndarray:
    """A tensor's bytes as the file holds them: drawn by `values`, or a matrix in the ggml type
    `qtype` (K-quants as random blocks; Q4_1 / Q5_1 rows offset apart, so their zero points matter)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if qtype in K_BLOCK_BYTES:
        return random_k_blocks(rng, *dims, qtype)
    data = values.draw(rng, name, dims)
    if qtype in ("Q4_1", "Q5_1"):
        data = data.astype(np.float32) + rng.uniform(-0.1, 0.1, (dims[0], 1)).astype(np.float32)
    if qtype is None:
        return data.astype(np.float32 if len(dims) == 1 else values.matrix_dtype)
    return quantize(data.astype(np.float32), GGMLQuantizationType[qtype])


def add_made_up_vocabulary(w, vocab: int) -> None:
    """A made-up byte-level BPE vocabulary of `vocab` tokens ("t", "0", "t0", "t3", "t4", ...; one
    merge): enough for the reader to build a tokenizer, so the file runs through `LLM` as a real one."""
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["t", "0", "t0"] + [f"t{i}" for i in range(3, vocab)])
    w.add_token_merges(["t 0"])


def gguf_writer(path: Path, shape: Shape):
    """A `gguf.GGUFWriter` at `path` with `shape`'s metadata and a made-up vocabulary written; the
    caller adds the tensors (or `write_random_gguf` streams them)."""
    import gguf

    a, w = shape.arch, gguf.GGUFWriter(str(path), shape.arch)
    for key, value in (("embedding_length", shape.hidden), ("block_count", shape.layers),
                       ("feed_forward_length", shape.ffn), ("attention.head_count", shape.heads),
                       ("attention.head_count_kv", shape.kv_heads), ("vocab_size", shape.vocab),
                       ("context_length", shape.context), ("attention.key_length", shape.dim),
                       ("attention.value_length", shape.dim)):
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_theta)
    add_made_up_vocabulary(w, shape.vocab)
    return w


def write_random_gguf(path: Path, shape: Shape, seed: int = 0, types=None, values: Values = BENCH) -> Path:
    """A GGUF of random weights in `shape` at `path` (see the module's docstring): matrices
    unquantized, or in the ggml type `types(name)` names for a matrix (its file name, e.g.
    "blk.0.attn_v.weight"; None: unquantized), as tests write small quantized files without
    llama-quantize; values drawn by `values`."""
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    w = gguf_writer(path, shape)
    tensors = [(name, dims, None if f32 or types is None else types(name)) for name, dims, f32 in _tensors(shape)]
    for name, dims, qtype in tensors:
        if qtype is not None:
            raw = gguf.GGMLQuantizationType[qtype]
            nbytes = int(np.prod(quant_shape_to_byte_shape(dims, raw)))
            w.add_tensor_info(name, quant_shape_to_byte_shape(dims, raw), np.dtype(np.uint8), nbytes, raw_dtype=raw)
        else:
            dtype = np.dtype(np.float32 if len(dims) == 1 else values.matrix_dtype)
            w.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims, qtype in tensors:
        w.write_tensor_data(_stored(rng, name, dims, qtype, values))
    w.close()
    return path
