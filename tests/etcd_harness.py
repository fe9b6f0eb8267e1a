"""Tests that need a real etcd skip, saying why, where it is not installed (``make etcd``)."""

from __future__ import annotations

import pytest

from meshnet.deploy.etcd_cluster import ETCD

needs_etcd = pytest.mark.skipif(ETCD is None, reason="etcd is not installed (make etcd: Debian's etcd-server)")
