"""``@record``: a dataclass-like class whose methods are shared functions, not generated code.

``dataclasses.dataclass`` writes the source of ``__init__``, ``__repr__``, ``__eq__``,
``__hash__`` and (frozen) ``__setattr__``/``__delattr__`` for each class and compiles it,
and checks every field's annotation for ``ClassVar``/``InitVar``: about 8 million
instructions for a frozen class of 14 fields, paid at import by every process that imports
torch, since the decision runs there. ``record`` collects the fields itself, declared as for
a dataclass (annotations, defaults, ``dataclasses.field(...)``), generates nothing, and
gives the class the same behaviour through functions shared by every record: positional and
keyword arguments, defaults and ``default_factory``, ``field(repr=False, compare=False,
init=False)``, ``__post_init__``, equality between instances of the same class, hashing of
the compared fields when frozen (unhashable otherwise, as a dataclass),
``FrozenInstanceError``. Not supported, and refused: ``ClassVar`` and ``InitVar`` fields, a
``field()`` without an annotation. A record is not a dataclass (only public ``dataclasses``
API is used): ``fields`` and ``replace`` here do what ``dataclasses``' do, and
``dataclasses.replace`` of a record raises ``TypeError`` rather than half-working.
Unlike a dataclass, a record pickles (and ``copy`` copies) only the fields that differ from
their defaults, which the copy then reads from the class: the layer cache stores every rule
of the policy. Read a record's fields with ``getattr`` or ``fields``, not ``vars()``.
"""

from __future__ import annotations

import dataclasses
import reprlib
import sys
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound=type)
R = TypeVar("R")
_MISSING = dataclasses.MISSING
_FIELDS = "__record_fields__"


def fields(item: object) -> tuple[dataclasses.Field, ...]:
    """The fields of a record or record class, in order (as ``dataclasses.fields``)."""
    try:
        return tuple(getattr(item, _FIELDS).values())
    except AttributeError:
        raise TypeError("must be called with a record or an instance of one") from None


def replace(obj: R, /, **changes: Any) -> R:
    """A new record like ``obj`` with ``changes``, made through ``__init__`` (so
    ``__post_init__`` runs), as ``dataclasses.replace``: a ``field(init=False)`` cannot be
    changed."""
    for made in fields(obj):
        if not made.init:
            if made.name in changes:
                raise ValueError(f"field {made.name} is declared with init=False, "
                                 "it cannot be specified with replace()")  # fmt: skip
        elif made.name not in changes:
            changes[made.name] = getattr(obj, made.name)
    return type(obj)(**changes)


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    spec = cls.__record_init__
    if len(args) > len(spec):
        raise TypeError(
            f"{cls.__qualname__}.__init__() takes {len(spec) + 1} positional arguments "
            f"but {len(args) + 1} were given"
        )
    for i, (name, default, factory) in enumerate(spec):
        if i < len(args):
            if name in kwargs:
                raise TypeError(
                    f"{cls.__qualname__}.__init__() got multiple values for argument {name!r}"
                )
            value = args[i]
        elif name in kwargs:
            value = kwargs.pop(name)
        elif default is not _MISSING:
            value = default
        elif factory is not _MISSING:
            value = factory()
        else:
            raise TypeError(
                f"{cls.__qualname__}.__init__() missing 1 required positional argument: {name!r}"
            )
        object.__setattr__(self, name, value)
    if kwargs:
        name = next(iter(kwargs))
        raise TypeError(
            f"{cls.__qualname__}.__init__() got an unexpected keyword argument {name!r}"
        )
    for name, default, factory in cls.__record_later__:  # field(init=False) with a default
        object.__setattr__(self, name, factory() if default is _MISSING else default)
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    cls = type(self)
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in cls.__record_repr__)
    return f"{cls.__qualname__}({shown})"


def _values(self: Any) -> tuple:
    return tuple(getattr(self, name) for name in type(self).__record_compare__)


def _eq(self: Any, other: object) -> bool:
    if other.__class__ is self.__class__:
        return _values(self) == _values(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(_values(self))


def _getstate(self: Any) -> dict:
    # Fields equal to their class-level default are left out (the module's docstring says
    # why): the attribute lookup finds the default on the class.
    cls = type(self)
    defaults = cls.__record_defaults__
    return {
        name: value
        for name, value in self.__dict__.items()
        if name not in defaults
        or not _same(value, defaults[name])
        or getattr(cls, name, _MISSING) is not defaults[name]  # a subclass shadows it
    }


_SCALARS = (str, int, bool, bytes, type(None))


def _same(value: object, default: object) -> bool:
    # equal scalars of the same type, the very object, or two empty tuples or frozensets
    # (Python 3.9 makes new empty tuples, from tuple() of an empty generator); a container
    # that is only equal could hold equal elements of another type (1 for True), and a float
    # another sign (-0.0 for 0.0)
    if value is default:
        return True
    kind = type(value)
    if kind is not type(default):
        return False
    return value == default if kind in _SCALARS else kind in _EMPTIES and not value and not default


_EMPTIES = (tuple, frozenset)


def _frozen_setattr(self: Any, name: str, value: object) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _collect(cls: type) -> dict[str, dataclasses.Field]:
    """The fields ``dataclasses`` would collect, without its per-field type checks.

    Those of the bases first, then the class's own annotations in order; the default is a
    ``dataclasses.field(...)`` or a plain value found on the class (or inherited, as
    ``dataclasses`` finds it).
    """
    found: dict[str, dataclasses.Field] = {}
    for base in reversed(cls.__mro__[1:]):
        found.update(vars(base).get(_FIELDS, {}))
    if sys.version_info >= (3, 10):
        own = cls.__annotations__  # the class's own: never a base's
    else:  # pragma: no cover - 3.9, where the attribute falls back to a base's
        own = vars(cls).get("__annotations__", {})
    for name, value in cls.__dict__.items():
        if isinstance(value, dataclasses.Field) and name not in own:
            raise TypeError(f"record {cls.__qualname__}: {name!r} is a field without an annotation")
    for name, kind in own.items():
        if _pseudo_field(kind):
            raise TypeError(f"record {cls.__qualname__}: {name}: ClassVar, InitVar: not supported")
        default = getattr(cls, name, _MISSING)
        if isinstance(default, dataclasses.Field):
            made = default
            if made.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, made.default)
        else:
            made = dataclasses.field(default=default)
        if made.default is not _MISSING and type(made.default).__hash__ is None:
            raise ValueError(f"mutable default {type(made.default)} for field {name} "
                             "is not allowed: use default_factory")  # fmt: skip
        made.name, made.type = name, kind
        found[name] = made
    return found


def _pseudo_field(kind: object) -> bool:
    """A ``ClassVar`` or ``InitVar`` annotation, as text (``from __future__ import annotations``)
    or as the object."""
    if isinstance(kind, str):
        return kind.startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar"))
    return (
        kind is ClassVar
        or getattr(kind, "__origin__", None) is ClassVar
        or isinstance(kind, dataclasses.InitVar)
        or kind is dataclasses.InitVar
    )


def record(cls: T | None = None, /, *, frozen: bool = False) -> Any:
    """``@dataclass`` / ``@dataclass(frozen=True)`` without code generation (see above)."""

    def wrap(cls: T) -> T:
        collected = _collect(cls)
        setattr(cls, _FIELDS, collected)
        declared = tuple(collected.values())
        cls.__record_init__ = tuple(  # type: ignore[attr-defined]
            (f.name, f.default, f.default_factory) for f in declared if f.init
        )
        cls.__record_later__ = tuple(  # type: ignore[attr-defined]
            (f.name, f.default, f.default_factory)
            for f in declared
            if not f.init and (f.default is not _MISSING or f.default_factory is not _MISSING)
        )
        cls.__record_repr__ = tuple(f.name for f in declared if f.repr)  # type: ignore[attr-defined]
        cls.__record_defaults__ = {  # type: ignore[attr-defined]
            f.name: f.default for f in declared if f.default is not _MISSING
        }
        compared = tuple(f.name for f in declared if f.compare)
        cls.__record_compare__ = compared  # type: ignore[attr-defined]
        own = cls.__dict__
        for name, function in (("__init__", _init), ("__repr__", _repr), ("__eq__", _eq)):
            if name not in own:
                setattr(cls, name, function)
        if not any("__getstate__" in vars(base) for base in cls.__mro__[:-1]):
            cls.__getstate__ = _getstate  # type: ignore[attr-defined]  # not over one's own
        if "__hash__" not in own or own["__hash__"] is None:
            cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
        if frozen:
            cls.__setattr__ = _frozen_setattr  # type: ignore[assignment]
            cls.__delattr__ = _frozen_delattr  # type: ignore[assignment]
        return cls

    return wrap if cls is None else wrap(cls)
