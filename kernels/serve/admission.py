"""Admission: at most `max_concurrency` requests compute, at most `max_queue` wait, the rest are refused at
once; a waiting request that outlives its timeout leaves the queue and is never run.

Everything here runs on the event loop's one thread, so the counters need no lock. A slot freed by a
finished request passes straight to the oldest waiter (FIFO), so a burst cannot starve an early request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import time


class Refusal(enum.Enum):
    REJECTED = "rejected"  # concurrency and queue full: 503 with Retry-After, at once
    TIMEOUT = "timeout"  # waited past its timeout in the queue: 504


class Refused(Exception):
    def __init__(self, kind: Refusal, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Admission:
    def __init__(self, *, max_concurrency: int, max_queue: int) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self, *, timeout_s: float) -> float:
        """Wait for a compute slot; returns the seconds spent queued. Raises Refused."""
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            return 0.0
        if len(self._waiters) >= self.max_queue:
            raise Refused(
                Refusal.REJECTED,
                f"{self.running} requests computing and {len(self._waiters)} "
                f"queued: the limits are max_concurrency={self.max_concurrency}, "
                f"max_queue={self.max_queue}",
            )
        t0 = time.perf_counter()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted at the deadline: hand the slot on, this request still never runs
            else:
                fut.cancel()
                self._remove(fut)
            raise Refused(
                Refusal.TIMEOUT,
                f"waited {time.perf_counter() - t0:.3f} s in the queue, past the "
                f"timeout of {timeout_s * 1000:.0f} ms; not run",
            ) from None
        except asyncio.CancelledError:  # the client went away while queued
            if fut.done() and not fut.cancelled():
                self.release()
            else:
                fut.cancel()
                self._remove(fut)
            raise
        return time.perf_counter() - t0

    def release(self) -> None:
        """A slot is free: the oldest live waiter takes it, else the count drops."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # `running` is unchanged: the slot moves to the waiter
                return
        self.running -= 1

    def _remove(self, fut: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)
