"""A multi-host lab on one machine: namespaced nodes on a private bridge, each with its own
address, shaped link, memory cap and pinned core, running real meshnet components."""
