"""The public Python API (``from src import …``), without Hydra or MLflow: the package docstring's example runs."""

from __future__ import annotations

import subprocess
import sys

import src


def test_every_public_name_resolves_and_the_version_is_the_packages():
    for name in src.__all__:
        assert getattr(src, name) is not None
    assert src.__version__ == "0.2.0"
    assert "load_verdicts" in dir(src)


def test_the_docstring_example_on_a_simulated_table(tmp_path):
    path = tmp_path / "verdicts.csv"
    src.simulate_panel(n_clusters=150, accuracies=[0.8, 0.75, 0.7, 0.7, 0.65], seed=1).to_csv(path, index=False)
    table = src.load_verdicts(path)
    settings = src.LadderSettings(n_boot=200)
    results = src.analyze(table, src.StackedLogit(), settings)
    for r in results.values():
        assert isinstance(r.summary["admissibility"]["admissible"], bool)
        assert src.decide(r.summary).label


def test_importing_the_package_imports_neither_sklearn_nor_mlflow():
    code = "import sys, src; print(any(m.split('.')[0] in ('sklearn', 'mlflow', 'pandas') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
