"""Prompt frames shared by every member and by the frontier judge.

A frame is a small config node (``conf/frame/<name>.yaml``) holding the prompt text.  It renders an item
into ordered segments so that a backend can put the shared part (the document, then the question) first
and reuse its KV cache across items that share it:

    head | document | context || candidate | instruction

``prefix`` = document + context (shared by the items of one cluster), ``suffix`` = candidate + instruction.
The frame hash (sha256 of the canonical JSON of the whole node) is part of every verdict cache key.

A frame with ``guard: true`` (``conf/frame/*_guarded.yaml``, beyond the paper) treats the item's text as untrusted
data: each field is :func:`src.core.injection.neutralise` d, and the templates (instruction included) may place
per-item boundary identifiers ``{b_evidence}``, ``{b_question}``, ``{b_candidate}`` (:func:`src.core.injection.boundary`
of the field and of the fields before it, so a document's prefix stays shared by its candidates). ``guards`` names
the paper frame it hardens (``base``: the frame whose settings non-LLM judges use). The paper's frames have no
``guard`` and render exactly as before.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from src.core.injection import boundary, neutralise
from src.io.config import ConfigError, build, check_yaml_bounds, conf_file, plain
from src.io.paths import conf_group

FRAME_DIR = conf_group("frame")
_REQUIRED = ("name", "system", "document", "context", "candidate", "instruction", "labels")


def canonical_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Rendered:
    """One item rendered under a frame (backend-agnostic text pieces)."""

    item_id: str
    system: str
    document: str  # "" for ungrounded items
    context: str
    suffix: str  # candidate + instruction
    grounded: bool

    @property
    def prefix(self) -> str:
        return self.document + self.context

    @property
    def user(self) -> str:
        return self.prefix + self.suffix


@dataclass(frozen=True)
class FrameLabels:
    """A frame's verdict words: "supported" → vote 0, "hallucinated" → vote 1."""

    supported: list[str]
    hallucinated: list[str]


@dataclass(frozen=True)
class FrameSpec:
    """The keys of a judging frame (conf/frame/<name>.yaml): the prompt's segments, in the order that lets items
    sharing a document reuse its KV cache, and the verdict words."""

    name: str
    system: str
    document: str
    context: str
    candidate: str
    instruction: str
    labels: FrameLabels
    instruction_ungrounded: str | None = None
    guard: bool = False  # a guarded frame: untrusted text delimited and neutralised (src.core.injection)
    guards: str | None = None  # the paper frame a guarded frame hardens


FIELDS = frozenset({"evidence", "question", "candidate", "b_evidence", "b_question", "b_candidate"})
"""The only replacement fields a frame's templates may hold: an item's texts and their boundary identifiers."""
TEMPLATES = ("document", "context", "candidate")
"""The segments :meth:`Frame.render` formats with an item's fields (a guarded frame's instructions too)."""


def check_templates(d: Mapping[str, Any], where: str) -> None:
    """The templates a frame formats name only :data:`FIELDS`, plainly: ``str.format`` would otherwise follow an
    attribute or an index (``{candidate.__class__}``) or a format spec that a frame from someone else chose."""
    formatted = TEMPLATES + (("instruction", "instruction_ungrounded") if d.get("guard") else ())
    for key in formatted:
        text = d.get(key)
        if not isinstance(text, str):
            continue
        try:
            parts = list(string.Formatter().parse(text))
        except ValueError as err:
            raise ConfigError(f"{where}: {key}: {err} (a literal brace is written {{{{ or }}}})") from None
        for _, field, spec, conversion in parts:
            if field is not None and (field not in FIELDS or spec or conversion):
                raise ConfigError(
                    f"{where}: {key}: replacement field {{{field}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}} is refused (a frame names only {', '.join(sorted(FIELDS))})"
                )


def check_frame(d: Any, where: str) -> None:
    """A frame node checked whole: every key and value (:class:`FrameSpec`; a misspelt key would otherwise change
    the hash, silently) and its templates (:func:`check_templates`)."""
    build(FrameSpec, d, where)
    check_templates(d, where)


class Frame:
    def __init__(self, cfg: Mapping[str, Any]):
        d = dict(plain(cfg, True))
        check_frame(d, conf_file("frame", d.get("name")) if isinstance(d, Mapping) else "frame")
        self.cfg = d
        self.name: str = d["name"]
        self.hash: str = canonical_hash(d)
        labels = d["labels"]
        self.supported_words: list[str] = list(labels["supported"])
        self.hallucinated_words: list[str] = list(labels["hallucinated"])
        self.guard: bool = bool(d.get("guard", False))
        self.base: str = str(d.get("guards") or self.name)  # the paper frame a guarded frame hardens

    def render(self, item: Mapping[str, Any]) -> Rendered:
        evidence = item.get("evidence") or ""
        if not isinstance(evidence, str):  # NaN from pandas
            evidence = ""
        fields = {
            "evidence": evidence.strip(),
            "question": str(item.get("question") or "").strip(),
            "candidate": str(item.get("candidate") or "").strip(),
        }
        grounded = bool(fields["evidence"])
        if self.guard:
            fields = self._guarded(fields)
        document = self.cfg["document"].format(**fields) if grounded else ""
        context = self.cfg["context"].format(**fields) if self.cfg["context"] else ""
        instr = self.cfg["instruction"] if grounded else self.cfg.get("instruction_ungrounded", self.cfg["instruction"])
        if self.guard:
            instr = instr.format(**fields)
        suffix = self.cfg["candidate"].format(**fields) + instr.strip()
        return Rendered(
            item_id=str(item["item_id"]),
            system=self.cfg["system"].strip(),
            document=document,
            context=context,
            suffix=suffix,
            grounded=grounded,
        )

    def _guarded(self, raw: dict[str, str]) -> dict[str, str]:
        """The fields neutralised, plus the boundary identifier of each segment (from the raw text)."""
        out = {k: neutralise(v) for k, v in raw.items()}
        ev, q, c = raw["evidence"], raw["question"], raw["candidate"]
        out.update(
            b_evidence=boundary(ev, salt=self.name),
            b_question=boundary(ev, q, salt=self.name),
            b_candidate=boundary(ev, q, c, salt=self.name),
        )
        return out


def load_frame(name_or_cfg: Any) -> Frame:
    """A Frame from a config node, a Frame, or a name under conf/frame/."""
    if isinstance(name_or_cfg, Frame):
        return name_or_cfg
    if isinstance(name_or_cfg, str):
        path = FRAME_DIR / f"{name_or_cfg}.yaml"
        if Path(name_or_cfg).name != name_or_cfg or not path.exists():
            raise FileNotFoundError(f"no frame {name_or_cfg!r} ({path})")
        text = path.read_text()
        check_yaml_bounds(text, conf_file("frame", name_or_cfg))
        return Frame(yaml.safe_load(text))
    return Frame(name_or_cfg)


def is_frame_cfg(cfg: Any) -> bool:
    try:
        return all(k in cfg for k in _REQUIRED)
    except TypeError:
        return False


def load_frames(frame_cfgs: Any) -> dict[str, Frame]:
    """Normalise ``dict[name, cfg] | cfg | None`` into ``{name: Frame}``.

    Nodes that are not prompt frames (e.g. the engine's ``auto`` selector, "each dataset under its own
    frame") are skipped; when nothing is left, every frame under conf/frame is loaded and each item is
    scored under its own ``frame`` column.
    """
    out: dict[str, Frame] = {}
    if isinstance(frame_cfgs, Frame):
        out = {frame_cfgs.name: frame_cfgs}
    elif isinstance(frame_cfgs, str):
        f = load_frame(frame_cfgs) if (FRAME_DIR / f"{frame_cfgs}.yaml").exists() else None
        out = {f.name: f} if f is not None and is_frame_cfg(f.cfg) else {}
    elif frame_cfgs is not None and is_frame_cfg(frame_cfgs):
        f = load_frame(frame_cfgs)
        out = {f.name: f}
    elif isinstance(frame_cfgs, Mapping) or hasattr(frame_cfgs, "items"):
        for k, v in frame_cfgs.items():
            if isinstance(v, Frame):
                out[str(k)] = v
            elif is_frame_cfg(v):
                out[str(k)] = load_frame(v)
    if not out:
        for p in sorted(FRAME_DIR.glob("*.yaml")):
            d = yaml.safe_load(p.read_text())
            if is_frame_cfg(d):
                f = Frame(d)
                out[f.name] = f
    return out
