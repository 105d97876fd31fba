#!/usr/bin/env bash
# Set up (CPU torch unless CUDA is there, the package with its dev extras) and run the test suite and the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
# The CPU build of torch, except where a CUDA build already sees a GPU (keep that one: the suite runs there too).
if ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  python3 -m pip install -q "torch==2.13.0" 2>&1 | grep -v "as the 'root' user" || true
fi
python3 -m pip install -q -e ".[dev]" 2>&1 | grep -v "as the 'root' user" || true
python3 -m ruff check roseinfer tests
python3 -m pytest -q "$@"
