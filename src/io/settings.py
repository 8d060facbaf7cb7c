"""The settings of the composed config, typed and frozen: the paths, the judge engine, tracking, each
beyond-the-paper study's own group (conf/prevalence, monitor, noise, rate, injection, traces), and
:class:`Settings`, all of them together with the groups read by their own readers (roster, dataset, frame,
stacker, analysis: their checked nodes, read-only).

Every Hydra entry turns its composed config into a :class:`Settings` once, through the checked path
(:func:`src.studies.checked.check_config`); below the entries no module sees the composed config itself, and a
function takes the settings it reads.

As with the suite's settings (:mod:`src.io.suite_settings`), the values live in the YAML files only: these
dataclasses hold no defaults (an optional key defaults to ``None``: absent), so nothing is repeated in code. Built
through :func:`src.io.config.build`, an unknown key (with the nearest known one), a missing key or a value of the
wrong type is one line naming the file and the key, whatever the command that reads the group
(:mod:`src.studies.checked`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from src.io.config import thaw
from src.io.suite_settings import SuiteSettings
from src.io.traces import TraceMapping


@dataclass(frozen=True)
class PathsSettings:
    """Where the raw data, the balanced sets, the verdict cache and the verdict tables are."""

    raw_dir: str
    own_dir: str
    datasets_dir: str
    cache_dir: str
    tables_dir: str


@dataclass(frozen=True)
class RaySettings:
    """The Ray Data engine's actor pools (``judge.engine=ray``)."""

    address: str | None
    actors_per_member: int
    batch_size: int
    num_cpus_per_actor: float
    num_gpus_per_actor: float


@dataclass(frozen=True)
class JudgeSettings:
    """Whether cache misses are judged, the per-dataset subsample, what a missing verdict does, the engine."""

    compute: bool
    per_dataset: int | None
    missing: Literal["error", "judged_only", "skip", "auto"]
    engine: Literal["local", "ray"]
    ray: RaySettings


@dataclass(frozen=True)
class TrackingSettings:
    """The MLflow store and experiment runs are logged to."""

    enabled: bool
    uri: str
    experiment: str


@dataclass(frozen=True)
class PanelSpec:
    """A simulated panel (:func:`src.studies.simulate.panel`): members' accuracies, their error correlation, the
    abstention rate, the clusters and the seed."""

    name: str
    n_clusters: int
    accuracies: list[float]
    rho: float
    abstain_rate: float
    seed: int


@dataclass(frozen=True)
class TrafficSpec(PanelSpec):
    """A simulated panel and its traffic (the rate study): optionally other accuracies on the traffic than on the
    calibration set, and conversations of ``cluster_size`` items sharing gold and difficulty."""

    description: str | None = None
    traffic_accuracies: list[float] | None = None
    cluster_size: int | None = None
    icc_gold: float | None = None
    icc_difficulty: float | None = None


@dataclass(frozen=True)
class PrevalenceSettings:
    """conf/prevalence: the prior-shift study."""

    output: str
    figure: str
    prevalences: list[float]
    window: int
    n_boot: int
    n_draws: int
    seed: int
    level: float
    ece_bins: int
    tol: float
    max_iter: int
    simulations: list[PanelSpec] | None


@dataclass(frozen=True)
class Calibration:
    dataset: str | None


@dataclass(frozen=True)
class PrevalenceWatch:
    reference: float | None
    reference_items: int
    tolerance: float


@dataclass(frozen=True)
class AccuracyDrop:
    members: list[int]
    to: float


@dataclass(frozen=True)
class CorrelationRise:
    rho: float


@dataclass(frozen=True)
class AbstentionRise:
    member: int
    rate: float


@dataclass(frozen=True)
class PrevalenceMove:
    to: float


@dataclass(frozen=True)
class Degrade:
    """What changes at the replay's change point, per scenario."""

    accuracy: AccuracyDrop
    correlated: CorrelationRise
    abstain: AbstentionRise
    prevalence: PrevalenceMove


@dataclass(frozen=True)
class Replay:
    """The simulated stream the monitor replays (``monitor.source=replay``)."""

    scenario: Literal["none", "accuracy", "correlated", "abstain", "prevalence"]
    seed: int
    calibration_items: int
    stable_items: int
    changed_items: int
    prevalence: float
    accuracies: list[float]
    rho: float
    degrade: Degrade


@dataclass(frozen=True)
class MonitorEvaluation:
    scenarios: list[str]
    seeds: int
    first_seed: int
    max_delay: int
    stable_streams: int
    stable_first_seed: int


@dataclass(frozen=True)
class MonitorSettings:
    """conf/monitor: live admissibility monitoring."""

    source: Literal["replay", "store"]
    store: str | None
    model: str | None
    labels: str | None
    min_labels: int
    calibration: Calibration
    window: int
    step: int
    alpha: float | Literal["auto"]
    false_alarm_target: float | None
    consecutive: int
    prevalence: PrevalenceWatch
    replay: Replay
    evaluation: MonitorEvaluation
    output: str
    figure: str


@dataclass(frozen=True)
class Dissent:
    floor: float
    bias: float | None = None


@dataclass(frozen=True)
class NoisePanel:
    """The noise study's simulated panel in the admissible regime."""

    enabled: bool
    n_clusters: int
    per_cluster: int
    accuracies: list[float]
    rho: float
    abstain_rate: float
    frontier_accuracy: float
    dataset: str
    seed: int


@dataclass(frozen=True)
class NoiseSettings:
    """conf/noise: noisy calibration labels."""

    output: str
    figure: str
    types: list[str]
    rates: list[float]
    default_rate: float
    draws: int
    n_boot: int
    seed: int
    stackers: list[str]
    native: bool
    dw: Dissent
    dl: Dissent
    simulation: NoisePanel


@dataclass(frozen=True)
class EMSettings:
    tol: float
    max_iter: int


@dataclass(frozen=True)
class CJECheck:
    replicates: int
    labels: list[int]
    prevalences: list[float]


@dataclass(frozen=True)
class CrossCheck:
    ppi_py: int
    cje: CJECheck


@dataclass(frozen=True)
class RateSettings:
    """conf/rate: hallucination rates with valid intervals."""

    output: str
    figure: str
    level: float
    pool: int
    replicates: int
    prevalences: list[float]
    labels: list[int]
    seed: int
    tau: float
    threshold: float
    em: EMSettings
    real: bool
    labeller: str | None
    crosscheck: CrossCheck
    simulations: list[TrafficSpec]


@dataclass(frozen=True)
class InjectionSettings:
    """conf/injection: candidates that instruct the judges."""

    output: str
    figure: str
    cache_dir: str
    datasets: list[str]
    n_items: int
    attacks: list[str]
    heldout: str
    dev: str
    heldout_draws: int
    defence: str
    max_weight_share: float
    guarded: bool
    seed: int
    n_boot: int
    level: float
    compute: bool
    budget_s: float | None
    members: list[str] | None
    progress: bool


@dataclass(frozen=True)
class TraceAssessments:
    """The names RAIM reads and writes on traces: its own assessment, the people's label, the label request tag."""

    name: str
    label: str
    request_tag: str


@dataclass(frozen=True)
class TracesSettings:
    """conf/traces: traces in, assessments out, and the panel against MLflow's scorer ensembles."""

    output: str
    figure: str
    ensembles: list[Literal["majority_vote", "mean"]]
    mean_threshold: float
    dataset: str
    page_size: int
    assessment: TraceAssessments
    mapping: TraceMapping


STUDIES: dict[str, type] = {
    "prevalence": PrevalenceSettings,
    "monitor": MonitorSettings,
    "noise": NoiseSettings,
    "rate": RateSettings,
    "injection": InjectionSettings,
    "traces": TracesSettings,
}
"""Each beyond-the-paper study's group and the settings it is read as."""


@dataclass(frozen=True)
class TopLevel:
    """The composed config's own keys (conf/config.yaml) and the ones a DVC stage adds (``+metrics=``,
    ``+betas=``, ``+redraw=``). The groups are checked by their own readers."""

    verdicts: str | None
    frontier: str | None
    output: str
    metrics: str | None = None
    betas: str | None = None
    redraw: bool | None = None


@dataclass(frozen=True)
class Settings:
    """A command's whole configuration, checked and frozen: the top-level keys (:class:`TopLevel`), the typed
    settings of each plain group, and the nodes of the groups RAIM turns into objects through their own
    allow-lists (``roster``, ``dataset``, ``frame``, ``stacker``, ``analysis``: read-only mappings, interpolations
    resolved once, as Hydra composed them). ``composed``: the whole composed config, read-only (what a run logs,
    scrubbed); ``unresolved``: the same before its interpolations were resolved (what a persisted copy keeps of a
    reference to a secret: :func:`src.mlops.redact.persistable`). Built only by
    :func:`src.studies.checked.check_config`."""

    top: TopLevel
    paths: PathsSettings
    judge: JudgeSettings
    tracking: TrackingSettings
    roster: Mapping[str, Any]
    dataset: Mapping[str, Any]
    frame: Mapping[str, Any]
    stacker: Mapping[str, Any]
    analysis: Mapping[str, Any]
    suite: SuiteSettings
    prevalence: PrevalenceSettings
    monitor: MonitorSettings
    noise: NoiseSettings
    rate: RateSettings
    injection: InjectionSettings
    traces: TracesSettings
    composed: Mapping[str, Any]
    unresolved: Mapping[str, Any]

    @property
    def verdicts(self) -> str | None:
        return self.top.verdicts

    @property
    def output(self) -> str:
        return self.top.output

    def node(self, group: str) -> dict:
        """One group's node as a new plain dict (its keys in the YAML's order): what a study records of its
        settings, and what a reader that checks a node itself reads."""
        return thaw(self.composed[group])
