"""Serving one request on the swarm: drive it along a route of shards, fail over, audit and bill it."""
