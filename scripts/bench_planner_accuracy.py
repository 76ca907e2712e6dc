"""The planner's predicted throughput against the offload engine's measured one, per policy.

Runs SmolLM2 (or --model) under six hand-picked policies on this machine and prints
predicted and measured tokens/s, their ratio, and the prefill and per-step decode times
behind them; same prompts and lengths for every policy, each run in a fresh engine. It goes
in rounds: a profile measured as `flexlamps profile --model <model>` does (GEMMs and
decompression timed on the model's own matrices), then every policy once, predicted with
that profile. On a shared machine speeds drift over minutes, so a policy's ratio is its
median over the rounds (all rounds' ratios are printed). --hardware fixes one profile.

A run's measured time is its wall time less the seconds the engine's thread sat ready to run while
other processes held the cores (Linux's schedstat, `thread_clock`): the profile's probes keep the
median of short repetitions, which mostly miss such waits, where a run of seconds takes all of them
(2026-12-07, load 2.8-4.4: weights 50% cpu 8x2 took 4.1-11.6 s of wall for 4.1-5.8 s of CPU, in
either tree). The wall clock's rate, the wait and the thread's CPU seconds are printed beside it.
Under a heavier load the probes' medians and the CPU seconds stretch too (load 5-6: profiles priced
the policies 2-5x slower than a quiet one): compare trees in turns, and take accuracy on a quiet box.

    python scripts/bench_planner_accuracy.py [--dtype bfloat16 --prompt-len 64 --gen-len 16 --rounds 3 --hardware hw.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import placement
from flexlamps import LLM, SamplingParams
from flexlamps.engine.executors.thread_clock import thread_clock
from flexlamps.hardware.machine import profile_machine
from flexlamps.models.description import model_spec
from flexlamps.models.loading.registry import open_checkpoint
from placement import Policy, TierSplit, WorkloadSpec

G = TierSplit(gpu=1, cpu=0, disk=0)


def policies() -> dict[str, Policy]:
    def p(bs, nb, w, c=G, h=G, **kw):
        return Policy(gpu_batch_size=bs, num_gpu_batches=nb, weights=w, cache=c, activations=h, **kw)

    return {
        "all gpu, 8x1": p(8, 1, G),
        "all gpu, 16x2": p(16, 2, G),
        "weights 50% cpu, 8x2": p(8, 2, TierSplit(gpu=0.5, cpu=0.5, disk=0)),
        "weights 75% disk, 16x2": p(16, 2, TierSplit(gpu=0.25, cpu=0, disk=0.75)),
        "cache cpu + cpu attention, 8x2": p(8, 2, G, c=TierSplit(gpu=0, cpu=1, disk=0), cpu_attention=True),
        "4-bit weights, 16x1": p(16, 1, G, compress_weight=True),
        # offloaded 4-bit: decode calls of 16 rows (fused kernel) and of 128 (dequantized, dense)
        "4-bit weights 75% disk, 8x2": p(8, 2, TierSplit(gpu=0.25, cpu=0, disk=0.75), compress_weight=True),
        "4-bit weights 75% disk, 32x4": p(32, 4, TierSplit(gpu=0.25, cpu=0, disk=0.75), compress_weight=True),
    }


def budget_policies() -> dict[str, Policy]:
    """SmolLM2 as it runs by default (bf16, 4-bit weights multiplied in place) with its weights
    on each tier: the gpu tier, the cpu tier, mostly disk."""
    def p(w):
        return Policy(gpu_batch_size=8, num_gpu_batches=1, weights=w, cache=G, activations=G, compress_weight=True)

    return {"4-bit weights on gpu tier, 8x1": p(G), "4-bit weights on cpu tier, 8x1": p(TierSplit(gpu=0, cpu=1, disk=0)),
            "4-bit weights 90% disk, 8x1": p(TierSplit(gpu=0.05, cpu=0.05, disk=0.9))}


TOLERANCE = 0.2  # the planner's accuracy target: measured within +-20% of predicted


@dataclasses.dataclass
class Run:
    """One policy: every timed run (`Timed`). Each run builds its
    own engine and closes it, as a user's job would: engines of the other policies left alive
    in the process slowed 4-bit decoding here by half again."""

    model: str
    policy: Policy
    folder: Path  # the offload folder, reused by the next run of this policy
    dtype: str  # torch dtype name the engine computes in
    prompt_len: int
    gen_len: int
    results: list = dataclasses.field(default_factory=list)  # a `Timed` per run

    @property
    def num_sequences(self) -> int:
        return self.policy.gpu_batch_size * self.policy.num_gpu_batches

    def once(self, hardware: placement.HardwareSpec) -> None:
        """One timed run in a fresh engine, predicted with `hardware` (this round's profile)."""
        llm = LLM(self.model, dtype=self.dtype, gpu_mem=8 * 2**30, cpu_mem=8 * 2**30, offload_dir=str(self.folder),
                  policy=self.policy)
        ids = llm.tokenizer.encode("The history of the printing press begins in the fifteenth century. " * 40)
        prompts = [ids[i: i + self.prompt_len] for i in range(self.num_sequences)]
        params = SamplingParams(max_new_tokens=self.gen_len, ignore_eos=True)
        llm.generate_ids(prompts[:2], [dataclasses.replace(params, max_new_tokens=2)] * 2)  # warm-up
        llm.executor.sweep.record_profile = True
        llm.executor.sweep.profiles = []
        start, (cpu, waited) = time.perf_counter(), thread_clock()
        llm.generate_ids(prompts, [params] * len(prompts))
        wall, (cpu_end, waited_end) = time.perf_counter() - start, thread_clock()
        self.results.append(Timed(wall, cpu_end - cpu, waited_end - waited, llm.executor.sweep.profiles, hardware))
        llm.close()


@dataclasses.dataclass
class Timed:
    """One timed generate: its wall seconds, the calling thread's CPU seconds and its seconds waiting
    for a core (the sweeps run on it), the engine's sweep profiles, the profile it is predicted with."""

    wall_s: float
    cpu_s: float
    waited_s: float
    sweeps: list
    hardware: placement.HardwareSpec

    @property
    def seconds(self) -> float:
        """What the run took on this machine's cores: its wall time less the wait for one."""
        return self.wall_s - self.waited_s


def describe(hw: placement.HardwareSpec) -> str:
    tables = [f"{dtype} GEMM GFLOP/s by rows, {label}: "
              + ", ".join(f"{r}: {f / 1e9:.0f}" for r, f in table.get(dtype, {}).items())
              for label, table in (("streamed", hw.gpu_gemm_flops_by_rows),
                                   ("resident", hw.gpu_gemm_flops_by_rows_resident)) for dtype in ("fp32", "bf16")]
    return "\n".join(f"  {t}" for t in tables) + (
        f"\n  memory {hw.gpu_mem_bytes_per_s / 1e9:.1f} GB/s, copy {hw.cpu_to_gpu_bytes_per_s / 1e9:.1f} GB/s, "
        f"disk read {hw.disk_read_bytes_per_s / 1e9:.2f} GB/s, layer overhead {hw.gpu_layer_overhead_s * 1e6:.0f} us, "
        f"dequant {hw.gpu_dequant_bytes_per_s / 1e9:.2f} GB/s + {hw.gpu_dequant_matrix_s * 1e6:.0f} us a matrix, "
        f"cpu attention {hw.cpu_attention_flops_per_s / 1e9:.1f} GFLOP/s"
        + "".join(f", delta rule {k} {v / 1e9:.1f} GFLOP/s" for k, v in hw.gpu_delta_rule_flops_per_s.items())
        + "\n"
        f"  4-bit fused kernel (under {hw.int4_dense_from_rows} rows) GFLOP/s by rows: "
        + "; ".join(f"{d} " + ", ".join(f"{r}: {f / 1e9:.0f}" for r, f in t.items())
                    for d, t in hw.gpu_int4_gemm_flops_by_rows.items())
        + f"; 4-bit dequant {hw.gpu_int4_dequant_bytes_per_s / 1e9:.2f} GB/s\n"
        f"  attention GFLOP/s: " + "; ".join(f"{phase} " + ", ".join(f"{d} {f / 1e9:.1f}" for d, f in rates.items())
                                             for phase, rates in hw.gpu_attention_flops_per_s.items())
        + "; a call (us): " + "; ".join(f"{phase} " + ", ".join(f"{d} {s * 1e6:.0f}" for d, s in calls.items())
                                       for phase, calls in hw.gpu_attention_call_s.items()))


def report(runs: dict[str, Run], model, args) -> None:
    """Each policy's predicted and measured tokens/s (its median round), the wall clock's rate and the
    seconds its thread waited for a core beside them; prefill and decode-step seconds, each sweep's
    wall less its own wait."""
    print(f"{'policy':<34} {'predicted':>10} {'measured':>10} {'meas/pred':>10} {'wall':>8} {'waited s':>9} "
          f"{'cpu s':>6}   "
          f"{'prefill s pred/meas':>20} {'decode step s pred/meas':>24}   ratio per round")
    model = dataclasses.replace(model, dtype={"float32": "fp32", "bfloat16": "bf16"}[args.dtype])
    workload = WorkloadSpec(prompt_len=args.prompt_len, gen_len=args.gen_len)
    within = 0
    for name, run in runs.items():
        rows = []
        for timed in run.results:
            pred = placement.predict(run.policy, model, timed.hardware, workload)
            measured = run.num_sequences * args.gen_len / timed.seconds
            rows.append((measured / pred.tokens_per_s, pred, measured, timed))
        ratio, pred, measured, timed = sorted(rows, key=lambda r: r[0])[len(rows) // 2]  # the median round
        prefill_s = sum(p.sweep_s - p.run_queue_s for p in timed.sweeps if p.prefill)
        decode_s = statistics.median(p.sweep_s - p.run_queue_s for p in timed.sweeps if not p.prefill)
        within += abs(ratio - 1) <= TOLERANCE
        print(f"{name:<34} {pred.tokens_per_s:>10.2f} {measured:>10.2f} {ratio:>10.2f} "
              f"{run.num_sequences * args.gen_len / timed.wall_s:>8.2f} {timed.waited_s:>9.2f} {timed.cpu_s:>6.2f}   "
              f"{pred.prefill_s:>9.3f}/{prefill_s:<10.3f} "
              f"{pred.decode_s / max(args.gen_len - 1, 1):>11.4f}/{decode_s:<12.4f}   "
              + " ".join(f"{r[0]:.2f}" for r in rows))
    print(f"{within} of {len(runs)} policies within +-{TOLERANCE:.0%} (median round); "
          f"threads {torch.get_num_threads()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of (profile, then every policy once); a policy's ratio is its median "
                         "over the rounds, each run predicted with its own round's profile")
    ap.add_argument("--set", dest="policy_set", default="mixed", choices=["mixed", "budgets"],
                    help="mixed: eight hand-picked policies; budgets: the default 4-bit weights on each tier "
                         "(use with --dtype bfloat16)")
    ap.add_argument("--hardware", default=None,
                    help="a HardwareSpec JSON for every round (default: profile this machine each round, "
                         "with the model's matrices)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flexlamps-acc-"))
    model = model_spec(open_checkpoint(args.model).config)  # every family the engine loads
    runs = {name: Run(args.model, policy, work / f"offload-{i}", args.dtype, args.prompt_len, args.gen_len)
            for i, (name, policy) in enumerate((policies() if args.policy_set == "mixed" else budget_policies()).items())}
    fixed = placement.HardwareSpec.from_json(Path(args.hardware).read_text()) if args.hardware else None
    for round_ in range(args.rounds):
        # on a shared machine the speeds drift over minutes: each round's runs are predicted with
        # a profile measured just before them
        if fixed is None:
            print(f"round {round_ + 1}: profiling this machine (about 40 s) ...", flush=True)
        hw = fixed or profile_machine(disk_folder=work, model_shapes=model.layer_matrix_shapes(),
                                      expert_dims=model.routed_expert_dims())
        print(f"hardware: {hw.name}\n{describe(hw)}", flush=True)
        for run in runs.values():
            run.once(hw)
    report(runs, model, args)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
