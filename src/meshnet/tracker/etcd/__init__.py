"""Tracker state in etcd: several tracker replicas sharing one swarm's records (``--store etcd://``)."""
