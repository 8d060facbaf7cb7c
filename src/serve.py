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

    def __init__(self, stacker, columns: list[str]):
        self.stacker = stacker
        self.columns = list(columns)

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return stacked_output(self.stacker, vote_matrix(model_input, self.columns, self.stacker.n_votes))


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
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=StackerModel(stacker, columns),
        code_paths=[str(ROOT / "src")],  # the pickled stacker refers to src.aggregate: ship it with the model
        signature=stacker_signature(columns),
        input_example=example.head(5),
        pip_requirements=pip_requirements(),
        metadata={"columns": list(columns), "threshold": float(stacker.threshold)},
    )
