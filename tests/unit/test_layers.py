"""The house: each layer imports only layers below it, no two packages import each other, and no module
imports another module's private name.

Walks the installed package's modules and their imports (as written, read
with ``ast``), so a new module is checked without being listed here.

The package root is the engine authors' one import surface: a face on the
top floor, like ``treemail.host``, which it hands on; no floor below imports it.
"""

import ast
import importlib
import pkgutil
from pathlib import Path

import treemail

# Bottom up. Producers, consumers and projections are one floor: none may import another.
LAYERS = [
    ("treemail.domain", 0),
    ("treemail.adapters", 1),
    ("treemail.services", 2),
    ("treemail.producers", 3),
    ("treemail.consumers", 3),
    ("treemail.projections", 3),
    ("treemail.entrypoints", 4),
    ("treemail.host", 4),
    ("treemail", 4),
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


def target_of(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The module an ``ImportFrom`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def names_of(nodes, module: str, is_package: bool, every: bool = False) -> set[str]:
    """The modules (and names) the import nodes read: treemail's only, or ``every`` one (libraries too)."""
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        else:
            target = target_of(module, node, is_package)
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in out if every or name == "treemail" or name.startswith("treemail.")}


def imports_of(module: str, path: Path, every: bool = False) -> set[str]:
    return imports_in(module, path.read_text(), path.name == "__init__.py", every)


def imports_in(module: str, source: str, is_package: bool = False, every: bool = False) -> set[str]:
    nodes = [node for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))]
    return names_of(nodes, module, is_package, every)


# What the top floor never touches: a server client, the key layout, the store and the stream readers.
# Its parts read sessions through ``services.sessionreader`` and send through ``services``.
STORAGE = (
    "redis", "valkey", "treemail.adapters.keys", "treemail.adapters.connection", "treemail.adapters.lanes",
    "treemail.adapters.eventstore", "treemail.adapters.directory", "treemail.adapters.commandclient",
    "treemail.adapters.wakes", "treemail.adapters.observe", "treemail.adapters.feed",
)


def storage_imports(module: str, names: set[str]) -> list[tuple[str, str]]:
    """``(module, imported)`` for each storage module (or a name in one) that a producers module imports."""
    if package_of(module) != "treemail.producers":
        return []
    return sorted((module, name) for name in names
                  if any(name == s or name.startswith(s + ".") for s in STORAGE))


def private_imports(module: str, source: str, is_package: bool = False) -> list[tuple[str, str]]:
    """``(module, imported)`` for each private name (one leading underscore) ``module`` imports from another
    module of treemail: a part reaching into another part's internals."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            target = target_of(module, node, is_package)
            if not (target == "treemail" or target.startswith("treemail.")) or target == module:
                continue
            found += [(module, f"{target}.{alias.name}") for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [(module, alias.name) for alias in node.names if alias.name.startswith("treemail.")
                      and any(part.startswith("_") and not part.startswith("__") for part in alias.name.split("."))]
    return found


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


def test_the_package_root_is_the_host_apis_face():
    root = {b for a, b in edges() if a == "treemail" and b != "treemail"}
    assert root == {"treemail.host", "treemail.domain.protocol"}, root
    assert set(treemail.__all__) == {"PROTOCOL_VERSION", *treemail.host.__all__}


def test_no_module_imports_another_modules_private_name():
    leaks = [leak for module, path in installed_modules().items()
             for leak in private_imports(module, path.read_text(), path.name == "__init__.py")]
    assert leaks == []


def test_the_private_name_check_catches_a_part_reaching_into_another():
    source = (
        "from treemail.producers.host.peers import _peer_call\n"
        "from .wakes import _text, WakeReader\n"
        "from . import _helpers\n"
        "import treemail.adapters._internal\n"
        "from treemail import __version__\n"
        "from treemail.producers.host.interrupts import interrupt_reader\n"
        "from redis.asyncio.client import _private\n"
    )
    assert private_imports("treemail.producers.host.facade", source) == [
        ("treemail.producers.host.facade", "treemail.producers.host.peers._peer_call"),
        ("treemail.producers.host.facade", "treemail.producers.host.wakes._text"),
        ("treemail.producers.host.facade", "treemail.producers.host._helpers"),
        ("treemail.producers.host.facade", "treemail.adapters._internal"),
    ]
    # A module's own private names are its own business.
    assert private_imports("treemail.producers.host.wakes", "from .wakes import _text\n") == []


def test_the_domain_imports_nothing_but_itself():
    outside = [(a, b) for a, b in edges() if package_of(a) == "treemail.domain" and package_of(b) != "treemail.domain"]
    assert outside == []


def test_the_installed_distribution_has_one_import_root():
    for name in ("producers", "consumers", "projections"):
        assert importlib.util.find_spec(f"treemail.{name}") is not None
    assert Path(treemail.__file__).parent.name == "treemail"


def test_the_top_floor_talks_only_to_services():
    touched = [found for module, path in installed_modules().items()
               for found in storage_imports(module, imports_of(module, path, every=True))]
    assert touched == []


def test_the_storage_check_catches_a_part_reading_storage_itself():
    source = (
        "import redis.asyncio as aioredis\n"
        "from redis.exceptions import RedisError\n"
        "from treemail.adapters import keys\n"
        "from treemail.adapters.eventstore import EventStore\n"
        "from ...adapters.wakes import WakeReader\n"
        "from treemail.adapters.config import Config\n"
        "from treemail.services.sessionreader import SessionReader\n"
    )
    module = "treemail.producers.host.facade"
    assert [name for _, name in storage_imports(module, imports_in(module, source, every=True))] == [
        "redis.asyncio", "redis.exceptions", "redis.exceptions.RedisError",
        "treemail.adapters.eventstore", "treemail.adapters.eventstore.EventStore", "treemail.adapters.keys",
        "treemail.adapters.wakes", "treemail.adapters.wakes.WakeReader",
    ]
    # A service below may hold them: only the top floor is bound.
    assert storage_imports("treemail.services.sessionreader", {"treemail.adapters.eventstore"}) == []
