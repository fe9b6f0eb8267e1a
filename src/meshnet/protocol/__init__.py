"""The shard wire protocol: generated code (never edited), typed frames, the single conversion
module (``convert``) and the error/status mapping (``status``)."""
