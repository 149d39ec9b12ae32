"""Dynamic batching: concurrent requests decoded together by one worker thread.

The event loop never runs a model. ``Batcher.submit`` puts a job on a bounded queue and awaits its
future; a full queue raises ``QueueFull`` at once (the route answers 429 with ``Retry-After``), so
memory never grows with the number of waiting clients. A worker thread takes the oldest job, waits
up to ``window`` seconds for more jobs of an equal *kind* (same model, same decoding options: they
can share one search; ``jobs.py`` names the server's kinds), stops at ``max_items`` texts, and runs
them as one call of ``run(kind, payloads)``; each job's result (or exception) goes back to its own
future. A batch that raises is run again one job at a time, so that an error belongs to the job that
caused it and the others still get their results. A job submitted ``alone`` (a streamed generation)
is never batched with another. A job whose caller gave up (a timeout, a client that disconnected) is
cancelled and skipped if it has not run; a batch whose callers have all given up stops at its next
decoding step (``aiayn.decoding.cancel``). ``busy()`` says how long each worker has been on its
batch. Jobs of other kinds wait, in order, for the next rounds. With ``workers`` > 1, as many
batches run at once (each on its own thread; give torch one thread per worker), so that a request
arriving while a batch runs need not wait for it to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiayn.decoding.cancel import SearchStopped, stop_when


class QueueFull(Exception):
    """The bounded queue has no room: try again later."""


@dataclass
class Job:
    kind: Any  # jobs whose kinds are equal (==) may run as one batch
    payload: Any
    size: int  # texts in the job (what ``max_items`` counts)
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    alone: bool = False  # never batched with another job
    queued: float = field(default_factory=time.perf_counter)

    def joins(self, first: Job) -> bool:
        """Whether this job may run in the batch that ``first`` opened."""
        return not (self.alone or first.alone) and self.kind == first.kind


class Batcher:
    """Worker threads running ``run(kind, payloads) -> results`` on batches of jobs.

    ``on_batch(n_jobs, n_items, seconds)`` is called after each batch (for metrics).
    """

    def __init__(
        self,
        run: Callable[[Any, list[Any]], list[Any]],
        max_queue: int,
        window: float,
        max_items: int,
        on_batch: Callable[[int, int, float], None] | None = None,
        workers: int = 1,
    ):
        self.run, self.window, self.max_items = run, window, max_items
        self.on_batch = on_batch or (lambda *_: None)
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.held: deque[Job] = deque()  # taken from the queue, waiting for a batch of their kind
        self.held_lock = threading.Lock()
        self.started: dict[str, float] = {}  # worker thread name -> when its current batch started
        self.threads = [threading.Thread(target=self._work, name=f"aiayn-model-{i}", daemon=True)
                        for i in range(workers)]  # fmt: skip
        for thread in self.threads:
            thread.start()

    def depth(self) -> int:
        return self.queue.qsize() + len(self.held)

    def busy(self) -> list[float]:
        """Seconds each busy worker has spent on its current batch (idle workers are not listed)."""
        now = time.perf_counter()
        return [now - t for t in list(self.started.values())]

    async def submit(self, kind: Any, payload: Any, size: int = 1, *, alone: bool = False) -> Any:
        """``run(kind, [payload, …])``'s result for this payload; ``size`` is its number of texts."""
        loop = asyncio.get_running_loop()
        job = Job(kind, payload, size, loop.create_future(), loop, alone)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        return await job.future

    def close(self) -> None:
        for _ in self.threads:
            self.queue.put(None)  # one stop signal per worker
        for thread in self.threads:
            thread.join(timeout=10)

    # -- the worker thread ----------------------------------------------------------------------
    def _next(self, timeout: float | None) -> Job | None:
        with self.held_lock:
            if self.held:
                return self.held.popleft()
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def _work(self) -> None:
        while True:
            first = self._next(None)
            if first is None:
                return  # close() was called
            if first.future.cancelled():
                continue
            batch, items = [first], first.size
            deadline = time.perf_counter() + self.window
            others: list[Job] = []
            while self.max_items and items < self.max_items and not first.alone:
                remaining = deadline - time.perf_counter()
                try:
                    job = (
                        self.queue.get(timeout=max(remaining, 0))
                        if remaining > 0
                        else self.queue.get_nowait()
                    )
                except queue.Empty:
                    break
                if job is None:
                    self.queue.put(None)  # keep the stop signal for after this batch
                    break
                if job.future.cancelled():
                    continue
                if job.joins(first) and items + job.size <= self.max_items:
                    batch.append(job)
                    items += job.size
                else:
                    others.append(job)
            with self.held_lock:
                self.held.extendleft(reversed(others))
            self._run(batch, items)

    def _run(self, batch: list[Job], items: int) -> None:
        t0 = time.perf_counter()
        self.started[threading.current_thread().name] = t0
        try:
            outcomes = self._outcomes(batch)
            if len(batch) > 1 and any(error is not None and not isinstance(error, SearchStopped)
                                      for _, _, error in outcomes):  # fmt: skip
                outcomes = [o for job in batch for o in self._outcomes([job])]  # each job on its own
        finally:
            del self.started[threading.current_thread().name]
        self.on_batch(len(batch), items, time.perf_counter() - t0)
        for job, result, error in outcomes:
            if job.future.cancelled():
                continue  # its caller is gone (and its event loop may be closed)
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: the worker goes on
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)

    def _outcomes(self, jobs: list[Job]) -> list[tuple[Job, Any, Exception | None]]:
        """``(job, result, error)`` of running ``jobs`` as one batch; the search stops between two
        steps once every caller has given up."""
        jobs = [job for job in jobs if not job.future.cancelled()]
        if not jobs:
            return []
        try:
            with stop_when(lambda: all(job.future.cancelled() for job in jobs)):
                results = self.run(jobs[0].kind, [job.payload for job in jobs])
            return [(job, result, None) for job, result in zip(jobs, results, strict=True)]
        except Exception as e:  # noqa: BLE001 -- the batch's callers get the error
            return [(job, None, e) for job in jobs]


def _settle(future: asyncio.Future, result: Any, error: Exception | None) -> None:
    if future.done():  # cancelled meanwhile: the caller is gone
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
