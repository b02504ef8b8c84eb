"""The docs name only what exists: every name in backticks in docs/*.md and the README that looks
like a code path resolves in the repository. What looks like one: a repository path
(`dlcrepro/step/engine.py`, `tests/test_engine.py::test_name`), a module's file (`engine.py`), and a
dotted name whose first part is one of the package's modules or classes (`engine.CHECK_SEQS`,
`Learner.sgd_step`, `cluster.memory.layer_bytes`). A dotted name that is a config key
(`train.lr`, `engine.topk`) resolves through the config's dataclasses. Read from the source with
`ast`, as a newcomer would look the name up, so the test imports nothing heavy."""

import ast
import dataclasses
import re
import typing
from functools import cache
from pathlib import Path

import pytest

from conftest import ROOT
from dlcrepro.core import config as config_module

PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
PACKAGE = ROOT / "dlcrepro"
# docs/measurements.md is a log: an entry may name the code of its day, saying in words that it has
# since been renamed or removed (these, no others)
HISTORICAL = {"measurements.md": {"engine.CHECK_MIN_LIKELY", "Learner.state", "cluster.py", "Cell.name", "tracking.for_jobs",
                                  "server._alive", "Learner._apply"}}
# other projects' names that share one of the package's module names: Hugging Face's model config
# (rehearsal.md), verl's data section (method.md)
FOREIGN = {"config.rope_parameters", "config.dtype", "data.train_batch_size"}
# a file a run writes (`checkpoint.pt`, `findings.csv`), not a code name
DATA_SUFFIXES = {"pt", "json", "csv", "png", "pdf", "md", "tex", "parquet", "yaml", "log", "damaged", "unverified"}
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PATH_ROOTS = ("dlcrepro/", "tests/", "bench/", "scripts/", "workflow/", "configs/", "docs/", "slurm/", "envs/")


@cache
def modules() -> dict[str, ast.Module]:
    """Dotted module name inside the package (`engine`, `cluster.memory`, `cluster`) -> its tree."""
    out = {}
    for p in PACKAGE.rglob("*.py"):
        name = p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        out[name] = ast.parse(p.read_text(encoding="utf-8"))
    return out


@cache
def short_names() -> dict[str, str]:
    """A module's own name -> its name inside the package (`engine` -> `step.engine`), where one
    module has it: the docs name a module as the code does, `engine.py`, not by its layer's folder."""
    last: dict[str, list[str]] = {}
    for name in modules():
        last.setdefault(name.rpartition(".")[2], []).append(name)
    return {k: v[0] for k, v in last.items() if len(v) == 1 and "." in v[0]}


def members(node, imports: bool = False) -> dict[str, ast.AST | None]:
    """The names a module or class body defines, each with its node where it is a class (to look
    inside), else None: functions, classes, assignments, annotated fields; the names it imports only
    with `imports` (a package's `__init__` exports them: `cluster.check_device`; a module that
    imports `PHASES` is not where `PHASES` lives)."""
    out: dict[str, ast.AST | None] = {}
    for n in node.body:
        if isinstance(n, ast.ClassDef):
            out[n.name] = n
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[n.name] = None
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                for e in ast.walk(t):
                    if isinstance(e, ast.Name):
                        out[e.id] = None
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = None
        elif imports and isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                out[(a.asname or a.name).split(".")[0]] = None
        elif isinstance(n, (ast.If, ast.For, ast.With, ast.Try)):  # `for _s in (...): register(...)` and the like
            out.update(members(n, imports))
        if (isinstance(n, ast.Assign) and isinstance(n.value, (ast.List, ast.Tuple))
                and any(getattr(t, "id", "") == "__all__" for t in n.targets)):
            out.update({e.value: None for e in n.value.elts if e.value not in out})  # what it exports on purpose
    if isinstance(node, ast.ClassDef):  # attributes set in methods: self.x = ...
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                    and isinstance(n.ctx, ast.Store):
                out.setdefault(n.attr, None)
    return out


@cache
def classes() -> dict[str, list[ast.ClassDef]]:
    """Class name -> its definitions anywhere in the package."""
    out: dict[str, list[ast.ClassDef]] = {}
    for tree in modules().values():
        for n in tree.body:
            if isinstance(n, ast.ClassDef):
                out.setdefault(n.name, []).append(n)
    return out


def resolves_in(node, parts: list[str], package: bool = False) -> bool:
    for i, part in enumerate(parts):
        names = members(node, imports=package and i == 0)
        if part not in names:
            return False
        node = names[part]
        if node is None:  # a function, a value: what follows is an attribute of a value (not read)
            return True
    return True


def config_key(parts: list[str]) -> bool:
    """`train.lr`, `engine.topk`: a path through Config's dataclasses (a dict field takes any key
    below it)."""
    cls = config_module.Config
    for part in parts:
        if not dataclasses.is_dataclass(cls):
            return True
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return False
        cls = typing.get_type_hints(cls)[part]
    return True


def code_name(span: str) -> bool | None:
    """True/False: a dotted code name that resolves or not; None: not a code name."""
    parts = span.removesuffix("()").removeprefix("dlcrepro.").split(".")
    mods = modules()
    for k in range(len(parts), 0, -1):  # the longest module prefix: cluster.memory.layer_bytes
        mod = ".".join(parts[:k])
        mod = mod if mod in mods or k > 1 else short_names().get(mod, mod)
        if mod in mods:
            package = (PACKAGE / mod.replace(".", "/") / "__init__.py").exists()
            return resolves_in(mods[mod], parts[k:], package) or config_key(parts)
    if parts[0] in classes():
        return any(resolves_in(c, parts[1:]) for c in classes()[parts[0]])
    return None


def path_resolves(span: str) -> bool | None:
    """True/False: a repository path (or a module's file) that exists or not; None: not a path."""
    path, _, test = span.partition("::")
    if re.search(r":\d+(-\d+)?$", path):  # `fa_utils.py:282-312`: a line of another project's source
        return None
    path = re.sub(r"#.*$", "", path)
    last = path.rstrip("/").rpartition("/")[2]
    if (path.startswith(PATH_ROOTS) and not re.search(r"[ *<{]", path) and ("." in last or path.endswith("/"))
            and not (path.startswith("docs/") and path.count("/") > 1)):  # vLLM's docs/features/...
        file = ROOT / path
        if not file.exists():
            return False
        return not test or re.search(rf"^\s*def {re.escape(test.split('[')[0])}\(", file.read_text(), re.M) is not None
    if re.fullmatch(r"[a-z_]+\.py", path):
        layers = [d for d in PACKAGE.iterdir() if d.is_dir()]
        return any((d / path).exists() for d in (PACKAGE, *layers, ROOT / "tests", ROOT / "bench", ROOT / "scripts"))
    return None


def unresolved(page: Path) -> list[str]:
    out = []
    for lineno, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for span in SPAN.findall(line):
            span = span.strip()
            ok = path_resolves(span)
            if (ok is None and DOTTED.fullmatch(span.removesuffix("()")) and span not in FOREIGN
                    and span.rpartition(".")[2] not in DATA_SUFFIXES):
                ok = code_name(span)
            if ok is False and span not in HISTORICAL.get(page.name, ()):
                out.append(f"{page.relative_to(ROOT)}:{lineno}: `{span}`")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_code_name_a_page_puts_in_backticks_exists(page):
    missing = unresolved(page)
    assert not missing, "names that no longer exist (or a typo):\n" + "\n".join(missing)
