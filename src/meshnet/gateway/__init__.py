"""OpenAI-compatible HTTP gateway: chat/text completions with SSE streaming and live telemetry.

Public entry points: ``create_app`` (app.py), ``GatewayConfig`` (config.py), ``serve_gateway``
(server.py), and the ports the rest of meshnet implements (ports.py).
"""
