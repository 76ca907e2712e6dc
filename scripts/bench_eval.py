"""Zero-shot multiple choice: instances/s of `flexlamps helm` vs lm-evaluation-harness's HF backend.

Same model, same items, same prompts (lm-eval's ARC format `Question: q\\nAnswer:` then `" " + choice`),
same threads, in one process, alternating, best of --repeats:
- ours: the items written as a user's file in the documented default format and evaluated by the
  run path of `flexlamps helm` (adapter, packed scoring, metrics, HELM run folder);
- peer: `lm_eval.models.huggingface.HFLM(pretrained=<transformers model>).loglikelihood` on the
  same (context, continuation) requests: lm-eval's own batched log-likelihood loop.
Accuracy is computed the same way from each side's log-likelihoods (acc: summed log-prob; acc_norm:
per character of the scored text), and the picks are compared item by item. Model FLOP rates are
given as a fraction of this machine's fp32 GEMM peak, measured here at the same threads.

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
    t0 = time.perf_counter()
    outcome = execute_run(llm, job.spec, job.scenario, out, "bench", SamplingParams, batch_size, overwrite=True)
    wall = time.perf_counter() - t0
    states = json.loads((outcome.path / "scenario_state.json").read_text())["request_states"]
    by_item: dict[str, list[float]] = {}
    cont_tokens = 0
    for s in states:
        by_item.setdefault(s["instance"]["id"], []).append(s["result"]["completions"][0]["logprob"])
        cont_tokens += len(s["result"]["completions"][0]["tokens"])
    return wall, list(by_item.values()), outcome.stat("prefill_tokens_computed"), cont_tokens


def run_peer(lm, items: list[dict]):
    from lm_eval.api.instance import Instance

    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(it["context"], " " + c), idx=k)
            for it in items for k, c in enumerate(it["choices"])]
    t0 = time.perf_counter()
    res = lm.loglikelihood(reqs, disable_tqdm=True)
    wall = time.perf_counter() - t0
    flat = iter(lp for lp, _ in res)
    return wall, [[next(flat) for _ in it["choices"]] for it in items]


def gemm_peak_flops(repeats: int = 5, n: int = 2048) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def load_peer(model: str, batch_size: int):
    import transformers
    from lm_eval.models.huggingface import HFLM

    from flexlamps.models.builtin import BUILTIN_MODELS, builtin_path

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
    ours_best = peer_best = float("inf")
    for rep in range(args.repeats):  # alternate, so both see the same machine load
        wall, ours_lps, computed, cont_tokens = run_ours(llm, file, work / "out", args.batch_size)
        ours_best = min(ours_best, wall)
        pwall, peer_lps = run_peer(peer, items)
        peer_best = min(peer_best, pwall)
        print(f"round {rep + 1}: ours {len(items) / wall:.2f} inst/s, peer {len(items) / pwall:.2f} inst/s",
              flush=True)
    peak = gemm_peak_flops()
    report(args, items, ours_lps, peer_lps, ours_best, peer_best, computed, cont_tokens, hf, peak)


def report(args, items, ours_lps, peer_lps, ours_wall, peer_wall, computed, cont_tokens, hf, peak) -> None:
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
    ours_flops = 2 * layer_params * computed + 2 * head_params * (len(items) + cont_tokens - num_requests)
    peer_flops = 2 * (layer_params + head_params) * tok
    load = os.getloadavg()[0]
    print(f"\n{args.task}, first {len(items)} items ({num_requests} choices), {args.model}, ours {args.dtype}, "
          f"{args.threads} thread(s), load average {load:.1f}, best of {args.repeats}")
    print(f"flexlamps helm   : {len(items) / ours_wall:8.2f} instances/s  acc {acc_o:.3f}  acc_norm {norm_o:.3f}  "
          f"{ours_flops / ours_wall / 1e9:6.1f} GFLOP/s = {ours_flops / ours_wall / peak:.0%} of peak")
    print(f"lm-eval HFLM     : {len(items) / peer_wall:8.2f} instances/s  acc {acc_p:.3f}  acc_norm {norm_p:.3f}  "
          f"{peer_flops / peer_wall / 1e9:6.1f} GFLOP/s = {peer_flops / peer_wall / peak:.0%} of peak")
    print(f"speed-up {peer_wall / ours_wall:.2f}x | acc_norm picks agree on {agree}/{len(items)} items | "
          f"max |log-prob difference| {diff:.2e} | fp32 GEMM peak here {peak / 1e9:.1f} GFLOP/s | "
          f"tokens through the layers: ours {computed:.0f}, peer {tok}")


def hf_tokens(args, items) -> int:
    """Tokens lm-eval runs through the model (context + continuation per choice, no padding)."""
    from flexlamps import LLM as _LLM  # noqa: F401  (the same tokenizer as ours)
    from flexlamps.models.registry import open_checkpoint

    tok = open_checkpoint(args.model).tokenizer
    return sum(len(tok.encode(it["context"] + " " + c)) for it in items for c in it["choices"])


if __name__ == "__main__":
    main()
