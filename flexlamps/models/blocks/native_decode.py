"""A step's decoder layers in one native call (`flexlamps.kernels.decode_layers`), for the models
and steps whose every layer the Python forward would run on our kernels anyway: decode steps, and
prompt chunks where prompts run on the codes too (`coded_weights.prompts_take_codes`: no fast dense
GEMM for bf16, an AVX2 CPU, or our prompt product on AMX tiles).

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
And each step (`run`, else None): into a dense cache of whole rows (no ring) in the compute dtype,
the positions the keys are written at, no packed segments.
"""

from __future__ import annotations

import ctypes
import weakref

import torch

from flexlamps.kernels import attention as attention_kernel, decode_layers, loader, tile_gemv
from flexlamps.kernels.decode_layers import Kernels, Layer, Matrix, Step
from flexlamps.models.blocks.coded_weights import Int4Twin, prompts_take_codes
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


def _matrix(w, kernel: tile_gemv.TileGemv, probe: torch.Tensor, shape: tuple[int, int]) -> tuple[Matrix, bool] | None:
    """`w` as the decode product takes it (`TileGemv.bind`'s arguments) and whether the prompts'
    product takes it too (`runs_prompt`), or None where the decode product does not."""
    w = w.int4 if isinstance(w, Int4Twin) else w
    if not isinstance(w, (Int4Weight, Int8Weight)) or tuple(w.shape) != shape or not kernel.runs(w, probe):
        return None
    split, plane, kind = tile_gemv.layout_of(w)
    matrix = Matrix(split.kernel_codes.data_ptr(), None if plane is None else plane.data_ptr(), split.scale_zero.data_ptr(), split.shape[0], w.shape[1],
                    split.group_size, tile_rows(split.shape[1]), kind, w.x_bits or kernel.x_bits)
    return matrix, kernel.runs_prompt(w, probe)


def native_loop() -> decode_layers.DecodeLayers | None:
    """This process's native decode loop, or None (`flexlamps.kernels.loader` says why)."""
    return loader.chosen().get("decode_layers")


class NativeDecode:
    """The native loop over one model's layers: `run` a step's rows through all of them."""

    def __init__(self, fwd: DecoderForward, layers: list[Layer], kernels: Kernels, held: list, bf16_dot: bool,
                 prompts: bool):
        self.fwd, self.cfg = fwd, fwd.cfg
        self._layers, self._kernels, self._held = (Layer * len(layers))(*layers), kernels, held
        self._bf16_dot, self.prompts = int(bf16_dot), prompts  # prompts: chunks of several tokens a row too
        self._loop = native_loop()
        self._last = (lambda: None, None)  # the last cache's first keys (weakly) and its pointers

    @classmethod
    def build(cls, fwd, layer_weights: list[dict], dtype: torch.dtype) -> "NativeDecode | None":
        """The loop for these layers' weights (kept by the caller), or None where it does not take them.
        Prompts too where every product of a prompt would run on the codes (`CodesKind`:
        `prompts_take_codes`, and the prompts' product takes every weight)."""
        kernels = loader.chosen()
        parts = [native_loop()] + [kernels.get(name) for name in ("tile_gemv", "elementwise", "attention")]
        cfg = fwd.cfg
        if (None in parts or dtype not in decode_layers.DTYPES or not plain_llama(fwd) or cfg.head_dim % 16
                or cfg.head_dim > attention_kernel.MAX_HEAD_DIM
                or cfg.num_heads // cfg.num_kv_heads > attention_kernel.MAX_GROUP):
            return None  # (the attention kernel's shapes: the Python forward runs torch's attention for others)
        _, gemv, elementwise, attention = parts
        made = [cls._layer(fwd, i, w, gemv, dtype) for i, w in enumerate(layer_weights)]
        if not made or None in made:
            return None
        addresses = Kernels(*(ctypes.cast(fn, ctypes.c_void_p).value for fn in (
            gemv.library.flexlamps_tile_gemv, gemv.library.flexlamps_tile_gemm, elementwise.library.flexlamps_rms_norm,
            elementwise.library.flexlamps_silu_mul, attention.library.flexlamps_attention,
            gemv.library.flexlamps_tile_gemv_group)))
        prompts = all(p for _, p in made) and prompts_take_codes(torch.empty(0, dtype=dtype))
        return cls(fwd, [layer for layer, _ in made], addresses, list(layer_weights), attention.bf16_dot, prompts)

    @staticmethod
    def _layer(fwd, index: int, w: dict, gemv, dtype: torch.dtype) -> tuple[Layer, bool] | None:
        """Layer `index` as the loop takes it and whether its prompts' products run on the codes; None
        where the loop does not take it."""
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
        mats = {name: _matrix(w[name], gemv, probe, shape) if name in w else (Matrix(), True)
                for name, shape in shapes.items()}
        if None in mats.values():
            return None
        layer = Layer(norms[0].data_ptr(), norms[1].data_ptr(), *(m for m, _ in mats.values()),
                      fwd.options[index].scale_for(d), 0)
        return layer, all(p for _, p in mats.values())

    def takes(self, x: torch.Tensor, keys: list[torch.Tensor], geo) -> bool:
        """Whether `run` computes this step: one token a row (or several, where `prompts`) in x's dtype
        (the cache's), causal keys (no packed segments), the rows' slots and positions inside the cache."""
        num_slots, _, capacity, _ = keys[0].shape
        if (x.dim() != 3 or (x.shape[1] != 1 and not self.prompts) or x.dtype != keys[0].dtype or geo is None
                or geo.segments is not None or geo.mask is None or geo.span > capacity
                or len(keys) != len(self._layers)):
            return False
        if geo.first is not None:
            return geo.first + x.shape[0] <= num_slots
        return int(geo.slots.min()) >= 0 and int(geo.slots.max()) < num_slots

    def run(self, x: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], geo, ctx,
            keep: torch.Tensor | None = None) -> torch.Tensor | None:
        """x (n, T, hidden) after every layer, each layer's keys and values (slots, kv_heads,
        capacity, head_dim), contiguous, written as the Python forward writes them (`DenseKVCache`'s
        rows); `geo` its `StepGeometry`, `ctx` the forward's `step_context`. `keep` (n,): the one
        token of each row read after the last layer (a prompt's logits row), whose rows alone that
        layer finishes (the others' keys and values are still written; their rows of x are left
        stale). None where this step is not taken (`takes`): the caller runs the Python forward then."""
        if not self.takes(x, keys, geo):
            return None
        positions = geo.positions.to(torch.int64).contiguous()
        if int(positions.min()) < 0:
            return None
        (n, t, _), cfg = x.shape, self.cfg
        rows = x.reshape(n * t, cfg.hidden_size).contiguous()
        slots = geo.slots.to(torch.int64).contiguous()
        keep = _kept_tokens(keep, n, t)
        cos, sin = (table.reshape(n * t, cfg.head_dim).contiguous() for table in ctx["global"])
        mask = geo.mask.contiguous()  # bool (n, T, span): a byte a key
        k_ptrs, v_ptrs = self._cache_pointers(keys, values)
        step = Step(n, t, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                    keys[0].shape[2], -1 if geo.first is None else geo.first, geo.span, slots.data_ptr(),
                    positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), mask.data_ptr(), ctypes.addressof(k_ptrs),
                    ctypes.addressof(v_ptrs), cfg.norm_eps, decode_layers.DTYPES[x.dtype], self._bf16_dot,
                    torch.get_num_threads(), None if keep is None else keep.data_ptr())
        self._loop.run(self._kernels, step, self._layers, len(self._layers), rows)
        return rows.view(n, t, cfg.hidden_size)

    def _cache_pointers(self, keys: list[torch.Tensor], values: list[torch.Tensor]):
        """Each layer's keys' and values' addresses, made again when the cache differs from the last
        one's (its first layer's keys stand for it)."""
        held, known = self._last
        if held() is not keys[0]:
            if not all(t.is_contiguous() and t.shape == keys[0].shape for t in keys + values):
                raise ValueError("native decode: a cache layer's keys or values are not whole contiguous rows")
            known = ((ctypes.c_void_p * len(keys))(*(t.data_ptr() for t in keys)),
                     (ctypes.c_void_p * len(values))(*(t.data_ptr() for t in values)))
            self._last = (weakref.ref(keys[0]), known)
        return known


def _kept_tokens(keep: torch.Tensor | None, rows: int, tokens: int) -> torch.Tensor | None:
    """`keep` as the loop reads it ((rows,) int64, each a token of its row), or None (every token
    finished) where it is not one token a row of a chunk."""
    if keep is None or tokens == 1 or keep.shape != (rows,):
        return None
    keep = keep.to(torch.int64).contiguous()
    return keep if int(keep.min()) >= 0 and int(keep.max()) < tokens else None
