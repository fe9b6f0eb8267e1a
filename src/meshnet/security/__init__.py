"""Swarm identity and integrity: the swarm CA, node certificates, invites, publisher signatures.

The only home of the `cryptography` package (an import-linter contract enforces it); every other
layer asks this one for PEM bytes, fingerprints and verdicts.
"""
