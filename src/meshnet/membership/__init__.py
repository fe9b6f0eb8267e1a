"""A node's or client's standing with the tracker: the tracker client, registration and heartbeats,
joining with an invite and renewing certificates."""
