"""The import graph of lra/, models/ and configs/, read from the source with `ast` (nothing
is imported): no circle among module-level imports, and no back arrow: a module of a role
package (lra/training, lra/runs, lra/reporting, lra/gpu, lra/downloading, lra/tasks), of
models/ or of configs/ never imports a module at the top of lra/ (the commands users run,
`python -m lra.<command>`, and the trainer lra/train.py), at any level (a function's
import too); lra.errors, the error classes every layer raises, is the one exception.

  python -m tests.test_imports          # the graph between lra/'s commands and packages,
                                        # then every circle and back arrow (exit 1 if any)
  python -m tests.test_imports --all    # every module's module-level imports
"""
from __future__ import annotations

import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("lra", "models", "configs")
# The modules at the top of lra/ that are not commands: the package itself and the errors.
SHARED_TOP = {"lra", "lra.errors"}


def modules(root: str, packages=PACKAGES) -> dict[str, str]:
    """{dotted module name: file} of every .py file under root/<package> (a package's
    __init__.py is the package's own name)."""
    found = {}
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(folder, name), root)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found[".".join(rel)] = os.path.join(folder, name)
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports(path: str, name: str, known: set[str]) -> tuple[set[str], set[str]]:
    """(module-level imports, all imports) of one file, as names in `known`. A module-level
    import is one the module runs when it is imported (not inside a function, nor under
    `if TYPE_CHECKING`). `from a import b` names a.b when that is a module, else a;
    `import a.b` names a.b."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    top, every = set(), set()

    def resolve(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:  # relative: from the module's package upwards
            parts = name.split(".") if is_package else name.split(".")[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                for a in node.names]

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in resolve(child):
                    # `import a.b.c` of an unknown tail: the longest known prefix
                    while target and target not in known:
                        target = target.rpartition(".")[0]
                    if target and target != name:
                        every.add(target)
                        if not in_function:
                            top.add(target)
            visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return top, every


def graph(root: str = REPO, packages=PACKAGES) -> tuple[dict[str, set], dict[str, set]]:
    """({module: its module-level imports}, {module: all its imports}) among the modules
    of `packages` under `root`."""
    found = modules(root, packages)
    known = set(found)
    top, every = {}, {}
    for name, path in found.items():
        top[name], every[name] = imports(path, name, known)
    return top, every


def cycles(edges: dict[str, set]) -> list[list[str]]:
    """The circles of a graph: each strongly connected component of more than one module
    (or a module importing itself), sorted (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    out.append(sorted(component))
    return sorted(out)


def top_modules(found: set[str], packages: set[str], top_package: str = "lra") -> set[str]:
    """The modules at the top of lra/: the commands and the trainer (not lra.errors, not
    the packages)."""
    return {m for m in found if m.startswith(top_package + ".") and m.count(".") == 1
            and m not in packages and m not in SHARED_TOP}


def back_arrows(every: dict[str, set], packages: set[str],
                top_package: str = "lra") -> list[str]:
    """'a -> b' for each module a that is not at the top of lra/ (a role package's, a
    model's, a config's) importing b, a module at the top of lra/ (see top_modules)."""
    top = top_modules(set(every), packages, top_package)
    return [f"{module} -> {target}" for module, targets in sorted(every.items())
            if module != top_package and module not in top
            for target in sorted(targets & top)]


def package_names(root: str = REPO) -> set[str]:
    """The dotted names of the packages (folders with __init__.py) under `root`."""
    return {name for name, path in modules(root).items()
            if os.path.basename(path) == "__init__.py"}


def package_of(module: str) -> str:
    """lra.training.optim -> lra.training; lra.sweep -> lra.sweep; models.x.y -> models."""
    parts = module.split(".")
    if parts[0] == "lra":
        return ".".join(parts[:2])
    return parts[0]


# ----------------------------------------------------------------------------- tests


def test_no_circles_and_no_back_arrows():
    top, every = graph()
    assert "lra.train" in top and "models.registry" in top and "configs.common" in top
    assert cycles(top) == [], f"import circles (module-level): {cycles(top)}"
    arrows = back_arrows(every, package_names())
    assert arrows == [], f"role packages importing lra/'s commands: {arrows}"


def test_no_circle_through_configs_and_the_training_packages():
    """At any level (a function's import too) no circle among configs/, lra/training,
    lra/runs and models/: the one there was, configs.common -> configs.hybrid ->
    lra.training.optim -> configs.hybrid, is gone (the optimiser reads the layer list from
    the run's RunSpec, lra/runs/spec.py, and imports nothing of configs/)."""
    _, every = graph()
    inner = ("configs", "lra.training", "lra.runs", "models")
    edges = {m: {t for t in targets if t.startswith(inner)}
             for m, targets in every.items() if m.startswith(inner)}
    assert cycles(edges) == [], f"import circles (any level): {cycles(edges)}"
    assert not {t for t in every["lra.training.optim"] if t.startswith("configs")}, \
        every["lra.training.optim"]


def test_lra_top_lists_commands_and_trainer_only():
    """`ls lra/`: the commands (each has a __main__), the trainer and the errors."""
    names = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "lra"))
                   if f.endswith(".py") and f != "__init__.py")
    for name in names:
        with open(os.path.join(REPO, "lra", name + ".py"), encoding="utf-8") as f:
            text = f.read()
        assert name in ("train", "errors") or 'if __name__ == "__main__"' in text, name


def _write(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def test_a_planted_circle_and_back_arrow_are_caught(tmp_path):
    """The checks can fail: a tmp `lra` with a circle through a package's __init__ and a
    relative import, a function-level import that is no circle, and a role package
    importing a command."""
    _write(str(tmp_path), {
        "lra/__init__.py": "",
        "lra/errors.py": "",
        "lra/cmd.py": "from lra.training import loop\nif __name__ == '__main__':\n    pass\n",
        "lra/training/__init__.py": "from . import loop\n",
        "lra/training/loop.py": "import lra.training.state\nfrom lra.errors import E\n",
        "lra/training/state.py": "from lra.training import loop\n",
        "lra/training/late.py": "def f():\n    from lra import cmd\n    import lra.training.loop\n",
        "lra/training/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    import lra.training.typed2\n",
        "lra/training/typed2.py": "import lra.training.typed\n",
        "models/__init__.py": "", "configs/__init__.py": "",
    })
    top, every = graph(str(tmp_path))
    assert top["lra.training.loop"] == {"lra.training.state", "lra.errors"}
    assert top["lra.training"] == {"lra.training.loop"}
    assert cycles(top) == [["lra.training.loop", "lra.training.state"]]
    assert "lra.training.loop" in every["lra.training.late"] and not top["lra.training.late"]
    assert back_arrows(every, package_names(str(tmp_path))) == [
        "lra.training.late -> lra.cmd"]
    # A self-import and a longer circle.
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# ----------------------------------------------------------------------------- command


def main(argv: list[str]) -> int:
    top, every = graph()
    packages = package_names()
    if "--all" in argv:
        for module in sorted(top):
            print(f"{module}: {', '.join(sorted(top[module])) or '-'}")
    else:
        print("lra/'s commands and packages, and what each imports (any level; "
              "models and configs as one node each):")
        edges: dict[str, set] = {}
        for module, targets in every.items():
            if not module.startswith("lra"):
                continue
            source = package_of(module)
            edges.setdefault(source, set()).update(
                package_of(t) for t in targets if package_of(t) != source)
        for source in sorted(edges):
            print(f"  {source} -> {', '.join(sorted(edges[source])) or '-'}")
    found = cycles(top)
    arrows = back_arrows(every, packages)
    print(f"{len(top)} modules; module-level import circles: "
          + ("; ".join(" -> ".join(c + [c[0]]) for c in found) if found else "none")
          + "; back arrows into lra/'s commands: " + ("; ".join(arrows) or "none"))
    return 1 if found or arrows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
