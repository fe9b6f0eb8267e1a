"""Model artifacts: safe GGUF parsing, architecture-aware range slicing, provenance, provisioning."""
