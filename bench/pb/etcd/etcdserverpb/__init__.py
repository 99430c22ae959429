"""Generated protobuf code (scripts/gen_proto.sh); do not edit."""
