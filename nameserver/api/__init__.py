"""The node's API: thin gRPC services over the core (NameServer, Admin, Log; the Controller's is in
nameserver/controller), the wrapper every method goes through (nameserver/api/rpc.py: errors to statuses,
deadlines, the forwarding mark, exactly-once identity), authorization (auth.py), and the in-process stub
through which the RocketMQ remoting ports call the same methods without a loopback hop (inprocess.py)."""

from nameserver.api.adminservice import AdminService
from nameserver.api.inprocess import InProcessStub
from nameserver.api.logservice import LogService
from nameserver.api.service import NameServerService

__all__ = ["AdminService", "InProcessStub", "LogService", "NameServerService"]
