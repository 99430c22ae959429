"""The move duty's executor over a node's group cores, run by group 0's core on its leader (docs/scaling.md,
"Sharding": moving a set; the decider is nameserver/state/shards/duty.py).

Group 0's core holds the directory, so its leader moves sets: an operator's Shards.MoveShard reaches it as
Admin.MoveSet (a worker passes it to its group 0 core, which forwards it to its leader), and a leader
newly elected resumes any move its predecessor left under way (duty.pending_moves) on its own thread.

The executor (duty.Executor) reads
- group 0 as this core's own state, once it has applied its read index;
- group k >= 1 from a replica of group k's core on this node (its private feed, as a worker follows it:
  groups/follow.py), once that has applied group k's read index (asked on the core's write channel, which a
  follower core answers from its leader). Every read is at its group's read index, so a step is never
  decided from a state older than the call: a replica that did not yet show the move finished could
  decide the copy again (the copy's preconditions make such a copy a no-op, this keeps it from being made);
and proposes a step's translation
- in group 0 to this core's log (this core leads group 0);
- in group k as Admin.ProposeStep on group k's core's private socket, which proposes it on its group's
  leader (forwarding it there as any call of a group core: core/forwarder.py, the workers' GroupCalls).
A step's translation is proposed as made (its preconditions guard it), without the write guard every
client write of the group passes (moves.guard_set_writes): the copy into a group the set left before, or
the drop in a fenced source, is the duty's own write that guard refuses to others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TypeVar

import grpc

from nameserver.api import corelink, writechannel
from nameserver.api.coreindex import CoreReadIndex
from nameserver.api.corelink import core_read_index
from nameserver.api.rpc import DeadlinePassed
from nameserver.api.writechannel import WriteChannel
from nameserver.config import NodeConfig, group_config
from nameserver.core.node import NameServerNode
from nameserver.errors import ValidationError
from nameserver.groups.follow import follow_core
from nameserver.pb import api_pb2, api_pb2_grpc, shards_pb2
from nameserver.replica import ReadReplica
from nameserver.replica.seed import seed_from_snapshots
from nameserver.state import MetadataState, Translation
from nameserver.state.shards import duty
from nameserver.state.shards.directory import GROUP0
from raftlog.proposer import NotLeader

log = logging.getLogger("nameserver.groups.moveduty")
T = TypeVar("T")
RESUME_RETRY_S = 1.0  # a resumed move that failed (a group without a leader, a core restarting) is run again
RESUME_TIMEOUT_S = 30.0  # one resumed run's waits and calls; the next retry starts afresh
RESUME_LOG_EVERY_S = 10.0  # a resumption failing again and again: one warning per this long
ANSWER_MARGIN_S = 1.0  # a move stops this long (at most a quarter of its time) before its caller's deadline


class MoveTimeout(DeadlinePassed):
    """The move did not end within the call's time (DEADLINE_EXCEEDED); it stays under way and group 0's
    leader finishes it."""


class GroupsExecutor:
    """duty.Executor over this node's group cores (run by group 0's core: `node` is its node)."""

    def __init__(self, node: NameServerNode, cfg: NodeConfig) -> None:
        self.node = node
        self.cfg = cfg
        self.cores = [group_config(cfg, group) for group in range(cfg.groups)]
        self._replicas: list[ReadReplica] = []  # [k - 1]: group k's, started on first use
        self._channels: list[grpc.Channel] = []
        self._writes: list[WriteChannel] = []
        self._indexes: list[CoreReadIndex] = []
        self._admins: list[api_pb2_grpc.AdminStub] = []
        self._started = threading.Lock()
        self.deadline = 0.0  # the current run's: every wait and call ends by it
        self.proposed = 0  # steps proposed since the last reset (a MoveShard's reply says how many)

    @property
    def groups(self) -> int:
        return self.cfg.groups

    def _start(self) -> None:
        """The replicas of groups 1..G-1 and the links to their cores, once (only a leader moves sets)."""
        with self._started:
            if self._replicas:
                return
            opts = [("grpc.max_receive_message_length", self.cfg.max_message_bytes),
                    ("grpc.max_send_message_length", self.cfg.max_message_bytes)]
            for group, core in enumerate(self.cores[1:], start=1):
                # with quota totals: a move is refused up front when its target lacks room (duty.check_room)
                replica = follow_core(self.cfg, group, f"move-duty-g{group}", accounting=True)
                seed_from_snapshots(replica, core.data_dir)
                replica.start()
                channel = corelink.own_channel(core, opts)
                writes = WriteChannel(writechannel.socket_path(core.data_dir), self.cfg.max_message_bytes)
                self._replicas.append(replica)
                self._channels.append(channel)
                self._writes.append(writes)
                self._indexes.append(core_read_index(writes, self.cfg, core.data_dir))  # group k's page
                self._admins.append(api_pb2_grpc.AdminStub(channel))

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise MoveTimeout("the move's time ran out")
        return left

    def read(self, group: int, at_least: int) -> MetadataState:
        """Group `group`'s state once it has applied its read index and `at_least`. The state is live: take
        it under `locked` only (its apply goes on meanwhile)."""
        if group == GROUP0:
            if not self.node.log.is_leader():  # a deposed leader stops: the new one resumes the move
                raise NotLeader("this core no longer leads group 0")
            index = self.node.linearizable_index(self._left())
            if not self.node.log.wait_applied(max(index, at_least), self._left()):
                raise MoveTimeout(f"group 0 did not apply {max(index, at_least)} in time")
            return self.node.state
        self._start()
        replica = self._replicas[group - 1]
        index = self._indexes[group - 1].read_index(self._left())
        if not replica.wait_applied(max(index, at_least), self._left()):
            raise MoveTimeout(f"group {group}'s replica on this node did not apply {max(index, at_least)} in time "
                              f"({replica.not_ready_reason() if not replica.ready else 'behind'})")
        return replica.state

    def locked(self, fn: Callable[[list[MetadataState]], T], states: Sequence[MetadataState]) -> T:
        """`fn(states)` with every state's lock held, in group order (as a worker's merged read takes them)."""
        locks = [self.node.lock] + [replica.lock for replica in self._replicas]
        with ExitStack() as held:
            for lock in locks[:len(states)]:
                held.enter_context(lock)
            return fn(list(states))

    def propose(self, group: int, translation: Translation) -> int:
        """The step's offset in its group (a step whose preconditions failed at apply is answered alike:
        the next read shows why). NotLeader when this core no longer leads group 0."""
        self.proposed += 1
        if group == GROUP0:
            return self.node.log.propose(translation.batch, self._left()).offset
        request = api_pb2.ProposeStepRequest(batch=translation.batch.SerializeToString())
        reply: api_pb2.WriteReply = self._admins[group - 1].ProposeStep(request, timeout=self._left())
        return reply.offset

    def stop(self) -> None:
        for index in self._indexes:
            index.stop()
        for writes in self._writes:
            writes.close()
        for channel in self._channels:
            channel.close()
        for replica in self._replicas:
            replica.stop()


class MoveDuty:
    """Group 0's core's moves: an operator's (`move`, on the leader) and those a new leader resumes (its own
    thread, woken when this core becomes leader).

    One move runs at a time on a node (docs/scaling.md, "Moves one at a time"), as Kafka's reassignment: a
    move of the set under way to another group is refused at once (ValidationError naming `group` and the
    move under way); the same move again joins it (it is idempotent); a move of another set waits its turn
    within its call's time, and when that runs out first it is answered with the set under way, nothing
    written."""

    def __init__(self, node: NameServerNode, cfg: NodeConfig) -> None:
        self.node = node
        self.executor = GroupsExecutor(node, cfg)
        self._running = threading.Lock()
        self._under_way: duty.MoveOrder | None = None  # the move holding _running, once it knows its set
        self._quiet_until = 0.0  # a failed resumption's next warning
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="move-duty", daemon=True)
        self._leadership = node.log.watch_leadership(self._on_leadership)

    def start(self) -> None:
        self._thread.start()
        if self.node.log.is_leader():
            self._wake.set()

    def stop(self) -> None:
        self._leadership.close()
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.executor.stop()

    def _on_leadership(self, is_leader: bool) -> None:
        if is_leader:
            self._wake.set()

    def _leading(self) -> bool:
        return self.node.log.is_leader() and self.node.log.ready

    def _loop(self) -> None:
        """Resume every move under way while this core leads, again after a failure, until none is left."""
        pending = False
        while not self._stopped.is_set():
            self._wake.wait(RESUME_RETRY_S if pending else None)  # woken, or a failed run's retry is due
            self._wake.clear()
            if self._stopped.is_set():
                return
            if not self._leading():
                pending = self.node.log.is_leader()  # elected, not applied yet: look again shortly
                continue
            pending = not self._resume()

    def _resume(self) -> bool:
        """Run the pending moves to their end; False when a run failed (tried again after RESUME_RETRY_S)."""
        with self._running:
            try:
                execute = self.executor
                execute.deadline = time.monotonic() + RESUME_TIMEOUT_S
                group0 = execute.read(GROUP0, 0)
                if not execute.locked(lambda states: duty.moves_recorded(states[GROUP0]), [group0]):
                    return True  # no set ever moved: the other groups need not be read (nor be up yet)
                ended = self._run(duty.decide, execute.deadline)
            except NotLeader:
                return True  # the new leader resumes
            except Exception as exc:  # a group unreachable, a core restarting, a step refused: run again
                now = time.monotonic()
                if now >= self._quiet_until:  # one line per RESUME_LOG_EVERY_S (a group core may start slowly)
                    self._quiet_until = now + RESUME_LOG_EVERY_S
                    log.warning("resuming the moves under way failed (tried again every %.0f s): %s: %s",
                                RESUME_RETRY_S, type(exc).__name__, exc)
                return False
            finally:
                self._under_way = None
        if isinstance(ended, duty.Done):
            log.info("resumed move done: set %r is in group %d", ended.broker_name, ended.group)
        return True

    def _run(self, decide: Callable[[Sequence[MetadataState]], duty.Decision], deadline: float
             ) -> duty.Done | duty.Idle:
        execute = self.executor
        execute.deadline = deadline

        def decided(states: Sequence[MetadataState]) -> duty.Decision:
            found = execute.locked(decide, states)
            if isinstance(found, duty.Step):  # a move is rare: one line a step
                log.info("move duty: %s", found)
                self._under_way = duty.MoveOrder(found.broker_name, found.target)
            return found

        return duty.run_move(decided, execute)

    def move(self, broker_name: str, target: int, timeout: float) -> shards_pb2.MoveShardReply:
        """Move the set to `target` (this core leads group 0) and answer once it is done: ValidationError
        naming the field for a bad move, MoveTimeout saying how far it got when the time ran out (a move
        begun stays under way: this leader's thread finishes it), NotLeader when leadership was lost. It
        stops a little before `timeout`, so that answer reaches the caller before its own deadline."""
        deadline = time.monotonic() + timeout - min(ANSWER_MARGIN_S, timeout / 4)
        self._refuse_another_target(broker_name, target)
        if not self._running.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise MoveTimeout(f"{self._running_move()}; the move of set {broker_name!r} to group {target} "
                              "waited its turn (one move at a time a node) and did not begin: nothing was written "
                              "for it; send it again once that move is done (`nsctl shard list` shows it)")
        execute = self.executor
        try:
            self._under_way = duty.MoveOrder(broker_name, target)
            execute.deadline = deadline
            execute.proposed = 0
            states = [execute.read(group, 0) for group in range(execute.groups)]
            order, source = execute.locked(lambda s: (duty.validate_move(s, broker_name, target),
                                                      s[GROUP0].directory.group_of(broker_name)), states)
            execute.locked(lambda s: duty.check_room(s, order, self.node.quota_limits), states)
            ended = self._run(lambda s: duty.decide(s, order), deadline)
            assert isinstance(ended, duty.Done)
            entry = execute.locked(lambda s: s[GROUP0].directory.entry(broker_name), states[:1])
            return shards_pb2.MoveShardReply(source=source, set=entry, steps=execute.proposed)
        except (MoveTimeout, TimeoutError) as exc:  # a group's read index or replica did not come in time
            if not execute.proposed:  # a move begun before is the duty's already (it ran or failed there)
                raise MoveTimeout(f"the move of set {broker_name!r} to group {target} did not begin in this call "
                                  f"({exc}): nothing was written; a move begun before is finished by group 0's "
                                  f"leader (`nsctl shard list {broker_name}` shows it)") from None
            self._wake.set()  # begun by this call: the duty finishes it
            raise MoveTimeout(f"set {broker_name!r} is still moving to group {target} after {execute.proposed} "
                              f"steps ({exc}); group 0's leader finishes the move: `nsctl shard list "
                              f"{broker_name}` shows where it is") from None
        except (ValidationError, NotLeader):
            raise
        except Exception:
            if execute.proposed:
                self._wake.set()
            raise
        finally:
            self._under_way = None
            self._running.release()

    def _refuse_another_target(self, broker_name: str, target: int) -> None:
        """A move of the set under way to another group: refused now, not after waiting for the lock (as
        Kafka refuses a new reassignment of partitions being reassigned)."""
        under_way = self._under_way
        if under_way is not None and under_way.broker_name == broker_name and under_way.target != target:
            raise ValidationError("group", f"a move of set {broker_name!r} to group {under_way.target} is running: "
                                           "one move of a set at a time; move it again once that one is done")

    def _running_move(self) -> str:
        under_way = self._under_way
        if under_way is None:
            return "group 0's leader is resuming the moves under way"
        return f"a move of set {under_way.broker_name!r} to group {under_way.target} is running on group 0's leader"
