"""Where the machine profile `--policy auto` plans with is cached (`cache`), torch-free so that
`flexlamps env` names the file without loading the probes."""

import hashlib
from pathlib import Path

from flexlamps.cache_folder import cache_root

# 3: dequantization over a sweep of matrices + a per-matrix cost, the engine's allocator;
# 4: GEMM rates for resident (prepacked) weights; 5: median repetitions, a model's own
# matrices, tensor-sized disk files, gpu_is_host; 6: the engine's 4-bit weights (fused kernel
# by rows, dequantization rate, the switch between them); 7: those in passes taking turns;
# 8: a quick GEMM check beside each profile, so one measured on a busy box is measured again;
# 9: the int8 GEMM 4-bit prompts run on (a CPU with it); 10: dense GEMMs by rows on prompt calls and, on
# CPUs, bf16 decode calls apart (the engine's decode kernel), MoE experts per phase; 11: 16-bit prompt rows on an
# AVX2 CPU on the native kernel (`kernels.half_gemm`), dense and MoE experts; 12: on an AMX CPU a prompt's bf16
# rows in oneDNN calls of 128 rows (`dense_gemm.AMX_PROMPT_ROW_BLOCK`), decode experts' kernel in 6-row tiles;
# 13: the engine's attention through its cache, by phase and dtype (`attention_probe`); 14: its fixed cost a call
PROFILE_VERSION = 14


def profile_cache_path(threads: int, shapes=None, expert_dims=None) -> Path:
    """Where the profile timed at `threads` compute threads on matrices of `shapes` (None: the
    generic ones) is cached, and on routed experts of `expert_dims` (hidden, width) for a MoE
    model (its own file: a profile without the experts' rates is measured again for one)."""
    root = cache_root()
    # versioned: a profile written before the probes changed is measured again, not reused; per
    # thread count: rates taken at 2 threads priced a 1-thread run 2x fast (measured/predicted 0.49)
    name = f"hardware-v{PROFILE_VERSION}-t{threads}"
    if shapes:
        name += "-" + hashlib.sha256(repr(tuple(map(tuple, shapes))).encode()).hexdigest()[:12]
    if expert_dims:
        name += "-experts-{}x{}".format(*expert_dims)
    return Path(root) / f"{name}.json"
