"""Typed arguments: a handler's annotated parameters carried through the job's JSON.

A handler whose parameters are annotated with pydantic models, dataclasses,
``TypedDict``s, enums, ``datetime``/``date``/``time``, ``UUID`` or ``Decimal``
(alone or inside ``list``, ``dict``, ``tuple`` or ``Optional``) gets those
types back in the worker. At enqueue each such argument is validated and
turned into JSON (refused with the validation error, nothing written); in the
worker the JSON is turned back into the annotated type. With pydantic
installed (the ``typed`` extra) pydantic does both for every annotation;
without it, dataclasses and the standard types above still work.

Parameters annotated with plain JSON types (or not at all) are left as they
are: a task without rich annotations pays nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from conveyor.errors import InvalidJobError

#: Types whose values JSON cannot carry as they are.
_SCALARS: tuple[type, ...] = (dt.datetime, dt.date, dt.time, uuid.UUID, Decimal)


class ArgumentError(InvalidJobError):
    """An argument does not fit its parameter's annotation."""


def _pydantic() -> Any:
    try:
        import pydantic
    except ImportError:
        return None
    return pydantic


def _is_typed_dict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and any(
        c.__module__.startswith("pydantic") and c.__name__ == "BaseModel" for c in tp.__mro__
    )


def is_rich(tp: Any) -> bool:
    """Whether values of ``tp`` need converting to and from JSON."""
    if isinstance(tp, type) and (
        issubclass(tp, (*_SCALARS, enum.Enum))
        or dataclasses.is_dataclass(tp)
        or _is_typed_dict(tp)
        or _is_model(tp)
    ):
        return True
    return any(is_rich(arg) for arg in typing.get_args(tp) if arg is not Ellipsis)


class _Converter:
    """One annotation's way to and from JSON: pydantic's when installed, else ours."""

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        pydantic = _pydantic()
        self._adapter = None
        if pydantic is not None:
            try:
                self._adapter = pydantic.TypeAdapter(annotation)
            except pydantic.PydanticUserError as exc:
                # typing.TypedDict before Python 3.12, for one: ours carries it instead.
                if _mentions_model(annotation):
                    raise InvalidJobError(f"{_name(annotation)}: {exc}") from None
        elif _mentions_model(annotation):
            raise InvalidJobError(
                f"{_name(annotation)} is a pydantic model: install conveyor[typed]"
            )

    def dump(self, value: Any) -> Any:
        if self._adapter is not None:
            stored = self._adapter.dump_python(self._adapter.validate_python(value), mode="json")
            self._adapter.validate_python(stored)  # what is stored loads in the worker
            return stored
        return _dump(self.annotation, _load(self.annotation, value))

    def load(self, value: Any) -> Any:
        if self._adapter is not None:
            return self._adapter.validate_python(value)
        return _load(self.annotation, value)

    def schema(self) -> dict[str, Any]:
        if self._adapter is not None:
            return dict(self._adapter.json_schema())
        return _schema(self.annotation)


class ArgumentTypes:
    """The rich annotated parameters of a handler, by name, and how to carry them."""

    def __init__(self, signature: inspect.Signature, hints: Mapping[str, Any]) -> None:
        self.signature = signature
        self.hints = dict(hints)
        self.converters = {name: _Converter(tp) for name, tp in hints.items() if is_rich(tp)}

    @classmethod
    def of(cls, fn: Callable[..., Any], skip_first: bool) -> ArgumentTypes | None:
        """The handler's typed parameters; None when none needs converting (no cost)."""
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # an annotation that cannot be resolved: leave the handler as is
            return None
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())[int(skip_first) :]
        signature = signature.replace(parameters=params)
        chosen = {p.name: hints[p.name] for p in params if p.name in hints}
        if not any(is_rich(tp) for tp in chosen.values()):
            return None
        return cls(signature, chosen)

    def dump(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The call's arguments validated and made JSON; ArgumentError says which does not fit."""
        return self._each(args, kwargs, "dump")

    def load(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The stored JSON arguments as the annotated types (in the worker)."""
        return self._each(args, kwargs, "load")

    def _each(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], way: str
    ) -> tuple[list[Any], dict[str, Any]]:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return list(args), dict(kwargs)  # the binding check says what is wrong
        for name, value in bound.arguments.items():
            converter = self.converters.get(name)
            if converter is None:
                continue
            kind = self.signature.parameters[name].kind
            try:
                if kind is inspect.Parameter.VAR_POSITIONAL:
                    bound.arguments[name] = tuple(getattr(converter, way)(v) for v in value)
                elif kind is inspect.Parameter.VAR_KEYWORD:
                    bound.arguments[name] = {
                        k: getattr(converter, way)(v) for k, v in value.items()
                    }
                else:
                    bound.arguments[name] = getattr(converter, way)(value)
            except ArgumentError:
                raise
            except Exception as exc:
                raise ArgumentError(
                    f"argument {name!r} does not fit {_name(converter.annotation)}: {exc}"
                ) from None
        return list(bound.args), dict(bound.kwargs)

    def schema(self, title: str) -> dict[str, Any]:
        """A JSON Schema of the call's arguments, by parameter name."""
        properties: dict[str, Any] = {}
        required: list[str] = []
        for param in self.signature.parameters.values():
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            tp = self.hints.get(param.name)
            properties[param.name] = (
                {} if tp is None else (self.converters.get(param.name) or _Converter(tp)).schema()
            )
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
        return {"title": title, "type": "object", "properties": properties, "required": required}


def task_schema(fn: Callable[..., Any], skip_first: bool, title: str) -> dict[str, Any]:
    """The JSON Schema of any handler's arguments (typed or not)."""
    typed = ArgumentTypes.of(fn, skip_first)
    if typed is not None:
        return typed.schema(title)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[int(skip_first) :]
    plain = ArgumentTypes(signature.replace(parameters=params), {})
    plain.hints = {p.name: hints[p.name] for p in params if p.name in hints}
    return plain.schema(title)


# --- without pydantic: dataclasses, TypedDicts, enums and the standard scalars --------


def _mentions_model(tp: Any) -> bool:
    return _is_model(tp) or any(_mentions_model(a) for a in typing.get_args(tp))


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def _origin(tp: Any) -> Any:
    return typing.get_origin(tp)


def _load(tp: Any, value: Any) -> Any:
    """A JSON value (or an instance) as ``tp``; ValueError or TypeError when it does not fit."""
    origin = _origin(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            try:
                return _load(option, value)
            except (ValueError, TypeError, InvalidOperation) as exc:
                errors.append(str(exc))
        raise ValueError(f"{value!r} fits none of {_name(tp)}: {'; '.join(errors)}")
    if origin in (list, Sequence, set, frozenset) or tp in (list, set):
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list | tuple | set | frozenset):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        loaded = [_load(item, v) for v in value]
        return loaded if origin in (list, Sequence, None) else (origin or list)(loaded)
    if origin is tuple:
        items = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        if len(items) == 2 and items[1] is Ellipsis:
            return tuple(_load(items[0], v) for v in value)
        if len(items) != len(value):
            raise ValueError(f"expected {len(items)} items, got {len(value)}")
        return tuple(_load(t, v) for t, v in zip(items, value, strict=True))
    if origin in (dict, Mapping) or tp is dict:
        _, item = typing.get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        return {k: _load(item, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return value if isinstance(value, tp) else tp(value)
    if tp is dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        return dt.datetime.fromisoformat(_text(value))
    if tp is dt.date:
        return value if isinstance(value, dt.date) else dt.date.fromisoformat(_text(value))
    if tp is dt.time:
        return value if isinstance(value, dt.time) else dt.time.fromisoformat(_text(value))
    if tp is uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(_text(value))
    if tp is Decimal:
        if isinstance(value, Decimal):
            return value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise TypeError(f"expected a decimal number, got {type(value).__name__}")
        return Decimal(str(value))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = set(value) - fields
        if unknown:
            raise ValueError(f"{tp.__name__} has no field {', '.join(sorted(unknown))}")
        return tp(**{k: _load(hints.get(k, Any), v) for k, v in value.items()})
    if _is_typed_dict(tp):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {type(value).__name__}")
        missing = set(tp.__required_keys__) - set(value)
        if missing:
            raise ValueError(f"{tp.__name__} needs {', '.join(sorted(missing))}")
        hints = typing.get_type_hints(tp)
        return {k: _load(hints.get(k, Any), v) for k, v in value.items()}
    return value  # a plain JSON type: the payload check covers it


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value


def _dump(tp: Any, value: Any) -> Any:
    """A value of ``tp`` (as _load made it) as JSON."""
    if value is None:
        return None
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hints = typing.get_type_hints(type(value))
        return {
            f.name: _dump(hints.get(f.name, Any), getattr(value, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, dict):
        return {k: _dump(Any, v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_dump(Any, v) for v in value]
    return value


_FORMATS = {dt.datetime: "date-time", dt.date: "date", dt.time: "time", uuid.UUID: "uuid"}
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _schema(tp: Any) -> dict[str, Any]:
    origin = _origin(tp)
    if tp in _FORMATS:
        return {"type": "string", "format": _FORMATS[tp]}
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    if tp is Decimal:
        return {"anyOf": [{"type": "number"}, {"type": "string"}]}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema(a) for a in typing.get_args(tp)]}
    if tp is type(None):
        return {"type": "null"}
    if origin in (list, set, frozenset, tuple, Sequence) or tp in (list, tuple):
        items = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return {"type": "array", "items": _schema(items[0]) if items else {}}
    if origin in (dict, Mapping) or tp is dict:
        pair = typing.get_args(tp)
        return {"type": "object", "additionalProperties": _schema(pair[1]) if pair else {}}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp], "title": tp.__name__}
    if isinstance(tp, type) and (dataclasses.is_dataclass(tp) or _is_typed_dict(tp)):
        hints = typing.get_type_hints(tp)
        if dataclasses.is_dataclass(tp):
            required = [
                f.name
                for f in dataclasses.fields(tp)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            ]
        else:
            required = sorted(getattr(tp, "__required_keys__", ()))
        return {
            "title": tp.__name__,
            "type": "object",
            "properties": {name: _schema(t) for name, t in hints.items()},
            "required": required,
        }
    return {}
