"""What RAIM trusts, and the checks between the files it reads as data and Hydra (docs/security.md).

Trusted: the installed code, the command line and ``dvc.yaml`` — the user's own words. Data: every file Hydra
would compose — the primary config (``conf/config.yaml``, or ``params.yaml`` for the DVC stages), the option of each
group that the defaults or the command line choose, and the options their defaults lists name — since any of them
may come from someone else (a pull request that "only changes parameters", a shared ``conf/`` folder). They are
looked up where Hydra looks: ``conf/``, ``--config-dir``, then the ``file://`` folders of ``hydra.searchpath=[…]``
on the command line (a ``pkg://`` entry, or a folder that is not there, is refused: its files could not be checked).
Before Hydra reads any of them, :func:`check_sources` checks each one as data:

* bounded, plain YAML (:func:`src.io.config.load_yaml`: size, depth, aliases, no language-specific tags);
* no ``@package`` directive (a group file's keys stay under its group: it cannot reach ``hydra``, ``tracking`` or
  ``output``), no ``hydra`` key, and a defaults list naming only ``_self_`` and other options of its own group;
* no instantiation hint (``_args_``, ``_partial_``, ``_recursive_``, ``_convert_`` …) anywhere, and a ``_target_``
  only where RAIM builds an object through an allow-list (a stacker, the analysis settings, a roster's backends, a
  dataset's builder), whose class is compared with that allow-list before anything is imported;
* the primary config's ``hydra`` node holds only the run folders and RAIM's own callbacks, named as strings.

Hydra's own errors (an unknown key, an option that does not exist) become RAIM's one line with the nearest name
(:func:`hydra_errors_in_one_line`). :func:`checked_command` applies all of it to a ``@hydra.main`` entry."""

from __future__ import annotations

import difflib
import functools
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from src.core.errors import EXIT_BAD_INPUT, check_overrides, debug, one_line, one_line_message, redacted
from src.io.config import ConfigError, load_yaml
from src.io.paths import CONF_DIR

F = TypeVar("F", bound=Callable)

PRIMARY = "config"
"""The primary config every RAIM command names (``config_name`` of its Hydra app)."""

SEARCHPATH = "hydra.searchpath"
"""The override that adds folders to Hydra's search path (after ``conf/`` and ``--config-dir``)."""

TARGET_PATHS: dict[str, tuple[str, ...]] = {
    "stacker": ("",),
    "analysis": ("",),
    "roster": ("members.*.backend", "frontier.backend"),
    "dataset": ("builder",),
}
"""Where a group's node may carry a ``_target_`` (dotted paths below the group, ``*`` any list index): the nodes RAIM
turns into objects, each through its allow-list (:class:`src.io.config.Targets`). Anywhere else a ``_target_`` is
refused before Hydra composes anything."""

CALLBACKS: dict[str, frozenset[str]] = {
    "src.run.SweepSummary": frozenset(),
    "src.mlops.redact.ScrubHydraOutputs": frozenset({"subdir"}),
}
"""The callbacks the primary config's ``hydra.callbacks`` may name (Hydra instantiates them), with their keys."""

HYDRA_NODE: dict[str, Any] = {
    "output_subdir": (str, type(None)),
    "callbacks": dict,
    "run": {"dir": str},
    "sweep": {"dir": str, "subdir": str},
    "job": {"chdir": bool},
    "help": {"template": str},
}
"""The shape of the primary config's ``hydra`` node: the run folders, the ``.hydra`` copy, the callbacks and the
``--help`` text."""

_PACKAGE = re.compile(r"^\s*#\s*@package\b", re.MULTILINE)
_HINT = re.compile(r"^_[A-Za-z0-9]+_$")  # Hydra's instantiation keys: _target_, _args_, _partial_, _convert_ …
_VALUE_FLAGS = {"--config-path": "cp", "-cp": "cp", "--config-name": "cn", "-cn": "cn", "--config-dir": "cd"}
_VALUE_FLAGS["-cd"] = "cd"
_FOLDER = "e.g. hydra.searchpath=[file:///abs/path/conf], a folder holding <group>/<option>.yaml"
_SKIP_FLAGS = frozenset({"--cfg", "-c", "--package", "-p", "--experimental-rerun", "--info", "-i"})


@dataclass(frozen=True)
class CommandLine:
    """What a Hydra command line asks for: the primary config's name, the folders searched for config files (RAIM's
    ``conf/`` first, then ``--config-dir``, then ``hydra.searchpath``'s folders: Hydra's order) and the overrides."""

    config_name: str
    search: tuple[Path, ...]
    overrides: tuple[str, ...]


def command_line(argv: Iterable[str], conf_dir: Path = CONF_DIR, config_name: str = PRIMARY) -> CommandLine:
    """Parse the flags Hydra reads before composing (``--config-name``, ``--config-dir``, ``--config-path``) and
    collect the overrides (words that are not flags or flag values)."""
    values: dict[str, str] = {}
    overrides: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        flag, eq, value = a.partition("=")
        if flag in _VALUE_FLAGS:
            if not eq:
                i += 1
                value = args[i] if i < len(args) else ""
            values[_VALUE_FLAGS[flag]] = value
        elif a in _SKIP_FLAGS:
            if i + 1 < len(args) and "=" not in args[i + 1] and not args[i + 1].startswith("-"):
                i += 1  # --cfg job, --info searchpath, --package stacker
        elif not a.startswith("-"):
            overrides.append(a)
        i += 1
    primary = conf_dir
    if "cp" in values:
        if not Path(values["cp"]).is_absolute():
            raise ConfigError(
                f"--config-path {values['cp']!r}: give an absolute folder, or use --config-dir DIR or RAIM_CONF_DIR "
                "(a relative one is read relative to RAIM's own module, which is rarely what is meant)"
            )
        primary = Path(values["cp"])
    search = (primary, *([Path(values["cd"]).absolute()] if values.get("cd") else []), *search_path(overrides))
    return CommandLine(values.get("cn") or config_name, search, tuple(overrides))


def search_path(overrides: Iterable[str]) -> list[Path]:
    """The folders a ``hydra.searchpath=[…]`` override adds to the search path (the first such override, as Hydra
    reads it), each a ``file://`` URL or a plain path (relative: to the working folder); any other kind of entry
    (``pkg://`` reads a Python package's files, unchecked), a folder that is not there, or a value that is not a
    list of strings is refused."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # imported here, not at start-up: hydra

    parser = OverridesParser.create()
    found = next((o for o in parser.parse_overrides(list(overrides)) if o.get_key_element() == SEARCHPATH), None)
    if found is None:
        return []
    entries = found.value()
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ConfigError(f"{SEARCHPATH}={found.get_value_string()}: a list of folders is expected ({_FOLDER})")
    folders = []
    for entry in entries:
        scheme, sep, rest = entry.partition("://")
        if sep and scheme != "file":
            raise ConfigError(
                f"{SEARCHPATH}: {entry!r} is refused (RAIM checks every config file it composes as data, so the search "
                f"path holds folders only: {_FOLDER})"
            )
        folder = Path(rest if sep else entry).absolute()
        if not folder.is_dir():
            raise ConfigError(f"{SEARCHPATH}: {entry!r}: no such folder ({_FOLDER})")
        folders.append(folder)
    return folders


def _shown(path: Path) -> str:
    """A config file's path as the user reads it: relative to the working folder when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _find(search: tuple[Path, ...], *parts: str) -> Path | None:
    """The first ``<dir>/<parts…>.yaml`` of the search path (the file Hydra would read), or None."""
    for d in search:
        p = d.joinpath(*parts[:-1], f"{parts[-1]}.yaml")
        if p.is_file():
            return p
    return None


def groups(search: tuple[Path, ...]) -> list[str]:
    """The config groups: the folders of the search path that hold YAML files."""
    return sorted({p.name for d in search if d.is_dir() for p in d.iterdir() if p.is_dir() and any(p.glob("*.yaml"))})


def options(search: tuple[Path, ...], group: str) -> list[str]:
    """The options of ``group``: its YAML files' names, over the search path."""
    return sorted({p.stem for d in search for p in (d / group).glob("*.yaml")})


def _nearest(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def option_file(search: tuple[Path, ...], group: str, option: Any, asked: str) -> Path:
    """The file of one option of ``group``, a plain name in the group's folder (never a path); an unknown one is
    one line naming the options and the nearest."""
    known = options(search, group)
    if isinstance(option, str) and option and Path(option).name == option and option in known:
        found = _find(search, group, option)
        if found is not None:
            return found
    raise ConfigError(
        f"{asked}: no option {option!r} in the {group!r} group (options: {', '.join(known) or 'none'}"
        f"{_nearest(str(option), known)})"
    )


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted path of the mapping, key, value) for every key of a nested node; list items as ``*``."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield path, str(k), v
            yield from _walk(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, f"{path}.*" if path else "*")


def check_hints(node: Any, where: str, group: str | None) -> None:
    """No instantiation key in ``node`` but a string ``_target_`` where :data:`TARGET_PATHS` allows one for
    ``group`` (None: nowhere)."""
    allowed = TARGET_PATHS.get(group or "", ())
    for path, key, value in _walk(node):
        if not _HINT.match(key):
            continue
        at = f"{path}.{key}" if path else key
        if key == "_target_" and path in allowed:
            if not isinstance(value, str):
                raise ConfigError(f"{where}: {at}: a class name (a string) is expected, got {value!r}")
            continue
        if key == "_target_":
            places = ", ".join(f"{group}.{p}".rstrip(".") for p in allowed) if allowed else "none in this group"
            raise ConfigError(
                f"{where}: {at}: a `_target_` here is refused (a config file is data; only the nodes RAIM builds "
                f"through an allow-list name a class: {places})"
            )
        raise ConfigError(f"{where}: {at}: Hydra's instantiation key {key!r} is refused (a config file is data)")


def _read(path: Path, where: str) -> dict:
    """A config file as plain data, bounded (:func:`load_yaml`), with no ``@package`` directive."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if _PACKAGE.search(text):
        raise ConfigError(
            f"{where}: an `# @package` directive is refused (a config file sets only its own group's keys; "
            "Hydra would place them elsewhere: hydra, tracking, output…)"
        )
    node = load_yaml(path, where)
    data = OmegaConf.to_container(node, resolve=False)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a config file holds a mapping of keys, got {type(data).__name__}")
    return data


def check_group_file(search: tuple[Path, ...], group: str, option: str, seen: set[Path] | None = None) -> None:
    """One option of ``group`` and every option its defaults list names, each checked as data (module doc)."""
    seen = set() if seen is None else seen
    path = option_file(search, group, option, f"{group}={option}")
    if path in seen:
        return
    seen.add(path)
    where = _shown(path)
    data = _read(path, where)
    if "hydra" in data:
        raise ConfigError(f"{where}: a `hydra` node is refused in a group file (Hydra is configured by RAIM only)")
    for entry in data.pop("defaults", None) or []:
        if entry == "_self_":
            continue
        if not isinstance(entry, str) or Path(entry).name != entry or entry.startswith(("override", "optional")):
            raise ConfigError(
                f"{where}: defaults: {entry!r} is refused (a group file's defaults list names only `_self_` and "
                f"other options of its own group, {group!r})"
            )
        try:
            check_group_file(search, group, entry, seen)
        except ConfigError as err:
            raise ConfigError(f"{where}: defaults: {err}") from None
    check_hints(data, where, group)


def _shape(node: Any, shape: Any, where: str, path: str) -> None:
    """``node`` fits :data:`HYDRA_NODE`'s ``shape`` (a mapping of known keys, or the allowed types of a value)."""
    if isinstance(shape, Mapping):
        if not isinstance(node, Mapping):
            raise ConfigError(f"{where}: {path}: a mapping is expected, got {node!r}")
        for k, v in node.items():
            if k not in shape:
                raise ConfigError(
                    f"{where}: {path}.{k}: refused (RAIM's config sets only {', '.join(f'{path}.{s}' for s in shape)}"
                    f"{_nearest(str(k), shape)})"
                )
            _shape(v, shape[k], where, f"{path}.{k}")
    elif not isinstance(node, shape):
        raise ConfigError(f"{where}: {path}: {node!r} is not a value this key takes")


def check_hydra_node(node: Any, where: str) -> None:
    """The primary config's ``hydra`` node: the shape of :data:`HYDRA_NODE`, callbacks named in :data:`CALLBACKS`
    (as strings, nothing imported) with only their own keys."""
    _shape(node, HYDRA_NODE, where, "hydra")
    for name, cb in (node.get("callbacks") or {}).items():
        at = f"hydra.callbacks.{name}"
        target = cb.get("_target_") if isinstance(cb, Mapping) else None
        if target not in CALLBACKS:
            raise ConfigError(
                f"{where}: {at}: _target_ {target!r} is not a callback RAIM ships (allowed: {', '.join(CALLBACKS)})"
            )
        extra = sorted(set(cb) - {"_target_"} - CALLBACKS[target])
        if extra:
            raise ConfigError(f"{where}: {at}: unknown key(s) {extra} for {target}")


def primary_choices(data: dict, where: str, known: list[str]) -> dict[str, Any]:
    """The group options the primary config's defaults list chooses ({group: option}); anything but ``_self_``
    and ``group: option`` of a known group is refused."""
    chosen: dict[str, Any] = {}
    for entry in data.pop("defaults", None) or []:
        if entry == "_self_":
            continue
        ok = isinstance(entry, Mapping) and len(entry) == 1
        group, option = next(iter(entry.items())) if ok else (None, None)
        if not ok or group not in known or not (option is None or isinstance(option, str)):
            raise ConfigError(
                f"{where}: defaults: {entry!r} is refused (the primary config's defaults list names only `_self_` "
                f"and `group: option` of RAIM's groups: {', '.join(known)})"
            )
        chosen[str(group)] = option
    return chosen


def check_primary(path: Path, known: list[str], conf_dir: Path = CONF_DIR) -> dict[str, Any]:
    """The primary config checked as data; returns the group options its defaults list chooses. Only RAIM's own
    primary config (in ``conf_dir``) has a ``hydra`` node."""
    where = _shown(path)
    data = _read(path, where)
    chosen = primary_choices(data, where, known)
    if "hydra" in data:
        if path.parent.resolve() != conf_dir.resolve():
            raise ConfigError(
                f"{where}: a `hydra` node is refused here (a composition such as params.yaml holds no Hydra settings)"
            )
        check_hydra_node(data.pop("hydra"), where)
    for key, value in data.items():
        if key in TARGET_PATHS:  # a composition (params.yaml) holds the groups' nodes under their names
            check_hints(value, f"{where}: {key}", key)
        else:
            check_hints({key: value}, where, None)
    return chosen


def _override_choices(cl: CommandLine, known: list[str], chosen: dict[str, Any]) -> dict[str, list[Any]]:
    """The group options the command line asks for, over the defaults' choices: ``group=opt``, ``+group=opt``,
    ``~group``, a sweep's every value; a group removed has no option to check."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # imported here, not at start-up: hydra
    from hydra.errors import HydraException  # imported here, not at start-up: hydra

    out = {g: [o] for g, o in chosen.items() if o is not None}
    parser = OverridesParser.create()
    for text in cl.overrides:
        (o,) = parser.parse_overrides([text])
        group = o.key_or_group
        if group not in known:
            continue
        if o.is_delete():
            out.pop(group, None)
        elif o.is_sweep_override():
            try:
                out[group] = list(o.sweep_string_iterator())
            except HydraException:  # glob(…) or a range: every option of the group is checked
                out[group] = options(cl.search, group)
        else:
            out[group] = [o.value()]
    return out


def check_sources(argv: Iterable[str], conf_dir: Path = CONF_DIR, config_name: str = PRIMARY) -> None:
    """Every file Hydra would compose for this command line, checked as data before Hydra reads any (module doc):
    the primary config, then each group option chosen by its defaults or the command line."""
    cl = command_line(argv, conf_dir, config_name)
    for d in cl.search:
        if (d / "hydra").is_dir():
            raise ConfigError(
                f"{_shown(d / 'hydra')}: a folder of Hydra settings is refused (RAIM configures Hydra only in its "
                "primary config's `hydra` node)"
            )
    known = groups(cl.search)
    primary = _find(cl.search, cl.config_name)
    if primary is None:
        raise ConfigError(
            f"--config-name {cl.config_name!r}: no {cl.config_name}.yaml in {', '.join(map(str, cl.search))}"
        )
    chosen = check_primary(primary, known, cl.search[0])
    for group, opts in _override_choices(cl, known, chosen).items():
        for option in opts:
            check_group_file(cl.search, group, option)


def _hydra_line(err: BaseException, argv: list[str]) -> str:
    """A Hydra composition error as one line: an unknown key with the keys its node has and the nearest one, an
    option that does not exist with the group's options, else Hydra's own first line."""
    from hydra.errors import MissingConfigException  # imported here, not at start-up: hydra

    cause = err.__cause__
    full_key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    key = getattr(cause, "key", None)
    if full_key and key is not None and parent is not None and hasattr(parent, "keys"):
        asked = next((a for a in argv if a.lstrip("+~").split("=", 1)[0] == full_key), full_key)
        node = full_key.rsplit(".", 1)[0] if "." in full_key else "the config"
        known = [str(k) for k in parent.keys() if not str(k).startswith("_")]
        return (
            f"override {asked!r}: {node} has no key {str(key)!r} (known: {', '.join(known)}"
            f"{_nearest(str(key), known)}); a key the node lacks is added with +{full_key}=…"
        )
    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        group, _, option = err.missing_cfg_file.rpartition("/")
        known = list(err.options or [])
        return (
            f"{err.missing_cfg_file}: no option {option!r} in the {group!r} group (options: {', '.join(known)}"
            f"{_nearest(option, known)})"
        )
    text = str(err).split("\n\n", 1)[0]
    full = " ".join(text.split()) or type(err).__name__
    return full if cause is None else f"{full} ({' '.join(str(cause).split()).split(' full_key:', 1)[0]})"


def hydra_errors_in_one_line() -> None:
    """From now on, what Hydra runs through ``run_and_report`` (composing the config, ``--cfg``, the job) answers a
    Hydra or OmegaConf error, or a folder Hydra cannot make (``$RAIM_HYDRA_DIR`` unwritable), with RAIM's one line
    and exit status 2 instead of Hydra's block or traceback and status 1 (``RAIM_DEBUG=1`` or
    ``HYDRA_FULL_ERROR=1``: the traceback)."""
    import hydra._internal.utils as hydra_utils  # imported here, not at start-up: hydra
    from hydra.errors import HydraException  # imported here, not at start-up: hydra

    run = hydra_utils.run_and_report
    if getattr(run, "one_line", False):
        return

    def in_one_line(func: Callable[[], Any]) -> Any:
        try:
            return func()
        except (HydraException, OmegaConfBaseException, OSError) as err:  # the job's own are one line already
            if debug():
                raise
            line = one_line_message(err) if isinstance(err, OSError) else _hydra_line(err, sys.argv[1:])
            print(f"error: {redacted(line)}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_BAD_INPUT) from None

    @functools.wraps(run)
    def run_and_report(func: Any) -> Any:
        return run(lambda: in_one_line(func))

    run_and_report.one_line = True  # type: ignore[attr-defined]
    hydra_utils.run_and_report = run_and_report


def checked_command(fn: F) -> F:
    """Decorate a ``@hydra.main`` entry (above it). Called as a command (without arguments): the overrides are
    parsed first (:func:`src.core.errors.check_overrides`), every file Hydra will compose is checked as data
    (:func:`check_sources`), and Hydra's own errors are one line (:func:`hydra_errors_in_one_line`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            argv = sys.argv[1:]
            check_overrides(argv)
            one_line(check_sources)(argv)
            hydra_errors_in_one_line()
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def commands_or_study(commands: Iterable[str], cli: Callable[[list[str]], int], study: Callable[[], Any]) -> None:
    """An entry with argparse subcommands and a study: ``python -m src.<x> <command> …`` (``sys.argv[1]`` one of
    ``commands``) runs ``cli``; anything else is ``study`` — the entry's ``@hydra.main`` app — under
    :func:`checked_command`, as every Hydra entry."""
    if len(sys.argv) > 1 and sys.argv[1] in commands:
        raise SystemExit(cli(sys.argv[1:]))
    checked_command(study)()
