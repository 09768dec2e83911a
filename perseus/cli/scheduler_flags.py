"""`perseus serve`'s scheduler flags, generated from the schedulers' argument models.

Every field of every registered scheduler's ``Args`` (`perseus.schedulers.args`,
`perseus.schedulers.registry.SCHEDULERS`) becomes one option: ``max_slowdown`` is
``--max-slowdown``, a boolean ``refine`` is ``--refine/--no-refine``, a field of a nested or
list type takes JSON. A field several schedulers share is one flag whose help names them
(and each one's default where they differ). Nothing is listed by hand: a field added to a
model is a flag at once. `command_with_flags` adds them to `perseus serve`'s own options;
the command is built only when ``perseus serve`` (or the command list) is asked for
(`perseus.cli.PerseusGroup`): importing the schedulers costs a second that other commands
never pay.

`scheduler_args` merges them over ``PERSEUS_SCHEDULER_ARGS`` (flags win) and validates the
result against the chosen scheduler's model: a bad value is one line naming the flag (or
``PERSEUS_SCHEDULER_ARGS.<name>``), the value and the allowed values or range.
"""

from __future__ import annotations

import enum
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types
import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from perseus.errors import ConfigurationError

__all__ = ["SchedulerFlag", "command_with_flags", "scheduler_args", "scheduler_flags"]

ARGS_VARIABLE = "PERSEUS_SCHEDULER_ARGS"


def _strip_optional(annotation: Any) -> Any:
    """``int | None`` → ``int`` (None is each field's "not given", never typed on a CLI)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _kind(annotation: Any) -> tuple[str, tuple[str, ...]]:
    """(metavar, choices) of a field's type; metavar ``<json>`` for anything not scalar."""
    annotation = _strip_optional(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        choices = tuple(str(v) for v in typing.get_args(annotation))
        return "[" + "|".join(choices) + "]", choices
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        choices = tuple(str(m.value) for m in annotation)
        return "[" + "|".join(choices) + "]", choices
    if annotation is bool:
        return "<bool>", ()
    if annotation is int:
        return "<int>", ()
    if annotation is float:
        return "<float>", ()
    if annotation is str:
        return "<str>", ()
    return "<json>", ()


def _bounds(info: FieldInfo) -> str:
    """The range a field's metadata allows: ``0 <= x <= 1``, ``>= 1``, ``> 0`` ('' when
    unbounded)."""
    low = high = ""
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            low = f"{m.ge:g} <= "
        elif isinstance(m, annotated_types.Gt):
            low = f"{m.gt:g} < "
        elif isinstance(m, annotated_types.Le):
            high = f" <= {m.le:g}"
        elif isinstance(m, annotated_types.Lt):
            high = f" < {m.lt:g}"
    if low and high:
        return f"{low}x{high}"
    if low:  # "1 <= " → ">= 1"
        bound, op = low.split(" ")[0], low.split(" ")[1]
        return f"{'>=' if op == '<=' else '>'} {bound}"
    if high:
        return high.strip()
    return ""


def _default_text(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        value = value.value
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


@dataclass(frozen=True)
class SchedulerFlag:
    """One generated option: a field name and what the schedulers that have it declare."""

    name: str
    metavar: str
    choices: tuple[str, ...]
    boolean: bool
    description: str
    schedulers: tuple[str, ...]
    defaults: tuple[tuple[str, str], ...]
    """(default, schedulers) pairs, most shared first."""
    bounds: str

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def help(self, every: tuple[str, ...]) -> str:
        text = self.description.rstrip(".") if self.description else self.name
        if set(self.schedulers) == set(every):
            who = "every scheduler"
        elif len(every) - len(self.schedulers) <= 2:
            who = "all but " + ", ".join(s for s in every if s not in self.schedulers)
        else:
            who = ", ".join(self.schedulers)
        parts = [f"{text} ({who})."]
        if self.bounds:
            parts.append(f"[range: {self.bounds}]")
        if len(self.defaults) == 1:
            parts.append(f"[default: {self.defaults[0][0]}]")
        else:
            parts.append(
                "[default: "
                + "; ".join(
                    d if i == 0 else f"{d} for {who_}" for i, (d, who_) in enumerate(self.defaults)
                )
                + "]"
            )
        return " ".join(parts)


def _models() -> dict[str, type[BaseModel]]:
    from perseus.schedulers.registry import SCHEDULERS

    return {name: cls.Args for name, cls in sorted(SCHEDULERS.items())}


def scheduler_flags(models: Mapping[str, type[BaseModel]] | None = None) -> list[SchedulerFlag]:
    """One flag per argument name of the registered schedulers' models (sorted by name)."""
    models = _models() if models is None else models
    seen: dict[str, list[tuple[str, FieldInfo]]] = {}
    for scheduler, model in models.items():
        for name, info in model.model_fields.items():
            seen.setdefault(name, []).append((scheduler, info))
    flags = []
    for name, owners in sorted(seen.items()):
        # The richest declaration describes it: the first with a description and bounds.
        _, main = max(owners, key=lambda o: (bool(o[1].description), bool(_bounds(o[1]))))
        metavar, choices = _kind(main.annotation)
        union = sorted({c for _, info in owners for c in _kind(info.annotation)[1]})
        if union:
            metavar, choices = "[" + "|".join(union) + "]", tuple(union)
        by_default: dict[str, list[str]] = {}
        for scheduler, info in owners:
            by_default.setdefault(_default_text(info), []).append(scheduler)
        defaults = tuple(
            (d, ", ".join(s)) for d, s in sorted(by_default.items(), key=lambda item: -len(item[1]))
        )
        flags.append(
            SchedulerFlag(
                name=name,
                metavar=metavar,
                choices=choices,
                boolean=metavar == "<bool>",
                description=main.description or "",
                schedulers=tuple(s for s, _ in owners),
                defaults=defaults,
                bounds=_bounds(main),
            )
        )
    return flags


def command_with_flags(
    serve: Callable[..., Any], flags: list[SchedulerFlag] | None = None
) -> Callable[..., Any]:
    """`serve`'s own options plus one per scheduler flag, as a function typer can read: the
    flags given (not None) reach `serve` as ``scheduler_flags`` (name → value)."""
    flags = scheduler_flags() if flags is None else flags
    every = tuple(sorted({s for f in flags for s in f.schedulers}))
    hints = typing.get_type_hints(serve, include_extras=True)
    own = [
        p.replace(annotation=hints[p.name])
        for p in inspect.signature(serve).parameters.values()
        if p.name != "scheduler_flags"
    ]
    taken = {p.name for p in own}
    clash = sorted(f.name for f in flags if f.name in taken)
    if clash:  # pragma: no cover - a scheduler argument named like a serve option
        raise ConfigurationError(f"scheduler arguments clash with perseus serve's options: {clash}")
    extra = []
    for f in flags:
        if f.boolean:
            option = typer.Option(
                f"{f.option}/--no-{f.option[2:]}", help=f.help(every), show_default=False
            )
            annotation: Any = Annotated[bool | None, option]
        else:  # a string, checked against the chosen scheduler's model (one clear line)
            option = typer.Option(
                f.option, help=f.help(every), metavar=f.metavar, show_default=False
            )
            annotation = Annotated[str | None, option]
        extra.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
    names = [f.name for f in flags]

    def command(**kwargs: Any) -> Any:
        given = {n: kwargs.pop(n) for n in names if kwargs.get(n) is not None}
        for n in names:
            kwargs.pop(n, None)
        return serve(**kwargs, scheduler_flags=given)

    params = own + extra
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = serve.__doc__
    command.__name__ = command.__qualname__ = "serve"
    return command


def _source(name: str, from_flags: Mapping[str, Any]) -> str:
    """The flag or variable entry `name` came from."""
    if name in from_flags:
        return "--" + name.replace("_", "-")
    return f"{ARGS_VARIABLE}.{name}"


def _allowed(model: type[BaseModel], name: str) -> str:
    info = model.model_fields.get(name)
    if info is None:
        return ""
    metavar, choices = _kind(info.annotation)
    if choices:
        return "one of " + ", ".join(choices)
    bounds = _bounds(info)
    what = {"<int>": "an integer", "<float>": "a number", "<bool>": "true or false"}.get(
        metavar, ""
    )
    if bounds:
        return f"{what}, {bounds}" if what and "x" in bounds else f"{what} {bounds}".strip()
    return what


def scheduler_args(
    scheduler: str,
    model: type[BaseModel],
    from_variable: Mapping[str, Any],
    from_flags: Mapping[str, Any],
) -> dict[str, Any]:
    """The scheduler's arguments: ``PERSEUS_SCHEDULER_ARGS`` with the flags given over it,
    flags converted to their types; `ConfigurationError` (one line) naming the first bad
    flag or variable entry, its value and what is allowed."""
    fields = model.model_fields
    unknown = sorted(n for n in from_flags if n not in fields)
    if unknown:
        flags = ", ".join("--" + n.replace("_", "-") for n in unknown)
        accepted = ", ".join("--" + n.replace("_", "-") for n in fields) or "none"
        raise ConfigurationError(
            f"{flags}: not an argument of scheduler {scheduler} (its arguments: {accepted})"
        )
    raw: dict[str, Any] = dict(from_variable)
    for name, value in from_flags.items():
        if isinstance(value, str) and _kind(fields[name].annotation)[0] == "<json>":
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigurationError(
                    f"--{name.replace('_', '-')} {value!r}: not valid JSON"
                ) from None
        raw[name] = value
    try:
        validated = model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        name = str(error["loc"][0]) if error["loc"] else "<args>"
        if error["type"] == "missing":
            raise ConfigurationError(
                f"scheduler {scheduler} needs {name} (--{name.replace('_', '-')} or "
                f"{ARGS_VARIABLE}): {fields[name].description or 'required'}"
            ) from None
        if error["type"] == "extra_forbidden":
            accepted = ", ".join(fields) or "none"
            raise ConfigurationError(
                f"{_source(name, from_flags)}: not an argument of scheduler {scheduler} "
                f"(its arguments: {accepted})"
            ) from None
        allowed = _allowed(model, name)
        message = str(error["msg"]).removeprefix("Value error, ")
        value = error.get("input")
        given = (
            f"--{name.replace('_', '-')} {value}"
            if name in from_flags
            else f"{ARGS_VARIABLE}.{name}={json.dumps(value, default=str)}"
        )
        raise ConfigurationError(
            f"{given}: {message}" + (f" (allowed: {allowed})" if allowed else "")
        ) from None
    merged = dict(from_variable)
    for name in from_flags:
        value = getattr(validated, name)
        merged[name] = value.model_dump() if isinstance(value, BaseModel) else value
        if isinstance(value, enum.Enum):
            merged[name] = value.value
    return merged
