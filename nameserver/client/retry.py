"""Retry policy: which statuses are retried, exponential backoff with full jitter, deadlines."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

# UNAVAILABLE: the node could not serve (not ready, no leader, down, behind min_offset).
# DEADLINE_EXCEEDED: an attempt ran out of time; for a write the outcome is unknown, which is safe to
# retry because writes carry x-client-id / x-client-seq (the server returns the first result).
RETRYABLE_CODES: frozenset[grpc.StatusCode] = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class RetryPolicy:
    """How long a call may take in total, how long one attempt may take, and how to back off.

    deadline_s: overall budget of one logical call (all attempts and sleeps).
    attempt_timeout_s: cap on one attempt, so a hung node does not eat the whole budget.
    initial_backoff_s, max_backoff_s, multiplier: the exponential backoff before attempt n+1 is
    uniform in [0, min(max, initial * multiplier**n)] ("full jitter").
    """

    deadline_s: float = 10.0
    attempt_timeout_s: float = 4.0
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    multiplier: float = 2.0
    rand: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.deadline_s <= 0 or self.attempt_timeout_s <= 0:
            raise ValueError("deadline_s and attempt_timeout_s must be > 0")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s or self.multiplier < 1:
            raise ValueError("need 0 <= initial_backoff_s <= max_backoff_s and multiplier >= 1")

    def backoff(self, attempt: int) -> float:
        """Sleep before retry number `attempt` (0-based): full jitter under an exponential cap."""
        cap = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** min(attempt, 64))
        return cap * self.rand()


class Deadline:
    """A point in monotonic time; hands out per-attempt timeouts that never pass it."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.at = clock() + seconds

    def remaining(self) -> float:
        return max(0.0, self.at - self._clock())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def attempt_timeout(self, cap: float) -> float:
        return min(cap, self.remaining())
