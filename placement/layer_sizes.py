"""Bytes of one layer for one block of a `Choice`: weights and cache as stored, and what the layer's calls stage."""

from dataclasses import dataclass

from placement.choice import Choice
from placement.expert_groups import staged_share
from placement.model_spec import ModelSpec
from placement.specs import WorkloadSpec


@dataclass(frozen=True, slots=True)
class LayerSizes:
    """Bytes and FLOPs of one layer for one block, derived once per `Choice`."""

    weight_stored: float  # one layer's weights as stored (compressed or not), embeddings spread
    weight_fp16: float  # the same, uncompressed (what GEMMs read; a GGUF's blocks as codes: their bytes)
    layer_stored: float  # one layer's own weights as stored, no embedding share (what streams)
    layer_matrices: float  # its compressible matrices in dtype (what compressed weights expand to)
    experts_stored: float  # its routed experts as stored (fetched only as tokens route to them)
    cache_stored: float  # cache bytes per token per layer as stored
    cache_fp16: float  # uncompressed
    indexer: float  # indexer key bytes per token per layer (GPU-resident)
    state: float  # fixed bytes per sequence per layer (hybrid models' DeltaNet states, never compressed)
    hidden: float  # hidden-state bytes per token
    query: float  # query bytes per token (sent to the CPU for CPU attention)


def layer_sizes(choice: Choice, model: ModelSpec, workload: WorkloadSpec) -> LayerSizes:
    dtype_bytes = model.dtype_bytes
    ratio = choice.compression.weight_bytes_per_element(dtype_bytes) / dtype_bytes
    capacity = workload.prompt_len + workload.gen_len
    cache_ratio = choice.compression.cache_bytes_per_element(capacity, dtype_bytes) / dtype_bytes
    # norms, biases and embeddings stay dense; only the layers' matrices are quantized, from
    # their values in dtype (an FP8 checkpoint's too: `per_stored` turns its bytes into those; a
    # GGUF's blocks kept as codes: their parameters, `ModelSpec.coded_per_layer`)
    per_stored = dtype_bytes / model.matrix_bytes_per_param
    # what compression leaves as it is: vectors, and the matrices the engine never compresses
    layer_dense = (model.vector_param_count() * dtype_bytes
                   + model.uncompressed_matrix_param_count() * model.matrix_bytes_per_param)
    embedding = model.embedding_bytes() / model.num_layers
    layer = model.weight_bytes_per_layer()
    coded_bytes, coded_params = model.coded_per_layer()
    matrices = (layer - layer_dense - coded_bytes) * per_stored + coded_params * dtype_bytes  # in dtype
    compress = choice.compress_weight
    layer_stored = matrices * ratio + layer_dense if compress else layer
    experts = model.routed_expert_bytes_per_layer()
    if compress:
        routed_bytes, routed_params = model.coded_per_layer(routed_only=True)
        experts = ((experts - routed_bytes) * per_stored + routed_params * dtype_bytes) * ratio
    cache = model.cache_bytes_per_token_per_layer()
    return LayerSizes(
        weight_stored=layer_stored + embedding, weight_fp16=layer + embedding, layer_stored=layer_stored,
        layer_matrices=matrices, experts_stored=experts,
        cache_stored=cache * (cache_ratio if choice.compress_cache else 1.0), cache_fp16=cache,
        indexer=model.indexer_bytes_per_token_per_layer(),
        state=model.state_bytes_per_sequence_per_layer(),
        hidden=model.hidden_size * dtype_bytes,
        query=model.num_heads * (model.head_dim + model.qk_rope_head_dim) * dtype_bytes)


def routed_staging(sz: LayerSizes, model: ModelSpec, num_tokens: float, group: int = 0) -> float:
    """Bytes of routed experts a layer's calls over `num_tokens` tokens stage at once (every pick,
    up to all experts, or the `group` streamed, `placement.expert_groups`), before the gpu tier's
    own share."""
    return sz.experts_stored * staged_share(model, num_tokens, group)


def held_tokens(choice: Choice, model: ModelSpec, workload: WorkloadSpec) -> float:
    """Tokens an (average) layer's cache holds for a block: each sequence's own positions and a
    shared prefix once, a window layer's last `window` of each (`ModelSpec.held_tokens`; a
    compressed cache keeps every position: the engine rings uncompressed layers only)."""
    block = choice.gpu_batch_size * choice.num_gpu_batches
    own, prefix = workload.prompt_len + workload.gen_len - workload.shared_prefix_len, workload.shared_prefix_len
    if choice.compress_cache:
        return block * own + prefix
    return block * model.held_tokens(own) + (model.held_tokens(prefix) if prefix else 0.0)
