"""Metrics exposition (Prometheus) and timing helpers shared by workers and the gateway."""
