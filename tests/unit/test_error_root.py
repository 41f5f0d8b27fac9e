"""One error root: every error treemail raises for a caller's mistake or a refusal is a ``TreemailError``
with a stable, non-empty ``code``, so a caller catches the library's errors in one clause and branches on
the code. Checked two ways: every exception class the package defines, and every ``raise`` in the layers a
host API call runs through (what the class a raise builds is, read from the module that raises it)."""

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import treemail
import treemail.consumers
import treemail.producers
import treemail.projections
from treemail import TreemailError
from treemail.domain import errors
from treemail.domain.errors import CodedError, InvalidRequest, NotFound, Rejected, UnknownSessionError
from treemail.domain.limits import IdentifierError

# The layers a host API call runs through, from the facade down to the decisions.
HOST_LAYERS = ("treemail.producers.host", "treemail.producers.tools", "treemail.producers.mcp", "treemail.services",
               "treemail.domain",
               # The host's own readers and command client, which live among the adapters.
               "treemail.adapters.commandclient", "treemail.adapters.observe", "treemail.adapters.wakes")
# An invariant of the code itself, never a caller's mistake: a failing one is a bug to report, not a code.
INVARIANTS = (AssertionError, NotImplementedError)
# Raises that never reach a caller as they are, each with where it goes instead.
ANSWERED_ELSEWHERE = {
    ("treemail.producers.mcp.framing", "ValueError"): "read by the line's judge, answered as a JSON-RPC parse error",
    ("treemail.producers.mcp.server", "MCPError"): "the SDK's JSON-RPC error: an answer on the wire to the MCP client",
    ("treemail.producers.tools.arguments", "invalid"): "the caller's factory, typed Callable[[str], Rejected]",
    ("treemail.domain.frozen", "TypeError"): "replace() naming a field treemail's own dataclass lacks: a bug",
    ("treemail.domain.messaging", "ValueError"): "a settings validator's: the loader answers it as a ConfigError",
}


def every_module():
    for package in (treemail, treemail.producers, treemail.consumers, treemail.projections):
        yield package
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not found.name.endswith("__main__"):
                yield importlib.import_module(found.name)


def error_classes() -> dict[str, type]:
    return {f"{cls.__module__}.{cls.__qualname__}": cls for module in every_module()
            for cls in vars(module).values()
            if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__.startswith("treemail.")}


def takes_code_per_raise(cls: type) -> bool:
    return issubclass(cls, (CodedError, Rejected))


def test_every_error_class_the_package_defines_is_under_the_root_with_a_stable_code():
    classes = error_classes()
    assert len(classes) >= 15, sorted(classes)  # the walk found the package's modules
    outside = [name for name, cls in classes.items() if not issubclass(cls, TreemailError)]
    uncoded = [name for name, cls in classes.items() if cls is not TreemailError
               and not (isinstance(cls.code, str) and cls.code) and not takes_code_per_raise(cls)]
    assert outside == []
    assert uncoded == []


@pytest.mark.parametrize("error, builtin", [
    (UnknownSessionError("no session has id x"), LookupError),
    (IdentifierError("identifier:invalid", "name must be a string"), ValueError),
    (InvalidRequest("peer_route:self", "a session cannot have a peer route to itself"), ValueError),
    (NotFound("approval:unknown_request", "no approval request has id r"), KeyError),
    (NotFound("approval:unknown_request", "no approval request has id r"), LookupError),
])
def test_a_class_that_was_a_builtin_error_still_is_one_and_says_its_code(error, builtin):
    assert isinstance(error, TreemailError) and isinstance(error, builtin)
    assert error.code and str(error).startswith(error.code + ": ") == isinstance(error, CodedError)
    if isinstance(error, NotFound):
        assert str(error) == "approval:unknown_request: no approval request has id r"  # a sentence, not a key


def test_a_code_chosen_per_raise_is_the_one_given():
    assert Rejected(errors.Code.SELF_SEND, "x").code == "send_message:self_send"
    assert errors.LifecycleError("lifecycle:closing", "x").code == "lifecycle:closing"


def raised_names(path: Path) -> list[tuple[int, str]]:
    """Each ``raise X(...)`` / ``raise mod.X(...)`` in the file, as (line, dotted name of what is called)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            found.append((node.lineno, ast.unparse(node.exc.func)))
        elif isinstance(node, ast.Raise) and isinstance(node.exc, (ast.Name, ast.Attribute)):
            name = ast.unparse(node.exc)
            if name[:1].isupper() or "." in name and name.rsplit(".", 1)[1][:1].isupper():
                found.append((node.lineno, name))  # a class raised without arguments
    return found


def resolve(module, dotted: str):
    first, *rest = dotted.split(".")
    value = getattr(module, first, getattr(builtins, first, None))
    for part in rest:
        value = getattr(value, part, None)
    return value


def raises_a_root_error(module, dotted: str) -> bool:
    """The class called, or what a factory function is annotated to return, is a ``TreemailError``."""
    called = resolve(module, dotted)
    if inspect.isclass(called):
        return issubclass(called, (TreemailError, *INVARIANTS))
    returns = inspect.signature(called).return_annotation if callable(called) else None
    if isinstance(returns, str):
        returns = resolve(inspect.getmodule(called), returns)
    return inspect.isclass(returns) and issubclass(returns, TreemailError)


def test_every_raise_in_the_layers_a_host_call_runs_through_builds_a_root_error():
    modules = [m for m in every_module() if m.__name__.startswith(HOST_LAYERS) and getattr(m, "__file__", None)]
    assert len(modules) >= 40
    outside = [f"{m.__name__}:{line} raise {name}" for m in modules
               for line, name in raised_names(Path(m.__file__))
               if (m.__name__, name) not in ANSWERED_ELSEWHERE and not raises_a_root_error(m, name)]
    assert outside == []


def test_the_raise_walk_sees_a_builtin_error_and_a_factory_of_one():
    import treemail.domain.limits as limits

    assert not raises_a_root_error(limits, "ValueError")
    assert raises_a_root_error(limits, "IdentifierError")
    assert raises_a_root_error(limits, "invalid")  # annotated to return an IdentifierError


# The classes whose first argument is the code they are raised with.
CODED = {"LifecycleError", "InvalidRequest", "NotFound", "ConnectionRefused", "IdentifierError", "CodedError"}
HOST_API_DOCS = Path(__file__).parents[2] / "docs" / "host-api.md"


def codes_raised(module) -> set[str]:
    """The codes ``module`` builds a coded error with: a literal, a module constant, or ``Code.X.value``."""
    tree = ast.parse(Path(module.__file__).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func).split(".")[-1] in CODED:
            code = node.args[0]
            if isinstance(code, ast.Constant):
                found.add(code.value)
            elif isinstance(code, ast.Attribute) and code.attr == "value":
                found.add(resolve(module, ast.unparse(code)))
            elif isinstance(code, ast.Name) and isinstance(getattr(module, code.id, None), str):
                found.add(getattr(module, code.id))
    return found


def test_every_code_an_error_is_raised_with_is_listed_where_the_host_apis_errors_are_described():
    section = HOST_API_DOCS.read_text().split("\n## Errors\n", 1)[1]
    raised = {code for module in every_module() if module.__name__.startswith(HOST_LAYERS) and module.__file__
              for code in codes_raised(module)}
    fixed = {str(getattr(cls.code, "value", cls.code)) for cls in error_classes().values() if cls.code}
    assert {"peer_route:self", "approval:unknown_request", "lifecycle:closing"} <= raised  # the walk reads them
    assert sorted(code for code in raised | fixed if f"`{code}`" not in section) == []
