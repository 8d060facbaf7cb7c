"""Prompt frames shared by every member and by the frontier judge.

A frame is a small config node (``conf/frame/<name>.yaml``) holding the prompt text.  It renders an item
into ordered segments so that a backend can put the shared part (the document, then the question) first
and reuse its KV cache across items that share it:

    head | document | context || candidate | instruction

``prefix`` = document + context (shared by the items of one cluster), ``suffix`` = candidate + instruction.
The frame hash (sha256 of the canonical JSON of the whole node) is part of every verdict cache key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from src.io.paths import conf_group

FRAME_DIR = conf_group("frame")
_REQUIRED = ("name", "system", "document", "context", "candidate", "instruction", "labels")


def _plain(cfg: Any) -> dict:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)


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


class Frame:
    def __init__(self, cfg: Mapping[str, Any]):
        d = _plain(cfg)
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"frame config lacks {missing}")
        self.cfg = d
        self.name: str = d["name"]
        self.hash: str = canonical_hash(d)
        labels = d["labels"]
        self.supported_words: list[str] = list(labels["supported"])
        self.hallucinated_words: list[str] = list(labels["hallucinated"])

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
        document = self.cfg["document"].format(**fields) if grounded else ""
        context = self.cfg["context"].format(**fields) if self.cfg["context"] else ""
        instr = self.cfg["instruction"] if grounded else self.cfg.get("instruction_ungrounded", self.cfg["instruction"])
        suffix = self.cfg["candidate"].format(**fields) + instr.strip()
        return Rendered(
            item_id=str(item["item_id"]),
            system=self.cfg["system"].strip(),
            document=document,
            context=context,
            suffix=suffix,
            grounded=grounded,
        )


def load_frame(name_or_cfg: Any) -> Frame:
    """A Frame from a config node, a Frame, or a name under conf/frame/."""
    if isinstance(name_or_cfg, Frame):
        return name_or_cfg
    if isinstance(name_or_cfg, str):

        path = FRAME_DIR / f"{name_or_cfg}.yaml"
        if not path.exists():
            raise FileNotFoundError(f"no frame {name_or_cfg!r} ({path})")
        return Frame(yaml.safe_load(path.read_text()))
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
