"""meshnet: serve one GGUF language model across several machines, a layer range per shard."""

__version__ = "0.1.0"
