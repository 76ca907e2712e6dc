"""Peak bytes per tier and phase (`MEMORY_ROWS`), affine in the fractions: what is resident plus
one call's working buffers, and the output head's moment."""

import dataclasses
import math

from placement.affine import Affine, C_CPU, C_DISK, C_GPU, H_CPU, H_DISK, H_GPU, W_CPU, W_DISK, W_GPU
from placement.attention_scratch import exact_attention_bytes
from placement.choice import Choice
from placement.layer_sizes import LayerSizes, held_tokens, routed_staging
from placement.model_spec import ModelSpec
from placement.staging import Capped, WeightStaging
from placement.weight_calls import in_place_int4, int4_twins

HEAD_CHUNK_ROWS = 8192  # the engine's output head runs in chunks of this many vocab rows (within a piece)
# weights of a GGUF matrix whose kept form `models.loading.in_place.blocks_matrix` builds at a time (whole
# tiles of BUILD_TILE_ROWS rows), and what that part's transients take a weight at most (the file's bytes,
# int8 codes, fp32 scales, the layout's temporaries: 8-16 measured, tests/unit/test_gguf_pieces.py), where
# a 1B's tied Q6_K head built whole held ~1.1 GB beyond its form
BUILD_WEIGHTS = 1 << 21
BUILD_TILE_ROWS = 64
BUILD_BYTES_PER_WEIGHT = 24
# the projections the decoder forward multiplies as one stacked matrix (`DecoderForward.FUSED_INT4`)
STACKED_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def workspace_bytes(model: ModelSpec, num_rows: int, num_queries: int, span: float, dtype_bytes: int = 0) -> float:
    """Compute scratch of one call of `num_rows` rows in one layer, as the engine charges it (its
    charges call this): the layer's intermediates in the dtype (default the model's) and the
    boolean attention mask, a byte per query and attended entry. Attention with sinks or
    soft-capping counts the exact fp32 path's scratch for its scores (`attention_scratch`)."""
    dtype_bytes = dtype_bytes or model.dtype_bytes
    scores = None
    if model.exact_attention and num_rows:
        held = exact_attention_bytes(num_rows, model.num_heads, model.num_kv_heads, model.head_dim, num_queries, span)
        scores = held / (num_rows * dtype_bytes)
    elements = int(num_rows * model.layer_workspace_elements(num_queries, span, scores))
    return elements * dtype_bytes + num_rows * num_queries * span


def head_working(choice: Choice, model: ModelSpec) -> float:
    """GPU bytes the engine holds while the output head runs (a moment of its own, beside a
    layer's): one vocab chunk's logits for the widest call."""
    rows = max(choice.gpu_batch_size, choice.decode_calls()[1])
    return min(HEAD_CHUNK_ROWS, model.vocab_size) * rows * model.dtype_bytes


def head_staged(model: ModelSpec) -> float:
    """GPU bytes of the head's rows staged while it runs where they are not all on the gpu tier:
    one chunk. The LP charges it whatever the fractions (a constant: the gpu_head row may refuse
    a head held whole on the gpu tier by that much); a plan's peak drops it where no row is off
    the gpu tier (`cost.memory_at`)."""
    return min(HEAD_CHUNK_ROWS, model.vocab_size) * model.hidden_size * model.dtype_bytes


def _cpu_decode_staging(choice, sz, model, rows: int, full_entries: float, cache_home: float) -> Affine:
    """The cpu tier's bytes for a decode call beside what is resident there: ESS's records (every
    one on the cpu tier, the pools besides), the disk tier's activations staged (its cache layers are
    files the OS pages in, charged to no budget: `caches.disk_rows`), and with CPU attention its scores
    plus a dequantized copy of one call's cache."""
    out = Affine()
    if choice.latent_pools:
        out.add(cache_home, C_GPU)
    out.add(2 * rows * sz.hidden, H_DISK)
    if choice.cpu_attention:
        out.add(model.dtype_bytes * rows * model.num_heads * full_entries)
        if choice.compress_cache:
            out.add(rows * full_entries * sz.cache_fp16)
    return out


def weight_staging(choice: Choice, sz: LayerSizes, model: ModelSpec, workload) -> WeightStaging | None:
    """A MoE model's staged weights in the gpu rows (`placement.staging`): a layer's routed experts as
    the prompt sweep's and a decode step's calls can pick them, the head's chunk; None for a dense
    model (a layer stages twice its off-gpu bytes, affine; the head a chunk, whatever the fractions)."""
    if not sz.experts_stored:
        return None
    calls, rows = choice.decode_calls()
    prompt_tokens = choice.num_gpu_batches * choice.gpu_batch_size * workload.prompt_columns
    head = model.vocab_size * model.hidden_size * model.dtype_bytes
    terms = (Capped("gpu_prefill", routed_staging(sz, model, prompt_tokens, choice.expert_group), sz.layer_stored),
             Capped("gpu_decode", routed_staging(sz, model, calls * rows, choice.expert_group), sz.layer_stored),
             Capped("gpu_head", head_staged(model), head))
    return WeightStaging(dense=sz.layer_stored - sz.experts_stored, layer=sz.layer_stored, terms=terms)


def memory_rows(choice, sz, model, workload, staging: WeightStaging | None) -> dict[str, Affine]:
    """Peak bytes per tier: resident data ("home") plus working buffers for one micro-batch; a MoE
    model's gpu rows less what `staging` (`weight_staging`) adds to them."""
    gbs, block = choice.gpu_batch_size, choice.gpu_batch_size * choice.num_gpu_batches
    s, n = workload.prompt_len, workload.gen_len
    cols = workload.prompt_columns  # a prompt step's width: a one-token prompt runs in two columns
    layers = model.num_layers
    num_cached = block * (s + n - workload.shared_prefix_len) + workload.shared_prefix_len
    weights_home = layers * sz.weight_stored
    cache_home = layers * held_tokens(choice, model, workload) * sz.cache_stored
    # DeltaNet states: one per sequence (and one for a shared prefix), placed by the cache fractions
    cache_home += layers * (block + (1 if workload.shared_prefix_len else 0)) * sz.state
    indexer_home = layers * num_cached * sz.indexer  # ESS: indexer keys stay on the GPU
    hidden_p, hidden_g = block * cols * sz.hidden, block * sz.hidden
    full_entries = model.attended_entries(s + n)

    def resident(hidden: float, gpu: bool) -> Affine:
        w, c, h = (W_GPU, C_GPU, H_GPU) if gpu else (W_CPU, C_CPU, H_CPU)
        return Affine().add(weights_home, w).add(cache_home, c).add(hidden, h)

    # GPU: double-buffered streamed layer weights (a layer's own: the embedding table and the
    # head are read in rows and vocab chunks, never staged whole; a MoE layer's as `staging`
    # prices them), compressed weights as they expand. A call's input and output are in its
    # workspace (`workspace_bytes`), as the engine charges them
    def gpu_working(row: str, seqs: int, tokens_per_seq: int, calls: int) -> Affine:
        if staging is not None:  # its chord here, the rest in `staging`
            work = Affine(indexer_home).plus(staging.chord(row))
        else:
            work = Affine(indexer_home + 2 * sz.layer_stored).add(-2 * sz.layer_stored, W_GPU)
        if choice.compress_weight:
            return work.add(dequantized_bytes(choice, sz, model, seqs * tokens_per_seq, calls))
        if model.weight_format == "fp8":  # upcast per call: an absorbed matrix and one other at most
            return work.add(2 * max(o * i for o, i in model.layer_matrix_shapes()) * model.dtype_bytes)
        return work

    gpu_prefill = resident(hidden_p, True).plus(gpu_working("gpu_prefill", gbs, cols, choice.num_gpu_batches))
    gpu_prefill.add(workspace_bytes(model, gbs, cols, cols))
    gpu_prefill.plus(_attended_cache(choice, gbs * cols * sz.cache_fp16))
    # a decode call runs the merged block or one micro-batch (`Choice.decode_calls`)
    calls, rows = choice.decode_calls()
    gpu_decode = resident(hidden_g, True).plus(gpu_working("gpu_decode", rows, 1, calls))
    gpu_decode.add(workspace_bytes(model, rows, 1, full_entries))
    gpu_decode.plus(_attended_cache(choice, rows * full_entries * sz.cache_fp16))

    gpu_head = resident(hidden_p, True).add(indexer_home + head_working(choice, model))
    gpu_head.plus(staging.chord("gpu_head") if staging is not None else Affine(head_staged(model)))

    # CPU: staging buffers for the activations that stream from disk (a disk cache layer is paged
    # by the OS, charged to no budget, as the engine maps it: `caches.disk_rows`); weights on disk
    # are read tensor by tensor straight into the gpu tier's staging (on a GPU through a
    # transient one-tensor host buffer), so they hold no layer-sized CPU buffer
    cpu_prefill = resident(hidden_p, False)
    if choice.latent_pools:  # ESS's layout: every record on the cpu tier, the pools besides
        cpu_prefill.add(cache_home, C_GPU)
    cpu_prefill.add(2 * gbs * cols * sz.hidden, H_DISK)
    cpu_decode = resident(hidden_g, False).plus(_cpu_decode_staging(choice, sz, model, rows, full_entries, cache_home))

    disk = Affine().add(weights_home, W_DISK).add(cache_home, C_DISK).add(hidden_p, H_DISK)
    return {"gpu_prefill": gpu_prefill, "gpu_decode": gpu_decode, "gpu_head": gpu_head, "cpu_prefill": cpu_prefill,
            "cpu_decode": cpu_decode, "disk": disk}


def dequantized_bytes(choice: Choice, sz: LayerSizes, model: ModelSpec, rows: int, calls: int = 1) -> float:
    """GPU bytes a layer's compressed matrices must expand to while it runs `calls` calls of
    `rows` rows each, as the offload engine does it: 4-bit matrices in fp16/bf16 multiply in
    place under `Choice.int4_in_place_below_rows` rows; from there every matrix is held dense
    for the sweep when there are several such calls (`int4_twins`, plus one matrix's
    transient copy before it is prepacked), else one matrix is dequantized per call. Other
    compressions expand the whole layer. Without the kernel (`Choice.int4_kernel`) every
    call dequantizes."""
    if choice.compression.num_bits != 4:
        return sz.layer_matrices
    if in_place_int4(dataclasses.replace(choice, compress_weight=True), model, rows):
        return 0.0
    largest = largest_called_matrix(model) * model.dtype_bytes
    return sz.layer_matrices + largest if int4_twins(choice, calls, rows) else largest


def largest_called_matrix(model: ModelSpec) -> int:
    """Elements of the largest matrix one call multiplies: a decoder layer's q/k/v and gate/up as the
    engine stacks them, one matrix each where every part is there (a MoE layer's q/k/v too; its
    experts' gate/up stay apart), with biases on all parts or none; OPT and MLA run theirs apart."""
    rows = [r for r in model.tensors.layered_rows if r.is_2d_matrix and r.kind != "router"]
    sizes = [r.numel for r in rows]
    if model.arch not in ("opt", "mla"):
        named = {r.name: r for r in model.tensors.layered_rows}
        for names in STACKED_PROJECTIONS:
            parts = [named.get(name) for name in names]
            biases = {named.get(name.replace("_proj", "_bias")) is None for name in names}
            if all(p is not None and p.is_2d_matrix for p in parts) and len({p.shape[1] for p in parts}) == 1 \
                    and len(biases) == 1:
                sizes.append(sum(p.shape[0] for p in parts) * parts[0].shape[1])
    return max(sizes, default=0)


def _attended_cache(choice: Choice, dense_bytes: float) -> Affine:
    """GPU bytes one call's attention holds besides the resident cache: `dense_bytes`, the
    call's cache rows uncompressed, copied in for the layers off the GPU (unless attention runs
    on the CPU) and decompressed for compressed layers on it. The engine attends one call at a
    time and fetches no cache ahead, so one copy is held, never two."""
    staged = Affine()
    if choice.latent_pools:  # the selected records, gathered from the pool, as one buffer
        return staged.add(dense_bytes)
    if not choice.cpu_attention:
        staged.add(dense_bytes, C_CPU, C_DISK)
    if choice.compress_cache:
        staged.add(dense_bytes, C_GPU)
    return staged


def build_transient_bytes(model: ModelSpec, offloaded: bool) -> int:
    """What building `model`'s weights holds beyond what is kept: one part of a GGUF matrix's form
    (BUILD_WEIGHTS weights, at least a tile of its widest input, or of whole heads where a llama
    GGUF's q / k rows are un-interleaved a part at a time; BUILD_BYTES_PER_WEIGHT each);
    offloaded, also the largest weight the store builds at once in the model's dtype (a matrix, or
    a table's piece of HEAD_CHUNK_ROWS rows), which no tier charges while it is read, compressed or
    written to disk (`--max-rss`: `flexlamps.commands.memory`)."""
    widest = max(model.hidden_size, model.intermediate_size, model.moe_intermediate_size,
                 model.num_heads * model.head_dim)
    unit = math.lcm(BUILD_TILE_ROWS, model.head_dim) if model.head_dim > 0 else BUILD_TILE_ROWS
    part = BUILD_BYTES_PER_WEIGHT * max(BUILD_WEIGHTS, unit * widest)
    largest = max(model.hidden_size * widest, min(HEAD_CHUNK_ROWS, model.vocab_size) * model.hidden_size)
    return part + (largest * model.dtype_bytes if offloaded else 0)
