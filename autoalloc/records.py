"""``@record``: a dataclass whose methods are shared functions instead of generated code.

``dataclasses.dataclass`` writes the source of ``__init__``, ``__repr__``, ``__eq__``,
``__hash__`` and (frozen) ``__setattr__``/``__delattr__`` for each class and compiles it:
about 8 million instructions for a frozen class of 14 fields, paid at import by every
process that imports torch, since the decision runs there. ``record`` lets
``dataclasses`` collect the fields (so ``dataclasses.fields``, ``replace``, ``asdict`` and
``is_dataclass`` work as before) but generates nothing, and gives the class the same
behaviour through functions shared by every record: positional and keyword arguments,
defaults and ``default_factory``, ``field(repr=False, compare=False, init=False)``,
``__post_init__``, equality between
instances of the same class, hashing of the compared fields when frozen (unhashable
otherwise, as a dataclass), ``FrozenInstanceError``.
"""

from __future__ import annotations

import dataclasses
import reprlib
import sys
from typing import Any, TypeVar

T = TypeVar("T", bound=type)
_MISSING = dataclasses.MISSING
_FIELDS = "__dataclass_fields__"
_FIELD = dataclasses._FIELD  # type: ignore[attr-defined]  # what dataclasses.fields() lists


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    _arguments(self, cls, cls.__record_init__, args, kwargs)
    for name, default, factory in cls.__record_later__:  # field(init=False) with a default
        object.__setattr__(self, name, factory() if default is _MISSING else default)
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _arguments(self: Any, cls: type, spec: tuple, args: tuple, kwargs: dict) -> None:
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


def _frozen_setattr(self: Any, name: str, value: object) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")


def _own_annotations(cls: type) -> dict:
    """The class's own annotations (3.10+: the attribute never falls back to a base's)."""
    if sys.version_info >= (3, 10):
        return cls.__annotations__
    return vars(cls).get("__annotations__", {})  # pragma: no cover - 3.9


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields ``dataclasses`` would collect, collected without its per-field type checks.

    A record's own annotations in order, after those of a record it derives from; a
    ``dataclasses.field(...)`` or a plain default as the class attribute. ``ClassVar`` and
    ``InitVar`` annotations are not supported (no record uses them), and are refused.
    """
    found: dict[str, dataclasses.Field] = {}
    for base in reversed(cls.__mro__[1:]):
        found.update(getattr(base, _FIELDS, {}))
    for name, kind in _own_annotations(cls).items():
        text = kind if isinstance(kind, str) else getattr(kind, "__name__", "")
        if "ClassVar" in text or "InitVar" in text:
            raise TypeError(f"record {cls.__qualname__}: {name}: {text} is not supported")
        default = cls.__dict__.get(name, _MISSING)
        if isinstance(default, dataclasses.Field):
            made = default
            if made.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, made.default)
        else:
            made = dataclasses.field(default=default)
        if isinstance(made.default, (list, dict, set)):
            raise ValueError(f"mutable default {type(made.default)} for field {name} "
                             "is not allowed: use default_factory")  # fmt: skip
        made.name, made.type = name, kind
        made._field_type = _FIELD  # type: ignore[attr-defined]
        found[name] = made
    return found


def record(cls: T | None = None, /, *, frozen: bool = False) -> Any:
    """``@dataclass`` / ``@dataclass(frozen=True)`` without code generation (see above)."""

    def wrap(cls: T) -> T:
        fields = tuple(_fields(cls).values())
        setattr(cls, _FIELDS, {f.name: f for f in fields})
        cls.__record_init__ = tuple(  # type: ignore[attr-defined]
            (f.name, f.default, f.default_factory) for f in fields if f.init
        )
        cls.__record_later__ = tuple(  # type: ignore[attr-defined]
            (f.name, f.default, f.default_factory)
            for f in fields
            if not f.init and (f.default is not _MISSING or f.default_factory is not _MISSING)
        )
        cls.__record_repr__ = tuple(f.name for f in fields if f.repr)  # type: ignore[attr-defined]
        compared = tuple(f.name for f in fields if f.compare)
        cls.__record_compare__ = compared  # type: ignore[attr-defined]
        own = cls.__dict__
        for name, function in (("__init__", _init), ("__repr__", _repr), ("__eq__", _eq)):
            if name not in own:
                setattr(cls, name, function)
        if "__hash__" not in own or own["__hash__"] is None:
            cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
        if frozen:
            cls.__setattr__ = _frozen_setattr  # type: ignore[assignment]
            cls.__delattr__ = _frozen_delattr  # type: ignore[assignment]
        return cls

    return wrap if cls is None else wrap(cls)
