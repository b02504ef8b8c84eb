"""The code in one style: `ruff check` with pyproject.toml's settings finds nothing, and every bench
script imports without running (a script the package moved away from fails here, not on the day
someone runs it)."""

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import tomllib

import pytest

from conftest import ROOT

# what ruff reads: the Snakefile and workflow/rules/*.smk are Snakemake, which `snakemake --lint` and `snakefmt --check` check
LINTED = ["dlcrepro", "tests", "bench", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts").glob("*.py"))]


def pinned_ruff() -> str:
    """The ruff version the test extra pins (`ruff==X`): another version has other rules."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    return next(r.split("==")[1] for r in extra if r.startswith("ruff=="))


def test_ruff_finds_nothing():
    p = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True)
    assert p.returncode == 0, f"ruff is not installed: pip install -e '.[test]' ({p.stderr.strip()})"
    assert p.stdout.split()[-1] == pinned_ruff(), f"{p.stdout.strip()}, but pyproject.toml pins ruff=={pinned_ruff()}"
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *LINTED],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"ruff check {' '.join(LINTED)}:\n{p.stdout}{p.stderr}"


BENCH = sorted((ROOT / "bench").glob("*.py"))


@pytest.mark.parametrize("path", BENCH, ids=[p.stem for p in BENCH])
def test_bench_script_imports_without_running(path):
    """Each script's work is behind `if __name__ == "__main__"`; importing it resolves its imports."""
    assert re.search(r'^if __name__ == "__main__":', path.read_text(), re.M), f"{path.name} runs when imported"
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)  # scripts put tests/ or the root on the path to import what they share
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    # an import inside a function runs only with its command (`memory_model.py widths`): resolve them all
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "dlcrepro":
            source = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(source, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), \
                    f"{path.name}:{node.lineno}: {node.module} has no {alias.name}"
