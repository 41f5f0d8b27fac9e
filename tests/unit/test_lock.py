"""The lock: the installed versions are the locked ones, and the lock holds every dependency, so a fresh
clone installs exactly what the suite was green with."""

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parents[2] / "constraints.txt"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not a pin: {line!r}"
            pins[canonicalize_name(name)] = version
    return pins


def required(name: str, extras: set[str], seen: set[str]) -> set[str]:
    """``name`` and everything it needs with ``extras``, as installed here."""
    key = canonicalize_name(name)
    if key in seen:
        return seen
    seen.add(key)
    for text in metadata.requires(name) or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras or {""}):
            required(requirement.name, set(requirement.extras), seen)
    return seen


def test_every_installed_dependency_is_the_locked_version():
    pins = locked()
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    differ = {name: (pins[name], installed[name]) for name in pins if name in installed and installed[name] != pins[name]}
    assert differ == {}, f"installed versions differ from {LOCK.name} (locked, installed): {differ}"


def test_the_lock_holds_every_dependency_of_treemail_with_its_extras():
    needed = required("treemail", {"dev", "server"}, set()) - {"treemail"}
    missing = sorted(needed - set(locked()))
    assert missing == [], f"not in {LOCK.name}: {missing} (make lock)"
