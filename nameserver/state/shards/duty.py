"""The move duty: group 0's leader moving a broker set between groups (docs/scaling.md, "Sharding").

A decider in the style of KRaft's control managers: it reads the groups' states as they are and returns
the one step to run next (one of moves.py's six translations, and the group whose log takes it), or
Done / Idle. It keeps nothing between calls: every fact it needs is in the states (group 0's directory
record says a move is under way and where to; the source's fence; the target's copy; the target's
tombstone of an earlier move out; a source still holding the set after the move), so a leader killed
anywhere, even after its proposal applied but before it saw the answer, resumes by calling it again and
running what it returns. Each translation is empty when its step is done, so a step run twice writes
nothing the second time. A step decided from a stale read is a no-op at apply: the copy requires the
target's records and its shard/ record at the versions read, and refuses a target that opened the set;
every other step rewrites a shard/ record under its version. The node's executor reads each group at its
read index (nameserver/groups/moveduty.py), so it decides from states no older than its call.

`run_move` is the loop (read, decide, propose, read again) over an Executor: group 0's core's leader runs
it (nameserver/groups/moveduty.py); the tests also run it on in-process states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from nameserver.errors import TooLargeError, ValidationError
from nameserver.state import keys, quotas
from nameserver.state.metadata import MetadataState
from nameserver.state.shards import moves
from nameserver.state.shards.directory import GROUP0
from nameserver.state.translate import Translation
from raftlog.pb import entry_pb2

BEGIN, FENCE, COPY, FINISH, OPEN, DROP = "begin", "fence", "copy", "finish", "open", "drop"  # moves.py's 1-6


@dataclass(frozen=True)
class MoveOrder:
    """Move `broker_name`'s set to group `target`: an operator's `nsctl shard move`, or a move the
    directory shows under way."""

    broker_name: str
    target: int


@dataclass(frozen=True)
class Step:
    """Propose `translation` (never empty) to `group`'s log: step `kind` of moving the set to `target`."""

    kind: str
    group: int
    broker_name: str
    target: int
    translation: Translation

    def __str__(self) -> str:
        return (f"{self.kind} of set {self.broker_name!r} (to group {self.target}) in group {self.group}: "
                f"{self.translation.records} records")


@dataclass(frozen=True)
class Done:
    """The set is in `group` only: the directory names it, no move is under way, `group` takes its writes
    (no tombstone of it there), no other group holds any of the set's records or a fence of it."""

    broker_name: str
    group: int


@dataclass(frozen=True)
class Idle:
    """No move under way and nothing left behind by one."""


Decision = Step | Done | Idle


def _claimed(state: MetadataState, group: int, broker_name: str) -> bool:
    """Group k >= 1 holds a shard/ record of the set that is not a tombstone: a fence, or one naming the
    group itself (in group 0, the record is the directory's)."""
    return (group != GROUP0 and keys.shard_key(broker_name) in state.kv
            and not moves.tombstoned(state, group, broker_name))


def _unopened(states: Sequence[MetadataState], broker_name: str, owner: int) -> bool:
    """The group k >= 1 the directory names for the set has not opened it (step 5 not run): it holds a
    tombstone or a fence of the set (it left k before), or no record though the set came by a move
    (`since` set). A set assigned to k at its first registration, never moved, has no record there and
    needs none."""
    if owner == GROUP0 or moves.opened(states[owner], owner, broker_name):
        return False
    return states[owner].directory.assigned(broker_name) or states[GROUP0].directory.entry_since(broker_name) > 0


def _leftovers(states: Sequence[MetadataState], broker_name: str, owner: int) -> list[int]:
    """The groups other than `owner` holding records of the set, or a fence of it (a tombstone is what a
    drop leaves: not a leftover)."""
    return [k for k, state in enumerate(states)
            if k != owner and (moves.set_keys(state, broker_name) or _claimed(state, k, broker_name))]


def _held(state: MetadataState, group: int) -> set[str]:
    """The sets a group holds records or a fence of, by their broker/ records and (group k >= 1) its shard/
    records other than tombstones: what a resumed leader scans for a move's leftovers. Not by ctrl/
    records: every set's is group 0's (moves.py), never a leftover of a move."""
    names = set(state.broker_names())
    return names | {name for name in state.directory.names() if _claimed(state, group, name)}


def pending_moves(states: Sequence[MetadataState]) -> list[MoveOrder]:
    """The moves a new leader of group 0 resumes, by set name: every set the directory says is moving,
    every set a group holds though the directory names another (its move finished, its drop did not run),
    and every set moved into a group k >= 1 that has not opened it. A leftover known only by
    queue datas (no broker/ or fence record) is not found here; a move of that set drops it. A set's
    controller record in group 0 is no leftover (it is group 0's wherever the set is)."""
    directory = states[GROUP0].directory
    found: dict[str, int] = {}
    for name in directory.names():
        target = directory.moving_to(name)
        if target is not None:
            found[name] = target
    for group, state in enumerate(states):
        for name in _held(state, group):
            if name not in found and directory.group_of(name) != group:
                found[name] = directory.group_of(name)
    for name in directory.names():  # moved, not opened (the target may hold no record of it yet)
        if name not in found and _unopened(states, name, directory.group_of(name)):
            found[name] = directory.group_of(name)
    return [MoveOrder(name, target) for name, target in sorted(found.items())]


def moves_recorded(group0: MetadataState) -> bool:
    """Group 0's directory shows a move, under way (`moving_to`) or finished (`since`, set by every finish):
    without one no group holds anything pending_moves finds, so a new leader need not read the others."""
    directory = group0.directory
    return any(directory.moving_to(name) is not None or directory.entry_since(name) > 0 for name in directory.names())


def validate_move(states: Sequence[MetadataState], broker_name: str, target: int) -> MoveOrder:
    """An operator's move, checked against group 0's directory before anything is written: ValidationError
    naming the field for a group the cluster does not have, a set no group holds, a set already in
    `target`, or one moving to another group. A move to `target` under way (or finished but for its
    opening or drop) is accepted: running it resumes it."""
    groups = len(states)
    if not broker_name:
        raise ValidationError("broker_name", "must not be empty")
    moves.check_group(target, groups)
    g0 = states[GROUP0]
    directory = g0.directory
    if not directory.assigned(broker_name) and not moves.set_keys(g0, broker_name):
        raise ValidationError("broker_name", f"no broker set {broker_name!r}")
    moving = directory.moving_to(broker_name)
    if moving is not None and moving != target:
        raise ValidationError("group", f"set {broker_name!r} is already moving to group {moving}")
    if (moving is None and directory.group_of(broker_name) == target and not _unopened(states, broker_name, target)
            and not _leftovers(states, broker_name, target)):
        raise ValidationError("group", f"set {broker_name!r} is in group {target} already")
    return MoveOrder(broker_name, target)


def check_room(states: Sequence[MetadataState], order: MoveOrder, limits: Mapping[str, int]) -> None:
    """An operator's move refused before anything is written when its target lacks room for the set's
    records ([limits] quotas, each group's state checked alone): TooLargeError naming the quota. A move's
    steps are proposed as made, with no quota check (a copy refused half-way would leave the set fenced,
    its writes refused, until the target had room), so this is where the target's quotas are kept; a move
    already under way is finished whatever the target holds. Writes into the target between this check
    and the copy may take it past a limit by what they add, as two writes translated at once may."""
    name, target = order.broker_name, order.target
    source = states[GROUP0].directory.group_of(name)
    if source == target or states[GROUP0].directory.moving_to(name) is not None:
        return
    held = states[target]
    copy = moves.copy_set(states[source], held, target, name)
    if target != GROUP0 and keys.shard_key(name) not in held.kv:  # the opening's record, a broker's count
        copy.batch.records.add(op=entry_pb2.OP_PUT, key=keys.shard_key(name), value=b"")
    try:
        quotas.check(held.usage, held.kv, copy.batch, limits)
    except TooLargeError as exc:
        raise TooLargeError(exc.field, f"group {target} lacks room for set {name!r}: {exc.message} (the move did "
                                       "not begin)") from None


def decide(states: Sequence[MetadataState], order: MoveOrder | None = None) -> Decision:
    """The next step of `order`'s move (Done when it is complete), or with no order the next step of the
    first pending move (Idle when none is). `states[k]` is group k's state as last read; every group's
    is needed, as leftovers may be in any."""
    if order is None:
        for found in pending_moves(states):
            decided = _next(states, found)
            if isinstance(decided, Step):
                return decided
        return Idle()
    return _next(states, order)


def _next(states: Sequence[MetadataState], order: MoveOrder) -> Step | Done:
    name, target = order.broker_name, order.target
    g0 = states[GROUP0]
    directory = g0.directory
    moving, owner = directory.moving_to(name), directory.group_of(name)

    def step(kind: str, group: int, tr: Translation) -> Step:
        return Step(kind, group, name, target, tr)

    if moving is None and owner != target:  # raises ValidationError when the move cannot begin
        return step(BEGIN, GROUP0, moves.begin_move(g0, name, target, len(states)))
    if moving is not None:
        if moving != target:
            raise ValidationError("group", f"set {name!r} is already moving to group {moving}")
        source, copy_to = states[owner], states[target]
        if source.directory.moving_to(name) != target:  # in group 0, the directory's record is the fence
            return step(FENCE, owner, moves.fence_set(source, name, owner, target))
        # the source state read holds the fence, so nothing of the set changes in it after this read
        copy = moves.copy_set(source, copy_to, target, name)
        if not copy.empty:
            return step(COPY, target, copy)
        # the copy is in the target state read: its offset is at or after the copy's (a floor for reads;
        # at least 1, as finish_move wants, for a set with no records moved to a group with no entries)
        since = max(copy_to.offset, 1)
        return step(FINISH, GROUP0, moves.finish_move(g0, name, target, since))
    if _unopened(states, name, owner):
        return step(OPEN, owner, moves.open_set(states[owner], g0, owner, name))
    for group in _leftovers(states, name, owner):
        return step(DROP, group, moves.drop_set(states[group], g0, group, name))
    return Done(name, target)


class Executor(Protocol):
    """What run_move needs of the processes: group k's state, read at or after an offset (the group's
    replica waits until it has applied it), and a translation proposed to group k's log (its apply
    offset once applied; a translation whose preconditions failed at apply is answered so too: the next
    read shows why)."""

    @property
    def groups(self) -> int: ...

    def read(self, group: int, at_least: int) -> MetadataState: ...

    def propose(self, group: int, translation: Translation) -> int: ...


class MoveStalled(Exception):
    """run_move ran its steps' limit without the decider answering Done or Idle."""


MAX_STEPS = 64  # a move is 6 steps and a drop per leftover group; a step refused at apply is run again


def run_move(decide: Callable[[Sequence[MetadataState]], Decision], execute: Executor,
             max_steps: int = MAX_STEPS) -> Done | Idle:
    """Run a move's steps until the decider answers Done or Idle. Each read of a group is at or after the
    offset of this run's last proposal to it, so a step is not decided again from a state that does not
    show it yet. Nothing is kept but those offsets: a run abandoned anywhere is resumed by another."""
    floors: dict[int, int] = {}
    for _ in range(max_steps):
        states = [execute.read(group, floors.get(group, 0)) for group in range(execute.groups)]
        decided = decide(states)
        if not isinstance(decided, Step):
            return decided
        floors[decided.group] = execute.propose(decided.group, decided.translation)
    raise MoveStalled(f"no end after {max_steps} steps")
