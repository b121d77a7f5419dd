"""``goodput serve --config FILE``: the flags of ``goodput serve`` in a YAML file.

A key is a flag's name without its two dashes (``max-jobs: 2000``; ``max_jobs`` is read the
same); a value is what the flag takes: a number, a string, ``off`` (YAML reads a bare ``off``
as false, which is taken as ``off``), a list for a repeatable flag (``spool-dir``). Flags given
on the command line win over the file. One key has no flag: ``token``, the token itself (as
``--token-file`` would hold it); a file holding it must not be readable by other users or
writable by anyone but its owner, or serve refuses it.

Every mistake in the file is a :class:`~goodput_processor.cli.UsageError` that names the key
and the file: an unknown key (with the nearest flag), a value of the wrong kind (a list, a
mapping, ``true``, nothing), a value the flag refuses (checked by the flag's own parser, and
later by serve's checks, whose messages :func:`blame` extends with the key and the file).
Needs PyYAML, which the ``serve`` extra brings.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from dataclasses import dataclass, field

__all__ = ["Default", "Loaded", "apply", "blame", "mark_defaults"]

#: The key that holds the token itself (no flag: argv is readable by other users).
TOKEN_KEY = "token"
#: Namespace entries that are not flags.
_NOT_FLAGS = {"func", "config"}


class Default(str):
    """A flag's default as the parser holds it: a ``str`` that says it was not typed."""

    __slots__ = ()


def mark_defaults(parser) -> None:
    """Mark every string default of ``parser`` as a :class:`Default`, so that a value given
    on the command line (a plain ``str``, even when equal to the default) is told apart from
    one left to the default. Call it once all arguments are added."""
    defaults = vars(parser.parse_args([]))
    parser.set_defaults(**{k: Default(v) for k, v in defaults.items()
                           if isinstance(v, str) and not isinstance(v, Default)})


def _given(value, default) -> bool:
    """Whether a namespace value was given on the command line (not left to ``default``)."""
    if value is None or isinstance(value, Default):
        return False
    if default is None or isinstance(default, str):
        return True
    return value != default  # a typed default cannot be marked: equal counts as not given


@dataclass
class Loaded:
    """What a config file set: ``sources`` maps each flag it set (``"--max-jobs"``) to the key
    as written; ``token``: the value of its ``token`` key, when the command line gave no
    ``--token-file``."""

    path: str
    sources: dict[str, str] = field(default_factory=dict)
    token: str | None = None


def _usage(message: str):
    from ..terminal import UsageError

    return UsageError(message)


def _read(path: str) -> dict:
    """The file's top-level mapping. Raises UsageError: no PyYAML, unreadable, not YAML,
    not a mapping."""
    try:
        import yaml
    except ImportError as e:
        from goodput.links import install_hint

        raise _usage(f"--config {path!r} needs PyYAML ({e}), which the serve extra brings: "
                     f"{install_hint('serve')}") from e
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise _usage(f"cannot read --config {path!r}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise _usage(f"--config {path!r} is not YAML{line}: "
                     f"{getattr(e, 'problem', None) or e}") from e
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise _usage(f"--config {path!r} must be a mapping of flag names to values "
                     f"(max-jobs: 2000), not a {type(doc).__name__}")
    return doc


def _tokens(path: str, key: str, flag: str, value) -> list[str]:
    """The command-line words for ``key: value`` (``--flag=value``, repeated for a list)."""
    def one(v) -> str:
        if v is False:
            return "off"
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            return str(v)
        what = "no value" if v is None else "true" if v is True else f"a {type(v).__name__}"
        raise _usage(f"{path}: {key}: {what} is not a value of {flag} (give what the flag "
                     "takes: a number, a string or off)")

    values = value if isinstance(value, list) else [value]
    if not values:
        raise _usage(f"{path}: {key}: an empty list is not a value of {flag}")
    return [f"{flag}={one(v)}" for v in values]


def _check_token_file(path: str) -> None:
    """Refuse a config file holding a token that others can read, or write."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:  # pragma: no cover - it was just read
        raise _usage(f"cannot stat --config {path!r}: {e.strerror or e}") from e
    if os.name == "posix" and mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        raise _usage(f"{path}: {TOKEN_KEY}: the file holds a token but other users can read or "
                     f"write it (mode {stat.S_IMODE(mode):04o}): chmod 600 {path}, or name a "
                     "token-file instead")


def apply(args, add_command) -> Loaded:
    """Read ``args.config`` and set, in ``args``, every flag of the file that the command line
    did not give (the flags are those ``add_command(subparsers)`` adds:
    :func:`~goodput_processor.serve.command.add_serve_command`). Returns what it set
    (:class:`Loaded`). Raises UsageError naming the key and the file for any mistake in it
    (module docstring)."""
    from ..terminal import Parser, UsageError

    path = args.config
    doc = _read(path)
    parser = Parser(prog="goodput")  # the serve subcommand's flags, as `goodput` reads them
    add_command(parser.add_subparsers(dest="command", parser_class=Parser))
    top = set(vars(parser.parse_args([])))
    defaults = {k: v for k, v in vars(parser.parse_args(["serve"])).items()
                if k not in top and k not in _NOT_FLAGS}
    loaded = Loaded(path)
    token_file_given = _given(getattr(args, "token_file", None), defaults.get("token_file"))
    seen: dict[str, str] = {}
    for key, value in doc.items():
        if not isinstance(key, str):
            raise _usage(f"{path}: key {key!r} is not a flag name")
        dest = key.strip().replace("-", "_")
        if dest in seen:
            raise _usage(f"{path}: {key}: set twice (also as {seen[dest]})")
        seen[dest] = key
        if dest == TOKEN_KEY:
            if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value):
                raise _usage(f"{path}: {key}: the token must be a non-empty string")
            _check_token_file(path)
            if not token_file_given:
                loaded.token = str(value).strip()
            continue
        if dest == "config":
            raise _usage(f"{path}: {key}: a config file cannot name another")
        if dest not in defaults:
            near = difflib.get_close_matches(dest, defaults, n=1)
            hint = f" (did you mean {near[0].replace('_', '-')}?)" if near else ""
            raise _usage(f"{path}: unknown key {key!r}{hint}: keys are the flags of "
                         "`goodput serve --help` without their dashes, at the top level")
        flag = "--" + dest.replace("_", "-")
        words = _tokens(path, key, flag, value)
        try:
            parsed = getattr(parser.parse_args(["serve", *words]), dest)
        except UsageError as e:
            raise _usage(f"{path}: {key}: {e}") from e
        if len(words) > 1 and not isinstance(parsed, list):
            raise _usage(f"{path}: {key}: {flag} takes one value, not a list")
        if not _given(getattr(args, dest, None), defaults[dest]):
            setattr(args, dest, parsed)
            loaded.sources[flag] = key
    if "token_file" in seen.keys() and TOKEN_KEY in seen:
        raise _usage(f"{path}: give {seen['token_file']} or {TOKEN_KEY}, not both")
    return loaded


def blame(error: Exception, loaded: Loaded | None) -> Exception:
    """``error`` (a UsageError about a flag), with the key and the file added when the flag
    named first in its message was set by the config file; else ``error`` itself."""
    if loaded is None:
        return error
    for flag in re.findall(r"--[a-z0-9][a-z0-9-]*", str(error)):
        key = loaded.sources.get(flag)
        if key is not None:
            return _usage(f"{error} (set by {key} in {loaded.path})")
    return error
