"""Recipes: a flat TOML file of training fields plus ``key=value`` overrides -> a ``TrainConfig``.

A recipe holds the shared fields (``TrainConfig``) and the task's own (its ``TaskOptions``) side by
side, with an optional ``[model]`` table of model-config fields. Overrides on the command line use
TOML literal syntax (``lr=0.5``, ``eval_bleu=false``, ``model.d_model=256``; a bare word is a
string, as is a string field's text whatever TOML reads in it: ``out_dir=2024-06-01``,
``tgt_lang=inf``). Each key goes where it belongs; a key no field takes or a wrong type is an error
naming the key (and where it came from) before any work starts. Another task's field does nothing
here and is dropped (so one set of overrides serves several tasks, and a ``train_config.json``
written when every task's fields were one flat list still reads), unless it would change what that
task learns (``TaskOptions.ABOUT``) and is set off its default: then it is an error that says whose
it is. So is an override that sets a field the rest of the config leaves without effect
(``config.inert_fields``: ``min_lr=1e-5`` with ``schedule=noam``), which would otherwise be ignored.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from pathlib import Path
from typing import Any

from aiayn.errors import ConfigError
from aiayn.textfiles import read_text
from aiayn.training.config import TaskOptions, TrainConfig, default_dict, inert_fields, shared_fields, to_dict
from aiayn.training.task import TASKS, ModelTableError, Task, get_task, task_names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

EXAMPLE_RECIPE = "recipes/multi30k-de-en.toml"


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


def _typed(key: str, value: Any, annotation: Any, where: str, text: str | None = None) -> Any:
    """``value`` checked against ``annotation``; ``text``, an override's text as written, is the value
    of a string field that TOML read as something else (a date, a number)."""
    # only a string field: list[str] and dict[str, Any] hold strings, but "12" is no list of files
    if text is not None and annotation is str and not isinstance(value, str):
        return text
    if not _type_ok(value, annotation):
        expected = {dict: "a table (e.g. model.d_model=256)", list: 'a list (e.g. ["a.txt"])'}.get(
            typing.get_origin(annotation), getattr(annotation, "__name__", str(annotation))
        )
        raise ConfigError(f"{where}: {key} must be {expected}, got {value!r}")
    return float(value) if annotation is float else value


def _option_fields(options: type[TaskOptions]) -> dict[str, Any]:
    hints = typing.get_type_hints(options)
    return {f.name: hints[f.name] for f in dataclasses.fields(options)}


def _other_task(key: str, value: Any, task: type[Task]) -> None:
    """A field of another task: dropped, since it does nothing here, unless that task names it in its
    ``ABOUT`` and it is off its default (an option that changes what is learnt, such as ``r_drop``),
    which is a ``ConfigError`` saying whose field it is. ``KeyError`` if no task has the field."""
    task_names()  # the built-in tasks registered
    owners = [
        other for other in TASKS.values() if other is not task and key in other.options.__dataclass_fields__
    ]
    if not owners:
        raise KeyError(key)
    for other in owners:
        f = other.options.__dataclass_fields__[key]
        default = f.default_factory() if callable(f.default_factory) else f.default
        if key in other.options.ABOUT and value != default:
            raise ConfigError(f"{key}={value!r} {other.options.ABOUT[key]}; task={task.name!r} does not take "
                              "it (remove it)")  # fmt: skip


def config_from_dict(
    data: dict[str, Any],
    source: str = "recipe",
    sources: dict[str, str] | None = None,
    texts: dict[str, str] | None = None,
) -> TrainConfig:
    """Build a ``TrainConfig`` (the task's options included) from flat fields, rejecting unknown
    keys and wrong types with a one-line error that names where the key came from (``sources[key]``,
    e.g. an override, else ``source``); then the task checks what it needs (``Task.check_config``).
    ``texts[key]``: an override's value as written, which a string field takes as it is."""
    shared, texts = shared_fields(), texts or {}
    where = lambda key: (sources or {}).get(key, source)  # noqa: E731
    task_name = data.get("task", TrainConfig.task)
    task = get_task(_typed("task", task_name, shared["task"], where("task"), texts.get("task")))
    own = _option_fields(task.options)
    common, options = {}, {}
    for key, value in data.items():
        if key in own:
            options[key] = _typed(key, value, own[key], where(key), texts.get(key))
        elif key in shared:
            common[key] = _typed(key, value, shared[key], where(key), texts.get(key))
        else:
            try:
                _other_task(key, value, task)
            except KeyError:
                known = ", ".join(sorted([*shared, *own]))
                raise ConfigError(f"{where(key)}: unknown key {key!r} (known keys: {known})") from None
    cfg = TrainConfig(**common, options=task.options(**options))
    try:
        task.check_config(cfg)
    except ModelTableError as e:  # named with where the table came from (its class name alone said neither)
        raise ConfigError(f"{where('model')}: [model] {e}") from None
    inert = {key: why for key, why in inert_fields(cfg).items() if key in (sources or {})}
    if inert:
        values, defaults = to_dict(cfg), default_dict(cfg)
        for key, why in inert.items():
            if values[key] != defaults[key]:
                value = texts.get(key, repr(values[key]))  # as typed: 1e-5, not 1e-05
                raise ConfigError(f"{where(key)}: {key}={value} does nothing: {why}; remove it")
    return cfg


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"model.d_model=256"`` -> (["model", "d_model"], 256). Values are TOML literals, else strings."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. lr=0.5 or model.d_model=256)")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def load_recipe(path: str | os.PathLike | None, overrides: list[str] = ()) -> TrainConfig:
    """A recipe file (or the defaults when ``path`` is None) with ``key=value`` overrides applied."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"recipe {path} is a directory; give a TOML file such as {EXAMPLE_RECIPE}")
        if not path.is_file():
            raise ConfigError(f"recipe {path} does not exist (e.g. {EXAMPLE_RECIPE})")
        text = read_text(path, "", ConfigError, fix="save the recipe as UTF-8")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"recipe {path} is not valid TOML: {e}") from None
    sources, texts, recipe_keys, tables = {}, {}, set(data), []
    for item in overrides:
        keys, value = parse_override(item)
        if len(keys) == 1 and isinstance(value, dict) and isinstance(data.get(keys[0]), dict):
            example = f"{keys[0]}.{next(iter(value))}=…" if value else f"{keys[0]}.FIELD=…"
            raise ConfigError(
                f"override {item!r} would replace the recipe's whole [{keys[0]}] table (its other fields "
                f"back to their defaults); give fields one by one: {example}"
            )
        if keys[0] == "model":
            tables.append(item)
        if len(keys) == 1:
            texts[keys[0]] = item.split("=", 1)[1]
        target = data
        for k in keys[:-1]:
            target = target.setdefault(k, {})
            if not isinstance(target, dict):
                raise ConfigError(f"override {item!r}: {k} is not a table")
        target[keys[-1]] = value
        sources[keys[0]] = f"override {item!r}"
    if tables:  # [model] from the recipe and overrides, or from several overrides: all of them named
        named = f"override{'s' if len(tables) > 1 else ''} {', '.join(map(repr, tables))}"
        sources["model"] = f"recipe {path} with {named}" if "model" in recipe_keys else named
    return config_from_dict(
        data, source=f"recipe {path}" if path else "overrides", sources=sources, texts=texts
    )
