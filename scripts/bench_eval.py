"""Zero-shot multiple choice: instances/s of `flexlamps helm` vs lm-evaluation-harness's HF backend.

Same model, same items, same prompts (lm-eval's ARC format `Question: q\\nAnswer:` then `" " + choice`),
same threads, in one process, alternating, best of --repeats:
- ours: the items written as a user's file in the documented default format and evaluated by the
  run path of `flexlamps helm` (adapter, packed scoring, metrics, HELM run folder);
- peer: `lm_eval.models.huggingface.HFLM(pretrained=<transformers model>).loglikelihood` on the
  same (context, continuation) requests: lm-eval's own batched log-likelihood loop.
Accuracy is computed the same way from each side's log-likelihoods (acc: summed log-prob; acc_norm:
per character of the scored text), and the picks are compared item by item. Model FLOP rates are
given as a fraction of this machine's fp32 GEMM peak, timed in every round at the same threads; each
is also given per CPU second of this process (robust to other processes sharing the cores).

    .venv/bin/pip install lm_eval==0.4.13     # not a flexlamps dependency
    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_eval.py --limit 200 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flexlamps import LLM, SamplingParams  # noqa: E402
from flexlamps.evals.jobs import RunOptions, plan_jobs  # noqa: E402
from flexlamps.evals.runner import execute_run  # noqa: E402
from flexlamps.evals.scenarios import default_data_dir, read_jsonl  # noqa: E402


def load_items(data: Path, task: str, limit: int) -> list[dict]:
    """MosaicML ICL rows {query: 'Question: ...', choices, gold} -> lm-eval's prompt for the task."""
    path = {"arc_easy": data / "arc" / "arc_easy.jsonl", "arc_challenge": data / "arc" / "arc_challenge.jsonl",
            "piqa": data / "piqa" / "piqa.jsonl"}[task]
    items = []
    for _, row in read_jsonl(path)[:limit]:
        question = row["query"].strip()
        question = question[len("Question: "):] if question.startswith("Question: ") else question
        items.append({"id": f"{task}-{len(items)}", "context": f"Question: {question}\nAnswer:",
                      "choices": [c.strip() for c in row["choices"]], "gold": int(row["gold"])})
    return items


def accuracy(items: list[dict], logprobs: list[list[float]]) -> tuple[float, float, list[int]]:
    """(acc, acc_norm, acc_norm picks) from per-choice log-probs."""
    raw = norm = 0.0
    picks = []
    for item, lps in zip(items, logprobs):
        per_char = [lp / len(" " + c) for lp, c in zip(lps, item["choices"])]
        raw += lps.index(max(lps)) == item["gold"]
        picks.append(per_char.index(max(per_char)))
        norm += picks[-1] == item["gold"]
    return raw / len(items), norm / len(items), picks


def run_ours(llm, file: Path, out: Path, batch_size: int):
    (job,) = plan_jobs((), (str(file),), RunOptions("flexlamps/bench"))
    outcome = execute_run(llm, job.spec, job.scenario, out, "bench", SamplingParams, batch_size, overwrite=True)
    states = json.loads((outcome.path / "scenario_state.json").read_text())["request_states"]
    by_item: dict[str, list[float]] = {}
    cont_tokens = 0
    for s in states:
        by_item.setdefault(s["instance"]["id"], []).append(s["result"]["completions"][0]["logprob"])
        cont_tokens += len(s["result"]["completions"][0]["tokens"])
    return list(by_item.values()), outcome.stat("prefill_tokens_computed"), cont_tokens


def run_peer(lm, items: list[dict]):
    from lm_eval.api.instance import Instance

    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(it["context"], " " + c), idx=k)
            for it in items for k, c in enumerate(it["choices"])]
    res = lm.loglikelihood(reqs, disable_tqdm=True)
    flat = iter(lp for lp, _ in res)
    return [[next(flat) for _ in it["choices"]] for it in items]


GEMM_N = 2048  # the peak is timed on n x n fp32 matrix products, at the run's threads
GEMM_REPEATS = 5


def gemm_peak():
    """GEMM_REPEATS products of GEMM_N-square fp32 matrices (2 n^3 FLOPs each) by the fastest GEMM
    torch has here: oneDNN with a prepacked weight (what flexlamps' linear runs; on this Zen 4 it
    beats torch.mm's BLAS by ~35%), so no model rate can exceed the peak by a kernel choice."""
    from flexlamps.models.blocks.linear import linear, pack

    a, b = torch.randn(GEMM_N, GEMM_N), pack(torch.randn(GEMM_N, GEMM_N))
    for _ in range(GEMM_REPEATS):
        linear(a, b)


def gemm_flops() -> float:
    return 2 * GEMM_N ** 3 * GEMM_REPEATS


def load_peer(model: str, batch_size: int):
    import transformers
    from lm_eval.models.huggingface import HFLM

    from flexlamps.models.loading.builtin import BUILTIN_MODELS, builtin_path

    if model.lower() in BUILTIN_MODELS:
        path = builtin_path(model.lower())
        kw = dict(gguf_file=path.name)
        src = path.parent
    else:
        kw, src = {}, model
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **kw).eval()
    tok = transformers.AutoTokenizer.from_pretrained(src, **kw)
    return hf, HFLM(pretrained=hf, tokenizer=tok, batch_size=batch_size, device="cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="arc_easy", choices=["arc_easy", "arc_challenge", "piqa"])
    ap.add_argument("--limit", type=int, default=200, help="first N items of the task's file")
    ap.add_argument("--data", type=Path, default=None, help="benchmark files (default: ../shared/data)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", help="ours (the peer runs float32 transformers)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256, help="ours: requests handed to the engine at once")
    ap.add_argument("--engine-batch", type=int, default=64, help="ours: contexts packed per forward step")
    ap.add_argument("--peer-batch-size", type=int, default=32, help="lm-eval's --batch_size")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    items = load_items(args.data or default_data_dir(), args.task, args.limit)
    work = Path(tempfile.mkdtemp(prefix="bench_eval_"))
    file = work / f"{args.task}.jsonl"
    file.write_text("".join(json.dumps(it) + "\n" for it in items))

    llm = LLM(args.model, dtype=args.dtype, max_batch_size=args.engine_batch)
    hf, peer = load_peer(args.model, args.peer_batch_size)
    best = {"ours": Timing(), "peer": Timing(), "gemm": Timing()}
    for rep in range(args.repeats):  # alternate, so all three see the same machine load
        (wall, cpu), (ours_lps, computed, cont_tokens) = _clocked(lambda: run_ours(llm, file, work / "out",
                                                                                    args.batch_size))
        best["ours"].add(wall, cpu)
        (pwall, pcpu), peer_lps = _clocked(lambda: run_peer(peer, items))
        best["peer"].add(pwall, pcpu)
        best["gemm"].add(*_clocked(gemm_peak)[0])
        print(f"round {rep + 1}: ours {len(items) / wall:.2f} inst/s, peer {len(items) / pwall:.2f} inst/s "
              f"({pwall / wall:.2f}x); cpu seconds ours {cpu:.1f}, peer {pcpu:.1f}", flush=True)
    report(args, items, ours_lps, peer_lps, best, computed, cont_tokens, hf)


@dataclass
class Timing:
    """Best wall and best CPU (process) seconds over the rounds: the CPU clock shows the work done
    whatever share of the cores the other processes on this machine left us."""
    wall_s: float = float("inf")
    cpu_s: float = float("inf")

    def add(self, wall_s: float, cpu_s: float) -> None:
        self.wall_s, self.cpu_s = min(self.wall_s, wall_s), min(self.cpu_s, cpu_s)


def _clocked(fn):
    """((wall s, cpu s), fn's result)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return (time.perf_counter() - w, time.process_time() - c), out


def report(args, items, ours_lps, peer_lps, best, computed, cont_tokens, hf) -> None:
    acc_o, norm_o, picks_o = accuracy(items, ours_lps)
    acc_p, norm_p, picks_p = accuracy(items, peer_lps)
    diff = max(abs(a - b) for x, y in zip(ours_lps, peer_lps) for a, b in zip(x, y))
    agree = sum(a == b for a, b in zip(picks_o, picks_p))
    layer_params = sum(p.numel() for n, p in hf.named_parameters() if ".layers." in n)
    head_params = hf.config.vocab_size * hf.config.hidden_size
    tok = hf_tokens(args, items)
    num_requests = sum(len(it["choices"]) for it in items)
    # model FLOPs (matmuls; attention over these short prompts is small): the tokens each side
    # runs through the layers, and the positions whose vocabulary logits it computes
    flops = {"ours": 2 * layer_params * computed + 2 * head_params * (len(items) + cont_tokens - num_requests),
             "peer": 2 * (layer_params + head_params) * tok}
    peak = {clock: gemm_flops() / getattr(best["gemm"], clock) for clock in ("wall_s", "cpu_s")}
    print(f"\n{args.task}, first {len(items)} items ({num_requests} choices), {args.model}, ours {args.dtype}, "
          f"{args.threads} thread(s), load average {os.getloadavg()[0]:.1f}, best of {args.repeats}")
    for side, name, acc, norm in (("ours", "flexlamps helm", acc_o, norm_o), ("peer", "lm-eval HFLM", acc_p, norm_p)):
        t = best[side]
        print(f"{name:17s}: {len(items) / t.wall_s:8.2f} instances/s  acc {acc:.3f}  acc_norm {norm:.3f}  "
              f"{flops[side] / t.wall_s / 1e9:6.1f} GFLOP/s wall = {flops[side] / t.wall_s / peak['wall_s']:.0%} of the "
              f"GEMM peak; per CPU second {flops[side] / t.cpu_s / 1e9:6.1f} = "
              f"{flops[side] / t.cpu_s / peak['cpu_s']:.0%}")
    print(f"speed-up {best['peer'].wall_s / best['ours'].wall_s:.2f}x wall, {best['peer'].cpu_s / best['ours'].cpu_s:.2f}x "
          f"CPU time | acc_norm picks agree on {agree}/{len(items)} items | max |log-prob difference| {diff:.2e} | "
          f"fp32 GEMM peak {peak['wall_s'] / 1e9:.1f} GFLOP/s wall, {peak['cpu_s'] / 1e9:.1f} per CPU second | "
          f"tokens through the layers: ours {computed:.0f}, peer {tok}")


def hf_tokens(args, items) -> int:
    """Tokens lm-eval runs through the model (context + continuation per choice, no padding)."""
    from flexlamps import LLM as _LLM  # noqa: F401  (the same tokenizer as ours)
    from flexlamps.models.loading.registry import open_checkpoint

    tok = open_checkpoint(args.model).tokenizer
    return sum(len(tok.encode(it["context"] + " " + c)) for it in items for c in it["choices"])


if __name__ == "__main__":
    main()
