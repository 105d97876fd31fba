"""pyproject.toml declares what `import roseinfer` needs, so that `pip install -e .` alone runs it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


# `import roseinfer`, and what the README's first command (`roseinfer generate`) loads: the CLI builds every
# subcommand's parser, so every bench module is imported too.
IMPORTS = {
    "import roseinfer": "import roseinfer",
    "the roseinfer command": "from roseinfer.entrypoints.cli import build_parser; build_parser()",
}


@pytest.mark.parametrize("what", IMPORTS)
def test_import_roseinfer_needs_only_declared_dependencies(what: str) -> None:
    declared = {
        _name(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    # ... and what those require in turn (typing_extensions comes with torch, nvidia-* with a CUDA torch).
    allowed, todo = set(), list(declared)
    while todo:
        dist = todo.pop()
        if dist in allowed:
            continue
        allowed.add(dist)
        try:
            todo += [_name(r) for r in requires(dist) or [] if "extra ==" not in r]
        except PackageNotFoundError:  # a requirement for another platform or Python
            pass
    # Modules the interpreter had loaded before (site hooks of this machine) are not roseinfer's.
    code = (
        f"import sys; before = set(sys.modules); {IMPORTS[what]}; "
        "print(' '.join({m.split('.')[0] for m in set(sys.modules) - before}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    dists = packages_distributions()
    needed = {
        _name(d)
        for m in loaded
        if m not in sys.stdlib_module_names
        for d in dists.get(m, [])
        if d != "roseinfer"
    }
    assert needed <= allowed, f"imported by {what} but not declared: {sorted(needed - allowed)}"
