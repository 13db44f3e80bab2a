"""The package's layering, read from its source: what imports what.

The registry sits on the ground floor (the standard library only); the engine's layers (``heads``, ``inference``,
``training``, ``export``) import no method folder (the registry names them, lazily); a method imports from specheads
only the declared method API (:mod:`specheads.methods.api` and its phase modules) and its own folder; no module
takes another package's private names; and no two modules import each other, directly or around a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "specheads"
ENGINE_LAYERS = ("heads", "inference", "training", "export")
METHOD_API = {f"specheads.methods.{name}" for name in ("api", "api_decode", "api_train", "api_export")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    """``specheads.methods.eagle.x`` -> ``specheads.methods.eagle``; ``specheads.heads.x`` -> ``specheads.heads``;
    a top-level module is its own package."""
    parts = module.split(".")
    if parts[1:2] == ["methods"] and len(parts) >= 3:
        return ".".join(parts[:3])
    if len(parts) > 2 or (ROOT / parts[-1]).is_dir():
        return ".".join(parts[:2])
    return module


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every ``specheads`` import in a file, at any depth (a lazy import is one too)."""
    module = _module_name(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if path.name == "__init__.py" else 0)]
                target = ".".join([*base, *([target] if target else [])])
            if target.split(".")[0] == "specheads":
                names = [alias.name for alias in node.names]
                submodules = [
                    f"{target}.{n}"
                    for n in names
                    if (ROOT.parent / f"{target}.{n}".replace(".", "/")).exists()
                    or (ROOT.parent / (f"{target}.{n}".replace(".", "/") + ".py")).exists()
                ]
                found.append((node.lineno, target, names))
                found += [(node.lineno, sub, []) for sub in submodules]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names if alias.name.split(".")[0] == "specheads"]
    return found


FILES = sorted(ROOT.rglob("*.py"))


def _violations(rule) -> list[str]:  # noqa: ANN001
    out = []
    for path in FILES:
        module = _module_name(path)
        for line, target, names in _imports(path):
            problem = rule(module, target, names)
            if problem:
                out.append(f"{path.relative_to(ROOT.parent)}:{line}: {problem}")
    return out


def test_the_registry_imports_only_the_standard_library() -> None:
    tree = ast.parse((ROOT / "registry.py").read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    imported.discard("__future__")
    assert imported <= {"importlib", "collections", "dataclasses", "typing", "torch"}, imported
    # torch only under TYPE_CHECKING
    source = (ROOT / "registry.py").read_text()
    assert "if TYPE_CHECKING:" in source and source.count("import torch") == 1


def test_the_engine_layers_import_no_method_folder() -> None:
    def rule(module: str, target: str, names: list[str]) -> str | None:
        if _package(module).split(".")[1:2] in [[layer] for layer in ENGINE_LAYERS] and target.startswith(
            "specheads.methods"
        ):
            return f"imports {target} (name methods through the registry)"
        return None

    violations = _violations(rule)
    assert not violations, "\n".join(violations)


def test_no_module_takes_another_packages_private_names() -> None:
    def rule(module: str, target: str, names: list[str]) -> str | None:
        private = [name for name in names if name.startswith("_") and name != "__version__"]
        if private and _package(target) != _package(module):
            return f"imports private {private} from {target}"
        return None

    violations = _violations(rule)
    assert not violations, "\n".join(violations)


def test_methods_use_only_the_declared_api_and_their_own_folder() -> None:
    def rule(module: str, target: str, names: list[str]) -> str | None:
        own = _package(module)
        if not own.startswith("specheads.methods.") or own in METHOD_API:
            return None
        if target in METHOD_API or _package(target) == own:
            return None
        return f"imports {target}; a method may use the method API (specheads.methods.api*) and its own folder only"

    violations = _violations(rule)
    assert not violations, "\n".join(violations)


def test_no_import_circles_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    modules = {_module_name(path) for path in FILES}
    for path in FILES:
        module = _module_name(path)
        edges = graph.setdefault(module, set())
        for _, target, _ in _imports(path):
            # a module importing its own package, or a package's __init__ re-exporting its modules, is no circle
            inner = module.startswith(target + ".") or (path.name == "__init__.py" and target.startswith(module + "."))
            if target in modules and target != module and not inner:
                edges.add(target)
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("package", ["specheads", "specheads.heads"])
def test_public_names_of_methods_come_from_the_registry(package: str) -> None:
    import importlib

    from specheads.registry import HEAD_TYPES

    module = importlib.import_module(package)
    for method in HEAD_TYPES.values():
        assert method.public, f"{method.name} lists no public names"
        for path in method.public:
            name = path.partition(":")[2]
            assert name in module.__all__ and getattr(module, name).__name__ == name
