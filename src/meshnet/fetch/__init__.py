"""The artifact plane's client: find holders through the tracker, fetch verified byte ranges from
them and assemble a slice; a node fetches only what it serves."""
