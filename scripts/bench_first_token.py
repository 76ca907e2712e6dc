"""Seconds from process start to the first generated token of `flexlamps generate`, cold and warm.

Runs the README's command (examples/prompts.jsonl, --chat) as a fresh process each time, with
its own empty cache folder ($FLEXLAMPS_CACHE), and reads the "first token ... s after process
start" that `generate` prints. The first run is cold (the GGUF is repacked and the cache written;
the files themselves may already be in the page cache), the others warm (the packed weights,
their dense copies and the tokenizer mapped from the cache). Beside them, in turns with the warm
runs: how long after its start a fresh process has imported torch, on the same clock (the
floor under any of these numbers; the process's exit, which a plain `time python -c "import
torch"` adds, is not on the way to a first token).

    python scripts/bench_first_token.py [--warm-runs 5] [--threads 1] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_TOKEN = re.compile(r"first token ([0-9.]+) s after process start \| peak RSS ([0-9.]+) MiB")


def first_token_s(model: str, threads: int, cache: Path, work: Path) -> tuple[float, float]:
    """(seconds to the first token, peak RSS MiB) of one `generate` process."""
    out = work / "out.jsonl"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "flexlamps.cli", "generate", "--model", model, "--prompts",
           str(ROOT / "examples" / "prompts.jsonl"), "--out", str(out), "--chat", "--max-new-tokens", "8",
           "--threads", str(threads), "--no-progress"]
    env = dict(os.environ, FLEXLAMPS_CACHE=str(cache))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    found = FIRST_TOKEN.search(done.stderr + done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"generate failed (exit {done.returncode}): {(done.stderr or done.stdout)[-800:]}")
    return float(found.group(1)), float(found.group(2))


# The same clock as generate's "after process start" (`commands.generate._since_process_start`),
# inlined so the child imports nothing but torch.
_IMPORT_TORCH = ("import os, time, torch\n"
                 "fields = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\n"
                 "print(time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf('SC_CLK_TCK'))")


def import_torch_s() -> float:
    """Seconds from a fresh process's start until it has imported torch."""
    if not Path("/proc/self/stat").exists():  # not Linux: the whole process, exit included
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        return time.perf_counter() - t
    done = subprocess.run([sys.executable, "-c", _IMPORT_TORCH], check=True, capture_output=True, text=True)
    return float(done.stdout.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--warm-runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flexlamps-first-token-") as tmp:
        cache, work = Path(tmp) / "cache", Path(tmp)
        cold, cold_rss = first_token_s(args.model, args.threads, cache, work)
        warm, floors = [], []
        for _ in range(args.warm_runs):  # in turns with the floor, so load bursts hit both alike
            warm.append(first_token_s(args.model, args.threads, cache, work))
            floors.append(import_torch_s())
    seconds = sorted(s for s, _ in warm)
    print(f"load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus | threads {args.threads} | model {args.model}")
    print(f"cold (empty cache): first token {cold:.2f} s, peak RSS {cold_rss:.0f} MiB")
    print(f"warm: first token best {seconds[0]:.2f} s, median {seconds[len(seconds) // 2]:.2f} s "
          f"(runs: {' '.join(f'{s:.2f}' for s, _ in warm)}), peak RSS {max(r for _, r in warm):.0f} MiB")
    floor = sorted(floors)[len(floors) // 2]
    print(f"floor: torch imported {min(floors):.2f} s (best), {floor:.2f} s (median) after a fresh process's start; "
          f"flexlamps' share of the median first token {seconds[len(seconds) // 2] - floor:.2f} s")


if __name__ == "__main__":
    main()
