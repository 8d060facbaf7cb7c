"""The judges' backends: llama.cpp (the CPU default), transformers, vLLM, OpenAI-compatible servers, Anthropic's
API (the frontier judge) and the non-LLM judges, each turning one rendered item into a verdict record."""
