"""The injection detector's recall on the written attack sets (data/injection/) by the study's protocol — every attack
planted in every study item (40 medhallu + 40 expertqa, conf/injection) — for the detector of a given commit and for
the working tree's, side by side: how the rules did before they were changed, and now.

    python scripts/injection_recall.py a426b1f     # the commit that added the held-out set, before any rule change
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir

from src.core import detector
from src.core import injection as inj
from src.io.paths import CONF_DIR, ROOT
from src.studies.injection import items as study_items


def detector_at(commit: str):
    """src/core/injection.py as it was at ``commit`` (where the detector lived before src/core/detector.py), loaded
    as a module of its own."""
    text = subprocess.run(
        ["git", "show", f"{commit}:src/core/injection.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "injection_then.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("injection_then", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["injection_then"] = mod
    spec.loader.exec_module(mod)
    return mod


def main(commit: str) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["roster=cpu", "injection.heldout_draws=0"])
    recs = [r for cell in study_items.cells(cfg).values() for r in cell["items"]["clean"].to_dict("records")]
    for name in ("dev", "heldout"):
        attacks = study_items.written_set(ROOT / "data" / "injection" / f"{name}.jsonl")
        for label, mod in ((commit, detector_at(commit)), ("now", detector)):
            hits = np.array([[mod.scan(inj.plant(r, a)).flagged for r in recs] for a in attacks])
            print(
                f"{name} set, detector {label}: {int(hits.sum())}/{hits.size} (attack, item) pairs flagged "
                f"= {hits.mean():.3f}; attacks flagged in most items: {int((hits.mean(1) > 0.5).sum())}/{len(attacks)}"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "a426b1f")
