"""The decode phase's per-layer terms: transfers and compute of one block's decode step."""

from placement.affine import Affine, C_CPU, C_DISK, C_GPU, H_CPU, H_DISK, W_CPU, W_DISK, W_GPU
from placement.cost_experts import (cached_expert_reads, cpu_experts_in_place, dequantized_tokens, disk_streamed,
                                    routed_reads_s, routed_rows_delta_s)
from placement.expert_compute import expert_flops_per_token
from placement.expert_groups import experts_read
from placement.layer_time import delta_rule_s, elementwise_s, layer_seconds, streamed_weights
from placement.weight_calls import (call_gemm_s, dequant_s, fp8_upcast_s, resident_delta_s, runs_fused_int4,
                                     weight_dequant_passes, weight_dequant_rate)


def _decode_weight_dequant_s(choice, model, hardware, calls: int, rows: int, block: int) -> float:
    """A decode layer's 4-bit weight dequantization where the fused kernel does not run them: what
    the whole block touches, dequantized once, or what each call touches, once a call."""
    if not choice.compress_weight or runs_fused_int4(choice, model, hardware, rows):
        return 0.0
    rate = weight_dequant_rate(choice, hardware)
    once = weight_dequant_passes(choice, calls, rows) == 1
    tokens = dequantized_tokens(choice, model, hardware, "decode", block if once else rows)  # 0: experts priced whole
    return (1 if once else calls) * (dequant_s(model.expanded_bytes_per_layer(tokens), model, rate)
                                     + model.matrices_per_layer(tokens) * hardware.gpu_dequant_matrix_s)


def decode_terms(choice, sz, model, hardware, workload) -> dict[str, Affine]:
    block = choice.gpu_batch_size * choice.num_gpu_batches
    context = workload.prompt_len + workload.gen_len / 2  # average over the decode steps
    entries = model.mean_attended_entries(context)  # a window layer reads its window
    hidden = block * sz.hidden
    cache_read = block * entries * sz.cache_stored  # entries attention touches, as stored
    new_cache = block * sz.cache_stored

    calls, rows = choice.decode_calls()
    read = experts_read(model, choice.expert_group, calls, rows, block)  # the experts its block routes to
    streamed = streamed_weights(sz, model, block, read)
    cached = cached_expert_reads(choice, sz, model, hardware, block)  # those the expert cache serves
    disk = disk_streamed(choice, sz, model, read, streamed - cached[1])
    ctog = Affine().add(streamed - cached[0], W_CPU).add(disk, W_DISK).add(hidden, H_CPU, H_DISK)
    gtoc = Affine().add(hidden, H_CPU, H_DISK).add(new_cache, C_CPU, C_DISK)
    dtoc = Affine().add(disk, W_DISK).add(hidden, H_DISK).add(cache_read, C_DISK)
    ctod = Affine().add(hidden, H_DISK).add(new_cache, C_DISK)
    if sz.state:  # an off-gpu DeltaNet state comes to the compute device and goes back, every step
        ctog.add(block * sz.state, C_CPU, C_DISK)
        gtoc.add(block * sz.state, C_CPU, C_DISK)
    if choice.cpu_attention:  # queries go to the CPU, attention outputs come back
        gtoc.add(block * sz.query, C_CPU, C_DISK)
        ctog.add(block * sz.hidden, C_CPU, C_DISK)
    elif not choice.latent_pools:  # the off-GPU cache must come to the GPU every step (only
        ctog.add(cache_read, C_CPU, C_DISK)  # the selected entries); pools copy their misses (LatentTerms)

    # every call (the merged block, or each micro-batch) re-reads the whole layer and its share
    # of the head from GPU memory (an MoE call reads only the experts its tokens pick): a
    # roofline, or the measured GEMM rate at that many rows, which on CPUs falls well short of both
    embed_share = sz.weight_fp16 - model.weight_bytes_per_layer()
    touched_by_call = model.weight_bytes_touched_per_layer(rows) + embed_share
    gemm_s = calls * call_gemm_s(choice, model, hardware, rows, rows * model.matmul_flops_per_token_per_layer(),
                                  rows * model.head_flops_per_token() / model.num_layers, touched_by_call,
                                  embed_share, decode=True)
    resident_s = resident_delta_s(choice, model, hardware, rows, rows * model.matmul_flops_per_token_per_layer(),
                                   model.weight_bytes_touched_per_layer(rows), calls, decode=True)
    gemm_s += calls * (hardware.gpu_layer_overhead_s + routed_rows_delta_s(choice, model, hardware, rows, "decode"))
    gemm_s += calls * fp8_upcast_s(choice, model, hardware, model.weight_bytes_touched_per_layer(rows))
    gemm_s += elementwise_s(block, model, hardware)
    gemm_s += delta_rule_s(block, model, hardware, decode=True)
    gemm_s += _decode_weight_dequant_s(choice, model, hardware, calls, rows, block)
    attention = _attention_s(choice, sz, model, hardware, block, context)
    comp = Affine(gemm_s).add(resident_s, W_GPU).plus(attention)
    if hardware.gpu_is_host:  # a disk-tier cache is a mapped file the compute thread faults in itself: no overlap
        comp.add(cache_read / hardware.disk_read_bytes_per_s, C_DISK)  # (measured: docs/performance.md, moe19)
    cpu_experts_in_place(choice, sz, model, hardware, (calls, rows), block, ctog, comp)
    before_router = _before_router_s(choice, model, hardware, (calls, rows), embed_share, block).plus(attention)
    terms = layer_seconds(ctog, gtoc, dtoc, ctod, comp, hardware)
    terms["routed"] = routed_reads_s(choice, sz, model, hardware, (calls, rows), read, cached[1], before_router)
    return terms


def _attention_s(choice, sz, model, hardware, block: float, context: float) -> Affine:
    """A decode layer's attention over `context` cached tokens, on the GPU, or where the cache is
    off it on the CPU when `cpu_attention` (its share of the cache there)."""
    entries = model.mean_attended_entries(context)
    attn_flops = block * model.attention_flops_per_query(context)
    attn_bytes = block * (entries * sz.cache_fp16 + context * sz.indexer)
    calls = choice.decode_calls()[0]
    gpu_attn_s = max(hardware.attention_seconds("decode", model.dtype, attn_flops, calls),
                     attn_bytes / hardware.gpu_mem_bytes_per_s)
    if choice.compress_cache:
        gpu_attn_s += dequant_s(block * entries * sz.cache_fp16, model, hardware.gpu_dequant_bytes_per_s)
    if not choice.cpu_attention:
        return Affine(gpu_attn_s)
    cpu_attn_s = attn_flops / hardware.cpu_attention_flops_per_s
    if choice.compress_cache:
        cpu_attn_s += dequant_s(block * entries * sz.cache_fp16, model, hardware.cpu_dequant_bytes_per_s)
    return Affine().add(gpu_attn_s, C_GPU).add(cpu_attn_s, C_CPU, C_DISK)


def _before_router_s(choice, model, hardware, calls_rows: tuple[int, float], embed_share: float, block: float) -> Affine:
    """A decode layer's work before its router names the routed experts, attention aside: its other
    products (the layer's share of the output head's included), the per-call overhead and the
    elementwise passes, at the rates `comp` prices them at (0 for a dense model: nothing waits)."""
    calls, rows = calls_rows
    if not model.num_experts:
        return Affine()
    routed = model.num_experts_per_token * expert_flops_per_token(model) * model.moe_layer_share
    flops = rows * (model.matmul_flops_per_token_per_layer() - routed)
    head_flops = rows * model.head_flops_per_token() / model.num_layers
    dense = model.weight_bytes_touched_per_layer(0) + embed_share
    gemm_s = call_gemm_s(choice, model, hardware, rows, flops, head_flops, dense, embed_share, decode=True)
    return Affine(calls * (gemm_s + hardware.gpu_layer_overhead_s) + elementwise_s(block, model, hardware))
