"""Every gRPC metadata key the nameserver, its clients and its tools send or read: one place, so a name
cannot drift between a sender and a reader.

Request metadata
    x-client-id, x-client-seq   exactly-once writes: who is writing, and its write number (client.py)
    authorization               "Bearer <token>" ([auth] tokens)
    x-rip18-forwarded           a follower forwarded this write or read index (honoured from peers only)
    x-rip18-session-owner       the original caller's session owner, on a forwarded write (peers only)
    x-rip18-forward-deadline-ms the forwarding node's deadline for the call, unix ms by its wall clock (on a
                                forwarded call, so from peers only: nameserver/api/rpc.py in_time)
    x-rip18-as-role             a peer acting for a less privileged caller (the remoting listener)
    x-rip18-worker-caller       a worker's client (address, certificate names) on the core's private socket
    x-rip18-read-replica        a read replica's public gRPC address, on its Log.Follow (nsctl status lists it)
    x-rip18-group               a group core's forwarded call: its Raft group, whose core the workers pass it to

Trailing metadata
    x-apply-offset              the node's apply offset, on a read it could not serve yet (and NOT_FOUND)
    x-current-version           a binding's version, on a failed compare-and-set
    x-log-to-offset             the offset a ReadLog stream was served up to
    x-log-first-kept            the first offset a node's log still holds (ReadLog OUT_OF_RANGE)
    x-rip18-core-offset         the core's apply offset, to its worker (which removes it)
"""

CLIENT_ID = "x-client-id"
CLIENT_SEQ = "x-client-seq"
AUTHORIZATION = "authorization"
FORWARDED = "x-rip18-forwarded"
SESSION_OWNER = "x-rip18-session-owner"
FORWARD_DEADLINE = "x-rip18-forward-deadline-ms"  # nameserver/core/forwarder.py sets it
AS_ROLE = "x-rip18-as-role"
WORKER_CALLER = "x-rip18-worker-caller"  # nameserver/api/corelink.py
READ_REPLICA = "x-rip18-read-replica"  # nameserver/api/logservice.py ReadReplicas
GROUP = "x-rip18-group"  # a group core's forwarded call: its Raft group (nameserver/core/forwarder.py)

APPLY_OFFSET = "x-apply-offset"
CURRENT_VERSION = "x-current-version"
LOG_TO_OFFSET = "x-log-to-offset"
LOG_FIRST_KEPT = "x-log-first-kept"
CORE_OFFSET = "x-rip18-core-offset"
