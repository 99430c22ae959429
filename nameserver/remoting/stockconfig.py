"""RocketMQ's NamesrvConfig keys (4.9.7 and 5.x) that are not replicated settings here, and what each is.

The stock NameServer's UPDATE_NAMESRV_CONFIG (318) takes any key: it sets those its NamesrvConfig (and
NettyServerConfig) has, ignores the rest, and refuses only its black list. So do we: a replicated
setting (nameserver/state/settings.py) goes through the log, a key below is accepted with a remark saying
it changes nothing here and why, any other key is accepted and ignored with a remark. GET_NAMESRV_CONFIG
(319) lists every key below, with this node's value where it has one and RocketMQ's default otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nameserver.config import NodeConfig
from nameserver.safetext import shown
from nameserver.state import settings

# RocketMQ 5's DefaultRequestProcessor refuses a 318 naming one of these with NO_PERMISSION (its
# configBlackList field's default, plus rocketmqHome, which it always adds).
CONFIG_BLACK_LIST = frozenset({"configBlackList", "configStorePath", "kvConfigPath", "rocketmqHome"})


@dataclass(frozen=True)
class StockKey:
    value: Callable[[NodeConfig], str]  # what 319 shows: this node's value, else RocketMQ's default
    here: str  # why setting it changes nothing here (318's remark)


def _stock(default: str) -> Callable[[NodeConfig], str]:
    return lambda cfg: default


_THREADS = "a stock NameServer's thread pool; here [grpc] workers and [node] worker_processes in the TOML"
_START_WAIT = "a stock NameServer's wait for brokers after its start; not configurable here"

STOCK_KEYS: dict[str, StockKey] = {
    # Black-listed: refused before anything else. We keep no such directory or file (the KV table is in
    # the Raft log), so 319 shows them empty; and it never shows a file path.
    "rocketmqHome": StockKey(_stock(""), "black-listed"),
    "kvConfigPath": StockKey(_stock(""), "black-listed"),
    "configStorePath": StockKey(_stock(""), "black-listed"),
    "configBlackList": StockKey(lambda cfg: ";".join(sorted(CONFIG_BLACK_LIST)), "black-listed"),
    "productEnvName": StockKey(_stock("center"), "the environment clusterTest asks; nothing here reads it"),
    "clusterTest": StockKey(_stock("false"), "a stock NameServer's route lookup in a test environment; "
                            "not here"),
    "clientRequestThreadPoolNums": StockKey(_stock("8"), _THREADS),
    "defaultThreadPoolNums": StockKey(_stock("16"), _THREADS),
    "clientRequestThreadPoolQueueCapacity": StockKey(_stock("50000"), _THREADS),
    "defaultThreadPoolQueueCapacity": StockKey(_stock("10000"), _THREADS),
    "unRegisterBrokerQueueCapacity": StockKey(_stock("3000"), "unregistrations go through the Raft log here"),
    "scanNotActiveBrokerInterval": StockKey(lambda cfg: str(cfg.scan_interval_ms),
                                            "node-local: [liveness] scan_interval_ms in the TOML"),
    "enableControllerInNamesrv": StockKey(lambda cfg: "true" if cfg.controller_addr else "false",
                                          "node-local: [controller] listen in the TOML"),
    "needWaitForService": StockKey(_stock("false"), _START_WAIT),
    "waitSecondsForService": StockKey(_stock("45"), _START_WAIT),
}

REMARK_NAMES = 8  # names listed per kind in a 318 remark; the rest are counted


def stock_values(cfg: NodeConfig) -> dict[str, str]:
    """319's lines for the stock keys that are not replicated settings."""
    return {name: key.value(cfg) for name, key in STOCK_KEYS.items() if name not in settings.SETTINGS}


def split_update(keys: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """A 318's keys as (replicated settings, stock keys without effect here, keys RocketMQ does not know)."""
    replicated, no_effect, unknown = [], [], []
    for name in sorted(keys):
        if name in settings.SETTINGS:
            replicated.append(name)
        elif name in STOCK_KEYS:
            no_effect.append(name)
        else:
            unknown.append(name)
    return replicated, no_effect, unknown


def update_remark(no_effect: list[str], unknown: list[str]) -> str | None:
    """318's remark on SUCCESS: the keys that changed nothing here, and why. None when every key was applied,
    as RocketMQ answers (mqadmin prints no remark of a success anyway)."""
    parts = []
    if no_effect:
        parts.append("accepted, no effect here: " + _names(
            [f"{name} ({STOCK_KEYS[name].here})" for name in no_effect]))
    if unknown:
        parts.append("accepted and ignored, not a NamesrvConfig key: " + _names([shown(n, 64) for n in unknown]))
    return "; ".join(parts) or None


def _names(names: list[str]) -> str:
    more = len(names) - REMARK_NAMES
    return ", ".join(names[:REMARK_NAMES]) + (f" and {more} more" if more > 0 else "")
