"""Stock RocketMQ's rule for NOTIFY_MIN_BROKER_ID_CHANGE (RouteInfoManager.registerBroker, unRegisterBroker,
chooseBrokerAddrsToNotify), applied to one change of a broker set (nameserver/remoting/minbroker.py)."""

from __future__ import annotations

from nameserver.pb import state_pb2
from nameserver.remoting import codes
from nameserver.remoting.minbroker import MinIdChange, min_id_change, notice


def broker_set(ids: dict[int, str], acting: bool = True) -> state_pb2.BrokerData:
    bd = state_pb2.BrokerData(cluster="c", broker_name="b", enable_acting_master=acting)
    for bid in sorted(ids):
        bd.addrs.add(broker_id=bid, addr=ids[bid])
    return bd


def test_a_lower_id_registering_tells_the_others() -> None:
    assert min_id_change(broker_set({1: "s1", 2: "s2"}), broker_set({0: "m", 1: "s1", 2: "s2"})) == \
        MinIdChange(0, "m", "", ("s1", "s2"))
    # as stock, whatever the set's enableActingMaster
    assert min_id_change(broker_set({1: "s1"}, False), broker_set({0: "m", 1: "s1"}, False)) == \
        MinIdChange(0, "m", "", ("s1",))


def test_a_slave_turned_master_alone_is_told_itself() -> None:
    # the same address registers as id 0: stock drops its old id first; a set of one tells that one
    assert min_id_change(broker_set({1: "x"}), broker_set({0: "x"})) == MinIdChange(0, "x", "", ("x",))


def test_the_lowest_leaving_tells_the_rest_in_acting_master_sets_only() -> None:
    assert min_id_change(broker_set({0: "m", 1: "s1", 2: "s2"}), broker_set({1: "s1", 2: "s2"})) == \
        MinIdChange(1, "s1", "m", ("s1", "s2"))
    assert min_id_change(broker_set({0: "m", 1: "s1"}, False), broker_set({1: "s1"}, False)) is None


def test_no_change_of_the_lowest_id_tells_no_one() -> None:
    assert min_id_change(None, broker_set({1: "s1"})) is None  # a new set
    assert min_id_change(broker_set({0: "m"}), None) is None  # the last one left
    assert min_id_change(broker_set({0: "m", 1: "s1"}), broker_set({0: "m"})) is None  # a slave left
    assert min_id_change(broker_set({0: "m"}), broker_set({0: "m2"})) is None  # id 0 at a new address
    assert min_id_change(broker_set({0: "m"}), broker_set({0: "m", 1: "s1"})) is None  # a slave joined


def test_the_header_is_stocks() -> None:
    cmd = notice(MinIdChange(1, "s1", "m", ("s1",)), "")
    assert (cmd.code, cmd.is_oneway) == (codes.NOTIFY_MIN_BROKER_ID_CHANGE, True)
    assert cmd.ext_fields == {"minBrokerId": "1", "minBrokerAddr": "s1", "offlineBrokerAddr": "m"}
    assert notice(MinIdChange(0, "m", "", ("s1",)), "h:10912").ext_fields == \
        {"minBrokerId": "0", "minBrokerAddr": "m", "haBrokerAddr": "h:10912"}


def test_the_notifier_reads_each_applied_change_as_the_apply_makes_it() -> None:
    """MinBrokerIdNotifier.on_changes, fed an entry's changes as the apply makes them ((offset, type, key, old, new)
    tuples): a broker set's change tells the addresses this node holds; other records and a setting off, none."""
    from nameserver.remoting.minbroker import MinBrokerIdNotifier
    from nameserver.state import keys
    sent: list[tuple[str, dict[str, str], str]] = []
    notifier = MinBrokerIdNotifier(lambda addr: addr != "s2")
    notifier._sender.stop()
    notifier._sender = type("Sender", (), {"send": lambda self, addr, cmd, what: sent.append((addr, cmd.ext_fields,
                                                                                             what))})()

    class State:
        on = True

        def setting_on(self, name: str, default: bool) -> bool:
            return self.on

        def broker_live(self, addr: str) -> None:
            return None

    before, after = broker_set({1: "s1", 2: "s2"}).SerializeToString(), broker_set({0: "m", 1: "s1", 2: "s2"})
    changes = [(7, keys.TOPIC_TYPE, keys.topic_key("T", "b"), None, b"q"),
               (7, keys.BROKER_TYPE, keys.broker_key("b"), before, after.SerializeToString())]
    state = State()
    notifier.on_changes(changes, state)
    assert sent == [("s1", {"minBrokerId": "0", "minBrokerAddr": "m"}, "broker set b's lowest broker id 0 (m)")]
    state.on = False
    notifier.on_changes(changes, state)
    assert len(sent) == 1
