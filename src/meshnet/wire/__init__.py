"""The wire protocols: generated code (never edited, imported only in this package), typed frames
(``frames``), one conversion module per proto file (``shard_wire``, ``tracker_wire``), the gRPC
service names servers and clients use (``services``) and the error/status mapping (``status``)."""
