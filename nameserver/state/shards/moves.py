"""The directory's writes and a broker set's move between groups, as translations (docs/scaling.md,
"Sharding": moving a set).

Directory writes (assign, pin, begin and finish a move) are translated against group 0's state, where the
directory is; the copy and the opening against the target group's state; the drop against the source
group's. Each step is idempotent (an empty translation when already done), so a leader killed at any point
resumes by running the steps again:

  1. begin_move: the directory says the set is `moving_to` the target (the router refuses its writes)
  2. fence_set:  the source group's own shard/<name> record says so too (in group 0, step 1's record is
                 it). Every write of the set in its group is guarded by that record (guard_set_writes): one
                 translated before the fence applies fails its precondition, so nothing of the set is
                 accepted by the source once the fence is in its log, whatever its directory replica said
  3. copy_set:   the set's records, as the source holds them at or after its fence, written to the target
                 in one batch
  4. finish_move: the directory names the target, `since` the copy's offset there (reads switch to it)
  5. open_set:   in a target k >= 1: a record naming the group itself (replacing the tombstone or fence
                 of a set that had left it before, which until then refuses the set's writes, so nothing is
                 written there that a copy run again would delete); a copy refuses an opened target
  6. drop_set:   the set's records deleted from the source, its fence turned into a tombstone

A group's own shard/<name> record places the set for that group's writes (in group 0 it is the directory's
record): absent, the group takes them (the set was assigned here and never left); a fence (`moving_to`)
or a record naming another group (a tombstone: the set left) refuses them; a record naming the group
itself (step 5) takes them again. It is never deleted, and each step that changes it changes its version,
which every write of the set is guarded by: a write translated before the set left, however late it
reaches the log (after the drop, or after a move back), is a no-op there.

A set's records here are its NameServer records (broker/, topic/, live/, filter/). Its controller record
(ctrl/<name>, RIP-44) is never one of them: every controller record is group 0's, whichever group holds the
set's routes, so no step reads, copies or drops it, a write of it is no set's write (no guard, no
precondition on the set's shard/ record), and a group k >= 1 takes none (docs/scaling.md, "Controller mode
with groups").

Bad input raises ValidationError naming the field, and nothing is written.
"""

from __future__ import annotations

from nameserver.errors import ValidationError
from nameserver.pb import state_pb2
from nameserver.state import keys
from nameserver.state.metadata import MetadataState
from nameserver.state.shards.directory import GROUP0, default_group
from nameserver.state.translate import RecordBuilder, Translation
from raftlog.pb import entry_pb2


class SetMoving(Exception):
    """A write of a set that is moving between groups: refused, the sender retries (to `target` once the
    move is done: the router then sends it there)."""

    doing = "is moving to"

    def __init__(self, broker_name: str, target: int) -> None:
        super().__init__(f"broker set {broker_name!r} {self.doing} group {target}: retry")
        self.broker_name = broker_name
        self.target = target


class SetMoved(SetMoving):
    """A write of a set this group no longer holds (its shard/ record names `target`: a tombstone, or in
    group 0 the directory): refused as a SetMoving is; the sender's router sends its retry to `target`."""

    doing = "moved to"


def refusal(state: MetadataState, group: int, broker_name: str) -> SetMoving | None:
    """Why group `group` (whose state this is) takes no write of the set now, or None when it takes them:
    its shard/ record is a fence (SetMoving) or names another group (SetMoved)."""
    found = state.directory.entry(broker_name)
    if found is None:
        return None
    if found.HasField("moving_to"):
        return SetMoving(broker_name, found.moving_to)
    return SetMoved(broker_name, found.group) if found.group != group else None


def tombstoned(state: MetadataState, group: int, broker_name: str) -> bool:
    """Group `group`'s record of the set says the set moved out of it (in group 0: the directory places it
    in another group, no move under way)."""
    found = state.directory.entry(broker_name)
    return found is not None and not found.HasField("moving_to") and found.group != group


def check_group(group: int, groups: int) -> None:
    """`group` names one of `groups` groups, else a ValidationError naming the field."""
    if not 0 <= group < groups:
        raise ValidationError("group", f"{group} is not a group of this cluster (0 to {groups - 1})")


def _in_group0(state: MetadataState, broker_name: str) -> bool:
    """The set has NameServer records in this (group 0's) state: a set registered before the cluster had
    groups. Its controller record does not count: every set's is group 0's, wherever its routes are."""
    return state.broker_data(broker_name) is not None


def _write(state: MetadataState, broker_name: str, value: state_pb2.ShardSet) -> Translation:
    b = RecordBuilder(state)
    key = keys.shard_key(broker_name)
    b.require(key)
    b.put(keys.SHARD_TYPE, key, value)
    return b.build()


def assign_set(state: MetadataState, broker_name: str, cluster: str, groups: int) -> Translation:
    """A set's directory record before its first records are written (the router's AssignFirst): the
    default group by its name's hash, or group 0 when group 0 already holds it. Empty when assigned."""
    if state.directory.assigned(broker_name):
        return Translation()
    b = RecordBuilder(state)
    # group 0 must still hold (or not hold) the set's records when this applies
    b.require(keys.broker_key(broker_name))
    group = GROUP0 if _in_group0(state, broker_name) else default_group(broker_name, groups)
    key = keys.shard_key(broker_name)
    b.require(key)
    b.put(keys.SHARD_TYPE, key, state_pb2.ShardSet(group=group, cluster=cluster))
    return b.build()


def pin_set(state: MetadataState, broker_name: str, group: int, groups: int) -> Translation:
    """An operator's choice of a set's group (`nsctl shard assign`, through Admin.AssignSet): before its first
    registration, or marking the group it is in. A set held elsewhere is moved, not pinned."""
    check_group(group, groups)
    found = state.directory.entry(broker_name)
    current = found.group if found is not None else GROUP0 if _in_group0(state, broker_name) else None
    if found is not None and found.HasField("moving_to"):
        raise ValidationError("broker_name", f"set {broker_name!r} is moving to group {found.moving_to}")
    if current is not None and current != group:
        raise ValidationError("group", f"set {broker_name!r} is in group {current}: move it instead")
    value = found if found is not None else state_pb2.ShardSet(group=group)
    value.pinned = True
    return _write(state, broker_name, value)


def begin_move(state: MetadataState, broker_name: str, target: int, groups: int) -> Translation:
    """Step 1: the set is moving to `target`. Empty when it already is."""
    check_group(target, groups)
    found = state.directory.entry(broker_name)
    if found is None:
        if not _in_group0(state, broker_name):
            raise ValidationError("broker_name", f"no broker set {broker_name!r}")
        found = state_pb2.ShardSet(group=GROUP0)
    if found.HasField("moving_to"):
        if found.moving_to == target:
            return Translation()
        raise ValidationError("group", f"set {broker_name!r} is already moving to group {found.moving_to}")
    if found.group == target:
        raise ValidationError("group", f"set {broker_name!r} is in group {target} already")
    found.moving_to = target
    return _write(state, broker_name, found)


def finish_move(state: MetadataState, broker_name: str, target: int, since: int) -> Translation:
    """Step 4: the set is `target`'s from its offset `since` (where its copy applied; a duty resumed after
    its copy applied, whose copy step was then empty, passes the target's offset now: later, so as safe).
    Empty when done."""
    found = state.directory.entry(broker_name)
    if found is not None and not found.HasField("moving_to") and found.group == target and found.since == since:
        return Translation()
    if found is None or not found.HasField("moving_to") or found.moving_to != target:
        raise ValidationError("broker_name", f"set {broker_name!r} is not moving to group {target}")
    if since < 1:
        raise ValidationError("since", f"the copy's offset must be positive: {since}")
    found.group = target
    found.ClearField("moving_to")
    found.since = since
    return _write(state, broker_name, found)


def fence_set(source: MetadataState, broker_name: str, source_group: int, target: int) -> Translation:
    """Step 2, in the source group: its shard/<name> record saying the set moves to `target` (in group 0
    the directory's record of step 1 is the fence already). Empty when fenced."""
    if source.directory.moving_to(broker_name) == target:
        return Translation()
    return _write(source, broker_name, state_pb2.ShardSet(group=source_group, moving_to=target))


def sets_written(state: MetadataState, tr: Translation) -> set[str]:
    """The broker sets whose records a translation writes: named by its broker/ and topic/ keys, and by the
    set a live/ or filter/ address is registered under (before, and after for a live/ put). A ctrl/ key
    names none: controller records are group 0's, not a set's group's, and stay there when it moves."""
    names: set[str] = set()
    for rec in tr.batch.records:
        key = rec.key
        name: str | None = None
        if key.startswith(keys.BROKER_PREFIX):
            name = keys.parse_broker_key(key)
        elif key.startswith(keys.TOPIC_PREFIX):
            parsed = keys.parse_topic_key(key)
            name = parsed[1] if parsed is not None else None
        elif key.startswith((keys.LIVE_PREFIX, keys.FILTER_PREFIX)):
            addr = keys.parse_live_key(key) or keys.parse_filter_key(key)
            live = state.broker_live(addr) if addr else None
            name = live.broker_name if live is not None else None
            if rec.op == entry_pb2.OP_PUT and key.startswith(keys.LIVE_PREFIX):
                names.add(state_pb2.BrokerLive.FromString(rec.value).broker_name)
        if name:
            names.add(name)
    return names


def guard_set_writes(state: MetadataState, tr: Translation, group: int) -> Translation:
    """Any write in group `group` (whose state this is), with several groups: SetMoving when it writes
    records of a set fenced here, SetMoved of one moved out (refusal); else guarded by each written set's
    shard/ record keeping its version now (0: absent), so a fence or tombstone applied between translation
    and apply turns the write into a no-op whose retry is refused. A controller record (ctrl/) is no set's
    (group 0's alone): refused in a group k >= 1 (ValidationError), unguarded in group 0."""
    if group != GROUP0:
        for rec in tr.batch.records:
            if rec.key.startswith(keys.CONTROLLER_PREFIX):
                raise ValidationError("broker_name", f"controller record {rec.key[:80]!r} is group 0's, not group "
                                                     f"{group}'s: controller calls are served by group 0's core")
    written = sets_written(state, tr)
    for name in sorted(written):
        refused = refusal(state, group, name)
        if refused is not None:
            raise refused
    for name in sorted(written):
        key = keys.shard_key(name)
        tr.batch.preconditions.add(key=key, version=state.kv.version(key))
    return tr


# The records a move's steps write: a set's (set_keys) and its shard/ record; nothing else (KV, settings,
# bindings, sessions, members and controller records are group 0's and never move).
STEP_PREFIXES = (keys.BROKER_PREFIX, keys.TOPIC_PREFIX, keys.LIVE_PREFIX, keys.FILTER_PREFIX, keys.SHARD_PREFIX)


def check_step(batch: entry_pb2.Batch) -> None:
    """A step a group core is asked to propose as it is (Admin.ProposeStep): records a move writes, each
    typed by its key's prefix and a put or a delete; else ValidationError naming the record's field, so
    nothing else enters the group's log that way."""
    if not batch.records:
        raise ValidationError("batch", "a step writes records")
    for i, rec in enumerate(batch.records):
        field = f"batch.records[{i}]"
        if not rec.key.startswith(STEP_PREFIXES):
            raise ValidationError(f"{field}.key", f"{rec.key[:80]!r} is not a record a move writes")
        if rec.type != keys.record_type_of(rec.key):
            raise ValidationError(f"{field}.type", f"{rec.type} is not the type of {rec.key[:80]!r}")
        if rec.op not in (entry_pb2.OP_PUT, entry_pb2.OP_DELETE):
            raise ValidationError(f"{field}.op", f"unknown op {rec.op}")


def set_keys(state: MetadataState, broker_name: str) -> list[str]:
    """Every key of one set's records in a group's state: broker/ by its name, its queue datas, the live/
    and filter/ records of the addresses registered under it. Sorted. Not its ctrl/ record: group 0's
    whichever group holds the set, it is never copied or dropped by a move."""
    found = [keys.broker_key(broker_name)]
    found += [keys.topic_key(topic, broker_name) for topic in state.broker_topics(broker_name)]
    for addr, live, _version in state.live_addrs():
        if live.broker_name == broker_name:
            found += [keys.live_key(addr), keys.filter_key(addr)]
    return sorted(key for key in found if key in state.kv)


def opened(state: MetadataState, group: int, broker_name: str) -> bool:
    """Group `group` (whose state this is) has taken the set as its own: its shard/ record names the group
    itself (step 5; in group 0 the directory names group 0, no move under way), or, in group 0, there is
    no record at all. A copy into such a group would overwrite the set's writes taken there since."""
    found = state.directory.entry(broker_name)
    if found is None:
        return group == GROUP0
    return not found.HasField("moving_to") and found.group == group


def copy_set(source: MetadataState, target: MetadataState, target_group: int, broker_name: str) -> Translation:
    """Step 3, in the target group: the set's records as the source holds them (a record the target holds
    of the set and the source does not, left by an earlier copy, is deleted). Empty when equal.

    Decided from a read of the target, it requires the target's shard/<name> record and every key it
    writes or deletes at the versions read: a copy decided from a stale read (a driver that did not see
    the move finish) is a no-op at apply instead of deleting what the target took after the finish. A
    target that has taken the set as its own (`opened`) is refused outright (ValidationError)."""
    if opened(target, target_group, broker_name):
        raise ValidationError("group", f"group {target_group} holds set {broker_name!r} as its own: "
                                       "a copy there would overwrite its writes")
    b = RecordBuilder(target)
    wanted = set_keys(source, broker_name)
    for key in wanted:
        value = source.kv.get(key)
        assert value is not None  # set_keys lists only held keys
        b.require(key)
        b.put_value(keys.record_type_of(key), key, value)
    for key in set_keys(target, broker_name):
        if key not in wanted:
            b.require(key)
            b.delete(keys.record_type_of(key), key)
    b.require(keys.shard_key(broker_name))
    return b.build()


def open_set(target: MetadataState, group0: MetadataState, target_group: int, broker_name: str) -> Translation:
    """Step 5, in the target group k >= 1 once group 0's directory (`group0`) names it: the record the set
    left there before (a tombstone, or the fence of a move out whose drop never ran) replaced by one naming
    the group, so the set's writes are taken there again (at a new version of the record: a write
    translated before the set left stays refused). Empty when the target takes the set's writes already
    (it is open already; group 0 is always: the directory's record is its own).

    Run in every target k >= 1, also one the set never left (no record there): once open, the target's
    record names it, which a copy decided from a stale read is refused by (copy_set), and its new version
    fails such a copy's precondition."""
    directory = group0.directory
    if directory.group_of(broker_name) != target_group or directory.moving_to(broker_name) is not None:
        raise ValidationError("broker_name", f"set {broker_name!r} has not moved to group {target_group}")
    if target_group == GROUP0 or opened(target, target_group, broker_name):
        return Translation()
    return _write(target, broker_name, state_pb2.ShardSet(group=target_group))


def drop_set(source: MetadataState, group0: MetadataState, source_group: int, broker_name: str) -> Translation:
    """Step 6, in the source group: delete the set's records and turn its fence into a tombstone (its
    shard/ record naming the group that holds the set: it refuses the set's writes from now on; in group
    0 the directory's record does so), once group 0's directory (`group0`) names another group and no move
    of it is under way. Empty when the records are gone and the tombstone is there."""
    directory = group0.directory
    if directory.group_of(broker_name) == source_group or directory.moving_to(broker_name) is not None:
        raise ValidationError("broker_name", f"set {broker_name!r} has not moved out of group {source_group}")
    b = RecordBuilder(source)
    for key in set_keys(source, broker_name):
        b.delete(keys.record_type_of(key), key)
    if source_group != GROUP0 and not tombstoned(source, source_group, broker_name):
        b.put(keys.SHARD_TYPE, keys.shard_key(broker_name), state_pb2.ShardSet(group=directory.group_of(broker_name)))
    return b.build()
