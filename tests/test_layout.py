"""The package's layering (docs/architecture.md): imports run downward, the one circle left is the
fork server's, and nothing below the training loop imports it. Read from the source, as a newcomer
would follow the imports, those under `if TYPE_CHECKING:` included: a circle for the type checker
is a circle for the reader."""

import ast

from conftest import ROOT

PACKAGE = ROOT / "dlcrepro"


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


def test_the_only_import_circle_is_the_fork_servers():
    assert circles(imports()) == [["cli", "server"]]


def test_the_registries_config_reads_import_nothing_of_config():
    graph = imports()
    assert {"grid", "registry", "tracking"} <= graph["config"]
    assert not [m for m in ("grid", "registry", "tracking") if "config" in graph[m]]


def test_nothing_below_the_training_loop_imports_it():
    graph = imports()
    below = {"learner", "engine", "manifest", "corrections", "diagnostics", "divergence", "seeds", "stamped",
             "checkpoint", "model", "data", "config", "grid", "registry", "rollouts", "tracking", "util"}
    assert not [m for m in below if "train" in graph[m]]
    assert {"learner", "engine", "divergence", "seeds"} <= graph["train"]  # the loop reads its rooms, not the reverse
