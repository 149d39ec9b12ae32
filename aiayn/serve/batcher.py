"""Dynamic batching: concurrent requests decoded together by one worker thread.

The event loop never runs a model. ``Batcher.submit`` puts a job on a queue and awaits its future.
At most ``max_queue`` jobs wait (queued, or being gathered into a batch: everything submitted and not
yet started); one more raises ``QueueFull`` at once (the route answers 429 with ``Retry-After``), so
memory never grows with the number of waiting clients; jobs whose callers gave up free their places
then. Every worker takes its jobs from the one queue (a deque under a condition variable), so a job
that one worker leaves there is seen by every other. A worker thread
takes the oldest job, waits up to ``window`` seconds for more jobs of an equal *kind* (same model,
same decoding options: they can share one search; ``jobs.py`` names the server's kinds), stops at
``max_items`` texts, and runs them as one call of ``run(kind, payloads)``; each job's result (or
exception) goes back to its own future, and a result that *is* an exception is that job's error (a
request whose answer would be too large, say). A batch that raises is run again one job at a time, so
that an error belongs to the job that caused it and the others still get their results. A job submitted
``alone`` (a streamed generation) is never batched with another. A job whose caller gave up (a
timeout, a client that disconnected) is cancelled and skipped if it has not run; a batch whose
callers have all given up stops at its next decoding step (``aiayn.decoding.cancel``). ``busy()``
says how long each worker has been on its batch. Jobs of other kinds wait, in order, for the next
rounds. With ``workers`` > 1, as many batches run at once (each on its own thread; give torch one
thread per worker), so that a request arriving while a batch runs need not wait for it to end.

**Iteration-level scheduling.** A kind for which ``stepwise(kind)`` returns a running search (a
translation decoded by beam search or greedily, ``serve/running.py``) is not run as one call: the
worker keeps that search going and, between two of its decoding steps, takes the jobs that have
arrived (their encoder pass and first step run then) as long as the texts in flight stay within
``max_items``; every job is answered the moment its last text is done, and a job whose caller gave
up leaves the search at the next step. So a request never waits for another request's whole
search, only for one step of it. Such a job starts at once even when nothing runs, with the jobs
already queued beside it: later ones join at the next step, so waiting ``window`` for company (as
whole batches do) would only delay it (measured: docs/serve.md, "The batch window"). A job of more
texts than ``max_items`` never joins a running search: it waits for the worker to be idle and runs
as one call (whose search batches its texts by tokens). While a worker runs a whole batch (a kind
that cannot run by step, or such a job), its running searches wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiayn.decoding.cancel import SearchStopped, stop_when

log = logging.getLogger("aiayn.serve")
_STOP = object()  # what ``_next`` returns once ``close`` was called and the queue is empty


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
    left: bool = False  # no longer counted as waiting (it started, or was skipped)

    def joins(self, first: Job) -> bool:
        """Whether this job may run in the batch that ``first`` opened."""
        return not (self.alone or first.alone) and self.kind == first.kind


class Batcher:
    """Worker threads running ``run(kind, payloads) -> results`` on batches of jobs.

    ``on_batch(n_jobs, n_items, seconds, step)`` is called after each batch (``step`` None) and each
    step of a running search (``step``: the kind and the results of the jobs that step finished, for
    the metrics to count their tokens as a batch's are); ``on_wait(seconds)`` when a job starts, with
    the time it waited (for metrics); ``on_start()`` first on each worker thread (its PyTorch
    threads). ``stepwise(kind)`` returns a running search for a kind decoded step by step, or None
    (the default for every kind): run in batches.
    """

    def __init__(
        self,
        run: Callable[[Any, list[Any]], list[Any]],
        max_queue: int,
        window: float,
        max_items: int,
        on_batch: Callable[[int, int, float, int | None], None] | None = None,
        workers: int = 1,
        stepwise: Callable[[Any], Any] | None = None,
        on_wait: Callable[[float], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ):
        self.run, self.window, self.max_items = run, window, max_items
        self.on_start = on_start or (lambda: None)
        self.on_batch = on_batch or (lambda *_: None)
        self.on_wait = on_wait or (lambda _: None)
        self.stepwise = stepwise or (lambda _: None)
        self.max_queue = max_queue
        self.pending: deque[Job] = deque()  # submitted and not yet taken by a worker, oldest first
        self.waiting = 0  # jobs submitted and not yet started or skipped: at most ``max_queue``
        self.closing = False
        self.abandoning = False  # close(finish=False): stop at the next step, answering with an error
        self.cond = threading.Condition()  # guards ``pending``, ``waiting`` and ``closing``
        self.started: dict[str, float] = {}  # worker thread name -> when its current batch started
        self.flight: dict[str, int] = {}  # worker thread name -> texts in its running searches
        self.threads = [threading.Thread(target=self._work, name=f"aiayn-model-{i}", daemon=True)
                        for i in range(workers)]  # fmt: skip
        for thread in self.threads:
            thread.start()

    def alive(self) -> int:
        """Worker threads still running (a fault in a round is survived, ``_fail``; only an exit that
        is not an ``Exception`` ends one before ``close``)."""
        return sum(thread.is_alive() for thread in self.threads)

    def in_flight(self) -> int:
        """Texts in the workers' running searches now."""
        return sum(self.flight.values())

    def depth(self) -> int:
        """Jobs waiting for the model (not yet started; those whose callers gave up are not counted)."""
        with self.cond:
            self._purge()
            return self.waiting

    def busy(self) -> list[float]:
        """Seconds each busy worker has spent on its current batch (idle workers are not listed)."""
        now = time.perf_counter()
        return [now - t for t in list(self.started.values())]

    def enqueue(self, kind: Any, payload: Any, size: int = 1, *, alone: bool = False) -> asyncio.Future:
        """Queue the job now, or raise ``QueueFull``; the future is ``run(kind, [payload, …])``'s
        result for this payload (``size``: its number of texts). A future cancelled before its job
        starts is skipped, not run, and its place goes to the next job that needs it."""
        loop = asyncio.get_running_loop()
        job = Job(kind, payload, size, loop.create_future(), loop, alone)
        with self.cond:
            if self.waiting >= self.max_queue:
                self._purge()
            if self.waiting >= self.max_queue:
                raise QueueFull
            self.waiting += 1
            self.pending.append(job)
            self.cond.notify_all()  # an idle worker, or one gathering a batch this job may join
        return job.future

    async def submit(self, kind: Any, payload: Any, size: int = 1, *, alone: bool = False) -> Any:
        """``enqueue``, then its result."""
        return await self.enqueue(kind, payload, size, alone=alone)

    def close(self, finish: bool = True) -> None:
        """Stop the workers once the jobs already queued and those in running searches are done (the
        threads are waited for 10 s each); ``finish=False`` (a forced exit): at their next decoding
        step, the jobs they hold answered with an error (no thread is left inside the model while the
        interpreter shuts down)."""
        with self.cond:
            self.closing = True
            self.abandoning = self.abandoning or not finish
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(timeout=10)

    # -- the worker thread ----------------------------------------------------------------------
    def _leave(self, jobs: list[Job]) -> None:
        """``jobs`` stop waiting: they start, or are skipped because their callers gave up."""
        with self.cond:
            for job in jobs:
                self.waiting -= not job.left
                job.left = True

    def _purge(self) -> None:
        """Drop the queued jobs whose callers gave up (``cond`` held)."""
        kept = deque(job for job in self.pending if not job.future.cancelled())
        self.waiting -= len(self.pending) - len(kept)
        self.pending = kept

    def _next(self, timeout: float | None) -> Job | object | None:
        """The oldest queued job; None if none came within ``timeout``; ``_STOP`` once ``close`` was
        called and the queue is empty."""
        with self.cond:
            if timeout != 0:
                self.cond.wait_for(lambda: self.pending or self.closing, timeout)
            if self.abandoning:
                return _STOP
            if self.pending:
                return self.pending.popleft()
            return _STOP if self.closing else None

    def _put_back(self, job: Job) -> None:
        """Return ``job`` to the head of the queue, for this worker's next round or another worker."""
        with self.cond:
            self.pending.appendleft(job)
            self.cond.notify_all()

    def _work(self) -> None:
        running: list[tuple[Any, Any]] = []  # (kind, its running search): stepwise kinds, this worker's
        jobs: dict[int, Job] = {}  # id(job) -> job, for the jobs in those searches
        self.on_start()
        try:
            while True:
                busy, admitted = bool(jobs), 0.0
                first = self._next(None if not busy else 0)
                if first is _STOP:
                    if not busy or self.abandoning:
                        return
                    first = None  # closing: the running searches finish first
                taken = [] if first is None else [first]  # the jobs in hand, until they are answered
                try:
                    if first is not None and first.future.cancelled():
                        self._leave([first])
                    elif first is not None:
                        search = self._running_for(first.kind, running)
                        if search is None:
                            taken, items = self._gather(first, self.max_items, wait=True)
                            self._run(taken, items)
                        elif busy and first.size > self._room(running):
                            self._put_back(first)  # it waits for texts to leave, or for an idle worker
                        elif first.size > self.max_items > 0:  # more texts than may be in flight: one
                            self._run([first], first.size)  # search, which batches them by tokens
                        else:
                            taken, _ = self._gather(first, max(self._room(running), first.size), wait=False)
                            admitted = self._admit(search, taken, jobs)
                    taken = []
                    self._step(running, jobs, admitted)
                except Exception as e:  # noqa: BLE001 -- the worker must outlive a fault (see _fail)
                    self._fail(e, taken, running, jobs)
        finally:
            self._abandon(jobs)

    def _fail(self, error: Exception, taken: list[Job], running: list[tuple[Any, Any]],
              jobs: dict[int, Job]) -> None:  # fmt: skip
        """A fault outside the model's own calls (which answer their jobs themselves): starting a
        search, dropping rows, a metrics callback. The jobs in hand and those in this worker's running
        searches get the error, the searches are dropped, and the worker goes on with the next job: a
        worker thread that died would leave every later request waiting for its timeout while
        ``/health`` said ok. The traceback goes to the log: it is a bug to report."""
        log.error("a model worker's round failed; its jobs get the error", exc_info=error)
        self._leave(taken)
        for job in [*taken, *jobs.values()]:
            _answer(job, None, error)  # an answered job's second answer is dropped (_settle)
        jobs.clear()
        running.clear()
        self._count_flight(running)

    def _running_for(self, kind: Any, running: list[tuple[Any, Any]]) -> Any:
        """The running search of ``kind`` (started if need be), or None for a kind run in batches.
        (Kinds are compared with ==: they need not be hashable.)"""
        for other, search in running:
            if other == kind:
                return search
        search = self.stepwise(kind)
        if search is not None:
            running.append((kind, search))
        return search

    def _room(self, running: list[tuple[Any, Any]]) -> int:
        """How many more texts may join the running searches (``max_items``; at least one job when
        ``max_items`` is 0 and nothing runs)."""
        return max(self.max_items - sum(search.texts for _, search in running), 0)

    def _gather(self, first: Job, limit: int, wait: bool) -> tuple[list[Job], int]:
        """``first`` and the queued jobs that may join it, oldest first, up to ``limit`` texts; waits
        up to ``window`` for them when ``wait``. Jobs that do not join stay queued, in order."""
        batch, items = [first], first.size
        if first.alone:
            return batch, items
        deadline = time.perf_counter() + (self.window if wait else 0)
        with self.cond:
            while limit and items < limit:
                kept: deque[Job] = deque()
                for job in self.pending:
                    if job.future.cancelled():
                        self.waiting -= 1
                    elif items < limit and job.joins(first) and items + job.size <= limit:
                        batch.append(job)
                        items += job.size
                    else:
                        kept.append(job)
                self.pending = kept
                remaining = deadline - time.perf_counter()
                if items >= limit or remaining <= 0 or self.closing:
                    break
                self.cond.wait(remaining)
        return batch, items

    def _admit(self, search: Any, batch: list[Job], jobs: dict[int, Job]) -> float:
        """Start ``batch``'s jobs in the running ``search`` (their encoder pass runs now, their first
        token with the next step); the seconds it took."""
        self._leave(batch)
        batch = [job for job in batch if not job.future.cancelled()]  # given up during the window
        if not batch:
            return 0.0
        now = time.perf_counter()
        for job in batch:
            self.on_wait(now - job.queued)
            jobs[id(job)] = job
        try:
            outcomes = self._timed(lambda: search.add([(id(job), job.payload) for job in batch]))
        except Exception as e:  # noqa: BLE001 -- these jobs' callers get the error
            outcomes = [(id(job), None, e) for job in batch]
        self._settle_all(outcomes, jobs)
        return time.perf_counter() - now

    def _step(self, running: list[tuple[Any, Any]], jobs: dict[int, Job], admitted: float = 0.0) -> None:
        """One decoding step of every running search; jobs whose callers gave up leave first. The
        seconds just spent admitting jobs count with the first step's (``on_batch``)."""
        for entry in list(running):
            kind, search = entry
            gone = {key for key, job in jobs.items() if job.kind == kind and job.future.cancelled()}
            if gone:
                search.drop(gone)
                for key in gone:
                    del jobs[key]
            if not len(search):
                running.remove(entry)  # a new one starts with the next job of this kind
                continue
            texts, t0 = search.texts, time.perf_counter()
            try:
                outcomes = self._timed(search.step)
            except Exception as e:  # noqa: BLE001 -- every job of the search gets the error
                outcomes = [(key, None, e) for key, job in jobs.items() if job.kind == kind]
                running.remove(entry)
            finished = [result for _, result, error in outcomes if error is None]
            self.on_batch(len(search), texts, time.perf_counter() - t0 + admitted, (kind, finished))
            admitted = 0.0
            self._count_flight(running)  # before the answers: a caller's next look at the gauges sees it
            self._settle_all(outcomes, jobs)
        self._count_flight(running)

    def _count_flight(self, running: list[tuple[Any, Any]]) -> None:
        self.flight[threading.current_thread().name] = sum(search.texts for _, search in running)

    def _timed(self, call: Callable[[], Any]) -> Any:
        """``call()``, with this worker shown as busy while it runs (``busy``)."""
        self.started[threading.current_thread().name] = time.perf_counter()
        try:
            return call()
        finally:
            del self.started[threading.current_thread().name]

    def _settle_all(self, outcomes: list[tuple[int, Any, Exception | None]], jobs: dict[int, Job]) -> None:
        for key, result, error in outcomes:
            job = jobs.pop(key, None)
            if job is not None:
                _answer(job, result, error)

    def _abandon(self, jobs: dict[int, Job]) -> None:
        """The worker stops: the jobs still in its searches get an error instead of no answer."""
        for job in jobs.values():
            _answer(job, None, RuntimeError("the server is shutting down"))

    def _run(self, batch: list[Job], items: int) -> None:
        self._leave(batch)
        t0 = time.perf_counter()
        for job in batch:
            self.on_wait(t0 - job.queued)

        def outcomes() -> list[tuple[Job, Any, Exception | None]]:
            out, raised = self._outcomes(batch)
            if len(batch) > 1 and raised is not None and not isinstance(raised, SearchStopped):
                out = [o for job in batch for o in self._outcomes([job])[0]]  # each job on its own
            return out

        done = self._timed(outcomes)
        self.on_batch(len(batch), items, time.perf_counter() - t0, None)
        for job, result, error in done:
            _answer(job, result, error)

    def _outcomes(self, jobs: list[Job]) -> tuple[list[tuple[Job, Any, Exception | None]], Exception | None]:
        """``(job, result, error)`` of running ``jobs`` as one batch, and what the batch raised (None
        if it ran: a result that is an exception is its job's own error); the search stops between
        two steps once every caller has given up."""
        jobs = [job for job in jobs if not job.future.cancelled()]
        if not jobs:
            return [], None
        try:
            with stop_when(lambda: self.abandoning or all(job.future.cancelled() for job in jobs)):
                results = self.run(jobs[0].kind, [job.payload for job in jobs])
        except Exception as e:  # noqa: BLE001 -- the batch's callers get the error
            return [(job, None, e) for job in jobs], e
        return [(job, None, r) if isinstance(r, Exception) else (job, r, None)
                for job, r in zip(jobs, results, strict=True)], None  # fmt: skip


def _answer(job: Job, result: Any, error: Exception | None) -> None:
    """Hand ``job``'s outcome to its event loop (nothing if its caller is gone)."""
    if job.future.cancelled():
        return  # its caller is gone (and its event loop may be closed)
    with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: the worker goes on
        job.loop.call_soon_threadsafe(_settle, job.future, result, error)


def _settle(future: asyncio.Future, result: Any, error: Exception | None) -> None:
    if future.done():  # cancelled meanwhile: the caller is gone
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
