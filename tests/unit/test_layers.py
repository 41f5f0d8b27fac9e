"""The house: each layer imports only layers below it, and no two packages import each other.

Walks the installed package's modules and their imports (as written, read
with ``ast``), so a new module is checked without being listed here.
"""

import ast
import importlib
import pkgutil
from pathlib import Path

import treemail

# Bottom up. Producers, consumers and projections are one floor: none may import another.
LAYERS = [
    ("treemail", 0),
    ("treemail.domain", 0),
    ("treemail.adapters", 1),
    ("treemail.services", 2),
    ("treemail.producers", 3),
    ("treemail.consumers", 3),
    ("treemail.projections", 3),
    ("treemail.entrypoints", 4),
    ("treemail.host", 4),
    ("treemail.__main__", 4),
]
ROOTS = ["treemail", "treemail.producers", "treemail.consumers", "treemail.projections"]


def package_of(module: str) -> str:
    """The longest LAYERS name that ``module`` is, or lies inside."""
    matches = [name for name, _ in LAYERS if module == name or module.startswith(name + ".")]
    return max(matches, key=len)


def layer_of(module: str) -> int:
    return dict(LAYERS)[package_of(module)]


def installed_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in ROOTS:
        package = importlib.import_module(root)
        found[root] = Path(package.__file__)
        for info in pkgutil.walk_packages(package.__path__, root + "."):
            spec = importlib.util.find_spec(info.name)
            found[info.name] = Path(spec.origin)
    return found


def imports_of(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in out if name == "treemail" or name.startswith("treemail.")}


def edges() -> list[tuple[str, str]]:
    modules = installed_modules()
    found = []
    for module, path in modules.items():
        for target in imports_of(module, path):
            # ``from x import name`` also yields x.name; keep it only where it is a module.
            if target in modules or target.rsplit(".", 1)[0] not in modules:
                found.append((module, target))
    return found


def test_the_walk_sees_every_floor():
    modules = installed_modules()
    assert {package_of(m) for m in modules} == {name for name, _ in LAYERS}
    assert len(modules) > 30


def test_no_module_imports_a_layer_above_it():
    upward = [(a, b) for a, b in edges() if layer_of(b) > layer_of(a)]
    assert upward == []


def test_no_two_packages_import_each_other_and_no_floor_imports_its_neighbours():
    between = {(package_of(a), package_of(b)) for a, b in edges() if package_of(a) != package_of(b)}
    two_way = [(a, b) for a, b in between if (b, a) in between]
    # The process floor: a worker, a projection runner and the host facade share only what lies below them.
    sideways = [(a, b) for a, b in between if layer_of(a) == layer_of(b) == 3]
    assert two_way == []
    assert sideways == []


def test_the_domain_imports_nothing_but_itself_and_the_package_root():
    outside = [(a, b) for a, b in edges() if package_of(a) == "treemail.domain"
               and package_of(b) not in ("treemail.domain", "treemail")]
    assert outside == []


def test_the_installed_distribution_has_one_import_root():
    for name in ("producers", "consumers", "projections"):
        assert importlib.util.find_spec(f"treemail.{name}") is not None
    assert Path(treemail.__file__).parent.name == "treemail"
