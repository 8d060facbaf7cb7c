"""The verdict cache keeps one folder per dataset (src/judges/cache.py): judging one set never writes to the files
another set's verdicts were read from; a cache in the earlier one-file-per-judge layout is refused with the
command that splits it, and the split moves every record byte for byte."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from src.io.datasets import read_items
from src.io.paths import dataset_cache_folder, dataset_folder
from src.judges import cache
from src.judges.runner import verdict_table

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "judges" / "mini.jsonl"
LEXICAL = {
    "name": "t",
    "members": [
        {
            "name": "lex",
            "family": "x",
            "backend": {"_target_": "src.judges.backends.nonllm.LexicalSupportBackend", "threshold": 0.6},
        }
    ],
}


def _items(dataset: str):
    items = read_items(MINI)
    items["dataset"] = dataset
    items["item_id"] = dataset + "-" + items["item_id"]
    return items


def test_judging_a_second_set_leaves_the_first_sets_file_untouched(tmp_path):
    verdict_table(LEXICAL, _items("alpha"), None, tmp_path, compute=True, progress=False)
    (first,) = (tmp_path / "alpha" / "lex").glob("*.jsonl")
    before = first.read_bytes()
    t = verdict_table(LEXICAL, _items("beta"), None, tmp_path, compute=True, progress=False)
    assert first.read_bytes() == before
    (second,) = (tmp_path / "beta" / "lex").glob("*.jsonl")
    assert len(second.read_text().splitlines()) == len(t) and t.attrs["report"]["lex"]["computed"] == len(t)
    assert second.with_suffix(".identity.json").exists()
    # reading both sets at once: each item from its own folder, nothing computed again
    both = verdict_table(LEXICAL, pd.concat([_items("alpha"), _items("beta")], ignore_index=True), None, tmp_path)
    assert both.attrs["report"]["lex"]["cached"] == 2 * len(t)
    assert both.attrs["report"]["lex"]["cache"]["records"] == 2 * len(t)


@pytest.mark.parametrize(
    "name, folder",
    [("medhallu", "medhallu"), ("my-set_2.v1", "my-set_2.v1"), ("", "items"), (None, "items")],
)
def test_a_plain_dataset_name_is_its_folder(name, folder):
    assert dataset_folder(name) == folder


@pytest.mark.parametrize("name", ["../../etc", "a/b", ".hidden", "two words", "é", "x" * 65])
def test_any_other_dataset_text_becomes_a_digest_inside_the_root(name):
    folder = dataset_folder(name)
    assert folder.startswith("ds-") and "/" not in folder and folder == dataset_folder(name)


def _legacy(root: Path) -> dict[str, list[bytes]]:
    """A cache in the one-file-per-judge layout: the two sets' records interleaved in one file per judge."""
    verdict_table(LEXICAL, _items("alpha"), None, root / "new", compute=True, progress=False)
    verdict_table(LEXICAL, _items("beta"), None, root / "new", compute=True, progress=False)
    parts = {ds: next((root / "new" / ds / "lex").glob("*.jsonl")) for ds in ("alpha", "beta")}
    lines = {ds: p.read_bytes().splitlines(keepends=True) for ds, p in parts.items()}
    old = root / "old" / "lex" / parts["alpha"].name
    old.parent.mkdir(parents=True)
    old.write_bytes(b"".join(x for pair in zip(lines["alpha"], lines["beta"]) for x in pair))
    old.with_suffix(".identity.json").write_bytes(parts["alpha"].with_suffix(".identity.json").read_bytes())
    return lines


def test_a_legacy_cache_is_refused_with_the_command_that_splits_it(tmp_path):
    _legacy(tmp_path)
    with pytest.raises(cache.CacheLayoutError, match=r"one-file-per-judge layout .*--split-cache --cache-dir"):
        verdict_table(LEXICAL, _items("alpha"), None, tmp_path / "old", compute=False, progress=False)


def test_the_split_moves_every_record_byte_for_byte_in_order(tmp_path):
    lines = _legacy(tmp_path)
    moved = cache.split_by_dataset(tmp_path / "old")
    assert list(moved.values()) == [{"alpha": len(lines["alpha"]), "beta": len(lines["beta"])}]
    for ds in ("alpha", "beta"):
        (part,) = (tmp_path / "old" / ds / "lex").glob("*.jsonl")
        assert part.read_bytes().splitlines(keepends=True) == lines[ds]
        assert part.with_suffix(".identity.json").exists()
    assert not (tmp_path / "old" / "lex").exists()
    t = verdict_table(LEXICAL, _items("alpha"), None, tmp_path / "old", compute=False, progress=False)
    assert t.attrs["report"]["lex"]["cached"] == len(lines["alpha"])
    assert cache.split_by_dataset(tmp_path / "old") == {}  # a second split finds nothing to do


@pytest.mark.parametrize(
    "damage, why", [(b'{"key": "x", "vo', "torn last record"), (b"not json\n", r"line \d+: not JSON")]
)
def test_a_damaged_legacy_file_stops_the_split_before_anything_is_written(tmp_path, damage, why):
    _legacy(tmp_path)
    (old,) = (tmp_path / "old" / "lex").glob("*.jsonl")
    with open(old, "ab") as fh:
        fh.write(damage)
    before = old.read_bytes()
    with pytest.raises(cache.RaimError, match=why):
        cache.split_by_dataset(tmp_path / "old")
    assert old.read_bytes() == before and not (tmp_path / "old" / "alpha").exists()


def test_the_split_never_overwrites_a_dataset_folders_file(tmp_path):
    _legacy(tmp_path)
    (old,) = (tmp_path / "old" / "lex").glob("*.jsonl")
    clash = tmp_path / "old" / "alpha" / "lex" / old.name
    clash.parent.mkdir(parents=True)
    clash.write_bytes(b"")
    with pytest.raises(cache.RaimError, match="exists already"):
        cache.split_by_dataset(tmp_path / "old")
    assert old.exists()


def test_the_split_command_is_one_line(tmp_path):
    _legacy(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "src.judges", "--split-cache", "--cache-dir", str(tmp_path / "old")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == f"1 cache files split by dataset under {tmp_path / 'old'}"


def test_building_a_set_makes_its_cache_folder(tmp_path):
    """The folder the set's DVC `verdicts` stage depends on exists before the set is judged."""
    folder = dataset_cache_folder(tmp_path, "newbench")
    assert folder == tmp_path / "newbench" and "Verdicts of dataset newbench" in (folder / "README.md").read_text()
    (folder / "README.md").write_text("kept")
    dataset_cache_folder(tmp_path, "newbench")
    assert (folder / "README.md").read_text() == "kept"


def test_each_verdicts_stage_depends_on_its_own_datasets_folder_only():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    deps = stages["verdicts"]["do"]["deps"]
    assert "${paths.cache_dir}/${key}" in deps and "${paths.cache_dir}" not in deps
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in stages["balance"]["do"]["outs"]]
    assert "${paths.cache_dir}/${key}/README.md" in outs


def test_the_committed_cache_is_in_the_per_dataset_layout():
    root = ROOT / "verdicts" / "cache"
    cache.check_layout(root)
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    for stage in lock:
        if stage.startswith("verdicts@"):
            assert (root / stage.split("@")[1] / "README.md").is_file()
