"""Real benchmarks -> balanced binary items (paper §2, Appendix J, Tables 18-20).

Every benchmark is reduced to items with the columns of ``ITEM_COLUMNS``; ``gold``
is 0 for a supported candidate and 1 for a hallucinated/unsupported one. Two
constructions (Table 18):

* matched pairs (MedHallu, RAGTruth, TruthfulQA, FActScore): one supported and one
  hallucinated candidate per source record, sharing question, evidence and cluster;
* pooled claims (WiCE, XSum, CNN/DM, ExpertQA, TRIVIA+): classes pooled across
  documents and the majority subsampled to the minority count (seed 0), the
  cluster being the shared document.

A dataset is a spec, ``conf/dataset/<name>.yaml`` (``name``, ``title``, ``frame``,
``paper_n`` and a ``builder`` node, instantiated only through an allow-list of RAIM's builders): either
:class:`Fields`, a field mapping over one JSON / JSON Lines / CSV / Parquet file, or
:class:`Registered`, a builder written in Python (ExpertQA, RAGTruth, FActScore).
Raw paths are relative to the raw roots, searched in order: the shipped snapshot
(``--raw-dir``, ``RAIM_RAW_DIR``) then the user's folder (``--own-dir``).

Output is deterministic: the same raw files and seed give the same bytes.
``python -m src.data --raw-dir DIR --own-dir DIR --out-dir OUT`` writes
``OUT/<name>.jsonl`` and ``OUT/summary/<name>.json`` (the Table 18 columns) per set.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.core.errors import ArgumentParser, RaimError, one_line
from src.core.textfiles import normal_id
from src.io.benchmarks import Registered
from src.io.builders import BINARY, ITEM_COLUMNS, Builder, DatasetError, Fields, _native, _to_frame
from src.io.config import Targets, check_keys, load_yaml, plain, refuse_interpolation
from src.io.files import atomic_write_text
from src.io.hub import HUB
from src.io.paths import conf_group, dataset_cache_folder
from src.io.raw import Duplicates, RawFilesMissing, RawRecordError, _found, _searched, raw_roots, read_jsonl

CONF_DIR = conf_group("dataset")
SHIPPED_DIR, OWN_DIR = "data/shipped", "data/own"

BUILDERS_ALLOWED = Targets("dataset builder", Fields, Registered, module=__name__)
"""The builders a dataset spec may name: a field mapping (:class:`Fields`) or a registered Python builder."""


# --------------------------------------------------------------------------- dataset specs


def _spec_dir(spec_dir: str | Path | None) -> Path:
    return CONF_DIR if spec_dir is None else Path(spec_dir)


@dataclass(frozen=True)
class DatasetSpec:
    """The keys of a dataset spec: a builder spec (``name``, ``title``, ``frame``, ``paper_n``, ``builder``) or a
    list spec (``name`` and ``datasets``, a list of names or a mapping name → raw folder)."""

    name: str | None = None
    title: str | None = None
    frame: str | None = None
    paper_n: int | None = None
    builder: dict | None = None
    datasets: list[str] | dict[str, str] | None = None


# The one interpolation a list spec's raw folders may hold: another path of the composed config (no resolver).
_PATH_REF = re.compile(r"\$\{paths\.[A-Za-z_]+\}")


def check_spec(spec: Any, where: str) -> dict:
    """A dataset spec checked before anything is built: its keys (:class:`DatasetSpec`), no interpolation or
    resolver anywhere (``${oc.env:…}`` would read the environment), except ``${paths.<key>}`` in a list spec's
    raw folders; the builder node's target and keys (:data:`BUILDERS_ALLOWED`) are checked when it is built."""
    if not isinstance(spec, Mapping):
        raise DatasetError(f"{where}: a dataset spec is a mapping (name, title, frame, paper_n, builder)")
    check_keys(DatasetSpec, spec, where)
    folders = spec.get("datasets")
    rest = {k: v for k, v in spec.items() if k != "datasets"}
    refuse_interpolation(rest, where)
    if isinstance(folders, Mapping):
        for k, v in folders.items():
            refuse_interpolation(_PATH_REF.sub("", v) if isinstance(v, str) else v, where, f"datasets.{k}")
    else:
        refuse_interpolation(folders, where, "datasets")
    return dict(spec)


def _load_spec(path: Path) -> dict:
    """``path`` as a checked dataset spec: bounded (size, depth, aliases) before it is parsed, read without
    resolving anything, then :func:`check_spec`."""
    try:
        spec = plain(load_yaml(path), False)
    except RaimError as err:
        raise DatasetError(str(err)) from None
    except Exception as err:  # YAML syntax, a key the YAML reader refuses (null)
        raise DatasetError(f"{path}: unreadable dataset spec ({' '.join(str(err).split())[:300]})") from None
    try:
        return check_spec(spec, str(path))
    except RaimError as err:
        raise DatasetError(str(err)) from None


def dataset_names(spec_dir: str | Path | None = None) -> list[str]:
    """The buildable datasets: specs in ``spec_dir`` with a ``builder`` (a list such as ``all`` has none)."""
    return sorted(p.stem for p in _spec_dir(spec_dir).glob("*.yaml") if "builder" in _load_spec(p))


def dataset_spec(name: str, spec_dir: str | Path | None = None) -> dict:
    """``<spec_dir>/<name>.yaml`` (default conf/dataset) as a dict."""
    path = _spec_dir(spec_dir) / f"{name}.yaml"
    if not name or Path(name).name != name or not path.is_file():
        raise DatasetError(
            f"unknown dataset {name!r}: no spec {path}; datasets: {', '.join(dataset_names(spec_dir)) or 'none'}"
        )
    spec = _load_spec(path)
    if spec.get("name", name) != name:
        raise DatasetError(f"{path}: name {spec['name']!r} differs from the file name {name!r}")
    return spec


def _builder(spec: Mapping, path: Path) -> Builder:
    """The spec's ``builder`` node instantiated through :data:`BUILDERS_ALLOWED`: its ``_target_`` is compared with
    RAIM's builders as a string and every key with the builder's signature before anything is imported or called;
    nested nodes are data; no interpolation is resolved."""

    node = spec.get("builder")
    if not isinstance(node, Mapping) or "_target_" not in node:
        raise DatasetError(f"{path}: no `builder` node with a `_target_` ({', '.join(BUILDERS_ALLOWED.classes)})")
    try:
        return BUILDERS_ALLOWED.instantiate(node, f"{path}: builder", interpolation=False)
    except RawRecordError:
        raise
    except RaimError as err:
        msg = " ".join(str(err).split())
        raise DatasetError(msg if msg.startswith(f"{path}: builder") else f"{path}: builder: {msg}") from None


def builder_for(name: str, spec_dir: str | Path | None = None) -> Builder:
    """The builder of dataset ``name``, from its spec."""
    return _builder(dataset_spec(name, spec_dir), _spec_dir(spec_dir) / f"{name}.yaml")


def _absent(builder: Builder, roots: Sequence[Path]) -> list[str]:
    return [p for p in builder.files if _found(roots, p) is None]


def missing_files(
    name: str, raw_dir: str | Path | Sequence[str | Path], spec_dir: str | Path | None = None
) -> list[str]:
    """The raw file patterns of ``name`` found in none of the raw roots ``raw_dir``."""
    return _absent(builder_for(name, spec_dir), raw_roots(raw_dir))


def _missing(name: str, builder: Builder, pattern: str, roots: Sequence[Path]) -> RawFilesMissing:
    return RawFilesMissing(
        f"{name}: expected raw file {pattern} is absent from {_searched(roots)}; "
        f"public source: {builder.public or 'not stated'}"
    )


def fetch_hub(name: str, raw_dir: str | Path, spec_dir: str | Path | None = None) -> None:
    """Materialise ``name``'s raw files under ``raw_dir`` from the Hugging Face hub."""
    builder = builder_for(name, spec_dir)
    if builder.hub is None:
        raise DatasetError(
            f"{name}: no Hugging Face copy of the published raw files is known; "
            f"download them from {builder.public} into {Path(raw_dir)} and use source='local'"
        )
    HUB[builder.hub](Path(raw_dir))


# --------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class Built:
    """One dataset's items with its spec, builder and duplicate report."""

    items: pd.DataFrame
    spec: Mapping[str, Any]
    builder: Builder
    duplicates: Duplicates | None

    def summary(self) -> dict[str, Any]:
        """Table 18 columns, the spec's title and paper n, and the duplicates dropped (null: not checked,
        a Python builder)."""
        dups = self.duplicates
        out = {
            **summarize(self.items),
            "title": self.spec.get("title"),
            "frame": self.spec["frame"],
            "construction": self.builder.construction,
            "paper_n": self.spec.get("paper_n"),
            "duplicates": None if dups is None else {"count": dups.count, "first": dups.first},
        }
        if getattr(self.builder, "on_bad_record", "error") == "drop":  # (with `error` there is none: it stops)
            bad = self.builder.dropped
            out["bad_records"] = {"policy": "drop", "count": bad.count, "first": bad.first}
        return out


def build_dataset(
    name: str,
    raw_dir: str | Path | Sequence[str | Path],
    seed: int = 0,
    source: str = "local",
    spec_dir: str | Path | None = None,
) -> Built:
    """Balanced binary items for dataset ``name`` from the raw roots ``raw_dir`` (searched in order).

    ``source='hub'`` first downloads the published files from the Hugging Face hub into the
    last root (the user's folder; needs ``datasets`` and network).
    """
    spec, roots = dataset_spec(name, spec_dir), raw_roots(raw_dir)
    path = _spec_dir(spec_dir) / f"{name}.yaml"
    builder = _builder(spec, path)
    if source == "hub":
        fetch_hub(name, roots[-1], spec_dir)
    elif source != "local":
        raise DatasetError(f"source must be 'local' or 'hub', not {source!r}")
    if "frame" not in spec:
        raise DatasetError(f"{path}: no `frame` (the frame its items are judged in, conf/frame/)")
    absent = _absent(builder, roots)
    if absent:
        raise _missing(name, builder, absent[0], roots)
    try:
        items, dups = builder.items(name, spec["frame"], roots, seed)
        df = _to_frame(items)
    except RawRecordError:
        raise
    except ValueError as err:  # one class empty, no items
        raise DatasetError(f"{name}: {err}") from None
    if dups is not None and dups.count:
        print(
            f"{name}: {dups.count} duplicate record(s) dropped, the first kept: {'; '.join(dups.first)}"
            + (" …" if dups.count > len(dups.first) else ""),
            file=sys.stderr,
        )
    bad = getattr(builder, "dropped", None)
    if bad is not None and bad.count:
        print(
            f"{name}: {bad.count} bad record(s) dropped (on_bad_record: drop): {'; '.join(bad.first)}"
            + (" …" if bad.count > len(bad.first) else ""),
            file=sys.stderr,
        )
    return Built(df, spec, builder, dups)


def build(
    name: str,
    raw_dir: str | Path | Sequence[str | Path],
    seed: int = 0,
    source: str = "local",
    spec_dir: str | Path | None = None,
) -> pd.DataFrame:
    """Balanced binary items for ``name`` (columns ``ITEM_COLUMNS`` [+ extras]); see :func:`build_dataset`."""
    return build_dataset(name, raw_dir, seed, source, spec_dir).items


def _json_cell(value: Any) -> Any:
    """A cell as JSON holds it: a NaN (how pandas holds a missing number) is null."""
    value = _native(value)
    return None if isinstance(value, float) and np.isnan(value) else value


def write_items(df: pd.DataFrame, path: str | Path) -> None:
    """JSON Lines, keys in column order, rows sorted by item_id: byte-identical per input."""
    if tuple(df.columns[: len(ITEM_COLUMNS)]) != ITEM_COLUMNS:
        raise ValueError(f"columns must start with {ITEM_COLUMNS}, got {tuple(df.columns)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = df.sort_values("item_id", kind="stable").to_dict("records")
    try:
        text = "".join(
            json.dumps({k: _json_cell(v) for k, v in row.items()}, ensure_ascii=False, allow_nan=False) + "\n"
            for row in rows
        )
    except ValueError as err:  # an infinity: JSON has none (json would write a bare Infinity token)
        raise DatasetError(f"{path}: an item holds a value JSON cannot represent ({err})") from None
    atomic_write_text(path, text)


def read_items(path: str | Path) -> pd.DataFrame:
    """Read ``write_items`` output; a bad line raises RawRecordError (file, line, field)."""
    path = Path(path)
    recs = read_jsonl(path, path.parent)
    first: dict[str, str] = {}
    for r in recs:
        for col in ITEM_COLUMNS:
            r.raw(col)
        r.label("gold", BINARY)
        item_id = normal_id(r.text("item_id"))
        if item_id in first:
            raise RawRecordError(r.where, "item_id", f"duplicate value {item_id!r} (first at {first[item_id]})")
        first[item_id] = r.where
    return _to_frame([{**r.data, **{k: normal_id(str(r.data[k])) for k in ("item_id", "cluster_id")}} for r in recs])


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Table 18 columns: items, clusters, items per cluster, class balance."""
    sizes = df.groupby("cluster_id").size()
    n_hal = int(df["gold"].sum())
    return {
        "n": len(df),
        "n_clusters": int(len(sizes)),
        "items_per_cluster": round(float(sizes.mean()), 4),
        "max_cluster": int(sizes.max()),
        "n_supported": len(df) - n_hal,
        "n_hallucinated": n_hal,
        "hallucinated_share": round(n_hal / len(df), 4),
    }


def _selection(names: Sequence[str] | None, spec_dir: str | Path | None) -> list[tuple[str, bool]]:
    """(name, strict) per dataset to build: every spec by default; a list spec (``all``) gives
    its members; a dataset named itself is strict (absent raw files are an error, not a skip)."""
    if not names:
        return [(n, False) for n in dataset_names(spec_dir)]
    unknown = [n for n in names if not n or Path(n).name != n or not (_spec_dir(spec_dir) / f"{n}.yaml").is_file()]
    if unknown:
        raise DatasetError(
            f"unknown dataset(s) {unknown}; dataset specs in {_spec_dir(spec_dir)}: "
            f"{', '.join(dataset_names(spec_dir)) or 'none'}"
        )
    out: dict[str, bool] = {}
    for n in names:
        spec = dataset_spec(n, spec_dir)
        members = [(m, False) for m in spec.get("datasets") or []] if "builder" not in spec else [(n, True)]
        if not members:
            raise DatasetError(f"{_spec_dir(spec_dir) / f'{n}.yaml'}: neither a `builder` nor a `datasets` list")
        for m, strict in members:
            out[m] = out.get(m, False) or strict
    return list(out.items())


def build_all(
    raw_dir: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    names: Sequence[str] | None = None,
    seed: int = 0,
    source: str = "local",
    own_dir: str | Path | None = None,
    spec_dir: str | Path | None = None,
) -> dict[str, dict]:
    """Write ``<out_dir>/<name>.jsonl`` and ``<out_dir>/summary/<name>.json`` per dataset.

    Raw roots: ``raw_dir`` then ``own_dir``; at least one must exist (your own set builds before the shipped
    snapshot is imported). Without ``names`` every spec is built and those whose raw files are absent are
    skipped with a line; a dataset named itself must be present.
    """
    roots, wanted = raw_roots(raw_dir, own_dir), _selection(names, spec_dir)
    if source == "local" and not any(r.is_dir() for r in roots):
        raise RaimError(
            f"raw data folder {', '.join(map(str, roots))} not found (--raw-dir, or RAIM_RAW_DIR; --own-dir)"
        )
    todo = []
    for name, strict in wanted:
        builder = builder_for(name, spec_dir)
        absent = _absent(builder, roots) if source == "local" else []
        if absent and strict:
            raise _missing(name, builder, absent[0], roots)
        if absent:
            print(
                f"skip {name}: raw files absent ({', '.join(absent)} in {_searched(roots)}); "
                f"public source: {builder.public or 'not stated'}",
                file=sys.stderr,
            )
        else:
            todo.append(name)
    if not todo:
        raise RaimError(
            f"no dataset could be built from {_searched(roots)}: every raw file is absent (see the lines above)"
        )
    out, summary = Path(out_dir), {}
    for name in todo:
        built = build_dataset(name, roots, seed, source, spec_dir)
        write_items(built.items, out / f"{name}.jsonl")
        summary[name] = built.summary()
        atomic_write_text(out / "summary" / f"{name}.json", json.dumps(summary[name], indent=2, sort_keys=True) + "\n")
    return summary


@one_line
def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m src.data", description="Build balanced binary items (Appendix J, Table 18).")
    ap.add_argument(
        "--raw-dir",
        default=os.environ.get("RAIM_RAW_DIR", SHIPPED_DIR),
        help=f"the shipped raw snapshot, searched first (default: RAIM_RAW_DIR or {SHIPPED_DIR})",
    )
    ap.add_argument("--own-dir", default=OWN_DIR, help=f"your own raw files, searched second (default {OWN_DIR})")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument(
        "--datasets",
        default="",
        help="comma-separated names or list specs such as `all` (default: every spec, absent ones skipped)",
    )
    ap.add_argument("--spec-dir", default=str(CONF_DIR), help="where <name>.yaml dataset specs are read")
    ap.add_argument(
        "--cache-dir",
        default=None,
        help="also make each built set's folder of this verdict cache (with its README), as the pipeline does",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=("local", "hub"), default="local")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()] or None
    summary = build_all(args.raw_dir, args.out_dir, names, args.seed, args.source, args.own_dir, args.spec_dir)
    for name, s in summary.items():
        if args.cache_dir:
            dataset_cache_folder(args.cache_dir, name)
        dups = f" duplicates={s['duplicates']['count']}" if s["duplicates"] else ""
        dups += f" bad_records_dropped={s['bad_records']['count']}" if "bad_records" in s else ""
        print(
            f"{name:11s} n={s['n']:5d} clusters={s['n_clusters']:5d} per_cluster={s['items_per_cluster']:.2f} "
            f"balance={s['n_supported']}/{s['n_hallucinated']}{dups}"
        )
    return 0


def read_dataset(items_dir: Path, name: str) -> pd.DataFrame:
    """The balanced items of dataset ``name`` (``<items_dir>/<name>.jsonl``, written by ``python -m src.data``)."""
    path = items_dir / f"{name}.jsonl"
    if not path.exists():
        raise DatasetError(
            f"{path} not found: build the items first (python -m src.data --raw-dir <raw> --out-dir {items_dir})"
        )
    return read_items(path)
