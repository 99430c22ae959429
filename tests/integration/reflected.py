"""What a generic gRPC tool (grpcurl) makes of a listener: the services its server reflection lists, each
one's descriptors resolved from reflection alone, and one call of each, which must be answered (any status
but UNIMPLEMENTED: a refusal by auth or by a field's check is the service answering)."""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from nameserver.api.auth import CONTROLLER_SERVICE
from nameserver.pb import api_pb2, shards_pb2

NAMESERVER, ADMIN, LOG = (api_pb2.DESCRIPTOR.services_by_name[s].full_name for s in ("NameServer", "Admin", "Log"))
SHARDS = shards_pb2.DESCRIPTOR.services_by_name["Shards"].full_name
HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# What a node's core answers on its listener (the public one without workers, else its private socket; a group
# k core serves no Controller), and what a worker answers (a sharded node's: Shards too).
CORE_SERVICES = frozenset({NAMESERVER, ADMIN, CONTROLLER_SERVICE, LOG, HEALTH, reflection.SERVICE_NAME})
WORKER_SERVICES = CORE_SERVICES
SHARDED_WORKER_SERVICES = WORKER_SERVICES | {SHARDS}
# The call made of each service: a read, or one refused for its empty request, changing nothing.
_PROBES = {NAMESERVER: "GetTopicList", ADMIN: "Status", CONTROLLER_SERVICE: "GetLeader", LOG: "DigestAt",
           HEALTH: "Check", reflection.SERVICE_NAME: "ServerReflectionInfo", SHARDS: "ListShards"}


def listed_and_answering(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> set[str]:
    """The services `channel`'s listener lists by reflection, after calling one method of each (found by
    reflection alone) and checking it answered; `metadata`: sent on each call."""
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    pool = descriptor_pool.DescriptorPool(db)  # a fresh pool: nothing known but what reflection says
    for name in sorted(services):
        method = pool.FindServiceByName(name).methods_by_name[_PROBES[name]]
        request = message_factory.GetMessageClass(method.input_type)
        reply = message_factory.GetMessageClass(method.output_type)
        path = f"/{name}/{method.name}"
        try:
            if method.client_streaming:  # reflection's one stream: list the services
                call = channel.stream_stream(path, request_serializer=request.SerializeToString,
                                             response_deserializer=reply.FromString)
                listed = next(call(iter([request(list_services="")]), timeout=10, metadata=metadata))
                assert {s.name for s in listed.list_services_response.service} == services
            else:
                channel.unary_unary(path, request_serializer=request.SerializeToString,
                                    response_deserializer=reply.FromString)(request(), timeout=10, metadata=metadata)
        except grpc.RpcError as err:
            assert err.code() != grpc.StatusCode.UNIMPLEMENTED, (path, err.details())
    return services
