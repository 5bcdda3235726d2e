"""``@record`` behaves as ``@dataclass`` for what autoalloc's records use, without generated code."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from autoalloc import records
from autoalloc.records import record


def define(decorate):
    @decorate
    class Item:
        """An item."""

        name: str
        size: int = 1
        tags: tuple[str, ...] = ()
        extra: dict = field(default_factory=dict)
        note: str = field(default="", compare=False, repr=False)

    return Item


def small(decorate):
    @decorate
    class Small:
        """Hashable fields only."""

        name: str
        size: int = 0

    return Small


Frozen = define(record(frozen=True))
Plain = define(record)
DFrozen = define(dataclass(frozen=True))
DPlain = define(dataclass)


def test_frozen_records_construct_compare_hash_and_show_as_dataclasses() -> None:
    for args, kwargs in [(("a",), {}), (("a", 2), {"tags": ("x",)}), ((), {"name": "b", "note": "n"})]:
        mine, theirs = Frozen(*args, **kwargs), DFrozen(*args, **kwargs)
        assert repr(mine) == repr(theirs)
        assert values(mine) == dataclasses.asdict(theirs)
        assert mine == Frozen(*args, **kwargs)
        with pytest.raises(TypeError):  # a dict field: unhashable, as the dataclass's
            hash(mine)
        with pytest.raises(TypeError):
            hash(theirs)
    mine, theirs = small(record(frozen=True)), small(dataclass(frozen=True))
    assert hash(mine("a", 2)) == hash(theirs("a", 2)) == hash(("a", 2))
    assert Frozen("a", note="x") == Frozen("a", note="y")  # compare=False
    assert Frozen("a") != Frozen("b") and Frozen("a") != DFrozen("a")
    assert Frozen("a").extra is not Frozen("a").extra  # default_factory: one each
    assert repr(Frozen("a")) == "define.<locals>.Item(name='a', size=1, tags=(), extra={})"


def test_frozen_records_refuse_changes_and_replace_makes_a_new_one() -> None:
    item = Frozen("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.name = "b"
    with pytest.raises(dataclasses.FrozenInstanceError):
        del item.size
    changed = records.replace(item, size=5)
    assert (changed.name, changed.size, item.size) == ("a", 5, 1)
    assert [f.name for f in records.fields(item)] == ["name", "size", "tags", "extra", "note"]
    assert records.fields(item) == records.fields(Frozen)


def test_a_record_is_not_taken_for_a_dataclass() -> None:
    """Only public ``dataclasses`` API: a record is not a dataclass, and dataclasses' own
    functions refuse it loudly instead of half-working; ``records``' do the job."""
    item = Frozen("a")
    assert not dataclasses.is_dataclass(item)
    for function in (dataclasses.fields, dataclasses.asdict):
        with pytest.raises(TypeError):
            function(item)
    with pytest.raises(TypeError):
        dataclasses.replace(item, size=2)
    with pytest.raises(TypeError, match="record"):
        records.fields(object())
    with pytest.raises(ValueError, match="init=False"):
        records.replace(define_later(), later=1)


def define_later():
    @record
    class Later:
        """A field set after __init__."""

        name: str = "x"
        later: int = field(default=0, init=False)

    return Later()


def values(item: object) -> dict:
    return {f.name: getattr(item, f.name) for f in records.fields(item)}


def test_wrong_arguments_fail_as_a_dataclass_does() -> None:
    for cls in (Frozen, DFrozen):
        for args, kwargs in [((), {}), (("a", 1, (), {}, "", "x"), {}), (("a",), {"name": "b"}),
                             (("a",), {"colour": 1})]:  # fmt: skip
            with pytest.raises(TypeError):
                cls(*args, **kwargs)


def test_mutable_records_change_and_are_unhashable() -> None:
    item = Plain("a")
    item.size = 3
    assert item == Plain("a", 3) and item != Plain("a")
    with pytest.raises(TypeError):
        hash(item)
    with pytest.raises(TypeError):
        hash(DPlain("a"))


@record(frozen=True)
class FrozenItem:
    """Pickled by module and name."""

    name: str
    extra: dict = field(default_factory=dict)
    note: str = field(default="", compare=False, repr=False)


@record
class PlainItem:
    """Pickled by module and name."""

    name: str
    extra: dict = field(default_factory=dict)
    note: str = field(default="", compare=False, repr=False)


@pytest.mark.parametrize("cls", [FrozenItem, PlainItem])
def test_records_copy_and_pickle(cls) -> None:
    item = cls("a", {"k": 1}, "n")
    for other in (copy.copy(item), copy.deepcopy(item), pickle.loads(pickle.dumps(item))):
        assert other == item and other.note == "n" and type(other) is cls


def test_post_init_and_fields_outside_init_as_a_dataclass() -> None:
    def derived(decorate):
        @decorate
        class Derived:
            """A field computed after __init__, another one with a default outside it."""

            name: str
            upper: str = field(init=False, compare=False, repr=False)
            seen: list = field(init=False, default_factory=list)

            def __post_init__(self) -> None:
                object.__setattr__(self, "upper", self.name.upper())

        return Derived

    mine, theirs = derived(record(frozen=True)), derived(dataclass(frozen=True))
    for cls in (mine, theirs):
        item = cls("ab")
        assert (item.upper, item.seen) == ("AB", [])
        change = records.replace if cls is mine else dataclasses.replace
        assert change(item, name="cd").upper == "CD"
        with pytest.raises(TypeError):
            cls("ab", "AB")
    assert repr(mine("ab")) == repr(theirs("ab"))


def test_fields_collected_as_a_dataclass_collects_them() -> None:
    def build(decorate):
        @decorate
        class Base:
            """A base with a default and a factory."""

            name: str = "base"
            extra: dict = field(default_factory=dict)

        @decorate
        class Child(Base):
            """Its own fields after the base's; a plain default and a field() default."""

            size: int = 1
            note: str = field(default="n", compare=False)

        return Child

    mine, theirs = build(record(frozen=True)), build(dataclass(frozen=True))
    assert [f.name for f in records.fields(mine)] == [f.name for f in dataclasses.fields(theirs)]
    assert repr(mine("a", {}, 2)) == repr(theirs("a", {}, 2))
    assert mine.note == theirs.note == "n"  # the class attributes, as dataclasses leave them
    assert not hasattr(mine, "extra") and not hasattr(theirs, "extra")
    with pytest.raises(ValueError):  # a mutable default, refused as a dataclass refuses it

        @record
        class Shared:
            """A list shared by every instance."""

            items: list = []  # noqa: RUF012


def test_class_variables_are_refused_rather_than_taken_for_fields() -> None:
    with pytest.raises(TypeError):

        @record
        class Counted:
            """A ClassVar is no field."""

            total: ClassVar[int] = 0


def test_inherited_defaults_and_annotations_as_objects() -> None:
    # Without `from __future__ import annotations` the annotations are objects, not text.
    space: dict = {}
    exec(
        "from dataclasses import InitVar, field\n"
        "from typing import ClassVar\n"
        "class Base:\n    x: int = 3\n"
        "class Counted:\n    total: ClassVar[int] = 0\n"
        "class Initial:\n    seed: InitVar[int] = 0\n"
        "class Loose:\n    y = field(default=1)\n"
        "class Shared:\n    buffer: bytearray = bytearray()\n",
        space,
    )
    for decorate in (record(frozen=True), dataclass(frozen=True)):
        child = decorate(type("Child", (space["Base"],), {"__annotations__": {"x": int}}))
        assert child().x == 3  # the default a base gives the re-annotated field
    for name, error in [("Counted", TypeError), ("Initial", TypeError), ("Loose", TypeError),
                        ("Shared", ValueError)]:  # fmt: skip
        with pytest.raises(error, match=r"ClassVar|annotation|mutable"):
            record(space[name])


@record(frozen=True)
class Defaulted:
    """Pickled by module and name."""

    name: str
    count: int = 0
    tags: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)


def test_pickle_leaves_out_the_fields_at_their_default() -> None:
    """The layer cache pickles every rule of the policy: a field equal to its default is read
    from the class after unpickling, not stored; one that differs, even by type only (``False``
    for ``0``), or that has a ``default_factory``, is stored."""
    item = Defaulted("a")
    assert set(item.__getstate__()) == {"name", "extra"}
    other = pickle.loads(pickle.dumps(item))
    assert other == item and other.count == 0 and other.tags == ()
    assert values(other) == values(item)
    assert records.replace(other, count=2).count == 2 and other.count == 0
    falsy = Defaulted("b", False, ("t",))
    assert set(falsy.__getstate__()) == {"name", "count", "tags", "extra"}
    back = pickle.loads(pickle.dumps(falsy))
    assert back.count is False and back.tags == ("t",) and back == falsy
    assert copy.copy(falsy) == falsy and copy.deepcopy(item) == item


def test_pickle_keeps_what_the_class_would_not_give_back() -> None:
    """A container only equal to its default (``(1,)`` for ``(True,)``) and a field whose
    default a subclass's attribute shadows are stored, so they come back as they were."""

    @record(frozen=True)
    class Flags:
        flags: tuple = (True,)
        size: int = 1

    class Bigger(Flags):
        size = 5

    globals().update(Flags=Flags, Bigger=Bigger)  # pickled by module and name
    Flags.__qualname__, Bigger.__qualname__ = "Flags", "Bigger"
    try:
        item = pickle.loads(pickle.dumps(Flags((1,))))
        assert item.flags == (1,) and type(item.flags[0]) is int
        assert pickle.loads(pickle.dumps(Bigger(size=1))).size == 1
        assert copy.copy(Bigger(size=1)).size == 1
    finally:
        del globals()["Flags"], globals()["Bigger"]


def test_a_float_keeps_its_sign_and_a_record_its_own_getstate() -> None:
    """``-0.0`` equals a ``0.0`` default but is not it; a record that pickles itself (here or
    in a base) keeps doing so."""

    @record(frozen=True)
    class Ratio:
        value: float = 0.0

    class Own:
        def __getstate__(self) -> dict:
            return {"name": "own"}

    @record
    class Custom(Own):
        name: str = "x"

    globals().update(Ratio=Ratio)
    Ratio.__qualname__ = "Ratio"
    try:
        assert str(pickle.loads(pickle.dumps(Ratio(-0.0))).value) == "-0.0"
        assert str(copy.copy(Ratio(-0.0)).value) == "-0.0"
    finally:
        del globals()["Ratio"]
    assert Custom("y").__getstate__() == {"name": "own"}
