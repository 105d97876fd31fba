#!/usr/bin/env bash
# Set up (CPU torch, the package with its dev extras) and run the test suite and the linter.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "torch==2.13.0" 2>&1 | grep -v "as the 'root' user" || true
python3 -m pip install -q -e ".[dev]" 2>&1 | grep -v "as the 'root' user" || true
python3 -m ruff check roseinfer tests
python3 -m pytest -q "$@"
