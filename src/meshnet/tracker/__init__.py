"""The tracker: the control plane's node registry, pure route planning and durable work records."""
