"""The planner's predicted throughput against the offload engine's measured one, per policy.

Runs SmolLM2 (or --model) under several hand-picked policies on this machine, with the
machine profile that `flexlamps profile` cached (or --hardware), and prints predicted and
measured tokens/s and their ratio. Same prompts and lengths for every policy.

    python scripts/bench_planner_accuracy.py [--prompt-len 64 --gen-len 16 --hardware hw.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import torch

import placement
from flexlamps import LLM, SamplingParams
from flexlamps.engine.policy_choice import machine_profile
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
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs per policy; the fastest counts, as the profile keeps each probe's best")
    ap.add_argument("--hardware", default=None, help="a HardwareSpec JSON (default: this machine's cached profile)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flexlamps-acc-"))
    hw = (placement.HardwareSpec.from_json(Path(args.hardware).read_text()) if args.hardware
          else machine_profile(work))
    print(f"hardware: {hw.name}")
    print(f"{'policy':<34} {'predicted':>10} {'measured':>10} {'meas/pred':>10}")
    for name, policy in policies().items():
        folder = work / "offload"
        shutil.rmtree(folder, ignore_errors=True)
        llm = LLM(args.model, gpu_mem=8 * 2**30, cpu_mem=8 * 2**30, offload_dir=str(folder), policy=policy)
        n = policy.gpu_batch_size * policy.num_gpu_batches
        ids = llm.tokenizer.encode("The history of the printing press begins in the fifteenth century. " * 40)
        prompts = [ids[i: i + args.prompt_len] for i in range(n)]
        params = SamplingParams(max_new_tokens=args.gen_len, ignore_eos=True)
        llm.generate_ids(prompts[:2], [dataclasses.replace(params, max_new_tokens=2)] * 2)  # warm-up
        seconds = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            llm.generate_ids(prompts, [params] * n)
            seconds = min(seconds, time.perf_counter() - t)
        measured = n * args.gen_len / seconds
        model = dataclasses.replace(placement.ModelSpec.from_hf_config(llm.reader.hf_config), dtype="fp32")
        pred = placement.predict(policy, model, hw, WorkloadSpec(prompt_len=args.prompt_len, gen_len=args.gen_len))
        print(f"{name:<34} {pred.tokens_per_s:>10.2f} {measured:>10.2f} {measured / pred.tokens_per_s:>10.2f}")
        llm.close()
    print(f"threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
