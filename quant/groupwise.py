"""Group-wise min-max quantization: `quantize` / `dequantize`, always as a pair.

FlexGen's scheme: split a tensor into groups of `group_size` consecutive elements along
`group_dim`; per group store a step (scale) and, when asymmetric, its min; each element
becomes round((x - min) / step), a code in [0, 2**bits - 1]. Dequantization is
`code * step + min`, the only part on the decode critical path, so it is written as a few
large vectorized torch ops over a `[outer, groups, group_size, inner]` view (no transpose,
no per-group loop). Imports torch only.
"""
from __future__ import annotations

import threading

import torch

from quant.config import QuantConfig
from quant.pack import pack_nibbles, unpack_nibbles, unpack_nibbles_range
from quant.qtensor import GroupLayout, QTensor, dtype_name


def quantize(tensor: torch.Tensor, config: QuantConfig) -> QTensor:
    """Compress `tensor` (fp32/fp16/bf16, any shape, any device) group-wise.

    A grouped dim that is not a multiple of `group_size` gets a shorter last group
    (padded internally with its own last value, so padding never widens a group's range).
    Constant groups get step 0 and round-trip exactly. Inputs must be finite.
    """
    dtype_name(tensor.dtype)  # raises a clear error for int/bool/fp8 inputs
    layout = GroupLayout.of(tuple(tensor.shape), config)
    codes, scales, mins = quantize_grouped(tensor.reshape(layout.outer, layout.length, layout.inner), config)
    flat = codes.reshape(-1)
    packed = pack_nibbles(flat) if config.bits == 4 else flat
    return QTensor(codes=packed, scales=scales, mins=mins, shape=tuple(tensor.shape), dtype=tensor.dtype, config=config)


def quantize_grouped(x: torch.Tensor, config: QuantConfig):
    """Quantize a `[outer, length, inner]` view grouped along dim 1.

    Returns:
        codes: uint8 `[outer, length, inner]`, unpacked.
        scales: `[outer, groups, 1, inner]` in `x.dtype` (a QTensor of it if param_bits=8).
        mins: same, or None when symmetric.
    """
    outer, length, inner = x.shape
    layout = GroupLayout(outer, length, inner, config.group_size)
    store_dtype = x.dtype
    xf = x.float()
    if length == 0 or outer * inner == 0:
        empty = x.new_empty((outer, layout.num_groups, 1, inner))
        return x.new_empty(x.shape, dtype=torch.uint8), empty, (None if config.symmetric else empty.clone())
    pad = layout.padded_length - length
    if pad:  # edge padding: repeats the last element, so min/max are unchanged
        xf = torch.cat([xf, xf[:, -1:, :].expand(outer, pad, inner)], dim=1)
    groups = xf.view(outer, layout.num_groups, config.group_size, inner)  # (O, G, gs, I)
    if config.symmetric:
        mid = 1 << (config.bits - 1)
        step = _round_up(groups.abs().amax(dim=2, keepdim=True) / (mid - 1), store_dtype)
        step, step_used = _store_params(step, config)
        codes = torch.round(groups / _nonzero(step_used)) + mid
        mins = None
    else:
        lo = groups.amin(dim=2, keepdim=True)  # exact in store_dtype: it is one of the inputs
        hi = groups.amax(dim=2, keepdim=True)
        mins, lo = _store_params(lo.to(store_dtype), config)
        # hi/n - lo/n instead of (hi-lo)/n: no overflow for ranges near the dtype's max. An 8-bit
        # decoded min can sit above a narrow group's max; the step is then 0, never negative.
        step = _round_up((hi / config.max_code - lo / config.max_code).clamp_min(0), store_dtype)
        step, step_used = _store_params(step, config)
        codes = torch.round((groups - lo) / _nonzero(step_used))
    codes = codes.clamp_(0, config.max_code).to(torch.uint8)
    codes = codes.view(outer, layout.padded_length, inner)[:, :length, :]
    return codes, step, mins


def _store_params(params: torch.Tensor, config: QuantConfig):
    """`(stored, used)`: how group params `[O, G, 1, I]` are kept, and their float32 values.

    With `param_bits=8` they become an 8-bit QTensor grouped over G (one min-max pair per
    (outer, inner) position); codes are then computed from the values it decodes to, so
    what dequantize sees is what quantize assumed.
    """
    if config.param_bits == 16:
        return params, params.float()
    stored = quantize(params, QuantConfig(bits=8, group_size=max(1, params.shape[1]), group_dim=1))
    return stored, dequantize(stored, torch.float32)


def dense_params(params) -> torch.Tensor:
    """Group scales or mins as a dense tensor, decoding 8-bit params (`param_bits=8`)."""
    return params.dequantize() if isinstance(params, QTensor) else params


def dequantize(
    qt: QTensor,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decompress `qt` to a dense tensor.

    Args:
        qt: the compressed tensor (on any device).
        dtype: result dtype; defaults to the original dtype.
        device: where to decompress; defaults to where `qt` is. Only the compressed
            bytes move, so moving to the GPU first and decompressing there is the cheap way.
        out: optional preallocated result (shape `qt.shape`) reused across calls; on CPU a
            float32 `out` also serves as the workspace, which is the fastest path.
    """
    if device is not None and torch.device(device) != qt.device:
        qt = qt.to(device)
    if out is not None:
        if tuple(out.shape) != qt.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {qt.shape}")
        dtype = out.dtype
    dtype = dtype or qt.dtype
    layout = qt.layout
    if qt.device.type == "cpu" and layout.length % layout.group_size == 0 and qt.numel:  # all groups full
        result = out if out is not None and out.is_contiguous() else torch.empty(qt.shape, dtype=dtype)
        _dequantize_cpu_chunked(qt, result.view(-1))
        return result if out is None or result is out else out.copy_(result)
    return _dequantize_whole(qt, dtype, out)


def _dequantize_whole(qt: QTensor, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    """One pass over the whole tensor: GPUs, and groups cut short by the tensor's end."""
    layout = qt.layout
    codes = unpack_nibbles(qt.codes, qt.numel) if qt.config.bits == 4 else qt.codes
    work_dtype = _work_dtype(dtype, qt.device)
    if out is not None and out.dtype == work_dtype and out.is_contiguous():
        work = out
    else:
        work = torch.empty(qt.shape, dtype=work_dtype, device=qt.device)
    work3 = work.view(layout.outer, layout.length, layout.inner)
    work3.copy_(codes.view(layout.outer, layout.length, layout.inner))
    scales = dense_params(qt.scales).to(work_dtype)
    if qt.mins is None:  # symmetric: value = (code - mid) * step
        offsets = scales * -(1 << (qt.config.bits - 1))
    else:
        offsets = dense_params(qt.mins).to(work_dtype)
    apply_affine_(work3, scales, offsets, layout.group_size)
    if work is out:
        return out
    if out is not None:
        return out.copy_(work)
    return work if work.dtype == dtype else work.to(dtype)


# Elements per chunk on the CPU path: the uint8 + fp32 workspaces (5 MiB) stay in cache,
# so only the packed input and the final output touch memory. 2**16..2**20 measured; 2**20
# was fastest on both a 1536x576 and a 4096x4096 weight.
_CHUNK_ELEMENTS = 1 << 20
_workspaces = threading.local()  # per thread: offload workers may dequantize concurrently


def _cpu_workspace(numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reused (uint8, float32) scratch of >= numel elements; fresh pages are slow to fault in."""
    cached = getattr(_workspaces, "buffers", None)
    if cached is None or cached[0].numel() < numel:
        # normal tensors even when first asked for under inference_mode: the same scratch is
        # written in place later outside it (an inference tensor would refuse that)
        with torch.inference_mode(False):
            cached = (torch.empty(numel, dtype=torch.uint8), torch.empty(numel, dtype=torch.float32))
        _workspaces.buffers = cached
    return cached


def _dequantize_cpu_chunked(qt: QTensor, out_flat: torch.Tensor) -> None:
    """CPU dequantize through cache-sized chunks when every group is full.

    With `length % group_size == 0` the flat tensor is a sequence of "slabs"
    (`group_size x inner` elements sharing one row of scales), so any run of whole slabs
    is a contiguous `[slabs, group_size, inner]` view with scales `[slabs, 1, inner]`.
    """
    layout = qt.layout
    slab = layout.group_size * layout.inner
    num_slabs = qt.numel // slab
    per_chunk = max(1, _CHUNK_ELEMENTS // slab)
    scales = dense_params(qt.scales).reshape(num_slabs, 1, layout.inner).float()  # (slabs, 1, I)
    if qt.mins is None:
        offsets = scales * -(1 << (qt.config.bits - 1))
    else:
        offsets = dense_params(qt.mins).reshape(num_slabs, 1, layout.inner).float()
    codes_buf, work_buf = _cpu_workspace(min(num_slabs, per_chunk) * slab)
    direct = out_flat.dtype == torch.float32  # fp32 result: compute in place, no workspace
    for first in range(0, num_slabs, per_chunk):
        last = min(num_slabs, first + per_chunk)
        start, stop = first * slab, last * slab
        if qt.config.bits == 4:
            codes = unpack_nibbles_range(qt.codes, qt.numel, start, stop, codes_buf)
        else:
            codes = qt.codes[start:stop]
        work = out_flat[start:stop] if direct else work_buf[: stop - start]
        work.copy_(codes)
        _mul_add_(work.view(last - first, layout.group_size, layout.inner), scales[first:last], offsets[first:last])
        if not direct:
            out_flat[start:stop].copy_(work)


def apply_affine_(work: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, group_size: int) -> None:
    """In place: `work[o, l, i] = work[o, l, i] * scales[o, l // gs, 0, i] + offsets[...]`.

    `work` is `[outer, length, inner]` holding codes as floats; `scales`/`offsets` are
    `[outer, groups, 1, inner]`. Full groups are one broadcast view; a short last group
    (length not a multiple of gs) is a second, small op.
    """
    outer, length, inner = work.shape
    full = length // group_size
    if full:
        body = work[:, : full * group_size, :].view(outer, full, group_size, inner)  # (O, G, gs, I)
        _mul_add_(body, scales[:, :full], offsets[:, :full])
    if length % group_size:
        tail = work[:, full * group_size :, :]  # (O, rest, I)
        _mul_add_(tail, scales[:, full], offsets[:, full])


def _mul_add_(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> None:
    # NOTE: on CPU, addcmul with a broadcast scale measured 1.8 ms vs 0.4 ms for
    # mul_ + add_ when inner == 1 (KV layout), and 0.25 vs 0.5 ms the other way round when
    # inner is wide (weight layout, dim 0); pick by layout.
    if x.shape[-1] > 1 and x.is_contiguous():
        torch.addcmul(offset, x, scale, out=x)
    else:
        x.mul_(scale).add_(offset)


def _work_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    # Half-precision elementwise math on CPU is emulated and slower than fp32; on GPUs the
    # target dtype is native and halves the workspace traffic.
    return dtype if device.type == "cuda" else torch.float32


def _round_up(step: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`step` stored in `dtype`, rounded up so the group's max still maps to <= max_code."""
    stored = step.to(dtype)
    # No `if too_small.any()` shortcut: that would sync the GPU on every KV append.
    bumped = torch.nextafter(stored, torch.full_like(stored, float("inf")))
    return torch.where(stored.float() < step, bumped, stored)


def _nonzero(step: torch.Tensor) -> torch.Tensor:
    # Constant groups have step 0; divide by 1 instead (x - min is exactly 0 there).
    return torch.where(step > 0, step, torch.ones_like(step))
