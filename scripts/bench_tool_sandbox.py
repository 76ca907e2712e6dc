"""The cost of the tool sandbox's OS boundary per call: the median wall time of `--calls` calls of
`run_program` behind bubblewrap (namespaces, seccomp, a tmpfs work dir) and without it
(`Limits(unsafe=True)`: a plain subprocess in a temp dir, the mechanism flexlamps used before
the boundary), the two modes alternating call by call so a shared machine's load hits both alike.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_tool_sandbox.py --calls 100
"""

import argparse
import statistics
import time

from flexlamps.tools.sandbox import Limits, boundary_problem, run_program

PROGRAMS = {
    "empty program": "pass",
    "a HumanEval-sized test": "def add(a, b):\n    return a + b\n\n\ndef check(c):\n"
                              + "".join(f"    assert c({n}, {n}) == {2 * n}\n" for n in range(20)) + "\n\ncheck(add)\n",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=100, help="calls per mode and program")
    a = p.parse_args()
    problem = boundary_problem()
    if problem is not None:
        raise SystemExit(problem)
    modes = {"boundary": Limits(wall_s=120), "no boundary": Limits(wall_s=120, unsafe=True)}
    print(f"{'program':24s} {'boundary ms':>12s} {'no boundary ms':>15s} {'extra ms':>9s}")
    for name, source in PROGRAMS.items():
        seconds = {mode: [] for mode in modes}
        for _ in range(a.calls):
            for mode, limits in modes.items():
                start = time.perf_counter()
                res = run_program(source, limits)
                seconds[mode].append(time.perf_counter() - start)
                if not res.ok:
                    raise SystemExit(f"{mode}: {res.text()}")
        med = {mode: statistics.median(s) * 1e3 for mode, s in seconds.items()}
        print(f"{name:24s} {med['boundary']:12.1f} {med['no boundary']:15.1f} {med['boundary'] - med['no boundary']:9.1f}")


if __name__ == "__main__":
    main()
