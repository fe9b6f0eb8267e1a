"""Vocabulary shared by every layer: ids, layer ranges, generation values, errors. Imports nothing of ours."""
