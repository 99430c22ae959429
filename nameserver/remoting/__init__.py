"""RocketMQ remoting protocol compatibility: a TCP listener (default port 9876) that speaks RocketMQ's
frame format and serves the nameserver request codes by calling this node's gRPC service in-process.

    frame.py, header.py, command.py   the wire: frames, JSON and ROCKETMQ binary headers
    jsonfmt.py, bodies.py             body shapes in fastjson's or standard JSON
    registerbody.py                   RegisterBrokerBody (plain or compressed) and its CRC
    handlers.py, status.py            request code -> service call; gRPC status -> response code
    server.py                         the asyncio TCP server (start()/stop())
    oneway.py, minbroker.py           what we push to brokers' own addresses; 905 NOTIFY_MIN_BROKER_ID_CHANGE
"""

from nameserver.remoting.server import RemotingServer

__all__ = ["RemotingServer"]
