#!/usr/bin/env bash
# The checks that need a CUDA GPU, in under 8 minutes on one: the parity and offload tests on
# CUDA (the in-memory engine defaults to the GPU; the offload executor loads weights on a copy
# stream from pinned buffers), the latent cache's miss copies, one offloaded SmolLM2 generate, and
# bench_offload at a small size.
# On a machine without CUDA it says so and exits 0.
#   bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: needs a CUDA GPU and torch sees none here; nothing to check (exit 0)"
    exit 0
fi
"$PY" -c "import torch; print('gpu_check on', torch.cuda.get_device_name(0))"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "== parity and offload tests on CUDA"
timeout 300 "$PY" -m pytest -q -x -m "gpu or not slow" tests/integration/test_models_parity.py tests/integration/test_offload_engine.py \
    tests/unit/test_engine_generate.py tests/integration/test_agents_offloaded.py

echo "== the latent cache on CUDA: exact offload bit for bit, overlapped miss copies (copy stream, pinned staging) within tolerance"
timeout 240 "$PY" -m pytest -q -x -m gpu tests/integration/test_latent_offload.py
timeout 150 "$PY" scripts/bench_latent_overlap.py --device cuda --heads 128 --layers 2 --rows 8 --context 16384 --repeats 2

echo "== one offloaded SmolLM2 generate (weights across gpu / cpu / disk)"
printf '{"id": "a", "prompt": "The capital of France is"}\n{"id": "b", "prompt": "1, 2, 3, 4,"}\n' > "$WORK/prompts.jsonl"
timeout 120 .venv/bin/flexlamps generate --prompts "$WORK/prompts.jsonl" --out "$WORK/out.jsonl" --max-new-tokens 16 \
    --gpu-mem 200MiB --cpu-mem 200MiB --offload-dir "$WORK/offload"
cat "$WORK/out.jsonl"

echo "== bench_offload, small"
timeout 120 "$PY" scripts/bench_offload.py --model smollm2 --prompts 8 --prompt-len 32 --gen-len 8 --workdir "$WORK/bench"
echo "gpu_check: done"
