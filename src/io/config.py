"""RAIM's configuration (``conf/``, composed by Hydra): one option of a group read by name, the option a set of
values matches, and ``params.yaml`` — the composition DVC's stages read — regenerated from ``conf/``."""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import difflib
import functools
import inspect
import json
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from src.core.errors import ArgumentParser, RaimError, one_line
from src.io.paths import CONF_DIR, ROOT


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Dotted keys → string values (lists as JSON), as MLflow params."""
    out: dict[str, str] = {}
    if isinstance(data, Mapping):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        if not data and prefix:
            out[prefix[:-1]] = "{}"
        return out
    value = json.dumps(data, default=str) if isinstance(data, (list, tuple)) else str(data)
    out[prefix[:-1]] = value[:6000]
    return out


def group_option(group: str, name: str) -> DictConfig:
    """Load one option of a config group by name (e.g. a dataset's frame when ``frame=auto``), bounded
    (:func:`load_yaml`); a name is a file name in the group's folder, never a path."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not isinstance(name, str) or not name or Path(name).name != name or not path.exists():
        raise FileNotFoundError(f"no config {group}/{name}.yaml under {CONF_DIR}")
    return load_yaml(path, conf_file(group, name))


def composed_option(group: str, name: str) -> DictConfig:
    """conf/<group>/<name>.yaml with its defaults list (other options of the group) merged first, as Hydra does."""
    node = group_option(group, name)
    defaults = list(node.pop("defaults", None) or []) or ["_self_"]
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create()
    for d in defaults:
        merged = OmegaConf.merge(merged, node if d == "_self_" else composed_option(group, d))
    return merged


@functools.cache
def _option(group: str, name: str) -> tuple[tuple[str, str], ...]:
    """:func:`composed_option`, flattened."""
    return tuple(sorted(flatten(OmegaConf.to_container(composed_option(group, name), resolve=False)).items()))


def option_name(group: str, values: Mapping) -> str | None:
    """The conf/<group> option whose composed values ``values`` hold (``logreg``), else the nearest one with the
    values that differ (``logreg (C=0.1)``); None when the group has no options. Read off the values, so the
    same under ``python -m src.run`` and the DVC stage (params.yaml has no Hydra group choices)."""
    flat = flatten(values)
    diffs = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        opt = dict(_option(group, path.stem))
        diffs[path.stem] = [k for k in sorted(set(flat) | set(opt)) if flat.get(k) != opt.get(k)]
    if not diffs:
        return None
    best = min(diffs, key=lambda n: len(diffs[n]))
    changed = ", ".join(f"{k}={flat.get(k, 'unset')}" for k in diffs[best])
    return f"{best} ({changed})" if changed else best


ENV_DEPENDENT = ("MLFLOW_TRACKING_URI", "RAIM_RAW_DIR")  # environment variables whose values must not be baked


_ENV_REF = re.compile(r"oc\.env:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")


def env_references(overrides: Iterable[str] = ()) -> set[str]:
    """The environment variables that conf/ (every YAML file under it) and ``overrides`` read with ``oc.env``."""
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(CONF_DIR.rglob("*.yaml"))]
    return {m for t in [*texts, *overrides] for m in _ENV_REF.findall(t)}


def write_params(
    path: str | Path = ROOT / "params.yaml",
    overrides: Iterable[str] = (),
    clean: Callable[[Any], Any] | None = None,
    verify: Callable[[Any], Any] | None = None,
) -> Path:
    """Regenerate params.yaml from conf/ exactly as `dvc exp run` does (DVC's Hydra composition), with every
    environment variable that conf/ or the overrides read (``${oc.env:NAME,default}``, and :data:`ENV_DEPENDENT`)
    unset while it composes: no value of this machine's environment — a path, a server, a key — is committed.
    Such a reference resolves to its default, and one that conf/ escapes (``\\${oc.env:…}``, as
    conf/roster/openai_server.yaml does for its key and base URL) is written as the reference itself, which is
    also what `dvc exp run -S` writes, whatever its environment holds. ``clean`` (the secret scrubber of the
    entry point) rewrites the composed data when it changes it: an override that gives a secret as a value.
    ``verify`` (the entry's config check) is called with the composed config (OmegaConf, as a DVC stage reads
    params.yaml) before the file is moved into place: a composition every command would refuse is refused here,
    and leaves the params.yaml that was there as it was."""
    from dvc.utils.hydra import compose_and_dump  # imported here, not at start-up: dvc ~0.14 s
    from dvc.utils.serialize import dump_yaml  # imported here, not at start-up: dvc ~0.14 s

    overrides, path = list(overrides), Path(path)
    names = set(ENV_DEPENDENT) | env_references(overrides)
    saved = {k: os.environ.pop(k) for k in sorted(names) if k in os.environ}
    staged = path.with_name(f".{path.stem}.{os.getpid()}{path.suffix}")  # the suffix picks DVC's YAML writer
    try:
        compose_and_dump(staged, str(CONF_DIR), None, "config", "", overrides)
        composed = OmegaConf.load(staged)  # read as a DVC stage reads it (1e-06 a float, not a string)
        data = OmegaConf.to_container(composed, resolve=False)
        if clean is not None and (cleaned := clean(data)) != data:
            dump_yaml(staged, cleaned)
            composed = OmegaConf.load(staged)
        if verify is not None:
            verify(composed)
        os.replace(staged, path)
    except HydraException as e:  # a bad override: Hydra's own message, on one line
        raise RaimError(f"params.yaml: {' '.join(str(e).split())[:300]}") from None
    except InterpolationResolutionError as e:
        raise RaimError(
            f"params.yaml: {' '.join(str(e).split())[:300]} (the environment variables conf/ and the "
            f"overrides read are unset while params.yaml is composed: give such a reference a default, "
            f"${{oc.env:NAME,null}})"
        ) from None
    finally:
        os.environ.update(saved)
        staged.unlink(missing_ok=True)
    return path


@one_line
def params_main(
    argv: list[str] | None = None,
    clean: Callable[[Any], Any] | None = None,
    check: Callable[[list[str]], None] | None = None,
    verify: Callable[[Any], Any] | None = None,
) -> int:
    """``python -m src.track params [override …]``: regenerate params.yaml from conf/ (``clean`` and ``verify``:
    as in :func:`write_params`; ``check``: called with the overrides before anything is composed —
    :func:`src.io.trust.check_sources`, every file the composition reads checked as data)."""
    ap = ArgumentParser(prog="python -m src.track")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("params", help="regenerate params.yaml from conf/ (as `dvc exp run` does)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. stacker.C=0.5")
    p.add_argument("--out", default=str(ROOT / "params.yaml"))
    a = ap.parse_args(argv)
    if check is not None:
        check(a.overrides)
    print(f"wrote {write_params(a.out, a.overrides, clean, verify)}")
    return 0


# ------------------------------------------------------------------------------------------------------------------
# Checked configuration: the nodes a user may receive from someone else (a roster's backends, a stacker, the analysis
# settings, a dataset's builder) are instantiated only through an allow-list of RAIM's own classes, checked as
# strings before anything is imported, resolved or called; every key is checked against the class's signature (or
# the settings dataclass's fields) and every value against its annotation; a YAML file is bounded (size, depth,
# alias expansion) before OmegaConf reads it.


class ConfigError(RaimError, ValueError):
    """A config node RAIM refuses: a ``_target_`` outside its allow-list, an unknown or missing key, a value of the
    wrong type, an interpolation where none is allowed, a YAML file over its bounds. One line naming the file, the
    node and the key."""


INTERPOLATION = "${"
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Param:
    """One key a class takes: its name, its annotation (``Any`` when it has none) and whether it is required."""

    name: str
    hint: Any
    required: bool


@functools.cache
def params_of(cls: type) -> dict[str, Param]:
    """The keys ``cls`` takes: a dataclass's init fields, else its ``__init__`` parameters (``self`` left out).
    A class that takes ``*args`` or ``**kwargs`` is refused: it would swallow a misspelt key."""
    if dataclasses.is_dataclass(cls):
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate is left unchecked
            hints = {}
        return {
            f.name: Param(
                f.name,
                hints.get(f.name, Any),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if f.init
        }
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001
        hints = {}
    out = {}
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{cls.__qualname__} takes *{p.name}: a config key it does not know would vanish there")
        out[p.name] = Param(p.name, hints.get(p.name, Any), p.default is p.empty)
    return out


def type_name(hint: Any) -> str:
    """An annotation as the user reads it (``float | None``, ``list[str]``)."""
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "").replace("NoneType", "null")


def type_ok(value: Any, hint: Any) -> bool:
    """Whether a config value (plain YAML data) fits an annotation. Checked: ``bool``, ``int`` (not a bool),
    ``float`` (an int too), ``str``, ``None``, unions, ``Literal``, sequences and mappings with their item types,
    dataclasses (a mapping); any other annotation (``Any``, a class no YAML value can be) is not checked."""
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(type_ok(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    base = origin or hint
    if dataclasses.is_dataclass(base):
        return isinstance(value, Mapping)
    if base in (list, tuple, Sequence, collections.abc.Sequence, collections.abc.Iterable):
        if not isinstance(value, (list, tuple)):
            return False
        if base is tuple and args and args[-1] is not Ellipsis:
            return len(args) == len(value) and all(type_ok(v, a) for v, a in zip(value, args))
        return not args or all(type_ok(v, args[0]) for v in value)
    if base in (dict, Mapping, collections.abc.Mapping):
        return isinstance(value, Mapping) and (len(args) < 2 or all(type_ok(v, args[1]) for v in value.values()))
    return True


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and INTERPOLATION in value


def check_keys(cls: type, node: Mapping, where: str, *, types_: bool = True) -> dict:
    """``node``'s keys checked against what ``cls`` takes (:func:`params_of`): an unknown key (with the nearest
    known one), a missing required key or a value of the wrong type is a :class:`ConfigError` naming ``where``.
    Values that are still interpolations (``${…}``) are not type-checked. Returns ``node`` as a dict."""
    if not isinstance(node, Mapping):
        raise ConfigError(f"{where}: expected a mapping of {cls.__name__}'s keys, got {type(node).__name__} {node!r}")
    known = params_of(cls)
    unknown = [str(k) for k in node if k not in known]
    if unknown:
        close = {k: difflib.get_close_matches(k, list(known), n=1) for k in unknown}
        hint = ", ".join(f"{m[0]!r}" for m in close.values() if m)
        plural = "s" if len(unknown) > 1 else ""
        raise ConfigError(
            f"{where}: unknown key{plural} {', '.join(map(repr, unknown))} for {cls.__name__} "
            f"(known: {', '.join(known)}" + (f"; did you mean {hint}?)" if hint else ")")
        )
    lacking = [k for k, p in known.items() if p.required and k not in node]
    if lacking:
        raise ConfigError(
            f"{where}: missing key{'s' if len(lacking) > 1 else ''} {', '.join(map(repr, lacking))} for {cls.__name__}"
        )
    if types_:
        for k, v in node.items():
            if not _is_interpolation(v) and not type_ok(v, known[k].hint):
                raise ConfigError(f"{where}: {k}={v!r} is not {type_name(known[k].hint)} ({cls.__name__})")
    return dict(node)


def refuse_nested_targets(value: Any, where: str, path: str = "") -> None:
    """Nested nodes are data, never targets: a ``_target_`` anywhere below a node is refused."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if k == "_target_":
                raise ConfigError(
                    f"{where}: {here}: a nested `_target_` is refused (values below a node are data; "
                    "only the node itself names a class)"
                )
            refuse_nested_targets(v, where, here)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            refuse_nested_targets(v, where, f"{path}[{i}]")


def refuse_interpolation(value: Any, where: str, path: str = "") -> None:
    """No ``${…}`` anywhere (no resolver runs, no other node is read): a :class:`ConfigError` naming the key."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            refuse_interpolation(v, where, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            refuse_interpolation(v, where, f"{path}[{i}]")
    elif _is_interpolation(value):
        raise ConfigError(
            f"{where}: {path}: interpolation {value!r} is refused here (no resolver runs in this "
            "config: write the value itself)"
        )


def freeze(data: Any) -> Any:
    """Plain config data made read-only, all the way down: a mapping as a :class:`types.MappingProxyType`, a list
    as a tuple (what a settings object holds of a node it does not type: :mod:`src.io.settings`)."""
    if isinstance(data, Mapping):
        return types.MappingProxyType({k: freeze(v) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return tuple(freeze(v) for v in data)
    return data


def thaw(data: Any) -> Any:
    """:func:`freeze`'s data as plain, new dicts and lists again (to write as JSON, or to hand to a reader)."""
    if isinstance(data, Mapping):
        return {k: thaw(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [thaw(v) for v in data]
    return data


def plain(node: Any, resolve: bool) -> Any:
    """A config node as plain Python data (an OmegaConf container converted, ``resolve`` or not; a frozen node of a
    settings object thawed)."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=resolve)
    if isinstance(node, (types.MappingProxyType, tuple)):
        return thaw(node)
    return node


def composed(cfg: Any) -> dict:
    """The whole composed config as plain data, interpolations resolved (unresolved where one cannot be outside a
    Hydra app, e.g. ``${hydra:…}``), without a ``hydra`` node."""
    if not isinstance(cfg, (DictConfig, ListConfig)):
        return thaw(cfg)
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # noqa: BLE001 - e.g. a ${hydra:...} interpolation outside a Hydra app
        data = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    return data


def resolve_references(data: Any, what: str = "config") -> Any:
    """Plain data with its ``${…}`` references resolved from this process's environment (``oc.env``), as a new
    copy; one that cannot be (a variable without a default unset) is one line naming ``what``."""
    try:
        return OmegaConf.to_container(OmegaConf.create(data), resolve=True)
    except InterpolationResolutionError as e:
        raise RaimError(f"{what}: {' '.join(str(e).split())[:300]}") from None


def both_forms(node: Any) -> tuple[Any, Any]:
    """(unresolved, resolved) plain data of a node Hydra composed; a plain node is both."""
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=False), OmegaConf.to_container(node, resolve=True)
    return node, node


def load_plain(path: str | Path) -> Any:
    """A YAML file Hydra itself wrote (its ``multirun.yaml``) as plain data, unresolved."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def to_yaml(data: Any) -> str:
    """Plain data as the YAML text OmegaConf writes (a run's logged config.yaml, a scrubbed Hydra file)."""
    return OmegaConf.to_yaml(OmegaConf.create(data))


def build(cls: type, node: Any, where: str) -> Any:
    """A settings dataclass from a config node: every key checked (:func:`check_keys`), nested dataclasses built
    the same way, values kept as they are (no conversion)."""
    kw = check_keys(cls, plain(node, True), where)
    hints = params_of(cls)
    for k, v in kw.items():
        sub = _dataclass_in(hints[k].hint)
        if sub is not None and isinstance(v, Mapping):
            kw[k] = build(sub, v, f"{where}.{k}")
        elif (item := _dataclass_items(hints[k].hint)) is not None and isinstance(v, list):
            kw[k] = [build(item, x, f"{where}.{k}[{i}]") for i, x in enumerate(v)]
    return cls(**kw)


def _dataclass_items(hint: Any) -> type | None:
    """The dataclass of a ``list[<dataclass>]`` annotation (also inside ``… | None``), else None."""
    for h in (hint, *typing.get_args(hint)):
        if typing.get_origin(h) is list and (args := typing.get_args(h)) and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def _dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    for a in typing.get_args(hint):
        if dataclasses.is_dataclass(a):
            return a
    return None


class Targets:
    """An allow-list of the classes a config node of one kind may name as its ``_target_``, by dotted path.

    :meth:`instantiate` checks the ``_target_`` string against the list, refuses nested targets and checks every
    key against the class's signature before anything is resolved, imported or called (the classes are RAIM's own,
    already imported by the module that holds the list); then it resolves the node's interpolations (unless they are
    refused) and calls the class with the node's keys."""

    def __init__(self, kind: str, *classes: type, module: str | None = None):
        self.kind = kind  # `module`: the module a user's config names them by (default each class's own)
        self.classes = {f"{module or c.__module__}.{c.__qualname__}": c for c in classes}
        for c in classes:
            params_of(c)  # a class that would swallow unknown keys is refused here, at import

    def __contains__(self, target: object) -> bool:
        return isinstance(target, str) and target in self.classes

    def resolve(self, target: Any, where: str) -> type:
        """The allowed class named ``target`` (a string compared with the list; nothing is imported)."""
        if target in self:
            return self.classes[target]
        raise ConfigError(
            f"{where}: _target_ {target!r} is not a {self.kind} RAIM ships (allowed: {', '.join(self.classes)})"
        )

    def check(self, node: Any, where: str) -> tuple[type, dict]:
        """(class, keyword arguments) of an unresolved node, checked; interpolations are left as they are."""
        raw = plain(node, False)
        if not isinstance(raw, Mapping) or "_target_" not in raw:
            raise ConfigError(
                f"{where}: a {self.kind} node is a mapping with a `_target_` (one of {', '.join(self.classes)})"
            )
        cls = self.resolve(raw["_target_"], where)
        kw = {k: v for k, v in raw.items() if k != "_target_"}
        refuse_nested_targets(kw, where)
        return cls, check_keys(cls, kw, where, types_=False)

    def instantiate(self, node: Any, where: str, *, interpolation: bool = True) -> Any:
        """The checked node's object. ``interpolation=False``: any ``${…}`` in the node is refused instead of
        resolved (a dataset spec). Errors of the class's own checks are re-raised as one line naming ``where``."""
        cls, kw = self.check(node, where)
        if interpolation:  # a plain mapping's references too (an escaped ``\${oc.env:…}`` composes to one)
            resolved = plain(node if isinstance(node, DictConfig) else OmegaConf.create(dict(node)), True)
            kw = {k: v for k, v in resolved.items() if k != "_target_"}
        else:
            refuse_interpolation(kw, where)
        kw = check_keys(cls, kw, where)
        try:
            return cls(**kw)
        except RaimError:
            raise
        except (TypeError, ValueError, KeyError) as err:
            raise ConfigError(f"{where}: {cls.__name__}: {' '.join(str(err).split())}") from None


def conf_file(group: str, option: str | None) -> str:
    """``conf/<group>/<option>.yaml`` as the user reads it (relative to the project), or ``<group>`` when no such
    file exists (a node made in code or on the command line)."""
    if option:
        path = CONF_DIR / group / f"{option}.yaml"
        if Path(str(option)).name == str(option) and path.is_file():
            return f"{CONF_DIR.name}/{group}/{option}.yaml"
    return group


def hydra_choice(group: str) -> str | None:
    """The option of ``group`` the running Hydra job composed (``logreg``), or None outside a Hydra job."""
    if not HydraConfig.initialized():
        return None
    return HydraConfig.get().runtime.choices.get(group)


def node_source(group: str, values: Any = None) -> str:
    """Where a composed group's node came from, for error lines: the Hydra job's choice, else the option whose
    values match (:func:`option_name`), as ``conf/<group>/<option>.yaml``."""
    choice = hydra_choice(group)
    if choice is None and values is not None:
        with contextlib.suppress(Exception):
            choice = (option_name(group, plain(values, False)) or "").split(" (", 1)[0] or None
    return conf_file(group, choice)


PLAIN_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq", "merge")
)  # YAML's core schema: a python/… or a custom tag names a constructor, not data
YAML_MAX_BYTES = 1 << 20  # a config file of RAIM's is a few kB
YAML_MAX_DEPTH = 32
YAML_MAX_NODES = 100_000  # after alias expansion


def check_yaml_bounds(
    text: str, where: str, *, max_depth: int = YAML_MAX_DEPTH, max_nodes: int = YAML_MAX_NODES
) -> None:
    """Refuse a YAML document whose expansion would be large or deep before any loader expands it: the node graph
    is composed (aliases stay shared references, so composing is linear in the text) and its expanded size and
    depth are counted once per distinct node. An anchor "bomb" of a few lines is refused in milliseconds; so is a
    tag outside YAML's core schema (``!!python/object/apply:…``: a constructor, not data)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        docs = list(yaml.compose_all(text, Loader=loader))
    except RecursionError:
        raise ConfigError(f"{where}: YAML nested deeper than {max_depth} levels: refused") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: unreadable YAML ({' '.join(str(err).split())[:300]})") from None
    if len(docs) > 1:
        raise ConfigError(f"{where}: {len(docs)} YAML documents in one file: a config file holds one")
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    active: set[int] = set()

    def walk(node: yaml.Node, level: int) -> None:
        if node.tag not in PLAIN_TAGS:
            raise ConfigError(f"{where}: YAML tag {node.tag!r} is refused (a config file holds plain data)")
        key = id(node)
        if key in active:
            raise ConfigError(f"{where}: a YAML alias refers to its own anchor (a recursive structure): refused")
        if level > max_depth:
            raise ConfigError(f"{where}: YAML nested deeper than {max_depth} levels: refused")
        if key in size:
            if level + depth[key] > max_depth:
                raise ConfigError(f"{where}: YAML nested deeper than {max_depth} levels (through an alias): refused")
            return
        active.add(key)
        kids = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        for k in kids:
            walk(k, level + 1)
        active.discard(key)
        size[key] = 1 + sum(size[id(k)] for k in kids)
        depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
        if size[key] > max_nodes:
            raise ConfigError(f"{where}: YAML expands to more than {max_nodes:,} nodes (anchors and aliases): refused")

    for doc in docs:
        walk(doc, 0)


def load_yaml(path: str | Path, where: str | None = None, *, max_bytes: int = YAML_MAX_BYTES) -> Any:
    """A config file through OmegaConf, bounded first: at most ``max_bytes``, then :func:`check_yaml_bounds`."""
    path = Path(path)
    where = where or str(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise ConfigError(f"{where}: {size:,} bytes, over the {max_bytes:,} a config file may hold: refused")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{where}: not UTF-8 text (byte {err.start})") from None
    check_yaml_bounds(text, where)
    return OmegaConf.create(text) if text.strip() else OmegaConf.create()
