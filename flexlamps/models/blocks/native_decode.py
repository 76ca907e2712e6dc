"""A decode step's decoder layers in one native call (`flexlamps.kernels.decode_layers`), for the
models and steps whose every layer the Python forward would run on our kernels anyway.

`DecoderForward.layer` makes ~10 kernel calls a layer with ~33 torch ops between them; on a
SmolLM2 decode step that Python was ~40% of the step at batch 1, and it grows with the layers.
The native loop makes the same kernel calls on the same values in the same order (the product
of each weight's codes, the norms, the SwiGLU, the attention) and does the rest (rotation, cache
writes, residual adds) with torch's roundings, so every row gets the Python forward's bits: the
offloaded executor, which keeps the Python forward, and a scheduled run still equal this one.

What it takes (`NativeDecode.build`, once per model; else the Python forward runs):
- the plain LLaMA layer (`DecoderForward`: pre-norms, SwiGLU, half-split rope over the whole
  head, no biases, q/k norms, soft-capping, sinks or windows), in bf16;
- every layer's gate/up stacked (`fuse_weights`), and q/k/v stacked or apart (of different kinds:
  a Q4_K_M's Q6_K v), each product a 4-bit or int8 weight the decode kernel takes (a twin's
  codes), the norms and attention on our kernels.
And each step (`run`, else None): one token a row, into a dense cache of whole rows (no ring)
in the compute dtype, the positions the keys are written at, no packed segments.
"""

from __future__ import annotations

import ctypes
import weakref

import torch

from flexlamps.kernels import decode_layers, loader, tile_gemv
from flexlamps.kernels.decode_layers import Kernels, Layer, Matrix, Step
from flexlamps.models.blocks.coded_weights import Int4Twin
from flexlamps.models.blocks.decoder import DecoderForward
from quant.int4_tiles import tile_rows
from quant.int4_weight import Int4Weight
from quant.int8_weight import Int8Weight

# a layer's weights the loop takes: q, k and v stacked (`fuse_weights`), or apart where their kinds differ
_COMMON = frozenset({"attn_norm", "mlp_norm", "o_proj", "gate_up_proj", "down_proj"})
LAYER_WEIGHTS = (_COMMON | {"qkv_proj"}, _COMMON | {"q_proj", "k_proj", "v_proj"})


def plain_llama(fwd) -> bool:
    """Whether every layer of `fwd` is the plain LLaMA layer the native loop computes."""
    if type(fwd) is not DecoderForward:
        return False
    cfg = fwd.cfg
    att, dec = cfg.attention, cfg.decoder
    return (cfg.activation == "silu" and dec.pre_norms and not dec.sandwich_norms and not dec.norm_plus_one
            and dec.residual_scale == 1.0 and not att.qk_norm and not att.rope_interleaved
            and fwd.rotary_dim == cfg.head_dim and cfg.head_dim <= decode_layers.MAX_HEAD_DIM
            and all(kind == "global" for kind in fwd.layer_rope)
            and all(opts.fused and opts.window is None for opts in fwd.options))


def _matrix(w, kernel: tile_gemv.TileGemv, probe: torch.Tensor, shape: tuple[int, int]) -> Matrix | None:
    """`w` as the decode product takes it (`TileGemv.bind`'s arguments), or None where it does not."""
    w = w.int4 if isinstance(w, Int4Twin) else w
    if not isinstance(w, (Int4Weight, Int8Weight)) or tuple(w.shape) != shape or not kernel.runs(w, probe):
        return None
    int8 = isinstance(w, Int8Weight)
    split = w.split if int8 else w
    fifth = w.fifth if int8 else None
    kind = tile_gemv.KIND_INT5 if fifth is not None else tile_gemv.KIND_INT8_SPLIT if int8 else tile_gemv.KIND_INT4
    return Matrix(split.kernel_codes.data_ptr(), None if fifth is None else fifth.data_ptr(), split.scale_zero.data_ptr(),
                  split.shape[0], w.shape[1], split.group_size, tile_rows(split.shape[1]), kind, w.x_bits or kernel.x_bits)


def native_loop() -> decode_layers.DecodeLayers | None:
    """This process's native decode loop, or None (`flexlamps.kernels.loader` says why)."""
    return loader.chosen().get("decode_layers")


class NativeDecode:
    """The native loop over one model's layers: `run` a decode step's rows through all of them."""

    def __init__(self, fwd: DecoderForward, layers: ctypes.Array, kernels: Kernels, held: list, bf16_dot: bool):
        self.fwd, self.cfg = fwd, fwd.cfg
        self._layers, self._kernels, self._held, self._bf16_dot = layers, kernels, held, int(bf16_dot)
        self._loop = native_loop()
        self._last = (lambda: None, None)  # the last cache's first keys (weakly) and its pointers

    @classmethod
    def build(cls, fwd, layer_weights: list[dict], dtype: torch.dtype) -> "NativeDecode | None":
        """The loop for these layers' weights (kept by the caller), or None where it does not take them."""
        kernels = loader.chosen()
        parts = [native_loop()] + [kernels.get(name) for name in ("tile_gemv", "elementwise", "attention")]
        if None in parts or dtype not in decode_layers.DTYPES or not plain_llama(fwd):
            return None
        _, gemv, elementwise, attention = parts
        cfg = fwd.cfg
        layers = [cls._layer(fwd, i, w, gemv, dtype) for i, w in enumerate(layer_weights)]
        if not layers or None in layers:
            return None
        addresses = Kernels(*(ctypes.cast(fn, ctypes.c_void_p).value for fn in (
            gemv.library.flexlamps_tile_gemv, elementwise.library.flexlamps_rms_norm,
            elementwise.library.flexlamps_silu_mul, attention.library.flexlamps_attention)))
        if cfg.num_heads // cfg.num_kv_heads > 16 or cfg.head_dim % 16:  # the attention kernel's shapes
            return None
        return cls(fwd, (Layer * len(layers))(*layers), addresses, list(layer_weights), attention.bf16_dot)

    @staticmethod
    def _layer(fwd, index: int, w: dict, gemv, dtype: torch.dtype) -> Layer | None:
        cfg = fwd.cfg
        hidden, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
        heads, kv = cfg.num_heads, cfg.num_kv_heads
        if set(w) not in LAYER_WEIGHTS:
            return None
        norms = [w["attn_norm"], w["mlp_norm"]]
        if not all(isinstance(t, torch.Tensor) and t.dtype == dtype and t.is_contiguous() and t.shape == (hidden,)
                   and t.device.type == "cpu" for t in norms):
            return None
        probe = torch.empty(1, 1, hidden, dtype=dtype)
        shapes = {"qkv_proj": ((heads + 2 * kv) * d, hidden), "o_proj": (hidden, heads * d),
                  "gate_up_proj": (2 * inter, hidden), "down_proj": (hidden, inter), "q_proj": (heads * d, hidden),
                  "k_proj": (kv * d, hidden), "v_proj": (kv * d, hidden)}
        mats = {name: _matrix(w[name], gemv, probe, shape) if name in w else Matrix() for name, shape in shapes.items()}
        if None in mats.values():
            return None
        return Layer(norms[0].data_ptr(), norms[1].data_ptr(), *mats.values(), fwd.options[index].scale_for(d), 0)

    def takes(self, x: torch.Tensor, keys: list[torch.Tensor], geo) -> bool:
        """Whether `run` computes this step: one token a row in x's dtype (the cache's), causal keys
        (no packed segments), the rows' slots and positions inside the cache."""
        num_slots, _, capacity, _ = keys[0].shape
        if (x.dim() != 3 or x.shape[1] != 1 or x.dtype != keys[0].dtype or geo is None or geo.segments is not None
                or geo.fresh or geo.mask is None or geo.span > capacity or len(keys) != len(self._layers)):
            return False
        if geo.first is not None:
            return geo.first + x.shape[0] <= num_slots
        return int(geo.slots.min()) >= 0 and int(geo.slots.max()) < num_slots

    def run(self, x: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], geo, ctx) -> torch.Tensor | None:
        """x (n, 1, hidden) after every layer, each layer's keys and values (slots, kv_heads,
        capacity, head_dim), contiguous, written as the Python forward writes them (`DenseKVCache`'s
        rows); `geo` its `StepGeometry`, `ctx` the forward's `step_context`. None where this step is
        not taken (`takes`): the caller runs the Python forward then."""
        if not self.takes(x, keys, geo):
            return None
        positions = geo.positions[:, 0].contiguous()
        if int(positions.min()) < 0:
            return None
        n, cfg = x.shape[0], self.cfg
        rows = x.reshape(n, cfg.hidden_size).contiguous()
        slots = geo.slots.to(torch.int64).contiguous()
        cos, sin = (t.reshape(n, cfg.head_dim).contiguous() for t in ctx["global"])
        mask = geo.mask.contiguous() if geo.first is not None else None  # bool: a byte a key
        k_ptrs, v_ptrs, ones = self._cache_pointers(keys, values)
        step = Step(n, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                    keys[0].shape[2], -1 if geo.first is None else geo.first, geo.span, geo.span, slots.data_ptr(),
                    positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), None if mask is None else mask.data_ptr(),
                    ones.data_ptr(), ctypes.addressof(k_ptrs), ctypes.addressof(v_ptrs), cfg.norm_eps,
                    decode_layers.DTYPES[x.dtype], self._bf16_dot, torch.get_num_threads())
        self._loop.run(self._kernels, step, self._layers, len(self._layers), rows)
        return rows.view(n, 1, cfg.hidden_size)

    def _cache_pointers(self, keys: list[torch.Tensor], values: list[torch.Tensor]):
        """Each layer's keys' and values' addresses, and `capacity` ones (a row's keys all visible),
        made again when the cache differs from the last one's (its first layer's keys stand for it)."""
        held, known = self._last
        if held() is not keys[0]:
            if not all(t.is_contiguous() and t.shape == keys[0].shape for t in keys + values):
                raise ValueError("native decode: a cache layer's keys or values are not whole contiguous rows")
            known = ((ctypes.c_void_p * len(keys))(*(t.data_ptr() for t in keys)),
                     (ctypes.c_void_p * len(values))(*(t.data_ptr() for t in values)),
                     torch.ones(keys[0].shape[2], dtype=torch.uint8))
            self._last = (weakref.ref(keys[0]), known)
        return known
