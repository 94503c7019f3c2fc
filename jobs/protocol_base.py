"""The bucket protocol's base (jobs/protocol.py re-exports every public name here): the node
states, the protocol's errors, the one rule every document is read by (`load_json`: a size cap,
a depth cap, finite numbers only) and the `Document` base class whose typed field readers
refuse what is not of the field's type.

Everything in a run's prefix is writable by a node that runs user code, so a reader treats it as
untrusted: a document too large, too deep or ill-typed is a ProtocolError (a ValueError), never
a RecursionError, a MemoryError or a NaN in a figure. Standard library only and importing
nothing of the project: the agent runs it on the node (Python 3.10+), the controller reads with
it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, TypeVar

PROTOCOL_VERSION = 1  # what the writers write; a document without `version` reads as 0
UNVERSIONED = 0
# the caps of the parsing rule: what a well-behaved writer never comes near
MAX_DOCUMENT_BYTES = 1024 * 1024  # a JSON document's default cap (Document.MAX_BYTES)
MAX_DEPTH = 32  # nesting of objects and lists
MAX_MAGNITUDE = 1e18  # the largest number a document may hold (an int: 19 digits at most)
_MAX_INT_DIGITS = 19


class NodeState(str, Enum):
    BOOTSTRAPPED = "bootstrapped"  # the agent started and read cluster.json
    RENDEZVOUS = "rendezvous"  # checkpoints restored; waiting for every node of the attempt
    RUNNING = "running"  # the entrypoint runs
    SUCCEEDED = "succeeded"  # the entrypoint exited 0 (or a server ended after the chief)
    FAILED = "failed"  # the entrypoint, the setup, the rendezvous or the agent failed
    STOPPED = "stopped"  # control/stop, the deadline, SIGTERM or the linger time ended it

    def __str__(self) -> str:
        return self.value


FINAL_STATES = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.STOPPED})


class ProtocolError(ValueError):
    """A document that cannot be read: not JSON (a half-written object), not a JSON object, too
    large, too deeply nested, a number not finite or beyond MAX_MAGNITUDE, or a field of the
    wrong type. A ValueError: readers treat it as "not there (yet)" and skip it."""


class MissingField(ProtocolError):
    """A document without one of its required fields (`field`)."""

    def __init__(self, doc: str, name: str) -> None:
        super().__init__(f"{doc} has no {name!r}")
        self.field = name


# --- the parsing rule -----------------------------------------------------------------------------
def load_json(
    body: bytes | str,
    *,
    what: str,
    max_bytes: int = MAX_DOCUMENT_BYTES,
    max_depth: int = MAX_DEPTH,
    allow_infinity: bool = False,
    non_finite_as_null: bool = False,
) -> Any:
    """The JSON value in `body`, read by the protocol's one rule: at most `max_bytes` long, at
    most `max_depth` levels of objects and lists, and every number finite and within
    MAX_MAGNITUDE (NaN and -Infinity never; Infinity only with `allow_infinity`). Raises
    ProtocolError (naming `what`) for anything else, never RecursionError; with
    `non_finite_as_null`, a number that is not finite or out of range reads as null instead
    (a heartbeat whose training's loss diverged to NaN is still a heartbeat). Pure."""
    size = len(body)
    if size > max_bytes:
        raise ProtocolError(f"{what}: {size} bytes, over its cap of {max_bytes} bytes")
    try:
        data = json.loads(
            body,
            parse_constant=_constant(what, allow_infinity, non_finite_as_null),
            parse_float=_float(what, non_finite_as_null),
            parse_int=_int(what, non_finite_as_null),
        )
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError(f"{what}: nested too deep (over {max_depth} levels)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ProtocolError(f"{what}: not JSON: {exc}") from None
    _check_depth(data, max_depth, what)
    return data


def _constant(what: str, allow_infinity: bool, as_null: bool) -> Callable[[str], float | None]:
    def read(name: str) -> float | None:
        if name == "Infinity" and allow_infinity:
            return math.inf
        if as_null:
            return None
        raise ProtocolError(f"{what}: a number that is not finite ({name})")

    return read


def _float(what: str, as_null: bool) -> Callable[[str], float | None]:
    def read(text: str) -> float | None:
        value = float(text)
        if math.isfinite(value) and abs(value) <= MAX_MAGNITUDE:
            return value
        if as_null:
            return None
        raise ProtocolError(f"{what}: a number out of range ({text[:40]})")

    return read


def _int(what: str, as_null: bool) -> Callable[[str], int | None]:
    def read(text: str) -> int | None:
        if len(text.lstrip("-")) <= _MAX_INT_DIGITS and abs(int(text)) <= MAX_MAGNITUDE:
            return int(text)
        if as_null:
            return None
        raise ProtocolError(f"{what}: an integer out of range ({text[:40]}...)")

    return read


def _check_depth(data: Any, max_depth: int, what: str) -> None:
    """Raise ProtocolError when `data` nests objects and lists deeper than `max_depth` (the top
    value is level 1). Iterative: no recursion of its own."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > max_depth:
            raise ProtocolError(f"{what}: nested too deep (over {max_depth} levels)")
        stack.extend((child, depth + 1) for child in children)


# --- field readers: each raises TypeError or ValueError for a value not of its type --------------
def read_integer(value: Any) -> int:
    """An int (a float with no fraction reads as one); not a bool, a string or anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not an integer: {_short(value)}")
    if isinstance(value, float) and not value.is_integer():
        raise TypeError(f"not an integer: {value!r}")
    return int(value)


def read_number(value: Any) -> float:
    """A finite int or float as a float; not a bool, a string, NaN or an infinity."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a number: {_short(value)}")
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


def _number_or_infinity(value: Any) -> float:
    if isinstance(value, float) and value == math.inf:
        return value
    return read_number(value)


def read_text(value: Any) -> str:
    """A string (a number reads as its text); not an object or a list."""
    if isinstance(value, (dict, list)):
        raise TypeError(f"not a string: {_short(value)}")
    return str(value)


def _state(value: Any) -> str:
    text = read_text(value)
    known = {s.value for s in NodeState}
    return NodeState(text) if text in known else text  # a newer agent's state stays a string


def _lines(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise TypeError(f"not a list: {_short(value)}")
    return [read_text(x) for x in value]


def _counts(value: Any) -> dict[str, int]:
    return {k: read_integer(v) for k, v in read_object(value).items()}


def _strings(value: Any) -> dict[str, str]:
    return {k: read_text(v) for k, v in read_object(value).items()}


def read_object(value: Any) -> dict[str, Any]:
    """A JSON object as a dict with string keys; not anything else."""
    if not isinstance(value, dict):
        raise TypeError(f"not an object: {_short(value)}")
    return {str(k): v for k, v in value.items()}


def _objects(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise TypeError(f"not a list: {_short(value)}")
    return [read_object(x) for x in value]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# how each field type (as annotated) is read from JSON; a null reads as the field's default,
# except for the `| None` types, where it is None
_READERS: dict[str, Callable[[Any], Any]] = {
    "int": read_integer,
    "float": read_number,
    "str": read_text,
    "list[str]": _lines,
    "dict[str, int]": _counts,
    "dict[str, str]": _strings,
    "dict[str, Any]": read_object,
    "list[dict[str, Any]]": _objects,
}

D = TypeVar("D", bound="Document")


@dataclass(frozen=True, eq=False)
class Document(dict):  # type: ignore[type-arg]
    """The base of every JSON document: a frozen dataclass whose fields are the JSON object's
    (`version` first). It is also that JSON object: a read-only dict of `to_dict()`, so
    `doc["state"]`, `doc.get("attempt")` and `json.dumps(doc)` work, and a document equals the
    dict it reads from. Mutating it raises TypeError; `dataclasses.replace` makes a new one."""

    version: int = PROTOCOL_VERSION
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # fields a document must have
    INDENT: ClassVar[int | None] = None
    OMIT_NULLS: ClassVar[bool] = False  # whether a None field is left out of the JSON
    MAX_BYTES: ClassVar[int] = MAX_DOCUMENT_BYTES  # from_json refuses a longer body
    INFINITE: ClassVar[tuple[str, ...]] = ()  # float fields that may hold Infinity
    NON_FINITE_AS_NULL: ClassVar[bool] = False  # a NaN (or out-of-range number) reads as null
    # field name -> its reader, where the field's annotated type says too little
    FIELD_READERS: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    def __post_init__(self) -> None:
        dict.update(self, self.to_dict())

    def _read_only(self, *_args: Any, **_kwargs: Any) -> Any:
        raise TypeError(f"a {type(self).__name__} is read-only: use dataclasses.replace")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field, `version` included (None fields left out where the
        document says OMIT_NULLS). Pure."""
        out = {name: _plain(getattr(self, name)) for name in self._names()}
        return {k: v for k, v in out.items() if v is not None} if self.OMIT_NULLS else out

    def to_json(self) -> bytes:
        """The document as the bytes the bucket holds. Pure."""
        return json.dumps(self.to_dict(), indent=self.INDENT).encode()

    @classmethod
    def from_dict(cls: type[D], data: Any) -> D:
        """The document from a decoded JSON object. Unknown fields are ignored; a missing
        optional field (or a null) takes its default. Raises MissingField for a missing
        required field and ProtocolError for anything else unreadable. Pure."""
        if not isinstance(data, Mapping):
            raise ProtocolError(f"{cls.__name__}: not a JSON object")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = data.get(f.name)
            if raw is None:
                if f.name in cls.REQUIRED:
                    raise MissingField(cls.__name__, f.name)
                if f.name == "version":
                    values[f.name] = UNVERSIONED  # written before documents had a version
                continue  # its default (None for the `| None` fields)
            reader = cls._reader(f.name, str(f.type).removesuffix(" | None"))
            try:
                values[f.name] = reader(raw)
            except (TypeError, ValueError) as exc:
                raise ProtocolError(f"{cls.__name__}.{f.name}: {exc}") from None
        return cls(**values)

    @classmethod
    def _reader(cls, name: str, kind: str) -> Callable[[Any], Any]:
        if name in cls.FIELD_READERS:
            return cls.FIELD_READERS[name]
        if name == "state":
            return _state
        return _number_or_infinity if name in cls.INFINITE else _READERS[kind]

    @classmethod
    def from_json(cls: type[D], body: bytes | str) -> D:
        """The document from the bucket's bytes, read by `load_json` (at most MAX_BYTES, at
        most MAX_DEPTH deep, finite numbers: Infinity only in the INFINITE fields), then
        `from_dict`. Raises ProtocolError for anything else (e.g. a half-written object).
        Pure."""
        data = load_json(
            body,
            what=cls.__name__,
            max_bytes=cls.MAX_BYTES,
            allow_infinity=bool(cls.INFINITE),
            non_finite_as_null=cls.NON_FINITE_AS_NULL,
        )
        return cls.from_dict(data)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value
