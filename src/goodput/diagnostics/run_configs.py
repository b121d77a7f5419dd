"""The configs of a run (``goodput.diagnostics.run(configs=...)``): a mapping, or the path of
a YAML or JSON file, read into a dict (:func:`load_configs`) and flattened into
``ml.config.*`` resource attributes (:func:`flatten_configs`, at most
:data:`MAX_CONFIG_ATTRIBUTES`; the rest only in the run's RUN_CONFIG record).

Raises :class:`ConfigError` for a file that is missing, unreadable, not YAML/JSON, or not a
mapping (the message names the file).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping

from goodput.diagnostics import environment
from goodput.links import install_hint

__all__ = ["CONFIG_PREFIX", "MAX_CONFIG_ATTRIBUTES", "ConfigError", "flatten_configs",
           "load_configs"]

#: Most ``ml.config.*`` resource attributes (the rest are only in the RUN_CONFIG record).
MAX_CONFIG_ATTRIBUTES = 64
#: Prefix of the flattened user configs.
CONFIG_PREFIX = "ml.config."


class ConfigError(ValueError):
    """The ``configs`` of a run cannot be used (missing or unreadable file, bad YAML/JSON,
    content that is not a mapping); the message names the file."""


def load_configs(configs) -> dict:
    """User configs as a dict: ``None`` -> ``{}``, a mapping -> a copy, a path (str or
    ``os.PathLike``) -> the YAML (``.yaml``/``.yml``) or JSON (``.json``; other suffixes:
    JSON, then YAML) mapping in that file.

    Raises:
        ConfigError: the file is missing or unreadable, does not parse, is empty or
            holds something other than a mapping; ``configs`` has another type; YAML
            needs PyYAML and it is not installed.
    """
    if configs is None:
        return {}
    if isinstance(configs, Mapping):
        return dict(configs)
    if not isinstance(configs, (str, os.PathLike)):
        raise ConfigError("configs must be a mapping or the path of a YAML/JSON file, got "
                          f"{type(configs).__name__}")
    path = os.fspath(configs)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"configs file {path!r} cannot be read: {exc}") from exc
    suffix = os.path.splitext(path)[1].lower()
    if suffix in (".yaml", ".yml"):
        data = _parse_yaml(text, path)
    else:
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError as exc:
            if suffix == ".json":
                raise ConfigError(f"configs file {path!r} is not valid JSON: {exc}") from exc
            data = _parse_yaml(text, path)
    if data is None:
        raise ConfigError(f"configs file {path!r} is empty")
    if not isinstance(data, Mapping):
        raise ConfigError(f"configs file {path!r} holds a {type(data).__name__}, "
                          "not a mapping of names to values")
    return dict(data)


def _parse_yaml(text: str, path: str):
    try:
        import yaml
    except ImportError as exc:
        raise ConfigError(f"configs file {path!r}: reading YAML needs PyYAML: "
                          f"{install_hint('diagnostics')}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"configs file {path!r} is not valid YAML: {exc}") from exc


def _scalar(value):
    if isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return environment.truncate(value)
    return environment.truncate(json.dumps(value, default=str, sort_keys=True))


def flatten_configs(configs: Mapping, limit: int = MAX_CONFIG_ATTRIBUTES) -> tuple[dict, int]:
    """``configs`` as ``ml.config.<dotted.key>`` attributes, and how many were left out.

    Nested mappings become dotted keys; values that are str/bool/int/float stay as they
    are, others (lists, None, ...) become JSON strings; strings are cut at 256 UTF-8
    bytes; only the first ``limit`` keys (in the mapping's order) are kept.
    """
    items: list = []

    def walk(d: Mapping, path: str) -> None:
        for k, v in d.items():
            key = f"{path}.{k}" if path else str(k)
            if isinstance(v, Mapping) and v:
                walk(v, key)
            else:
                items.append((CONFIG_PREFIX + key, _scalar(v)))

    walk(configs, "")
    return dict(items[:limit]), max(0, len(items) - limit)
