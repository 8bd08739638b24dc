"""Config sections made from settings dataclasses, and the dataclasses made back from them.

  c.train.step = section(StepConfig(), exclude=("estimator", "temperature"))
  step = settings(StepConfig, c.train.step, "train.step", estimator=c.algo)
  c.stages.planner = section(StageConfig, exclude=("module",), steps=0, batch_size=48, ...)

`section` gives every field of a dataclass its default (a nested dataclass: a nested section; a
field whose default is None: a placeholder of the field's type, so that a flag can set it), so
every field can be set from a config file or the command line
(`--config.train.step.epsilon=0.28`). `settings` is the one validator: a key that is not a
field, a value of the wrong type and the dataclass's own checks are refused as a ConfigError
that names the field and the value. Both systems' sections are made and read by this pair alone.

A section whose keys are one dataclass's fields plus keys of the experiment's own (the training
loop beside the rollout, the router's embedder, a phase's epochs) is a dataclass that extends the
first: `class TrainConfig(RolloutConfig)`; `as_base(train, RolloutConfig)` is the first back.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Mapping

import ml_collections
from ml_collections.config_dict import placeholder


class ConfigError(ValueError):
  """An experiment setting is invalid; the message names the field and the value."""


def check(ok: bool, where: str, value: Any, expected: str) -> None:
  """Raises ConfigError "config.<where>=<value>: <expected>" unless ok."""
  if not ok:
    raise ConfigError(f"config.{where}={value!r}: {expected}")


@functools.cache
def _field_types(cls) -> dict[str, tuple[Any, bool]]:
  """field -> (its type without None, whether None is allowed)."""
  out = {}
  for name, hint in typing.get_type_hints(cls).items():
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
      rest = [a for a in args if a is not type(None)]
      hint = rest[0] if len(rest) == 1 else Any
    out[name] = (hint, optional)
  return out


def _fields(cls) -> dict[str, dataclasses.Field]:
  return {f.name: f for f in dataclasses.fields(cls) if f.init}


def section(instance, *, exclude: tuple[str, ...] = (), **values) -> ml_collections.ConfigDict:
  """A ConfigDict of `instance`'s fields (less `exclude`: set from elsewhere; a nested
  section less the names its field's metadata lists as "set_elsewhere") and values. `instance`
  may be the dataclass itself: then `values` over its defaults, not checked until `settings`
  builds it (so a value the translation replaces, such as steps 0 where epochs give the steps,
  may stand)."""
  cls = instance if isinstance(instance, type) else type(instance)
  fields, kinds = _fields(cls), _field_types(cls)
  if instance is not cls:
    check(not values, cls.__name__, values, "values go with the dataclass, not an instance")
  for name, value in values.items():
    check(name in fields, f"{cls.__name__}.{name}", value,
          f"{cls.__name__} has no such field (fields: {', '.join(fields)})")
  out = ml_collections.ConfigDict()
  for name, field in fields.items():
    if name in exclude:
      continue
    if instance is not cls:
      value = getattr(instance, name)
    elif name in values:
      value = values[name]
    elif field.default is not dataclasses.MISSING:
      value = field.default
    elif field.default_factory is not dataclasses.MISSING:
      value = field.default_factory()
    else:
      raise ConfigError(f"config section of {cls.__name__}: field {name!r} has no default; "
                        "give it a value")
    if dataclasses.is_dataclass(value):  # less the fields the system sets (field metadata)
      out[name] = section(value, exclude=field.metadata.get("set_elsewhere", ()))
    elif value is None:
      kind = typing.get_origin(kinds[name][0]) or kinds[name][0]
      out[name] = placeholder(kind if isinstance(kind, type) else object)
    else:
      out[name] = value
  return out


def _value(kind, optional: bool, value, where: str, given: Mapping):
  """`value` as a field of type `kind`, or a ConfigError naming where and value. `given`: a
  nested section's fields set from elsewhere."""
  if value is None:
    check(optional, where, value, "must be set (None is not allowed)")
    return None
  if dataclasses.is_dataclass(kind):
    check(isinstance(value, (Mapping, ml_collections.ConfigDict))
          or dataclasses.is_dataclass(value), where, value, f"expected a {kind.__name__} section")
    return value if dataclasses.is_dataclass(value) else settings(kind, value, where, **given)
  origin = typing.get_origin(kind) or kind
  if origin is bool:
    check(isinstance(value, bool), where, value, "expected True or False")
  elif origin is int:
    check(isinstance(value, int) and not isinstance(value, bool), where, value,
          "expected an int")
  elif origin is float:
    check(isinstance(value, (int, float)) and not isinstance(value, bool), where, value,
          "expected a number")
    return float(value)
  elif origin is str:
    check(isinstance(value, str), where, value, "expected a string")
  elif origin is tuple:
    check(isinstance(value, (list, tuple)), where, value, "expected a tuple")
    return tuple(value)
  elif origin is dict:
    check(isinstance(value, (Mapping, ml_collections.ConfigDict)), where, value,
          "expected a mapping")
    return dict(value)
  return value


def settings(cls, config: Mapping, where: str, **given):
  """`cls` from the section `config` found at `config.<where>`. `given`: fields set elsewhere
  (e.g. the estimator from config.algo), which the section must not hold too; for a nested
  section, a dict of its own given fields (`step={"estimator": ...}`). A field the section
  lacks keeps the dataclass's default (a config written before the field existed)."""
  fields, kinds = _fields(cls), _field_types(cls)
  values = dict(config)
  nested = {name: given.pop(name) for name in list(given)
            if name in kinds and dataclasses.is_dataclass(kinds[name][0])
            and isinstance(given[name], Mapping)}
  for name in nested:  # a nested section the config lacks: its defaults and the given fields
    values.setdefault(name, {})
  for name, value in values.items():
    check(name in fields, f"{where}.{name}", value,
          f"{cls.__name__} has no such field (fields: {', '.join(fields)})")
    check(name not in given, f"{where}.{name}", value,
          f"set from elsewhere ({name}={given.get(name)!r}), not in this section")
  kwargs = {name: _value(*kinds[name], value, f"{where}.{name}", nested.get(name, {}))
            for name, value in values.items()}
  try:
    return cls(**kwargs, **given)
  except (TypeError, ValueError) as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(f"config.{where}: {e}") from e


def as_base(instance, cls, **values):
  """The `cls` that `instance` (of a dataclass that extends `cls`) holds: its `cls` fields, with
  `values` over them (e.g. a phase's steps, resolved from its epochs)."""
  return cls(**{**{f.name: getattr(instance, f.name) for f in dataclasses.fields(cls) if f.init},
                **values})
