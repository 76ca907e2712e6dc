"""fp16 GGUF checkpoints of random weights in a model's shape, for benchmarks against llama.cpp.

A `Shape` is an architecture ("llama" or "qwen2") and its sizes; `SHAPES` names a few real
models' (TinyLlama-1.1B, Llama-3.2-1B, Qwen2.5-0.5B, SmolLM2-360M), and `parse_shape` takes one of
them with any size overridden ("qwen2.5-0.5b:vocab=32002,layers=4"), so a benchmark runs shapes
nobody tuned for: grouped-query attention, head dims apart from hidden / heads, q/k/v biases,
input sizes that are not multiples of 256 (llama-quantize then falls back from the K-quants to
Q5_0 / Q8_0 for those matrices) and row counts that are not multiples of a kernel's tile.

`write_random_gguf` writes one tensor at a time (N(0, 0.05) weights in fp16, norms in f32, the
embedding table tied to the head), so a 1B checkpoint is written in a few hundred MB of memory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

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


def _values(rng, name: str, dims: tuple[int, ...]) -> np.ndarray:
    """A tensor's random values: norms near 1 and biases small (f32), matrices N(0, 0.05) in fp16."""
    if name.endswith("norm.weight"):
        return (1.0 + 0.05 * rng.standard_normal(dims)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.02 * rng.standard_normal(dims)).astype(np.float32)
    return (rng.standard_normal(dims, dtype=np.float32) * 0.05).astype(np.float16)


def _stored(rng, name: str, dims: tuple[int, ...], qtype: str | None) -> np.ndarray:
    """A tensor's bytes as the file holds them: `_values`, or a matrix in the ggml type `qtype`
    (K-quants as random blocks, `tests.gguf_models.random_k_blocks`; others quantized by `gguf`)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize
    from tests.gguf_models import random_k_blocks

    if qtype is None or len(dims) == 1:
        return _values(rng, name, dims)
    if qtype.endswith("_K"):
        return random_k_blocks(rng, *dims, qtype)
    return quantize(_values(rng, name, dims).astype(np.float32), GGMLQuantizationType[qtype])


def write_random_gguf(path: Path, shape: Shape, seed: int = 0, types=None) -> Path:
    """A GGUF of random weights in `shape` at `path` (see the module's docstring): matrices in fp16,
    or in the ggml type `types(name)` names for a matrix (its file name, e.g. "blk.0.attn_v.weight";
    None: fp16), as tests write small quantized files without llama-quantize."""
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    sys_path_tests()
    from tests.gguf_models import add_test_vocabulary

    a, w = shape.arch, gguf.GGUFWriter(str(path), shape.arch)
    for key, value in (("embedding_length", shape.hidden), ("block_count", shape.layers),
                       ("feed_forward_length", shape.ffn), ("attention.head_count", shape.heads),
                       ("attention.head_count_kv", shape.kv_heads), ("vocab_size", shape.vocab),
                       ("context_length", shape.context), ("attention.key_length", shape.dim),
                       ("attention.value_length", shape.dim)):
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_theta)
    add_test_vocabulary(w, shape.vocab)
    tensors = [(name, dims, None if f32 or types is None else types(name)) for name, dims, f32 in _tensors(shape)]
    for name, dims, qtype in tensors:
        if qtype is not None:
            raw = gguf.GGMLQuantizationType[qtype]
            nbytes = int(np.prod(quant_shape_to_byte_shape(dims, raw)))
            w.add_tensor_info(name, quant_shape_to_byte_shape(dims, raw), np.dtype(np.uint8), nbytes, raw_dtype=raw)
        else:
            dtype = np.dtype(np.float32 if len(dims) == 1 else np.float16)
            w.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims, qtype in tensors:
        w.write_tensor_data(_stored(rng, name, dims, qtype))
    w.close()
    return path


def sys_path_tests() -> None:
    """The repository on sys.path, so `tests.gguf_models` imports from a script."""
    import sys

    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
