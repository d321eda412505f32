"""Typed blocks of a JSON artifact: the one way a capability's file (dial.json, load.json) is read into frozen
dataclasses and written back from them.

:mod:`voice_llm.core.run.artifacts` types the core's files one by one. A capability's file is larger and nested (a
call's turns, each with its heard reply and barge-in), and is written by the capability itself: each object of it
is a :class:`Block`, a frozen dataclass whose fields are declared with :func:`typed` (the key's reader: a finite
number, a whole number, true or false, a string, a nested block, a list of them). :meth:`Block.read` checks each
typed key's type once, with the artifact rules' words (``dial.json: turns[2].heard.gap_ms is 'x', not a finite
number``), and keeps every key it does not type in ``extra``; :meth:`Block.as_dict` writes the block back, the
typed keys in order, then ``extra``, leaving out what the file did not have: a file read and written again is the
same document, key for key, so a block another capability adds (a WebRTC line's) survives a writer that does not
know it. The writer builds the same dataclasses, so a field renamed in the type is an error of the type checker in
every reader and writer at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from voice_llm.core.errors import ArtifactError
from voice_llm.core.run.artifacts import Artifact, field_error, field_path, is_finite_number

__all__ = ["Block", "Document", "Reader", "as_is", "block", "flag", "json_list", "json_object", "number", "numbers",
           "reasons", "span", "text", "tuple_of", "typed", "whole"]

B = TypeVar("B", bound="Block")
D = TypeVar("D", bound="Document")
Reader = Callable[[Any, str, str], Any]  # (the JSON value, the file's name, the field's path) -> the typed value


# --- the readers of one value (each given a value that is there and not null) -----------------------------------

def number(value: Any, what: str, where: str) -> float:
    if not is_finite_number(value):
        raise field_error(what, where, f"is {value!r:.80}, not a finite number")
    return value  # type: ignore[no-any-return]  # kept as written (1 stays 1): the file round-trips


def whole(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise field_error(what, where, f"is {value!r:.80}, not a whole number")
    return value


def flag(value: Any, what: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise field_error(what, where, f"is {value!r:.80}, not true or false")
    return value


def text(value: Any, what: str, where: str) -> str:
    if not isinstance(value, str):
        raise field_error(what, where, f"is {value!r:.80}, not a string")
    return value


def as_is(value: Any, what: str, where: str) -> Any:
    return value


def json_object(value: Any, what: str, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise field_error(what, where, f"is {value!r:.80}, not an object")
    return value


def json_list(value: Any, what: str, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise field_error(what, where, f"is {value!r:.80}, not a list")
    return value


def tuple_of(read: Reader) -> Reader:
    def reader(value: Any, what: str, where: str) -> tuple[Any, ...]:
        return tuple(read(item, what, field_path(where, i)) for i, item in enumerate(json_list(value, what, where)))
    return reader


def span(value: Any, what: str, where: str) -> tuple[float, float]:
    """[start_ms, end_ms]: a pause or a resumed stretch on the call clock."""
    pair = json_list(value, what, where)
    if len(pair) != 2:
        raise field_error(what, where, f"is {value!r:.80}, not [start_ms, end_ms]")
    return number(pair[0], what, field_path(where, 0)), number(pair[1], what, field_path(where, 1))


def reasons(value: Any, what: str, where: str) -> Mapping[str, str]:
    """``unknown``: why a number is null, a sentence per field."""
    body = json_object(value, what, where)
    for key, reason in body.items():
        text(reason, what, field_path(where, key))
    return dict(body)


def numbers(value: Any, what: str, where: str) -> Mapping[str, float | None]:
    """An object of numbers or nulls (a turn's agent_breakdown)."""
    body = json_object(value, what, where)
    for key, item in body.items():
        if item is not None:
            number(item, what, field_path(where, key))
    return dict(body)


def block(kind: type[B]) -> Reader:
    def reader(value: Any, what: str, where: str) -> B:
        return kind.read(json_object(value, what, where), what, where)
    return reader


# --- a field's declaration ---------------------------------------------------------------------------------------

def typed(read: Reader, *, key: str | None = None, required: bool = False, default: Any = None,
           omit: bool = False) -> Any:
    """A typed key of a block. ``required``: a file without it (or with null there) is refused; else an absent key
    is ``default`` and is left out again when written. ``omit``: a value None (or empty) that a writer built is
    left out of the file (a key the dialer writes only when it has one: a turn's pauses)."""
    meta = {"read": read, "key": key, "required": required, "omit": omit}
    if required:
        return field(metadata=meta)
    if isinstance(default, (list, dict)):
        raise TypeError("a mutable default")
    return field(default=default, metadata=meta)


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (tuple, Mapping)) and not value)


def _write(value: Any) -> Any:
    if isinstance(value, Block):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_write(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _write(item) for key, item in value.items()}
    return value


@dataclass(frozen=True, kw_only=True)
class Block:
    """One object of the file: its typed keys as fields, the rest in ``extra`` (kept, written back after them);
    ``absent`` the typed keys the file did not have (left out again when written, unless given a value since)."""

    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    @classmethod
    def _typed(cls) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
        """(field name, key in the file, its declaration) of each typed key, in the file's order."""
        for spec in fields(cls):
            if "read" in spec.metadata:
                yield spec.name, spec.metadata["key"] or spec.name, spec.metadata

    @classmethod
    def read(cls: type[B], body: Mapping[str, Any], what: str, where: str = "") -> B:
        """``body`` (an object of the file at ``where``) as this block; an ArtifactError naming the field."""
        values: dict[str, Any] = {}
        absent = set()
        known = set()
        for name, key, meta in cls._typed():
            known.add(key)
            at = field_path(where, key)
            if key not in body:
                if meta["required"]:
                    raise ArtifactError(f"{what} has no field {at!r}")
                absent.add(key)
                continue
            value = body[key]
            if value is None:
                if meta["required"]:
                    raise field_error(what, at, "is null")
                values[name] = None
                continue
            values[name] = meta["read"](value, what, at)
        extra = {key: value for key, value in body.items() if key not in known}
        return cls(**values, extra=extra, absent=frozenset(absent))

    def as_dict(self) -> dict[str, Any]:
        """The block as the file holds it: the typed keys in order, then ``extra``."""
        found: dict[str, Any] = {}
        for name, key, meta in self._typed():
            value = getattr(self, name)
            if (key in self.absent or meta["omit"]) and _empty(value):
                continue  # absent from the file read (and not set since), or a key written only when it has a value
            found[key] = _write(value)
        found.update(self.extra)
        return found


@dataclass(frozen=True, kw_only=True)
class Document(Artifact, Block):
    """A whole artifact made of blocks (dial.json, load.json): the run's ``schema_version`` by the folder's rule
    (:meth:`Artifact.parse`), and its own shape's version at ``SHAPE_KEY`` refused when newer than ``SHAPE``, the
    one this voice-llm writes. ``doc`` is the document parsed (None for one a writer built)."""

    SHAPE_KEY: ClassVar[str] = ""
    SHAPE: ClassVar[int] = 1
    doc: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def _parse(cls: type[D], doc: Any, what: str) -> D:
        if not isinstance(doc, Mapping):
            raise ArtifactError(f"{what} is not an object: {doc!r:.80}")
        version = doc.get(cls.SHAPE_KEY)
        if isinstance(version, int) and not isinstance(version, bool) and version > cls.SHAPE:
            raise ArtifactError(f"{what} was written by a newer voice-llm ({cls.SHAPE_KEY} {version}; this one reads "
                                f"up to {cls.SHAPE}): upgrade voice-llm to check or draw it")
        found = cls.read(doc, what)
        object.__setattr__(found, "doc", doc)
        return found
