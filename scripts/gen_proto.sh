#!/usr/bin/env bash
# Regenerate the protobuf/gRPC Python code from proto/ into OUT (default: the repo root).
# The generated files are committed; tests/test_generated_code.py checks they match proto/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root}
py=${PYTHON:-$root/.venv/bin/python}
cd "$root"
mkdir -p "$out/raftlog/pb" "$out/nameserver/pb"
"$py" -m grpc_tools.protoc -I proto --python_out="$out" --pyi_out="$out" \
  proto/raftlog/pb/entry.proto proto/nameserver/pb/state.proto
"$py" -m grpc_tools.protoc -I proto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  proto/nameserver/pb/api.proto proto/nameserver/pb/shards.proto
# The benchmark harness's trimmed etcd v3.4 API (proto/etcd): compiled under the virtual path
# bench/pb/etcd so the modules import as bench.pb.etcd.* (no top-level `etcd` package).
mkdir -p "$out/bench/pb/etcd/etcdserverpb" "$out/bench/pb/etcd/mvccpb"
"$py" -m grpc_tools.protoc -I bench/pb/etcd=proto/etcd --python_out="$out" --pyi_out="$out" \
  bench/pb/etcd/mvccpb/kv.proto
"$py" -m grpc_tools.protoc -I bench/pb/etcd=proto/etcd --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" bench/pb/etcd/etcdserverpb/rpc.proto
for d in raftlog/pb nameserver/pb bench/pb bench/pb/etcd bench/pb/etcd/etcdserverpb bench/pb/etcd/mvccpb; do
  [ -f "$out/$d/__init__.py" ] || printf '"""Generated protobuf code (scripts/gen_proto.sh); do not edit."""\n' > "$out/$d/__init__.py"
done
