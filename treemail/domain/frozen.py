"""A copy of a frozen dataclass with some fields changed, without running its ``__init__`` again.

The fold copies the session state once per event, and ``dataclasses.replace``
re-runs the generated ``__init__`` over every field (about 20) each time: it
was a tenth of a worker's CPU (BENCHMARKS.md). For the fold's
dataclasses, which have no ``__post_init__`` and no ``init=False`` field, a
copy of the instance dict is the same object, at a quarter of the cost.
"""

from dataclasses import fields, is_dataclass
from functools import cache


@cache
def _field_names(cls: type) -> frozenset[str]:
    if not is_dataclass(cls) or hasattr(cls, "__post_init__") or any(not f.init for f in fields(cls)):
        raise TypeError(f"{cls.__name__} is not a plain dataclass; use dataclasses.replace")
    return frozenset(f.name for f in fields(cls))


def replace(obj, /, **changes):
    names = _field_names(type(obj))
    if not names.issuperset(changes):  # checked without building the set of unknown names: once per event folded
        unknown = changes.keys() - names
        raise TypeError(f"{type(obj).__name__} has no field {sorted(unknown)[0]!r}")
    copy = object.__new__(type(obj))
    copy.__dict__.update(obj.__dict__, **changes)
    return copy
