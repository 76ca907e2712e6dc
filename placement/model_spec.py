"""`ModelSpec`: the shape numbers of a decoder-only model, built by its family from its one
description (`flexlamps.models.description.model_spec`) or stored (`placement.model_preset`).

Weight sizes, matrix counts and FLOPs are sums over `tensors`, the table of every weight the
family lists (the tensors the engine allocates); the shape numbers give the attention's work and
the bytes each token adds to the cache per layer:
  - MHA / GQA: K and V, `2 * num_kv_heads * head_dim` elements;
  - MLA (DeepSeek-V3.x): the compressed latent plus the shared RoPE key,
    `kv_lora_rank + qk_rope_head_dim` elements, plus (V3.2) the lightning indexer's key,
    `index_head_dim` elements, which ESS keeps on the GPU.
Hybrid models (Qwen3-Next, Qwen3.5) run `num_linear_layers` gated-DeltaNet layers, which cache
nothing per token but hold a fixed state per sequence (a conv window in dtype, fp32 recurrent
matrices); only their other layers cache K and V. Per-layer figures are averages over all layers.
Sliding-window layers (`layer_windows`: Mistral-v0.1, Gemma-2/3's local layers, gpt-oss's even
layers) keep only their last `window` positions, so a sequence holds min(window, context) tokens
in each of them (`held_tokens`) and a query reads as many (`mean_attended_entries`).
"""

from dataclasses import dataclass

from placement.jsonable import JsonMixin
from placement.routing import RoutingProfile
from placement.specs import DTYPE_BYTES
from placement.tensor_table import TensorTable
from quant.fp8_layout import WEIGHT_BLOCK, fp8_vector_bytes, fp8_weight_bytes, latent_record_bytes

ARCHES = ("decoder", "opt", "mla", "hybrid")  # a family's forward (flexlamps' Family.forward, ModelConfig.arch)
STORAGE_FORMATS = ("dense", "fp8", "mxfp4")
# stored bytes per parameter of a 2-D weight in FP8: one byte plus its tile's fp32 scale
_FP8_MATRIX_BYTES = fp8_weight_bytes(*WEIGHT_BLOCK) / (WEIGHT_BLOCK[0] * WEIGHT_BLOCK[1])
# Attention scores are materialized for at most this many queries at a time (fused attention
# kernels block the queries; this bounds what a long prompt charges).
SCORE_QUERY_CHUNK = 1024
# tokens per chunk of a DeltaNet layer's chunked rule (models.hybrid_config.DELTA_RULE_CHUNK)
LINEAR_CHUNK = 16


def delta_rule_flops(chunk: int, key_dim: int, value_dim: int, decode: bool) -> float:
    """FLOPs of one value head's chunked gated delta rule (models.blocks.gated_deltanet) for one
    token: per chunk, the two chunk x chunk products (k_beta k^T, q k^T), the two triangular solves,
    the state's three products (k_cumdecay S, q S, its update k^T v_new) and intra v_new. A decode
    token pays a whole chunk, its state update skipped; a prompt token a chunk's share."""
    c, dk, dv = chunk, key_dim, value_dim
    per_chunk = 4 * c * c * dk + c * c * (dk + dv) + 4 * c * dk * dv + 2 * c * c * dv
    return per_chunk if decode else (per_chunk + 2 * c * dk * dv) / c


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec(JsonMixin):
    name: str
    arch: str  # one of ARCHES: "decoder" (LLaMA-like), "opt", "mla" (DeepSeek-V3.x), "hybrid" (DeltaNet layers)
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # per-head width of q/k (v too, except MLA)
    intermediate_size: int  # dense FFN width
    vocab_size: int
    dtype: str = "fp16"  # storage / compute dtype of the uncompressed weights and cache
    tie_word_embeddings: bool = False
    # MLA (zero when not MLA)
    q_lora_rank: int = 0  # 0: plain q projection
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek-V3.2 lightning indexer (zero when absent)
    index_num_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0  # cache entries each query attends to after selection
    # MoE (zero when dense)
    num_experts: int = 0  # routed experts per MoE layer
    num_experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_intermediate_size: int = 0
    num_dense_layers: int = 0  # layers with a dense FFN (first_k_dense_replace, Qwen's mlp_only_layers)
    shared_intermediate_size: int = -1  # total width of the shared experts; -1: num_shared_experts experts
    # how often tokens route to each expert, measured on the user's prompts (`flexlamps profile
    # --prompts`): the expected distinct experts a step reads follow it. None: uniform routing
    routing: RoutingProfile | None = None
    # storage formats: "fp8" keeps the layers' 2-D weights in float8 with one fp32 scale per
    # 128x128 tile (FP8 checkpoints, `quant_method: fp8`; embeddings and vectors stay in dtype),
    # and the MLA cache in ESS's FP8 records (latent 512 FP8 + 4 scales + 64 bf16 rotary = 656 B
    # per token per layer for DeepSeek-V3.2; indexer key 128 FP8 + 1 scale = 132 B)
    weight_format: str = "dense"
    cache_format: str = "dense"
    # hybrid gated-DeltaNet models (zero when every layer is full attention): the full-attention
    # layers' q_proj also yields a sigmoid output gate and they norm q and k per head
    num_linear_layers: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    # sliding windows, one entry per layer (0: the layer attends over the whole context); ():
    # no layer slides
    layer_windows: tuple[int, ...] = ()
    # the attention runs the exact fp32 per-query path on every device (sinks: gpt-oss; soft-capping:
    # Gemma-2), whose scratch a layer's workspace counts (`placement.attention_scratch`)
    exact_attention: bool = False
    # every weight, a row per tensor of a layer, as the model's family lists them
    # (flexlamps.models.description.tensor_table): what the sizes below sum
    tensors: TensorTable

    def __post_init__(self):
        if self.arch not in ARCHES:
            raise ValueError(f"ModelSpec.arch must be one of {ARCHES}, got {self.arch!r}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"ModelSpec.dtype must be one of {tuple(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelSpec.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec: num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")
        for name in ("weight_format", "cache_format"):
            if getattr(self, name) not in STORAGE_FORMATS:
                raise ValueError(f"ModelSpec.{name} must be one of {STORAGE_FORMATS}, got {getattr(self, name)!r}")
        if self.cache_format == "fp8" and self.arch != "mla":
            raise ValueError("ModelSpec.cache_format 'fp8' is the MLA latent layout; use it with arch 'mla'")
        if self.arch == "mla" and not (self.kv_lora_rank and self.qk_rope_head_dim and self.v_head_dim):
            raise ValueError("ModelSpec: an MLA model needs kv_lora_rank, qk_rope_head_dim, v_head_dim")
        if self.routing is not None and (self.routing.num_experts, self.routing.experts_per_token) != (
                self.num_experts, self.num_experts_per_token):
            raise ValueError(f"ModelSpec: the routing profile is for {self.routing.experts_per_token} of "
                             f"{self.routing.num_experts} experts, the model routes to {self.num_experts_per_token} "
                             f"of {self.num_experts}; measure it for this model (flexlamps profile --prompts)")
        if self.shared_intermediate_size < 0:  # one spelling of the same model: the width itself
            object.__setattr__(self, "shared_intermediate_size", self.num_shared_experts * self.moe_intermediate_size)
        if self.num_linear_layers and (self.arch != "hybrid" or self.num_linear_layers >= self.num_layers
                                       or not (self.linear_num_value_heads and self.linear_key_head_dim
                                               and self.linear_value_head_dim and self.linear_conv_kernel)):
            raise ValueError("ModelSpec: a hybrid model (arch 'hybrid') needs fewer linear layers than layers and "
                             "linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel")
        self._check_windows()
        self._check_tensors()

    def _check_tensors(self) -> None:
        if not isinstance(self.tensors, TensorTable) or self.tensors.num_layers != self.num_layers:
            raise ValueError(f"ModelSpec.tensors must be the TensorTable of the model's {self.num_layers} layers "
                             "(flexlamps.models.description.model_spec builds both)")
        if self.tensors.dtype != self.dtype:  # the model re-dtyped (a run's compute dtype): its dense tensors too
            object.__setattr__(self, "tensors", self.tensors.in_dtype(self.dtype))

    def _check_windows(self) -> None:
        windows = tuple(self.layer_windows)  # a list from JSON
        object.__setattr__(self, "layer_windows", windows)
        if not windows:
            return
        if len(windows) != self.num_layers or any(not isinstance(w, int) or w < 0 for w in windows):
            raise ValueError(f"ModelSpec.layer_windows must hold one integer >= 0 per layer ({self.num_layers}; "
                             f"0: no window), got {windows!r}")
        if self.arch != "decoder":
            raise ValueError("ModelSpec.layer_windows: sliding windows are modelled for plain decoders (arch 'decoder')")

    # ---- sliding windows -----------------------------------------------------------------
    def held_tokens(self, context: float) -> float:
        """Tokens one sequence of `context` positions keeps in an (average) layer's cache: the
        context, or min(window, context) in a window layer (its ring of the last `window`)."""
        if not self.layer_windows:
            return context
        return sum(min(w, context) if w else context for w in self.layer_windows) / self.num_layers

    def mean_attended_entries(self, context: float) -> float:
        """Cache entries one query at `context` reads in an (average) layer: a window layer's
        window at most (`attended_entries` is the widest layer's)."""
        return min(self.held_tokens(context), self.attended_entries(context))

    # ---- hybrid (gated DeltaNet) ---------------------------------------------------------
    @property
    def full_attention_share(self) -> float:
        """Share of the layers that attend over a KV cache."""
        return 1.0 - self.num_linear_layers / self.num_layers

    def _linear_conv_dim(self) -> int:
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    def linear_state_bytes(self) -> int:
        """Bytes one sequence holds in one DeltaNet layer, as the engine keeps them: the conv window
        in dtype, the recurrent matrices at the last chunk boundary in fp32, and the tokens since
        that boundary (at most LINEAR_CHUNK - 1: k, v and beta in dtype, g in fp32)."""
        heads = self.linear_num_value_heads
        recurrent = heads * self.linear_key_head_dim * self.linear_value_head_dim * 4
        per_open_token = self._linear_open_token_entries() * self.dtype_bytes + heads * 4  # k | v | beta, and g
        return (self._linear_conv_dim() * (self.linear_conv_kernel - 1) * self.dtype_bytes + recurrent
                + (LINEAR_CHUNK - 1) * per_open_token)

    def _linear_open_token_entries(self) -> int:
        """Entries one token of a DeltaNet layer's open chunk holds in the compute dtype: k | v | beta."""
        return (self._linear_conv_dim() - self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads)

    def state_bytes_per_sequence_per_layer(self) -> float:
        """Fixed cache bytes one sequence holds per (average) layer, whatever its length."""
        if not self.num_linear_layers:
            return 0.0
        return self.num_linear_layers * self.linear_state_bytes() / self.num_layers

    # ---- weights: sums over the family's table ------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def shared_width(self) -> int:
        """Total width of the always-on shared experts."""
        return self.shared_intermediate_size

    def _moe_share(self) -> float:
        """The fraction of layers with a MoE FFN."""
        return self._num_moe_layers() / self.num_layers

    @property
    def moe_layer_share(self) -> float:
        """The fraction of layers with a MoE FFN (0 for a dense model)."""
        return self._moe_share()

    def _num_moe_layers(self) -> int:
        return max(self.num_layers - self.num_dense_layers, 0) if self.num_experts else 0

    def _per_layer(self, value, rows=None) -> float:
        """The average layer's sum of `value(row) * copies` over the layers' rows (or `rows`)."""
        rows = self.tensors.layered_rows if rows is None else rows
        return sum(value(r) * len(r.layers) for r in rows) / self.num_layers

    def layer_param_count(self, *, active_only: bool = False) -> float:
        """Parameters of one decoder layer, averaged over the layers; `active_only`: those a token uses."""
        return self._per_layer(lambda r: r.numel * (r.active if active_only else r.copies))

    def vector_param_count(self) -> float:
        """Parameters of one (average) layer outside 2-D matrices: norms, biases, the MoE score
        bias, DeltaNet's conv taps. These stay uncompressed when weights are quantized."""
        return self._per_layer(lambda r: 0 if r.is_2d_matrix else r.numel * r.copies)

    def uncompressed_matrix_param_count(self) -> float:
        """Parameters of one (average) layer's 2-D weights the engine never compresses: MLA's
        kv_b_proj (sliced per head for the absorbed attention), the indexer's head weights and
        the MoE routers (small, run in fp32)."""
        return self._per_layer(lambda r: r.numel * r.copies if r.is_2d_matrix and r.kind != "linear" else 0)

    @property
    def matrix_bytes_per_param(self) -> float:
        """Stored bytes of one parameter of a layer's 2-D weights (FP8: its share of the scales too)."""
        return _FP8_MATRIX_BYTES if self.weight_format == "fp8" else self.dtype_bytes

    def coded_per_layer(self, routed_only: bool = False) -> tuple[float, float]:
        """(stored bytes, parameters) of the average layer's matrices kept as a checkpoint's blocks
        (encoding "codes", a GGUF's; `routed_only`: its routed experts'): compression quantizes
        their values, so it prices their parameters, not their bytes."""
        rows = [r for r in self.tensors.layered_rows if r.encoding == "codes" and (r.routed or not routed_only)]
        return (self._per_layer(lambda r: r.stored_bytes * r.copies, rows),
                self._per_layer(lambda r: r.numel * r.copies, rows))

    def weight_bytes_per_layer(self) -> float:
        """Stored bytes of one decoder layer (the average layer, for MoE models)."""
        return self._per_layer(lambda r: r.stored_bytes * r.copies)

    def expected_experts(self, num_tokens: float) -> float:
        """Expected distinct routed experts `num_tokens` tokens pick in the average MoE layer: from
        the measured routing profile when there is one (a skewed profile picks fewer, as hot
        experts are shared), else uniform, E (1 - (1 - k/E)^T). 0 for a dense model."""
        if not self.num_experts:
            return 0.0
        if self.routing is not None and self.routing.tokens:
            layers = [int(j) for j in self.routing.counts] or range(self.num_dense_layers, self.num_layers)
            return self.routing.mean_expected_distinct(num_tokens, layers)
        return self.num_experts * (1 - (1 - self.num_experts_per_token / self.num_experts) ** num_tokens)

    def _routed_copies(self, row, num_tokens: float) -> float:
        """Copies of `row` that `num_tokens` tokens use: the experts some token picks, or all."""
        return self.expected_experts(num_tokens) if row.routed else row.copies

    def weight_bytes_touched_per_layer(self, num_tokens: float) -> float:
        """Bytes of one (average) layer that `num_tokens` tokens read: with MoE, only the
        routed experts some token picks (`expected_experts`)."""
        return self._per_layer(lambda r: r.stored_bytes * self._routed_copies(r, num_tokens))

    def expanded_bytes_per_layer(self, num_tokens: float | None = None) -> float:
        """Bytes compressed weights of one (average) layer expand to where `num_tokens` tokens read
        them (None: every copy; with MoE, else the routed experts some token picks): a GGUF's blocks
        kept as codes, which compression re-quantizes from their values, their parameters in the
        dtype; other rows their stored bytes (`weight_bytes_touched_per_layer`)."""
        def expanded(r) -> float:
            copies = r.copies if num_tokens is None else self._routed_copies(r, num_tokens)
            return (r.numel * self.dtype_bytes if r.encoding == "codes" else r.stored_bytes) * copies
        return self._per_layer(expanded)

    def routed_expert_bytes_per_layer(self) -> float:
        """Stored bytes of the average layer's routed experts: what a step stages only as its
        tokens route (0 for a dense model)."""
        return self.weight_bytes_per_layer() - self.weight_bytes_touched_per_layer(0)

    def matrices_per_layer(self, num_tokens: float) -> float:
        """2-D weight matrices of one (average) layer that `num_tokens` tokens use (what
        compressed weights decompress matrix by matrix); MoE counts the experts some token picks."""
        return self._per_layer(lambda r: self._routed_copies(r, num_tokens) if r.is_2d_matrix else 0)

    def layer_matrix_shapes(self) -> list[tuple[int, int]]:
        """(out_features, in_features) of the matrices the layers multiply (the MoE layers' where
        there are any), in the family's order, a row's once (a layer's routed experts share one):
        what a machine profile for this model times its GEMMs and decompression on."""
        moe_layers = {j for r in self.tensors.layered_rows if r.routed for j in r.layers}
        return [tuple(r.shape) for r in self.tensors.layered_rows if r.is_2d_matrix and r.kind != "router"
                and (not moe_layers or moe_layers & set(r.layers))]

    def routed_expert_dims(self) -> tuple[int, int] | None:
        """(hidden, width) of a routed expert (gate and up width x hidden, down hidden x width): what a
        machine profile for this model times the engine's expert product on; None for a dense model."""
        return (self.hidden_size, self.moe_intermediate_size) if self.num_experts else None

    def embedding_bytes(self) -> int:
        """Token embedding, output head (unless tied), learned positions, final norm."""
        return self.tensors.model_bytes()

    def total_weight_bytes(self) -> float:
        return self.tensors.total_bytes()

    def cache_bytes_per_token_per_layer(self) -> float:
        """Cache bytes one token adds to one (average) layer as stored (indexer keys excluded)."""
        if self.arch == "mla" and self.cache_format == "fp8":
            return latent_record_bytes(self.kv_lora_rank, self.qk_rope_head_dim)
        if self.arch == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        kv = 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes
        return kv if not self.num_linear_layers else kv * self.full_attention_share

    def indexer_bytes_per_token_per_layer(self) -> int:
        """Lightning-indexer key bytes per token per layer (DeepSeek-V3.2); kept on the GPU."""
        if self.cache_format == "fp8" and self.index_head_dim:
            return fp8_vector_bytes(self.index_head_dim)
        return self.index_head_dim * self.dtype_bytes

    # ---- work ----------------------------------------------------------------------------
    def matmul_flops_per_token_per_layer(self) -> float:
        """GEMM FLOPs one token costs in one (average) layer: 2 per active weight."""
        return self._per_layer(lambda r: r.flops_per_token * r.active)

    def head_flops_per_token(self) -> float:
        return self.tensors.head_flops_per_token()

    def attended_entries(self, context_len: float) -> float:
        """Cache entries the attention reads for one query (sparse selection caps it)."""
        return min(context_len, self.index_topk) if self.index_topk else context_len

    def attention_flops_per_query(self, context_len: float) -> float:
        """Score + weighted-sum FLOPs of one query token over `context_len` cached tokens."""
        entries = self.mean_attended_entries(context_len)
        if self.arch == "mla":  # absorbed form: scores over latent+rope, output in latent space
            flops = 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim) * entries
            return flops + 2 * self.index_num_heads * self.index_head_dim * context_len
        return 4 * self.num_heads * self.head_dim * entries

    def layer_workspace_elements(self, num_queries: int, num_keys: float, scores: float | None = None) -> float:
        """Scratch elements one sequence holds at the peak of a layer, beside the cache.

        The larger of the two stages, counting what the engine's forward keeps alive at once:
        attention holds the input, its norm, q, k, v, the attention output, the o projection
        and the scores (at most SCORE_QUERY_CHUNK queries at a time; `scores` where the caller
        counts them: the exact path's, `placement.cost_memory.workspace_bytes`); the FFN holds the
        input, its norm and the wide buffers (gate, up and their product; OPT: fc1 and its
        activation). The engine charges exactly this to its gpu budget, so plans and runs agree.
        """
        h, queries = self.hidden_size, num_queries
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if scores is None:
            scores = self.num_heads * min(queries, SCORE_QUERY_CHUNK) * num_keys
        attention = queries * (3 * h + 2 * q_dim + 2 * kv_dim) + scores
        ffn_wide = 2 if self.arch == "opt" else 3
        ffn = queries * (2 * h + ffn_wide * self.intermediate_size)
        return max(attention, ffn, self._linear_workspace_elements(queries))

    def delta_rule_flops_per_token_per_layer(self, decode: bool) -> float:
        """FLOPs of one token through the gated delta rule, per (average) layer: a decode token
        runs a whole chunk (its open chunk padded), a prompt token its share of one."""
        if not self.num_linear_layers:
            return 0.0
        flops = delta_rule_flops(LINEAR_CHUNK, self.linear_key_head_dim, self.linear_value_head_dim, decode)
        return self.linear_num_value_heads * flops * self.num_linear_layers / self.num_layers

    def delta_rule_passes_per_token_per_layer(self, decode: bool) -> float:
        """fp32 elements one token's DeltaNet layer passes over beside its GEMMs and the rule (whose
        measured rate covers its own casts and norms), per (average) layer: the causal conv and its
        SiLU (~10 passes over its channels), the gated norm (~10 over the values), the tokens laid
        after the open chunk (~4 over k | v | beta); a decode token lays out its whole open chunk."""
        if not self.num_linear_layers:
            return 0.0
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        laid_out = self._linear_open_token_entries() * (LINEAR_CHUNK if decode else 1)
        passes = 10 * self._linear_conv_dim() + 10 * value_dim + 4 * laid_out
        return passes * self.num_linear_layers / self.num_layers

    def _linear_workspace_elements(self, queries: int) -> float:
        """A DeltaNet layer's peak, in dtype elements (its rule runs in fp32): the projections and
        conv window in dtype, then q, k, v and their decayed copies in fp32 and three chunk x chunk
        matrices per value head and chunk, over the step's tokens after the row's open chunk (up to
        LINEAR_CHUNK - 1 earlier tokens, decodes included: models.blocks.aligned_delta_rule)."""
        if not self.num_linear_layers:
            return 0.0
        fp32 = 4 / self.dtype_bytes
        heads, value_dim = self.linear_num_value_heads, self.linear_num_value_heads * self.linear_value_head_dim
        expanded = 2 * heads * self.linear_key_head_dim + value_dim  # q and k repeated per value head, v
        chunks = -(-(queries + LINEAR_CHUNK - 1) // LINEAR_CHUNK) * LINEAR_CHUNK
        pairwise = 3 * heads * LINEAR_CHUNK * chunks
        return (queries * (2 * self.hidden_size + 2 * self._linear_conv_dim() + 2 * value_dim)
                + fp32 * (3 * chunks * expanded + pairwise))

    def elementwise_elements_per_token_per_layer(self) -> float:
        """Activation elements one token's non-GEMM passes read and write in one layer: two
        norms (read + write the hidden state), the rotary embedding of q and k (about ten
        passes over them: negate, concatenate, two products and their sum), the cache write,
        and the FFN activation in place; residual adds and the gate product ride on the GEMMs.
        Memory-bound: a third of a small model's prefill on a CPU, noise on a GPU."""
        h = self.hidden_size
        if self.arch == "mla":
            q_dim = self.num_heads * (self.head_dim + self.qk_rope_head_dim)
            kv_dim = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        rotary = 0 if self.arch == "opt" else 10 * (q_dim + kv_dim)
        num_moe = self._num_moe_layers()
        moe_width = self.moe_intermediate_size * self.num_experts_per_token + self.shared_width
        ffn_width = ((self.num_layers - num_moe) * self.intermediate_size + num_moe * moe_width) / self.num_layers
        return 4 * h + rotary + 4 * kv_dim + 2 * ffn_width
