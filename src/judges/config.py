"""The judges' configuration: a roster (conf/roster/<name>.yaml) and the judging frames (conf/frame/), composed
with Hydra's compose API.

A roster is checked before any judge is built: its keys (:class:`RosterSpec`, :class:`MemberSpec`), and each
member's backend node against :data:`BACKENDS`, the allow-list of RAIM's backend classes, with every key checked
against the class's signature (:class:`src.io.config.Targets`). A roster that is its parent minus some members
composes instead of copying: ``defaults: [<parent>, _self_]`` and ``drop_members: [<name>, …]``, resolved here
(:func:`resolve_roster`), so every reader sees the same member list."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydra import compose, initialize_config_dir

from src.core.errors import RaimError
from src.io.config import ConfigError, Targets, check_keys, conf_file, freeze, plain
from src.io.paths import CONF_DIR
from src.io.trust import check_group_file
from src.judges.backends.anthropic_api import AnthropicBackend
from src.judges.backends.hf import TransformersBackend
from src.judges.backends.llamacpp import LlamaCppBackend
from src.judges.backends.nonllm import LexicalSupportBackend, MiniLMSimilarityBackend
from src.judges.backends.openai_compat import OpenAICompatBackend
from src.judges.backends.vllm_backend import VLLMBackend
from src.judges.frames import is_frame_cfg

BACKENDS = Targets(
    "judge backend",
    LlamaCppBackend,
    MiniLMSimilarityBackend,
    LexicalSupportBackend,
    OpenAICompatBackend,
    AnthropicBackend,
    VLLMBackend,
    TransformersBackend,
)
"""The backends a roster may name (``src.judges.backends.*``)."""


@dataclass(frozen=True)
class MemberSpec:
    """One roster member: its column name, its backend node (checked against :data:`BACKENDS`), and the
    family / developer it documents (Table 21: no two members share a developer)."""

    name: str
    backend: dict
    family: str | None = None
    developer: str | None = None


@dataclass(frozen=True)
class FrontierSpec:
    """The roster's frontier judge (a comparator, computed only on request)."""

    name: str
    backend: dict


@dataclass(frozen=True)
class RosterSpec:
    """The keys of a roster: its name (the file's), members, optional frontier judge, and the parent's members
    it leaves out (``drop_members``, with ``defaults: [<parent>, _self_]``)."""

    name: str
    members: list[dict]
    frontier: dict | None = None
    drop_members: list[str] | None = None


def roster_file(roster: Any) -> str:
    """The file a roster node came from, for error lines: conf/roster/<name>.yaml (a roster's ``name`` is its file
    name: the DVC stages load it by that name)."""
    name = roster.get("name") if isinstance(roster, Mapping) else None
    return conf_file("roster", name) if isinstance(name, str) else "roster"


def _drop(raw: dict, where: str) -> dict:
    """``raw`` without the members ``drop_members`` names (an unknown name is an error) and without that key."""
    out = {k: v for k, v in raw.items() if k != "drop_members"}
    drop = list(raw.get("drop_members") or [])
    if drop:
        names = [m["name"] for m in raw["members"]]
        unknown = [d for d in drop if d not in names]
        if unknown:
            raise ConfigError(
                f"{where}: drop_members: {', '.join(map(repr, unknown))} not among the members ({', '.join(names)})"
            )
        out["members"] = [m for m in raw["members"] if m["name"] not in drop]
    return out


def check_roster(roster: Any, source: str | None = None) -> dict:
    """The roster, unresolved, checked: its keys, each member's keys, each backend node's ``_target_`` and keys
    (before any interpolation is resolved or anything is called), with ``drop_members`` applied."""
    raw = plain(roster, False)
    where = source or roster_file(raw)
    check_keys(RosterSpec, raw, where)
    if not isinstance(raw["members"], list):
        raise ConfigError(f"{where}: members: a list of members, got {type(raw['members']).__name__}")
    judges = [(f"members[{i}]", MemberSpec, m) for i, m in enumerate(raw["members"])]
    if raw.get("frontier") is not None:
        judges.append(("frontier", FrontierSpec, raw["frontier"]))
    for label, spec, node in judges:
        at = f"{where}: {label}" + (f" ({node['name']})" if isinstance(node, Mapping) and "name" in node else "")
        check_keys(spec, node, at)
        BACKENDS.check(node["backend"], at)
    return _drop(raw, where)


def resolve_roster(roster: Any, source: str | None = None, *, resolve: bool = True) -> dict:
    """The roster as plain data, checked (:func:`check_roster`) before its interpolations are resolved
    (``resolve``), with ``drop_members`` applied: what every reader of a roster's members uses."""
    checked = check_roster(roster, source)
    if not resolve or not isinstance(roster, Mapping):
        return checked
    return _drop(plain(roster, True), source or roster_file(checked))


def instruction_immune(roster: Mapping) -> list[bool]:
    """Per member of a (checked) roster, in order: whether no instruction in an item's text can address it — its
    backend is not a language model (``reads_instructions`` false: the lexical and MiniLM judges). The members the
    injection defence ``immune`` decides a flagged item by (:data:`src.core.injection.DEFENCES`)."""
    return [
        not BACKENDS.resolve(m["backend"]["_target_"], str(m.get("name"))).reads_instructions for m in roster["members"]
    ]


def member_where(roster: Mapping, name: str) -> str:
    """``conf/roster/<file>: members[i] (<name>)`` (or ``frontier (<name>)``) for an error line."""
    for i, m in enumerate(roster.get("members") or []):
        if m.get("name") == name:
            return f"{roster_file(roster)}: members[{i}] ({name})"
    return f"{roster_file(roster)}: frontier ({name})"


def roster_options() -> list[str]:
    """The rosters of conf/roster by name."""
    return sorted(p.stem for p in (CONF_DIR / "roster").glob("*.yaml"))


def load_roster(name: str) -> Mapping[str, Any]:
    """A roster node by name, composed with Hydra's compose API from conf/roster/<name>.yaml (the file and those its
    defaults list names checked as data first: :func:`src.io.trust.check_group_file`), checked and with
    ``drop_members`` applied, read-only, its interpolations resolved once as a composed config's are (an escaped
    ``\\${oc.env:…}`` stays the reference, resolved when the backend is built)."""
    path = CONF_DIR / "roster" / f"{name}.yaml"
    if not name or "/" in name or not path.exists():
        raise RaimError(f"no roster {name!r}; available: {roster_options()}")
    check_group_file((CONF_DIR,), "roster", name)
    with initialize_config_dir(config_dir=str(CONF_DIR / "roster"), version_base=None):
        node = compose(config_name=name)
    return freeze(resolve_roster(node, conf_file("roster", name)))


def load_frame_cfgs():
    """Every judging frame of conf/frame by name (selectors such as ``auto`` left out)."""
    out = {}
    for p in sorted((CONF_DIR / "frame").glob("*.yaml")):
        check_group_file((CONF_DIR,), "frame", p.stem)
    with initialize_config_dir(config_dir=str(CONF_DIR / "frame"), version_base=None):
        for p in sorted((CONF_DIR / "frame").glob("*.yaml")):
            cfg = compose(config_name=p.stem)
            if is_frame_cfg(cfg):  # skip selectors such as `auto`
                out[p.stem] = freeze(plain(cfg, True))
    return out
