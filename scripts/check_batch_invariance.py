"""Does batching change a record? `flexlamps generate` run several ways on the same prompts, each
file's texts compared with the prompts run one at a time (`--batch-size 1`).

The prompts are made here (seeded sentences of mixed lengths, --num-prompts of them, a few
sharing a long opening so prefix reuse is exercised), not read from a file, so another
--prompt-seed gives prompts nobody tuned for. The runs, as `docs/generate.md` promises them:

| run | compared with |
|---|---|
| `--batch-size 7`, `--batch-size 32` | `--batch-size 1` |
| offloaded (`--gpu-mem 96MiB --cpu-mem 96MiB`), batch 32 | `--batch-size 1` |
| `--ray --ray-workers 2` (needs the ray extra) | `--batch-size 1` |
| sampled (`--temperature 0.8 --seed 7`), batch 32 | the same, batch 1 |
| killed after 5 records and resumed, batch 32 | the same, uninterrupted |

    python scripts/check_batch_invariance.py [--model smollm2-135m] [--dtype auto] [--num-prompts 24] \\
        [--new-tokens 24] [--prompt-seed 0] [--prompts FILE] [--runs batch7,batch32,offloaded,ray,sampled,resume]

`--prompts` takes prompts of your own instead (one a line, or JSONL with "prompt"), held out from
whoever tuned the engine; `--model` any model `generate` takes (a tiny MoE or hybrid checkpoint too).

Prints one table row per run (texts equal / prompts); exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

WORDS = ("river city engine market winter history garden letter council harbor station theory village signal "
         "bridge painter century doctor island record machine teacher forest battle museum railway church "
         "farmer system pattern voice northern ancient quiet open early broken simple narrow golden").split()
VERBS = "built carried opened found moved wrote changed measured crossed followed reached named".split()
OFFLOADED = ["--gpu-mem", "96MiB", "--cpu-mem", "96MiB"]
SAMPLED = ["--temperature", "0.8", "--seed", "7"]
KILL_AFTER_RECORDS = 5


def make_prompts(num: int, seed: int) -> list[str]:
    """Seeded prompts of 3 to ~150 words; every fourth opens with the same long sentence."""
    rng = random.Random(seed)
    opening = " ".join(rng.choice(WORDS) for _ in range(40)) + "."
    prompts = []
    for i in range(num):
        words = []
        for _ in range(rng.choice([1, 1, 2, 4, 8, 12])):
            words += [rng.choice(WORDS), rng.choice(VERBS), "the", rng.choice(WORDS), rng.choice(WORDS) + "."]
        text = " ".join(words[: rng.randint(3, len(words))])
        prompts.append(f"{opening} {text}" if i % 4 == 3 else text.capitalize())
    return prompts


def read_prompts(path: Path) -> list[str]:
    """A file's prompts: JSONL lines' "prompt", or each non-empty line as it is."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line)["prompt"] if line.lstrip().startswith("{") else line for line in lines]


def run_generate(args, prompts: Path, out: Path, extra: list[str], env: dict | None = None) -> int:
    cmd = [sys.executable, "-m", "flexlamps", "generate", "--no-progress", "--model", args.model, "--dtype",
           args.dtype, "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", str(args.new_tokens),
           "--ignore-eos", *extra]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True).returncode


def texts(path: Path) -> dict[str, str]:
    return {r["id"]: r["text"] for r in map(json.loads, path.read_text().splitlines())}


def equal(a: dict[str, str], b: dict[str, str]) -> int:
    return sum(a.get(k) == v for k, v in b.items())


def produce(args, prompts: Path, folder: Path, name: str, extra: list[str], env=None) -> dict[str, str]:
    out = folder / f"{name}.jsonl"
    rc = run_generate(args, prompts, out, extra, env)
    if rc != 0:
        raise SystemExit(f"{name}: generate exited {rc}")
    return texts(out)


def resumed(args, prompts: Path, folder: Path) -> dict[str, str]:
    """A batch-32 run killed after some records (SIGKILL), then run again to finish."""
    out = folder / "resumed.jsonl"
    kill = {"FLEXLAMPS_KILL_AT": f"record:{KILL_AFTER_RECORDS}"}
    if run_generate(args, prompts, out, ["--batch-size", "32"], kill) == 0:
        raise SystemExit("resume: the run was not killed (fewer records than the kill point?)")
    if run_generate(args, prompts, out, ["--batch-size", "32"]) != 0:
        raise SystemExit("resume: the resumed run failed")
    return texts(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--prompt-seed", type=int, default=0)
    ap.add_argument("--prompts", type=Path, help="prompts of your own (one a line, or JSONL with 'prompt')")
    ap.add_argument("--runs", default="batch7,batch32,offloaded,ray,sampled,resume")
    args = ap.parse_args()
    runs = args.runs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prompts = folder / "prompts.jsonl"
        texts_in = read_prompts(args.prompts) if args.prompts else make_prompts(args.num_prompts, args.prompt_seed)
        args.num_prompts = len(texts_in)
        prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(texts_in)))
        ref = produce(args, prompts, folder, "batch1", ["--batch-size", "1"])
        rows = []
        for name, extra in (("batch7", ["--batch-size", "7"]), ("batch32", ["--batch-size", "32"]),
                            ("offloaded", ["--batch-size", "32", *OFFLOADED]),
                            ("ray", ["--batch-size", "32", "--ray", "--ray-workers", "2"])):
            if name in runs:
                rows.append((name, equal(produce(args, prompts, folder, name, extra), ref)))
        if "sampled" in runs:
            one = produce(args, prompts, folder, "sampled1", ["--batch-size", "1", *SAMPLED])
            rows.append(("sampled, batch 32 vs 1", equal(produce(args, prompts, folder, "sampled32",
                                                                 ["--batch-size", "32", *SAMPLED]), one)))
        if "resume" in runs:
            whole = texts(folder / "batch32.jsonl") if "batch32" in runs else produce(
                args, prompts, folder, "batch32", ["--batch-size", "32"])
            rows.append((f"killed after {KILL_AFTER_RECORDS} records, resumed", equal(resumed(args, prompts, folder), whole)))
    print(f"| run ({args.model}, --dtype {args.dtype}, {args.num_prompts} prompts, {args.new_tokens} tokens) "
          f"| texts equal |\n|---|---|")
    for name, same in rows:
        print(f"| {name} | {same} / {args.num_prompts} |")
    return 0 if all(same == args.num_prompts for _, same in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
