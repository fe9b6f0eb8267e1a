"""Generated from proto/meshnet/v1 by scripts/gen_proto.py. Do not edit."""
