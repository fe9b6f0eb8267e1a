"""The shard worker process: gRPC servicer (thin), shard runtime, server lifecycle, registration."""
