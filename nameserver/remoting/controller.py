"""Controller-port handlers: RocketMQ 5's controller request codes (RIP-44) as calls on the node's gRPC
Controller service, in-process, as the NameServer port's handlers call the NameServer service.

Headers and bodies have Apache RocketMQ's names and shapes (remoting/protocol/header/controller and
body/SyncStateSet, ElectMasterResponseBody, BrokerReplicasInfo). A decision the controller refuses is
answered with its own code (2000-2016) and remark; a call that failed (no leader, bad input) with the
NameServer port's mapping of gRPC statuses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from nameserver.config import NodeConfig
from nameserver.pb import api_pb2
from nameserver.remoting import bodies, codes, jsonfmt
from nameserver.remoting.bodies import BodyError
from nameserver.remoting.command import Command
from nameserver.remoting.handlers import parse_properties
from nameserver.remoting.request import RequestError, bool_field, dispatch, int_field, need, wants_fastjson
from nameserver.remoting.stockconfig import CONFIG_BLACK_LIST
from nameserver.state import settings

log = logging.getLogger("nameserver.remoting")


def sync_state_set_body(view: api_pb2.BrokerSetView, fastjson: bool = False) -> bytes:
    return jsonfmt.dumps({"syncStateSet": list(view.sync_state_set),
                          "syncStateSetEpoch": view.sync_state_set_epoch}, fastjson)


def master_header(view: api_pb2.BrokerSetView, epochs: bool = True) -> dict[str, str]:
    """masterBrokerId/masterAddress/masterEpoch(/syncStateSetEpoch); absent fields are Java nulls."""
    out: dict[str, str] = {}
    if view.master_id:
        out["masterBrokerId"] = str(view.master_id)
        out["masterAddress"] = view.master_address
    out["masterEpoch"] = str(view.master_epoch)
    if epochs:
        out["syncStateSetEpoch"] = str(view.sync_state_set_epoch)
    return out


def member_group(view: api_pb2.BrokerSetView) -> dict[str, Any]:
    return {"cluster": view.cluster_name, "brokerName": view.broker_name,
            "brokerAddrs": {r.broker_id: r.address for r in view.replicas}}


def _replica(view: api_pb2.BrokerSetView, r: api_pb2.ControllerReplicaView) -> dict[str, Any]:
    return {"brokerName": view.broker_name, "brokerId": r.broker_id, "brokerAddress": r.address, "alive": r.alive}


def replicas_info(views: list[api_pb2.BrokerSetView]) -> dict[str, Any]:
    """BrokerReplicasInfo: per set, the master and the replicas in and out of sync, with liveness."""
    table = {}
    for v in views:
        info: dict[str, Any] = {"masterEpoch": v.master_epoch, "syncStateSetEpoch": v.sync_state_set_epoch,
                                "inSyncReplicas": [_replica(v, r) for r in v.replicas if r.in_sync],
                                "notInSyncReplicas": [_replica(v, r) for r in v.replicas if not r.in_sync]}
        if v.master_id:
            info["masterBrokerId"] = v.master_id
            info["masterAddress"] = v.master_address
        table[v.broker_name] = info
    return {"replicasInfoTable": table}


def _ids(text: str, name: str) -> list[int]:
    try:
        return [int(part) for part in text.split(";") if part.strip()]
    except ValueError:
        # RocketMQ's remark for the same mistake (ReplicasInfoManager.cleanBrokerData)
        raise RequestError(2009, f"Please set the option <{name}> according to the format, exception: "
                                 f"java.lang.NumberFormatException: For input string: {text!r}") from None


class ControllerHandlers:
    def __init__(self, controller: Any, ns: Any, cfg: NodeConfig, timeout_s: float) -> None:
        self.ctl = controller  # the Controller service's calls, stub-style: ctl.ElectMaster(request, timeout=...)
        self.ns = ns  # the NameServer service's (the replicated settings)
        self.cfg = cfg
        self.timeout = timeout_s
        self._table: dict[int, Callable[[Command], Command]] = {
            codes.CONTROLLER_GET_METADATA_INFO: self.metadata,
            codes.CONTROLLER_GET_NEXT_BROKER_ID: self.next_broker_id,
            codes.CONTROLLER_APPLY_BROKER_ID: self.apply_broker_id,
            codes.CONTROLLER_REGISTER_BROKER: self.register_broker,
            codes.CONTROLLER_ELECT_MASTER: self.elect_master,
            codes.CONTROLLER_ALTER_SYNC_STATE_SET: self.alter_sync_state_set,
            codes.CONTROLLER_GET_REPLICA_INFO: self.replica_info,
            codes.CONTROLLER_GET_SYNC_STATE_DATA: self.sync_state_data,
            codes.CLEAN_BROKER_DATA: self.clean_broker_data,
            codes.BROKER_HEARTBEAT: self.heartbeat,
            codes.GET_CONTROLLER_CONFIG: self.get_config,
            codes.UPDATE_CONTROLLER_CONFIG: self.update_config,
        }

    @property
    def supported_codes(self) -> list[int]:
        return sorted(self._table)

    def handle(self, req: Command, conn: object | None = None) -> Command:
        return dispatch(self._table, req)

    def connection_closed(self, conn: object) -> None:
        """Brokers' liveness here is their heartbeats, not their connections (as RocketMQ's controller)."""

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        return method(request, timeout=self.timeout)

    @staticmethod
    def _answer(req: Command, reply: api_pb2.ControllerReply, ext: dict[str, str] | None = None,
                body: bytes = b"") -> Command:
        if reply.code != codes.SUCCESS:
            return req.response(reply.code, reply.remark, ext_fields=ext, body=body)
        return req.response(codes.SUCCESS, None, ext_fields=ext, body=body)

    # ---- where the leader is ---------------------------------------------------------------------

    def metadata(self, req: Command) -> Command:
        leader = self._call(self.ctl.GetLeader, api_pb2.ControllerLeaderRequest())
        ext = {"group": "rip18", "isLeader": "true" if leader.is_leader else "false",
               "peers": ";".join(leader.peers)}
        if leader.leader_address:
            ext["controllerLeaderId"] = leader.leader_id
            ext["controllerLeaderAddress"] = leader.leader_address
        return req.response(codes.SUCCESS, None, ext_fields=ext)

    # ---- registration ----------------------------------------------------------------------------

    def next_broker_id(self, req: Command) -> Command:
        cluster, name = req.ext("clusterName") or "", need(req, "brokerName")
        reply = self._call(self.ctl.GetNextBrokerId, api_pb2.BrokerSetRequest(cluster_name=cluster, broker_name=name))
        return req.response(codes.SUCCESS, None, ext_fields={"clusterName": cluster, "brokerName": name,
                                                             "nextBrokerId": str(reply.next_broker_id)})

    def apply_broker_id(self, req: Command) -> Command:
        cluster, name = req.ext("clusterName") or "", need(req, "brokerName")
        reply = self._call(self.ctl.ApplyBrokerId, api_pb2.ApplyBrokerIdRequest(
            cluster_name=cluster, broker_name=name, broker_id=int_field(req, "appliedBrokerId"),
            register_check_code=need(req, "registerCheckCode")))
        return self._answer(req, reply, {"clusterName": cluster, "brokerName": name})

    def register_broker(self, req: Command) -> Command:
        cluster, name = req.ext("clusterName") or "", need(req, "brokerName")
        reply = self._call(self.ctl.RegisterBroker, api_pb2.ControllerRegisterRequest(
            cluster_name=cluster, broker_name=name, broker_id=int_field(req, "brokerId"),
            broker_address=need(req, "brokerAddress")))
        ext = {"clusterName": cluster, "brokerName": name}
        if reply.code != codes.SUCCESS:
            return self._answer(req, reply, ext)
        view = reply.set
        master = next((r for r in view.replicas if r.broker_id == view.master_id), None)
        if master is not None and master.alive:  # the master, only while it heartbeats
            ext.update(master_header(view))
        return self._answer(req, reply, ext, sync_state_set_body(view, wants_fastjson(req)))

    # ---- election and in-sync replicas -----------------------------------------------------------

    def elect_master(self, req: Command) -> Command:
        reply = self._call(self.ctl.ElectMaster, api_pb2.ElectMasterRequest(
            cluster_name=req.ext("clusterName") or "", broker_name=need(req, "brokerName"),
            broker_id=int_field(req, "brokerId", -1), designate_elect=bool_field(req, "designateElect")))
        if reply.code not in (codes.SUCCESS, 2011) or not reply.HasField("set"):
            return self._answer(req, reply)
        view = reply.set
        body: dict[str, Any] = {"syncStateSet": list(view.sync_state_set)}
        if reply.code == codes.SUCCESS:
            body["brokerMemberGroup"] = member_group(view)
        return self._answer(req, reply, master_header(view), jsonfmt.dumps(body, wants_fastjson(req)))

    def alter_sync_state_set(self, req: Command) -> Command:
        doc = bodies.parse_json(req.body, "SyncStateSet")
        if not isinstance(doc, dict) or not isinstance(doc.get("syncStateSet"), list):
            raise BodyError("SyncStateSet body must be an object with a syncStateSet list")
        ids = doc["syncStateSet"]
        if not all(isinstance(i, int) and not isinstance(i, bool) and bodies.INT64[0] <= i <= bodies.INT64[1]
                   for i in ids):
            raise BodyError("SyncStateSet.syncStateSet must hold broker ids (integers)")
        reply = self._call(self.ctl.AlterSyncStateSet, api_pb2.AlterSyncStateSetRequest(
            broker_name=need(req, "brokerName"), master_id=int_field(req, "masterBrokerId"),
            master_epoch=int_field(req, "masterEpoch"), sync_state_set=ids,
            sync_state_set_epoch=bodies.int_value(doc, "syncStateSetEpoch", "SyncStateSet")))
        if reply.code != codes.SUCCESS:
            return self._answer(req, reply)
        return self._answer(req, reply, {"newSyncStateSetEpoch": str(reply.set.sync_state_set_epoch)},
                            sync_state_set_body(reply.set, wants_fastjson(req)))

    # ---- reads -----------------------------------------------------------------------------------

    def replica_info(self, req: Command) -> Command:
        reply = self._call(self.ctl.GetReplicaInfo, api_pb2.BrokerSetRequest(broker_name=need(req, "brokerName")))
        if reply.code != codes.SUCCESS:
            return self._answer(req, reply)
        return self._answer(req, reply, master_header(reply.set, epochs=False),
                            sync_state_set_body(reply.set, wants_fastjson(req)))

    def sync_state_data(self, req: Command) -> Command:
        names: list[str] = []
        if req.body:
            doc = bodies.parse_json(req.body, "broker name list")
            if not isinstance(doc, list) or not all(isinstance(n, str) for n in doc):
                raise BodyError("the body must be a JSON list of broker names")
            names = doc
        if not names:  # RocketMQ answers an empty request with an empty response
            return req.response(codes.SUCCESS, None)
        reply = self._call(self.ctl.ListBrokerSets, api_pb2.ListBrokerSetsRequest(broker_names=names))
        body = jsonfmt.dumps(replicas_info(list(reply.sets)), wants_fastjson(req))
        return req.response(codes.SUCCESS, None, body=body)

    # ---- administration --------------------------------------------------------------------------

    def clean_broker_data(self, req: Command) -> Command:
        reply = self._call(self.ctl.CleanBrokerData, api_pb2.CleanBrokerDataRequest(
            cluster_name=req.ext("clusterName") or "", broker_name=need(req, "brokerName"),
            broker_ids=_ids(req.ext("brokerControllerIdsToClean") or "", "brokerControllerIdsToClean"),
            clean_living_broker=bool_field(req, "isCleanLivingBroker")))
        return self._answer(req, reply)

    def heartbeat(self, req: Command) -> Command:
        if not req.ext("brokerId"):
            return req.response(codes.CONTROLLER_INVALID_REQUEST, "Heart beat with empty brokerId")
        self._call(self.ctl.Heartbeat, api_pb2.ControllerHeartbeatRequest(
            cluster_name=req.ext("clusterName") or "", broker_name=need(req, "brokerName"),
            broker_address=need(req, "brokerAddr"), broker_id=int_field(req, "brokerId"),
            epoch=int_field(req, "epoch", 0), max_offset=int_field(req, "maxOffset", 0),
            confirm_offset=int_field(req, "confirmOffset", 0), timeout_ms=int_field(req, "heartbeatTimeoutMills", 0),
            election_priority=int_field(req, "electionPriority", 0)))
        return req.response(codes.SUCCESS, "Heart beat success")

    def get_config(self, req: Command) -> Command:
        """This node's controller settings: its TOML's, and the replicated switches as the log has them."""
        replicated = self._call(self.ns.GetSettings, api_pb2.GetSettingsRequest()).settings
        props = {"controllerAddr": self.cfg.controller_addr, "controllerType": "rip18-raft",
                 "scanNotActiveBrokerInterval": str(self.cfg.controller_scan_interval_ms)}
        props |= {name: str(replicated[name]).lower() for name in settings.CONTROLLER_SETTINGS}
        text = "".join(f"{k}={v}\n" for k, v in props.items())
        return req.response(codes.SUCCESS, None, body=text.encode())

    def update_config(self, req: Command) -> Command:
        """enableElectUncleanMaster and notifyBrokerRoleChanged, replicated through the log (every controller
        node then decides alike; RocketMQ's controller changes only the one it was sent to). Anything else is
        a node-local setting in the node's TOML and is refused, naming it."""
        try:
            properties = parse_properties(req.body.decode("utf-8")) if req.body else {}
        except UnicodeDecodeError:
            raise RequestError(codes.SYSTEM_ERROR, "string2Properties error: the body is not UTF-8") from None
        if CONFIG_BLACK_LIST & properties.keys():
            raise RequestError(codes.NO_PERMISSION, "Can not update config in black list.")
        local = sorted(properties.keys() - set(settings.CONTROLLER_SETTINGS))
        if local:
            raise RequestError(codes.SYSTEM_ERROR, f"{local[0]!r} is not a replicated controller setting; they are "
                               f"{', '.join(settings.CONTROLLER_SETTINGS)} (the others are in the node's TOML, "
                               "[controller])")
        if properties:
            self._call(self.ns.UpdateSettings, api_pb2.UpdateSettingsRequest(settings=properties))
        return req.response()


__all__ = ["ControllerHandlers", "master_header", "member_group", "replicas_info", "sync_state_set_body"]
