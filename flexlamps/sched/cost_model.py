"""Per-iteration latency of the engine, as a small roofline-style model.

One iteration (a forward over every scheduled token) costs

    overhead_s + max(weights_read_s, prefill_per_token_s * prefill_tokens
                                     + decode_per_seq_s * decode_seqs)
               + kv_read_per_token_s * context_tokens
               + max(0, swap_time - compute_time)

- the weights are streamed from HBM once per iteration (memory-bound decode floor);
- every processed token costs its linear-layer FLOPs (compute-bound prefill / large batches);
- attention reads each scheduled request's cached context once;
- swaps are pipelined behind compute (INFERCEPT's "swap budget"): only the part of a swap
  that does not fit under the iteration's compute time stalls it.

The default, `CostModel.gptj6b_a100()`, is derived from GPT-J-6B's shapes and A100-40GB
datasheet numbers (see there). The real engine can measure its own and save it as JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from flexlamps.io.atomic import atomic_output


@dataclass
class CostModel:
    overhead_s: float  # launch, sampling, scheduling per iteration
    weights_read_s: float  # time to stream the weights once (memory-bound floor)
    prefill_per_token_s: float  # linear-layer compute per prompt/recompute token
    decode_per_seq_s: float  # linear-layer compute per decoding sequence
    kv_read_per_token_s: float  # attention: reading one cached token's K and V
    swap_bytes_per_s: float  # gpu <-> cpu bandwidth for KV blocks
    kv_bytes_per_token: int  # K + V bytes of one token over all layers
    gpu_kv_tokens: int  # KV capacity of the gpu tier, in tokens
    cpu_swap_tokens: int  # swap space on the cpu tier, in tokens
    max_model_len: int = 2048
    note: str = ""
    # a hybrid model's recurrent state, held whole from a request's first token on, as the KV tokens
    # of its blocks (engine.caches.paged_state): constant memory beside the growing context
    state_tokens: int = 0

    # -- derived costs ---------------------------------------------------------------------
    def compute_time(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        linear = self.prefill_per_token_s * prefill_tokens + self.decode_per_seq_s * decode_seqs
        return (
            self.overhead_s
            + max(self.weights_read_s, linear)
            + self.kv_read_per_token_s * context_tokens
        )

    def swap_time(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.swap_bytes_per_s

    def step_time(
        self, prefill_tokens: int, decode_seqs: int, context_tokens: int, swap_tokens: int = 0
    ) -> float:
        compute = self.compute_time(prefill_tokens, decode_seqs, context_tokens)
        return max(compute, self.swap_time(swap_tokens)) if swap_tokens else compute

    def decode_run_time(self, decode_seqs: int, context_tokens: int, steps: int) -> float:
        """Time of `steps` pure-decode iterations; each one adds `decode_seqs` context tokens."""
        per_step = self.compute_time(0, decode_seqs, 0)
        growth = steps * context_tokens + decode_seqs * steps * (steps - 1) / 2
        return steps * per_step + self.kv_read_per_token_s * growth

    def prefill_time(self, tokens: int) -> float:
        """T_fwd(C): one forward over `tokens` context tokens (recomputing a discarded cache)."""
        return self.compute_time(tokens, 0, tokens)

    def chunk_time(self, tokens: float) -> float:
        """Time a chunk of `tokens` recomputed tokens adds to an iteration it shares with a
        decode batch: the per-token slope of T_fwd (linear layers + attention over the chunk),
        no fixed part, as INFERCEPT prices a recompute chunk (a * c_h)."""
        return (self.prefill_per_token_s + self.kv_read_per_token_s) * tokens

    def swap_budget_tokens(self, iteration_s: float) -> int:
        """Tokens whose KV can move across PCIe while an iteration of `iteration_s` computes."""
        return int(iteration_s * self.swap_bytes_per_s / self.kv_bytes_per_token)

    # -- presets ---------------------------------------------------------------------------
    @classmethod
    def gptj6b_a100(cls, gpu_mem_gb: float = 40.0, cpu_swap_gib: float = 4.0) -> "CostModel":
        """GPT-J-6B (fp16) on one A100-SXM4-40GB, as INFERCEPT and LAMPS evaluate.

        Model shapes: 6.05e9 parameters, 28 layers, d_model 4096 (16 heads x 256), no GQA.
        - weights: 6.05e9 x 2 B = 12.1 GB; KV per token: 2 (K,V) x 28 x 4096 x 2 B = 458,752 B.
        - A100: 312 TFLOP/s bf16 dense, 1,555 GB/s HBM, PCIe 4.0 x16 (~25 GB/s pinned).
        - linear FLOPs per token: 2 x 6.05e9; at 50% MFU -> 7.8e-5 s per token.
        - weight streaming at 80% of HBM bandwidth: 12.1e9 / 1.244e12 = 9.7 ms per iteration.
        - attention KV read at 80% of HBM: 458,752 / 1.244e12 = 3.7e-7 s per cached token.
        - swap: 458,752 B / 25e9 B/s = 1.8e-5 s per token (INFERCEPT profiles 4e-5).
        - gpu KV tier: 0.9 x 40 GB (vLLM's memory utilization) - 12.1 GB weights - 1.5 GB
          activations = 22.4 GB -> 48.8k tokens; cpu swap: vLLM's default 4 GiB -> 9.4k tokens.
        """
        params, layers, d_model, dtype_bytes = 6.05e9, 28, 4096, 2
        flops, hbm, pcie = 312e12, 1.555e12, 25e9
        mfu, hbm_eff = 0.5, 0.8
        kv_bytes = 2 * layers * d_model * dtype_bytes
        weights = params * dtype_bytes
        per_token = 2 * params / (flops * mfu)
        gpu_kv = 0.9 * gpu_mem_gb * 1e9 - weights - 1.5e9
        return cls(
            overhead_s=3e-3,
            weights_read_s=weights / (hbm * hbm_eff),
            prefill_per_token_s=per_token,
            decode_per_seq_s=per_token,
            kv_read_per_token_s=kv_bytes / (hbm * hbm_eff),
            swap_bytes_per_s=pcie,
            kv_bytes_per_token=kv_bytes,
            gpu_kv_tokens=int(gpu_kv // kv_bytes),
            cpu_swap_tokens=int(cpu_swap_gib * 2**30 // kv_bytes),
            max_model_len=2048,
            note=f"GPT-J-6B fp16 on A100-{gpu_mem_gb:g}GB, derived from shapes and datasheet",
        )

    @classmethod
    def infercept_gptj6b(cls, gpu_mem_gb: float = 40.0, cpu_swap_gib: float = 128.0) -> "CostModel":
        """GPT-J-6B on one A100 as INFERCEPT profiled it for its paper (WukLab/InferCept,
        exps/6B_bench.sh, the constants its scheduler_v2.py is patched with): an iteration
        of T batched tokens takes a * T + c with a = 0.0463 ms/token, c = 10 ms (27.8 ms for
        the 384-token budget); a swap moves a * 384 + b = 110.8 tokens (t_sin: a = 0.00462,
        b = 108.99) while one full iteration computes, i.e. 3,990 tokens/s. Swap space: 128 GiB
        as in its runs (LAMPS's runs: 32 GiB). The profile has no separate attention or
        weight-streaming terms (a linear fit over batched tokens). The gpu KV tier is the
        A100-40GB one of `gptj6b_a100` (the paper says "one A100"); the token budget (384) and
        swap space are SchedulerConfig's (see `PAPER_SETTING`)."""
        base = cls.gptj6b_a100(gpu_mem_gb, cpu_swap_gib)
        a, c = 0.0463e-3, 10e-3
        full_iteration = a * 384 + c
        swap_tokens_per_s = (0.00462 * 384 + 108.99) / full_iteration
        return cls(
            overhead_s=c, weights_read_s=0.0, prefill_per_token_s=a, decode_per_seq_s=a,
            kv_read_per_token_s=0.0, swap_bytes_per_s=swap_tokens_per_s * base.kv_bytes_per_token,
            kv_bytes_per_token=base.kv_bytes_per_token, gpu_kv_tokens=base.gpu_kv_tokens,
            cpu_swap_tokens=base.cpu_swap_tokens, max_model_len=2048,
            note=f"GPT-J-6B on A100-{gpu_mem_gb:g}GB, INFERCEPT's profile (a*T + c), "
                 f"{cpu_swap_gib:g} GiB swap",
        )

    @classmethod
    def preset(cls, name: str, **kw) -> "CostModel":
        try:
            return PRESETS[name](**kw)
        except KeyError:
            raise ValueError(f"unknown cost-model preset {name!r}; choose from {', '.join(PRESETS)}") from None

    # -- json --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"cost model: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    def save(self, path: str) -> None:
        with atomic_output(path) as f:
            json.dump(self.to_json(), f, indent=2)

    @classmethod
    def load(cls, path: str) -> "CostModel":
        try:
            with open(path) as f:
                return cls.from_json(json.load(f))
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"cost model file {path}: {e}; write one with CostModel.save") from e


# name -> cost model; the papers' setting also fixes SchedulerConfig (see PAPER_SETTING)
PRESETS = {
    "gptj6b-a100-datasheet": CostModel.gptj6b_a100,
    "infercept-gptj6b": CostModel.infercept_gptj6b,
}
# the scheduler settings of INFERCEPT's and LAMPS's runs: vLLM's chunk-fill budget of 384
# tokens per iteration (scheduler_v2.py, `mlimit`), vLLM's default 256 sequences
PAPER_SETTING = {"max_num_batched_tokens": 384, "max_num_seqs": 256}
