"""Python client library of the RIP-18 nameserver (reference: docs/client.md).

- Client: typed calls; follows the leader for writes, spreads reads, retries UNAVAILABLE and unknown
  outcomes with backoff and jitter (exactly-once through client id + sequence), deadlines on every
  call, read-your-writes inside one client.
- RouteCache: topic routes fed by Watch, with a periodic pull as fallback (or pull only).
- BrokerAgent, BrokerFleet: register, heartbeat, re-register on a DataVersion change, unregister.
- QueueSelector, LatencyFaultTolerance: producer queue selection with latency fault tolerance.
- Credentials: TLS files and a bearer token for a secured cluster (nsctl uses the same).
"""

from nameserver.client.agent import AgentStats, BrokerAgent, BrokerFleet, BrokerIdentity, topic_config
from nameserver.client.client import Client, register_chunks
from nameserver.client.credentials import Credentials
from nameserver.client.endpoints import EndpointPool, parse_endpoints
from nameserver.client.errors import NameServerError
from nameserver.client.faults import LatencyFaultTolerance, not_available_duration
from nameserver.client.producer import NoRouteError, QueueSelector, RouteSource, SendFailed
from nameserver.client.retry import RETRYABLE_CODES, Deadline, RetryPolicy
from nameserver.client.routes import MessageQueue, RouteCache, TopicRouteView

__all__ = [
    "AgentStats",
    "BrokerAgent",
    "BrokerFleet",
    "BrokerIdentity",
    "Client",
    "Credentials",
    "Deadline",
    "EndpointPool",
    "LatencyFaultTolerance",
    "MessageQueue",
    "NameServerError",
    "NoRouteError",
    "QueueSelector",
    "RETRYABLE_CODES",
    "RetryPolicy",
    "RouteCache",
    "RouteSource",
    "SendFailed",
    "TopicRouteView",
    "not_available_duration",
    "parse_endpoints",
    "register_chunks",
    "topic_config",
]
