"""Replicated settings: RocketMQ NamesrvConfig switches that change what the registry answers.

They are set at run time through the log (UPDATE_NAMESRV_CONFIG on the remoting port, UpdateSettings over
gRPC), so every node answers alike and a change survives restarts; stock RocketMQ applies such a change to
one node's memory and file only. Node-local settings (addresses, timings, limits) stay in the node's TOML.

A setting never written takes its default: RocketMQ's, except where the node's TOML names one
(orderMessageEnable: [routes] order_message_enable; the controller's two: [controller]), so a TOML-only
deployment behaves as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nameserver.errors import ValidationError

ORDER_MESSAGE_ENABLE = "orderMessageEnable"
RETURN_ORDER_TOPIC_CONFIG_TO_BROKER = "returnOrderTopicConfigToBroker"
ENABLE_ALL_TOPIC_LIST = "enableAllTopicList"
ENABLE_TOPIC_LIST = "enableTopicList"
DELETE_TOPIC_WITH_BROKER_REGISTRATION = "deleteTopicWithBrokerRegistration"
SUPPORT_ACTING_MASTER = "supportActingMaster"
NOTIFY_MIN_BROKER_ID_CHANGED = "notifyMinBrokerIdChanged"
# Controller mode's switches (RocketMQ's ControllerConfig; docs/controller.md), replicated the same way.
ENABLE_ELECT_UNCLEAN_MASTER = "enableElectUncleanMaster"
NOTIFY_BROKER_ROLE_CHANGED = "notifyBrokerRoleChanged"
CONTROLLER_SETTINGS = (ENABLE_ELECT_UNCLEAN_MASTER, NOTIFY_BROKER_ROLE_CHANGED)


@dataclass(frozen=True)
class Setting:
    default: bool
    effect: str  # what it changes (docs and the error listing the known settings)


SETTINGS: dict[str, Setting] = {
    ORDER_MESSAGE_ENABLE: Setting(False, "routes carry orderTopicConf from the ORDER_TOPIC_CONFIG namespace"),
    RETURN_ORDER_TOPIC_CONFIG_TO_BROKER: Setting(True, "registration replies carry the ORDER_TOPIC_CONFIG table"),
    ENABLE_ALL_TOPIC_LIST: Setting(True, "the list of all topics (206, GetTopicList ALL) is served"),
    ENABLE_TOPIC_LIST: Setting(True, "topic lists by cluster and the unit lists (224, 311-313) are served"),
    DELETE_TOPIC_WITH_BROKER_REGISTRATION: Setting(
        False, "a master's changed registration removes its topics it no longer lists"),
    SUPPORT_ACTING_MASTER: Setting(
        False, "routes show a master-less acting group's lowest-id slave as broker id 0"),
    NOTIFY_MIN_BROKER_ID_CHANGED: Setting(
        False, "a broker set's members are sent 905 when the set's lowest broker id changes"),
    ENABLE_ELECT_UNCLEAN_MASTER: Setting(
        False, "controller mode elects outside the in-sync replicas when none of them is alive"),
    NOTIFY_BROKER_ROLE_CHANGED: Setting(True, "controller mode pushes each election to the set's brokers"),
}


def canonical_values(values: Mapping[str, str]) -> dict[str, str]:
    """The stored form of each value ("true"/"false"); ValidationError on the field `settings`, quoting the
    name, for an unknown name or a value that is not a boolean."""
    if not values:
        raise ValidationError("settings", "empty: name at least one setting")
    out = {}
    for name in sorted(values):
        quoted = repr(name[:64])
        if name not in SETTINGS:
            raise ValidationError("settings", f"{quoted} is not a replicated setting; they are "
                                  f"{', '.join(sorted(SETTINGS))} (node-local settings are in the node's TOML file)")
        text = values[name].strip().lower()
        if text not in ("true", "false"):
            raise ValidationError("settings", f"{quoted} takes true or false, got {values[name][:64]!r}")
        out[name] = text
    return out


def node_defaults(order_message_enable: bool, elect_unclean_master: bool, notify_broker_role_changed: bool
                  ) -> dict[str, bool]:
    """The defaults a node's TOML gives ([routes] order_message_enable, [controller]); the log's value wins."""
    return {ORDER_MESSAGE_ENABLE: order_message_enable, ENABLE_ELECT_UNCLEAN_MASTER: elect_unclean_master,
            NOTIFY_BROKER_ROLE_CHANGED: notify_broker_role_changed}


def effective(stored: Mapping[str, str], defaults: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """Every setting's value: the log's, else the node's default (`defaults`, from its TOML), else RocketMQ's."""
    out = {}
    for name, s in SETTINGS.items():
        default = (defaults or {}).get(name, s.default)
        value = stored.get(name)
        out[name] = default if value is None else value == "true"
    return out
