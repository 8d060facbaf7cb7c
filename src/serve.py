"""MLflow pyfunc models that RAIM serves.

* :class:`StackerModel` wraps a fitted :class:`src.aggregate.StackedLogit` (the per-dataset meta-learner of §2).
  Input: one column per panel member holding its verdict (1 = hallucinated, 0 = supported, 0.5 or null =
  abstained). Output: ``p_hallucinated`` (the stacker's probability), ``verdict`` (1 iff p ≥ threshold) and
  ``label``. This is what ``mlflow models serve`` answers.
* :class:`PanelModel` takes raw items (question, evidence, candidate), runs the configured roster's judges
  through the verdict cache (a hit never loads a model) and stacks their verdicts with a fitted stacker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_COLUMNS = ("p_hallucinated", "verdict", "label")
ITEM_INPUT = ("item_id", "question", "evidence", "candidate")


def vote_matrix(frame: pd.DataFrame, columns: list[str], n_votes: int | None = None) -> np.ndarray:
    """Votes in the stacker's column order; a missing vote column or a null vote is an abstention (0.5).

    Columns past ``n_votes`` are continuous extras (e.g. ``member@logodds``): those must be given.
    """
    from .verdicts import ABSTAIN

    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    unknown = [c for c in frame.columns if c not in columns]
    if unknown:
        raise ValueError(f"unknown input column(s) {unknown}; the stacker expects {columns}")
    k = len(columns) if n_votes is None else n_votes
    absent = [c for c in columns[k:] if c not in frame]
    if absent:
        raise ValueError(f"missing input column(s) {absent} (continuous features cannot abstain)")
    X = np.full((len(frame), len(columns)), ABSTAIN, dtype=float)
    for j, c in enumerate(columns):
        if c in frame:
            v = pd.to_numeric(frame[c], errors="raise").astype(float).to_numpy()
            if j >= k and np.isnan(v).any():
                raise ValueError(f"column {c!r}: a continuous feature cannot be null")
            X[:, j] = np.where(np.isnan(v), ABSTAIN, v)
    bad = ~np.isin(X[:, :k], (0.0, 1.0, ABSTAIN))
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise ValueError(f"row {r}: column {columns[c]!r}: a verdict must be 0, 1 or 0.5/null, got {X[r, c]}")
    return X


def stacked_output(stacker, X: np.ndarray) -> pd.DataFrame:
    p = stacker.predict_proba(X)[:, 1]
    verdict = (p >= stacker.threshold).astype(int)
    return pd.DataFrame({"p_hallucinated": p, "verdict": verdict,
                         "label": np.where(verdict == 1, "hallucinated", "supported")})


class StackerModel(mlflow.pyfunc.PythonModel):
    """A fitted stacker over member verdicts → p(hallucinated) and the verdict."""

    _skip_type_hint_validation = True  # the explicit signature validates inputs (MLflow warns otherwise)

    def __init__(self, stacker, columns: list[str]):
        self.stacker = stacker
        self.columns = list(columns)

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return stacked_output(self.stacker, vote_matrix(model_input, self.columns, self.stacker.n_votes))


class PanelModel(mlflow.pyfunc.PythonModel):
    """Raw items → the roster's judges (through the verdict cache) → the stacked verdict.

    Input columns: ``candidate`` (required), ``question``, ``evidence``, ``item_id``, ``frame``, ``dataset``.
    An item without ``item_id`` gets one from its content, so a repeated item is a cache hit; an item without
    ``frame`` is scored under the model's default frame. ``model_config`` (overridable at load time):
    ``cache_dir`` (the verdict cache), ``compute`` (score cache misses; False: a miss is an abstention).
    Output: ``item_id``, one column per member (its vote; NaN = abstained), ``p_hallucinated``, ``verdict``,
    ``label``.
    """

    _skip_type_hint_validation = True

    def __init__(self, roster: dict, frames: dict[str, dict], default_frame: str, stacker, columns: list[str]):
        self.roster = roster
        self.frames = frames
        self.default_frame = default_frame
        self.stacker = stacker
        self.columns = list(columns)
        self.config: dict = {}

    def load_context(self, context) -> None:
        self.config = dict(getattr(context, "model_config", None) or {})

    def items(self, frame: pd.DataFrame) -> pd.DataFrame:
        from .judges.cache import item_content_hash

        df = pd.DataFrame(frame).copy()
        if "candidate" not in df:
            raise ValueError("each item needs a 'candidate' (the text to judge)")
        for c in ("question", "evidence"):
            if c not in df:
                df[c] = ""
            df[c] = df[c].fillna("").astype(str)
        ids = [f"item-{item_content_hash(r)}" for r in df[["question", "evidence", "candidate"]].to_dict("records")]
        df["item_id"] = df["item_id"].fillna(pd.Series(ids)).astype(str) if "item_id" in df else ids
        df["frame"] = df["frame"].fillna(self.default_frame) if "frame" in df else self.default_frame
        df["dataset"] = df["dataset"].fillna("served") if "dataset" in df else "served"
        df["cluster_id"] = df["item_id"]
        return df

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from .judges.runner import verdict_table

        cfg = {**self.config, **(params or {})}
        items = self.items(model_input)
        table = verdict_table(self.roster, items, self.frames, Path(cfg.get("cache_dir", ROOT / "verdicts/cache")),
                              compute=bool(cfg.get("compute", True)), progress=False)
        self.last_report = table.attrs.get("report", {})
        votes = table[[c for c in self.columns if c in table]].astype("Float64").astype(float)
        out = stacked_output(self.stacker, vote_matrix(votes, self.columns, self.stacker.n_votes))
        return pd.concat([items[["item_id"]].reset_index(drop=True), votes.reset_index(drop=True), out], axis=1)


def panel_signature(columns: list[str], n_votes: int):
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema([ColSpec("string", "candidate")] + [ColSpec("string", c, required=False)
                                                        for c in ("question", "evidence", "item_id", "frame",
                                                                  "dataset")])
    outputs = Schema([ColSpec("string", "item_id")] + [ColSpec("double", c) for c in columns[:n_votes]]
                     + list(stacker_signature(columns).outputs.inputs))
    return ModelSignature(inputs=inputs, outputs=outputs)


def frame_configs() -> dict[str, dict]:
    """Every prompt frame under conf/frame, as plain data (baked into a panel model)."""
    import yaml

    out = {}
    for p in sorted((ROOT / "conf" / "frame").glob("*.yaml")):
        node = yaml.safe_load(p.read_text())
        if isinstance(node, dict) and node.get("name", p.stem) != "auto":
            out[p.stem] = node
    return out


def log_panel(roster: dict, stacker, columns: list[str], default_frame: str = "claim",
              cache_dir: str | Path | None = None, compute: bool = True, name: str = "panel"):
    """Log a :class:`PanelModel` (roster + frames + fitted stacker) in the active run; returns ``ModelInfo``."""
    from omegaconf import OmegaConf

    if not isinstance(roster, dict):
        roster = OmegaConf.to_container(roster, resolve=True)
    members = [m["name"] for m in roster["members"]]
    if list(columns[: stacker.n_votes or len(columns)]) != members:
        raise ValueError(f"the stacker's vote columns {columns} are not the roster's members {members}")
    frames = frame_configs()
    if default_frame not in frames:
        raise ValueError(f"default frame {default_frame!r} not among {sorted(frames)}")
    example = pd.DataFrame({"question": [""], "evidence": ["Paris is the capital of France."],
                            "candidate": ["The capital of France is Paris."]})
    return _log_pyfunc(name, PanelModel(roster, frames, default_frame, stacker, columns),
                       panel_signature(list(columns), stacker.n_votes or len(columns)), example,
                       model_config={"cache_dir": str(Path(cache_dir or ROOT / "verdicts/cache").resolve()),
                                     "compute": bool(compute)},
                       metadata={"roster": roster.get("name"), "members": members, "default_frame": default_frame})


def _log_pyfunc(name: str, model, signature, example: pd.DataFrame, **kwargs):
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=model,
        code_paths=[str(ROOT / "src")],  # pickled objects refer to src.* (the stacker, the judges): ship it
        signature=signature,
        input_example=example,
        pip_requirements=pip_requirements(),
        **kwargs,
    )


def stacker_signature(columns: list[str]):
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema([ColSpec("double", c, required=False) for c in columns])
    outputs = Schema([ColSpec("double", "p_hallucinated"), ColSpec("long", "verdict"), ColSpec("string", "label")])
    return ModelSignature(inputs=inputs, outputs=outputs)


def pip_requirements() -> list[str]:
    """Exact pins of what unpickling and running the models needs (inference of these is slow and wrong)."""
    import cloudpickle
    import sklearn

    import mlflow

    return [f"mlflow=={mlflow.__version__}", f"scikit-learn=={sklearn.__version__}", f"numpy=={np.__version__}",
            f"pandas=={pd.__version__}", f"scipy=={__import__('scipy').__version__}",
            f"cloudpickle=={cloudpickle.__version__}"]


def log_stacker(stacker, columns: list[str], example: pd.DataFrame | None = None, name: str = "stacker"):
    """Log a fitted stacker as a pyfunc model in the active run; returns MLflow's ``ModelInfo``."""
    if example is None:
        example = pd.DataFrame([[1.0] * len(columns), [0.0] * len(columns)], columns=columns)
    return _log_pyfunc(name, StackerModel(stacker, columns), stacker_signature(columns), example.head(5),
                       metadata={"columns": list(columns), "threshold": float(stacker.threshold)})


def main(argv: list[str] | None = None) -> int:
    """``python -m src.serve log-panel --roster tiny --stacker-uri models:/raim-stacker-wice@champion``."""
    import argparse

    from hydra import compose, initialize_config_dir

    from . import track

    ap = argparse.ArgumentParser(prog="python -m src.serve", description="log a panel pyfunc model")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("log-panel", help="roster + a logged stacker -> a panel model in a new run")
    p.add_argument("--roster", required=True)
    p.add_argument("--stacker-uri", required=True, help="a stacker model URI (models:/…, runs:/…)")
    p.add_argument("--default-frame", default="claim")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--no-compute", action="store_true", help="never score a cache miss (it abstains)")
    a = ap.parse_args(argv)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[f"roster={a.roster}"])
    track.setup(cfg)
    inner = mlflow.pyfunc.load_model(a.stacker_uri).unwrap_python_model()
    with track.start_run(cfg, "panel", tags={"stacker_uri": a.stacker_uri}) as run:
        info = log_panel(cfg.roster, inner.stacker, inner.columns, a.default_frame, a.cache_dir, not a.no_compute)
        mlflow.set_tag("panel_model_uri", info.model_uri)
    print(f"panel model {info.model_uri} (run {run.info.run_id})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
