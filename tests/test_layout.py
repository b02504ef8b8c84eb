"""The package's layering (docs/architecture.md): one folder per layer, each module in one, imports
run downward through the layers, the one circle left is the fork server's, and nothing below the
training loop imports it. Read from the source, as a newcomer would follow the imports, those under
`if TYPE_CHECKING:` included: a circle for the type checker is a circle for the reader."""

import ast

import re

from conftest import ROOT

PACKAGE = ROOT / "dlcrepro"
# the layers, lowest first: a module imports from its own layer and those before it, never after
LAYERS = ("core", "step", "cluster", "report", "study", "run")
ENTRY = {"__init__", "__main__"}  # the package itself and `python -m dlcrepro`, above every layer


def imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (top level, inside functions, or for type checking)."""
    mods = {p.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", "."): p for p in PACKAGE.rglob("*.py")}
    mods = {m.removesuffix(".__init__"): p for m, p in mods.items()}
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text())
        here = m.split(".")[:-1] if not path.name == "__init__.py" else m.split(".")
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("dlcrepro."):
                target = node.module.removeprefix("dlcrepro.")
            else:
                continue
            names = [target] if node.module else [f"{target}.{a.name}".lstrip(".") for a in node.names]
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != m:
                    graph[m].add(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, out, count = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = count[0]
        count[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def layer(module: str) -> int:
    """A module's layer, by the folder it is in (the entry points above all)."""
    return len(LAYERS) if module in ENTRY else LAYERS.index(module.split(".")[0])


def test_every_module_is_in_one_layers_folder():
    assert {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"} == {*LAYERS, "__init__.py", "__main__.py"}
    assert not [m for m in imports() if m not in ENTRY and m.split(".")[0] not in LAYERS]


def test_imports_run_down_the_layers():
    graph = imports()
    upward = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts if layer(t) > layer(m))
    assert not upward, "a module imports from a layer above its own:\n" + "\n".join(upward)


def test_the_architecture_page_lists_the_layers_in_order():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert tuple(re.findall(r"^\| `dlcrepro/(\w+)/` \|", page, re.M)) == LAYERS


def test_the_only_import_circle_is_the_fork_servers():
    assert circles(imports()) == [["run.cli", "run.server"]]


def test_the_registries_config_reads_import_nothing_of_config():
    graph = imports()
    registries = {"core.grid", "core.registry", "core.tracking"}
    assert registries <= graph["core.config"]
    assert not [m for m in registries if "core.config" in graph[m]]


def test_nothing_below_the_training_loop_imports_it():
    graph = imports()
    below = {"step.learner", "step.engine", "step.manifest", "step.corrections", "step.diagnostics", "step.divergence",
             "step.stamped", "step.checkpoint", "step.model", "step.data", "study.rollouts"}
    below |= {m for m in graph if m.startswith(("core.", "cluster", "report."))}
    assert not [m for m in below if "step.train" in graph[m]]
    # the loop reads its rooms, not the reverse
    assert {"step.learner", "step.engine", "step.divergence", "core.seeds"} <= graph["step.train"]
