"""Clients of shards and the tracker: session streams, the route driver, failover."""
