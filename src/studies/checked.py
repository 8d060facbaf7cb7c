"""The one checked path from a composed config to RAIM's objects, and the check of the whole composed config that
every Hydra command runs before it does anything (docs/security.md).

A config node becomes an object only here (a stacker, the analysis settings) or through the other allow-lists of
:class:`src.io.config.Targets` (a roster's backends, :data:`src.judges.config.BACKENDS`; a dataset's builder,
:data:`src.io.datasets.BUILDERS_ALLOWED`): the ``_target_`` is compared with RAIM's own classes as a string and
every key with the class's signature before anything is imported, resolved or called. No module calls Hydra's
``instantiate`` (a test holds every module of ``src/`` to it).

:func:`check_config` reads every group of the composed config — whichever of them the command uses — so that an
unknown key, a missing node or a class outside an allow-list is one line naming its file on every path (a roster
given with ``verdicts=…``, whose backends are never built, is checked all the same), and returns the command's
typed, frozen :class:`src.io.settings.Settings`: below the entries no module sees the composed config. Every Hydra
command calls it before any work (src.run once its outputs are checked, src.analyses, src.report, and each study
entry before :func:`src.mlops.tracking.run_study`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hydra.core.hydra_config import HydraConfig

from src.core.aggregate import NoiseRobustStackedLogit, StackedLogit
from src.core.ladderbase import LadderSettings
from src.io.config import ConfigError, Targets, build, check_keys, composed, conf_file, freeze, node_source, plain
from src.io.datasets import BUILDERS_ALLOWED, check_spec
from src.io.settings import STUDIES, JudgeSettings, PathsSettings, Settings, TopLevel, TrackingSettings
from src.io.suite_settings import suite_settings
from src.judges.config import check_roster
from src.judges.frames import check_frame, is_frame_cfg

STACKERS = Targets("stacker", StackedLogit, NoiseRobustStackedLogit)
"""The stackers a config may name (conf/stacker): RAIM's estimators of src.core.aggregate that the ladder fits."""
ANALYSIS = Targets("analysis settings", LadderSettings, module="src.core.ladder")
"""The analysis settings (conf/analysis), named by the ladder that reads them (``src.core.ladder.LadderSettings``;
the class lives in :mod:`src.core.ladderbase`, the ladder exports it)."""


def stacker_from(node: Any, where: str | None = None) -> StackedLogit:
    """A stacker node instantiated through :data:`STACKERS` (target and keys checked before anything is called)."""
    return STACKERS.instantiate(node, where or node_source("stacker", node))


def analysis_from(node: Any, where: str | None = None) -> LadderSettings:
    """An analysis node instantiated through :data:`ANALYSIS` (target and keys checked before anything is called)."""
    return ANALYSIS.instantiate(node, where or node_source("analysis", node))


def configured(s: Settings) -> tuple[LadderSettings, StackedLogit]:
    """The analysis settings and the stacker, each through its allow-list; an unknown key or a value of the wrong
    type is one line naming its file (conf/analysis/<option>.yaml, conf/stacker/<option>.yaml)."""
    return analysis_from(s.analysis), stacker_from(s.stacker)


@dataclass(frozen=True)
class FrameSelector:
    """A frame option that is not a prompt but a rule: ``auto``, each dataset under its own frame."""

    name: Literal["auto"]


def _stacker(node: Any, where: str) -> None:
    STACKERS.check(node, where)


def _analysis(node: Any, where: str) -> None:
    ANALYSIS.check(node, where)


def _roster(node: Any, where: str) -> None:
    check_roster(node, where)


def _dataset(node: Any, where: str) -> None:
    spec = check_spec(plain(node, False), where)
    if spec.get("builder") is not None:
        BUILDERS_ALLOWED.check(spec["builder"], f"{where}: builder")


def _frame(node: Any, where: str) -> None:
    if is_frame_cfg(node):
        check_frame(plain(node, True), where)
    else:
        build(FrameSelector, node, where)


def _suite(node: Any, where: str) -> Any:
    return suite_settings(node, where)


def _settings(cls: type) -> Callable[[Any, str], Any]:
    def check(node: Any, where: str) -> Any:
        return build(cls, node, where)

    return check


GROUPS: dict[str, Callable[[Any, str], Any]] = {
    "roster": _roster,
    "dataset": _dataset,
    "frame": _frame,
    "stacker": _stacker,
    "analysis": _analysis,
    "suite": _suite,
    **{name: _settings(cls) for name, cls in STUDIES.items()},
    "paths": _settings(PathsSettings),
    "judge": _settings(JudgeSettings),
    "tracking": _settings(TrackingSettings),
}
"""Every node of the composed config with the check of its group (what its readers build it as: the typed settings
of :mod:`src.io.settings` for the plain groups, None for a node kept as checked data)."""

NODES = ("roster", "dataset", "frame", "stacker", "analysis")
"""The groups a :class:`src.io.settings.Settings` holds as checked, read-only nodes (each read by its own reader)."""


def check_config(cfg: Mapping[str, Any]) -> Settings:
    """The whole composed config checked, group by group (:data:`GROUPS`), and its own keys (:class:`TopLevel`):
    a missing group, an unknown key or a class outside an allow-list is a :class:`ConfigError` naming the file.
    Returns the command's :class:`Settings` (typed, frozen): the one place a composed config becomes them
    (settings already built are returned as they are)."""
    if isinstance(cfg, Settings):
        return cfg
    if "hydra" in cfg:
        raise ConfigError("config: a `hydra` node in a composed config is refused (Hydra's settings are not data)")
    missing = [g for g in GROUPS if g not in cfg or cfg.get(g) is None]
    if missing:
        raise ConfigError(
            f"config: no {', '.join(map(repr, missing))} node (every RAIM command reads the whole config; "
            f"choose an option instead of removing one: {missing[0]}=…)"
        )
    raw = plain(cfg, False)
    check_keys(TopLevel, {k: v for k, v in raw.items() if k not in GROUPS}, source(None))
    built = {group: check(cfg[group], source(group)) for group, check in GROUPS.items()}
    data = composed(cfg)
    frozen = freeze(data)
    return Settings(
        top=TopLevel(**{k: v for k, v in data.items() if k not in GROUPS}),
        **{g: frozen[g] for g in NODES},
        **{g: built[g] for g in GROUPS if g not in NODES},
        composed=frozen,
        unresolved=freeze({k: v for k, v in raw.items() if k != "hydra"}),
    )


def source(group: str | None) -> str:
    """Where a group's node came from, for error lines: ``conf/<group>/<option>.yaml`` (the option the Hydra job
    composed), ``params.yaml: <group>`` (a DVC stage composes params.yaml), else the group's name."""
    if not HydraConfig.initialized():
        return group or "config"
    hc = HydraConfig.get()
    choice = hc.runtime.choices.get(group) if group else None
    if choice:
        return conf_file(group, choice)
    primary = f"{hc.job.config_name}.yaml"
    return f"{primary}: {group}" if group else primary
