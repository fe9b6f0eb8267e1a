"""Sessions on one shard: the KV/session table, pure scheduling and admission, the loop that owns a backend."""
