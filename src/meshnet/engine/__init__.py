"""Execution of one layer range: the Backend protocol, the llama.cpp backend, a fake backend, sampling, tokenizer."""
