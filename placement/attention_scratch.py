"""The exact fp32 attention path's shape rules and scratch (`flexlamps.models.blocks.attention`'s
per-query path, which attention with sinks or soft-capping runs on every device): its query chunks
follow `query_chunk`, and the layer workspace (`placement.cost_memory.workspace_bytes`, which the
planner prices and the sweep charges) counts `exact_attention_bytes` for it. Torch-free: one rule
for the path and its charge."""

# NOTE(exact): MIN_SPAN and KEY_BLOCK are shape rules of the exact path (see the attention module's
# docstring); changing them needs the exactness tests re-run.
MIN_SPAN = 16  # softmax's vectorized sums add masked zeros lane by lane from 16 keys on; MKL's
# product with fewer than 12 keys (columns) runs another kernel
KEY_BLOCK = 128  # MKL splits a longer reduction with the values at points that depend on its length
# fp32 scores held at once in a long prompt chunk (32 MiB; a batch of 32 prompts of 128 tokens of
# SmolLM2 in one block); more queries run in blocks (a query's result does not depend on its block)
SCORES_PER_BLOCK = 1 << 23
# fp32 score buffers of one chunk alive at once: the product, its copy padded to whole key blocks,
# the sink column's concatenation and the softmax (without sinks one fewer: the bound is kept)
SCORE_COPIES = 4
PAD_ROWS = 16  # the most query rows a product is padded to (`row_products.MAX_MIN_ROWS`)
_FP32 = 4


def padded_span(span: float) -> float:
    """Keys the scores hold a query: at least MIN_SPAN, padded to whole KEY_BLOCKs."""
    return -(-max(span, MIN_SPAN) // KEY_BLOCK) * KEY_BLOCK


def query_chunk(rows: int, heads: int, padded: float, queries: int) -> int:
    """Queries (of every row and head at once) whose scores one block holds: SCORES_PER_BLOCK."""
    return int(max(1, min(queries, SCORES_PER_BLOCK // (rows * heads * padded))))


def exact_attention_bytes(rows: int, heads: int, kv_heads: int, head_dim: int, queries: int, span: float,
                          value_dim: int = 0) -> float:
    """Bytes the exact path holds beside its inputs and its result in dtype: the keys and values
    in fp32, then one chunk's queries (padded to up to PAD_ROWS a kv head), SCORE_COPIES of their
    scores and their product with the values (and its last part) beside the chunks' fp32 outputs
    so far, or at the end those outputs twice (their concatenation)."""
    value_dim = value_dim or head_dim
    padded = padded_span(span)
    keys = _FP32 * rows * kv_heads * max(span, MIN_SPAN) * (head_dim + value_dim)
    chunk = query_chunk(rows, heads, padded, queries)
    chunk_rows = rows * kv_heads * max(heads // kv_heads * chunk, PAD_ROWS)  # every kv head's product's rows
    scores = _FP32 * chunk_rows * (SCORE_COPIES * (padded + 1) + head_dim + 2 * value_dim)
    outputs = _FP32 * rows * heads * queries * value_dim
    return keys + max(scores + outputs, 2 * outputs)
