"""Which items to label: :func:`propose` draws the next items from the unlabelled pool with the active sampling
probabilities (:func:`src.core.rates.sampling_probabilities`, seeded) and records every pool item's probability with
a fingerprint of the pool, so that labels read back against the proposal give the active-inference rate (Zrnic &
Candès 2024) and a proposal from another pool is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from src.core import rates
from src.core.rates import RateError
from src.io.files import atomic_write_text, to_json
from src.studies.pool import Pool

PROPOSAL_KIND = "raim-rate-proposal"


PROPOSAL_VERSION = 1


STATUS = ("not drawn", "proposed", "labelled")  # a pool item's place in a proposal; "labelled" = π 1


def propose(pool: Pool, budget: int, seed: int = 0, tau: float = 0.5, labelled: np.ndarray | None = None) -> dict:
    """The next items to label: each unlabelled item drawn independently with its active sampling probability
    (expected count ``budget``; already-labelled items are in the sample for certain), seeded; the document
    records every item's probability and status and the pool's fingerprint."""
    if isinstance(budget, bool) or int(budget) != budget or budget < 1:
        raise RateError(f"propose: budget {budget!r} (the number of items to label, after POOL) is not an integer ≥ 1")
    lab = np.zeros(len(pool), bool) if labelled is None else np.asarray(labelled, bool)
    pi = rates.sampling_probabilities(pool.p, int(budget), tau, ~lab)[0]
    take = rates.draw(pi, np.random.default_rng(seed), ~lab)[0]
    status = np.where(lab, 2, np.where(take, 1, 0))
    return {
        "kind": PROPOSAL_KIND,
        "version": PROPOSAL_VERSION,
        "pool": {"source": pool.source, "n": len(pool), "fingerprint": pool.fingerprint()},
        "design": {
            "rule": "Poisson sampling, π ∝ (1 − τ)·√(p(1 − p))/mean + τ, Σπ = budget, π ≤ 1 (Zrnic & Candès 2024)",
            "budget": int(budget),
            "tau": float(tau),
            "seed": int(seed),
        },
        "proposed": [str(i) for i in pool.item_ids[take]],
        "already_labelled": int(lab.sum()),
        "items": {
            "item_id": [str(i) for i in pool.item_ids],
            "pi": [float(v) for v in pi],
            "status": [STATUS[s] for s in status],
        },
    }


def write_proposal(doc: dict, path: str | Path) -> tuple[Path, Path]:
    """The proposal (JSON) and, beside it, ``<name>.labels.csv``: the proposed items with an empty gold column to
    fill in and read back with ``--labels``."""
    path = Path(path)
    if path.suffix != ".json":
        raise RateError(f"--proposal {path}: a proposal is written as .json")
    out = atomic_write_text(path, to_json(doc))
    template = template_path(path)
    atomic_write_text(template, "item_id,gold\n" + "".join(f"{_csv_cell(i)},\n" for i in doc["proposed"]))
    return out, template


def template_path(proposal: Path) -> Path:
    """Where :func:`write_proposal` writes a proposal's labels template: ``<name>.labels.csv`` beside it."""
    return proposal.with_name(proposal.stem + ".labels.csv")


def _csv_cell(s: str) -> str:
    return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"\n') else s


@dataclass
class Proposal:
    """A proposal read back against its pool: each item's probability and status (:data:`STATUS` index)."""

    source: str
    pi: np.ndarray
    status: np.ndarray

    @property
    def drawn(self) -> np.ndarray:
        return self.status > 0


def read_proposal(path: str | Path, pool: Pool) -> Proposal:
    """A proposal written by :func:`propose` for this very pool (same item ids), else one line saying why."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RateError(f"{path}: proposal file not found") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RateError(f"{path}: not a proposal (unreadable JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != PROPOSAL_KIND:
        raise RateError(
            f"{path}: not a proposal of src.rate (kind {doc.get('kind') if isinstance(doc, dict) else None!r})"
        )
    if doc.get("version") != PROPOSAL_VERSION:
        raise RateError(f"{path}: proposal version {doc.get('version')!r}; this RAIM reads version {PROPOSAL_VERSION}")
    meta = doc.get("pool") or {}
    if meta.get("fingerprint") != pool.fingerprint():
        raise RateError(
            f"{path}: a proposal drawn from another pool ({meta.get('source')!r}, {meta.get('n')} items); "
            f"{pool.source} holds {len(pool)} items with other ids: propose again on this pool"
        )
    items = doc.get("items") or {}
    try:
        order = np.array([pool.index[str(i)] for i in items["item_id"]])
        pi_in, st_in = np.asarray(items["pi"], float), [STATUS.index(s) for s in items["status"]]
    except (KeyError, TypeError, ValueError) as e:
        raise RateError(f"{path}: field 'items': malformed ({type(e).__name__}: {e})") from None
    if len(order) != len(pool) or len(pi_in) != len(order) or len(st_in) != len(order):
        raise RateError(
            f"{path}: field 'items': {len(order)} ids, {len(pi_in)} probabilities, {len(st_in)} statuses "
            f"for a pool of {len(pool)}"
        )
    pi, status = np.empty(len(pool)), np.empty(len(pool), int)
    pi[order], status[order] = pi_in, st_in
    bad = ~((pi > 0) & (pi <= 1))
    if bad.any():
        raise RateError(
            f"{path}: item {pool.item_ids[np.argmax(bad)]!r}: field 'pi': {pi[np.argmax(bad)]!r} is "
            "not a probability in (0, 1]"
        )
    return Proposal(str(path), pi, status)


def check_against(proposal: Proposal, labelled: np.ndarray, pool: Pool, labels_source: str) -> None:
    """Labels read against a proposal: every drawn (or already labelled) item has one, no other item has."""
    extra = labelled & ~proposal.drawn
    if extra.any():
        raise RateError(
            f"{labels_source}: item {pool.item_ids[np.argmax(extra)]!r} has a label but "
            f"{proposal.source} did not draw it ({int(extra.sum())} such item(s)): the active estimate "
            "weights drawn items only; drop them, or estimate without --proposal"
        )
    missing = proposal.drawn & ~labelled
    if missing.any():
        raise RateError(
            f"{labels_source}: {int(missing.sum())} item(s) drawn by {proposal.source} have no label "
            f"(first: {pool.item_ids[np.argmax(missing)]!r}): the active estimate needs every drawn "
            "item's label (a label left out is not missing at random)"
        )
