"""The dynamic batcher: same-key jobs decoded together, a bounded queue, cancelled jobs skipped,
a failure reaching the callers of the job that caused it only, a search stopped when its callers give up."""

import asyncio
import threading
import time

import pytest

from aiayn.decoding.cancel import SearchStopped, check_stop
from aiayn.serve.batcher import Batcher, QueueFull


class Recorder:
    def __init__(self, delay=0.0, fail=False):
        self.calls, self.delay, self.fail = [], delay, fail
        self.release = threading.Event()

    def __call__(self, key, payloads):
        self.calls.append((key, list(payloads)))
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("model failed")
        return [f"{key}:{p}" for p in payloads]


def test_concurrent_jobs_of_one_key_run_as_one_batch():
    run = Recorder(delay=0.05)
    b = Batcher(run, max_queue=16, window=0.05, max_items=8)

    async def go():
        return await asyncio.gather(*(b.submit("k", i) for i in range(6)), b.submit("other", 9))

    out = asyncio.run(go())
    b.close()
    assert out == [f"k:{i}" for i in range(6)] + ["other:9"]
    sizes = sorted(len(p) for _, p in run.calls)
    assert sizes[-1] >= 5 and sum(sizes) == 7  # the k jobs shared a batch; "other" ran on its own
    assert all(len({key for key, _ in [c]}) == 1 for c in run.calls)


def test_max_items_zero_runs_one_job_at_a_time():
    run = Recorder()
    b = Batcher(run, max_queue=16, window=0.05, max_items=0)

    async def go():
        return await asyncio.gather(*(b.submit("k", i) for i in range(4)))

    assert asyncio.run(go()) == [f"k:{i}" for i in range(4)]
    b.close()
    assert [len(p) for _, p in run.calls] == [1, 1, 1, 1]


def _one_slot_queue() -> tuple[Recorder, Batcher]:
    """A batcher whose queue holds one job, and whose worker takes 0.3 s a job."""
    run = Recorder(delay=0.3)
    return run, Batcher(run, max_queue=1, window=0.0, max_items=1)


async def _busy_and_full(b: Batcher) -> tuple[asyncio.Future, asyncio.Future]:
    """Job 1 running on the worker and job 2 waiting in the queue (then full)."""
    first = asyncio.ensure_future(b.submit("k", 1))
    await asyncio.sleep(0.1)  # the worker is busy with job 1
    second = asyncio.ensure_future(b.submit("k", 2))  # waits in the queue (size 1)
    await asyncio.sleep(0.01)
    return first, second


def test_a_full_queue_refuses_at_once_and_cancelled_jobs_are_skipped():
    run, b = _one_slot_queue()

    async def go():
        first, second = await _busy_and_full(b)
        with pytest.raises(QueueFull):
            await b.submit("k", 3)
        second.cancel()  # its caller gave up: the slot's job must not run
        return await first

    assert asyncio.run(go()) == "k:1"
    time.sleep(0.4)
    b.close()
    assert [p for _, p in run.calls] == [[1]]


def test_jobs_left_for_a_later_round_count_against_the_queue_bound():
    # While the worker gathers a batch of kind "a", jobs of kind "b" stay queued for the next round;
    # they still wait, so the bound counts them: at most max_queue jobs wait, one more is 429.
    run = Recorder()
    b = Batcher(run, max_queue=3, window=0.5, max_items=8)

    async def go():
        first = asyncio.ensure_future(b.submit("a", 0))
        await asyncio.sleep(0.05)  # the worker holds "a" and gathers for 0.5 s
        accepted, refused = [first], 0
        for i in range(1, 6):
            try:
                accepted.append(asyncio.ensure_future(b.submit("b", i)))
                await asyncio.sleep(0.02)  # the worker's gathering passes it over meanwhile
                if accepted[-1].done() and isinstance(accepted[-1].exception(), QueueFull):
                    accepted.pop()
                    refused += 1
            except QueueFull:
                refused += 1
        assert b.depth() <= 3
        return refused, await asyncio.gather(*accepted)

    refused, out = asyncio.run(go())
    b.close()
    assert refused == 3 and out == ["a:0", "b:1", "b:2"]
    assert b.depth() == 0  # every accepted job ran: nothing is left counted as waiting


def test_a_cancelled_job_gives_its_place_in_a_full_queue_to_the_next_caller():
    run, b = _one_slot_queue()

    async def go():
        first, second = await _busy_and_full(b)
        second.cancel()
        await asyncio.sleep(0.01)
        depth = b.depth()
        third = await b.submit("k", 3)  # not 429: the cancelled job no longer waits
        return await first, third, depth

    assert asyncio.run(go()) == ("k:1", "k:3", 0)
    b.close()
    assert [p for _, p in run.calls] == [[1], [3]]


def test_a_job_passed_over_by_a_gathering_worker_goes_to_the_idle_one_at_once():
    """Two workers: one gathers a batch of kind "a" for its 1 s window while the other, back from a
    job of its own, waits. A job of kind "b" arriving then starts on the idle worker at once; it is
    not kept, unseen by it, until the first one's window ends."""
    b = Batcher(Recorder(delay=0.2), max_queue=16, window=1.0, max_items=8, workers=2)

    async def go():
        slow = asyncio.ensure_future(b.submit("slow", 0, alone=True))  # one worker, 0.2 s, no window
        await asyncio.sleep(0.05)
        gathering = asyncio.ensure_future(b.submit("a", 1))  # the other worker, gathering until 1.05 s
        await slow
        await asyncio.sleep(0.1)  # the first worker is idle now, waiting behind the gathering one
        t0 = time.perf_counter()
        answer = await b.submit("b", 2, alone=True)  # alone: it runs without a window of its own
        return answer, time.perf_counter() - t0, await gathering

    answer, waited, gathered = asyncio.run(go())
    b.close()
    assert answer == "b:2" and gathered == "a:1"
    assert waited < 0.6  # its own 0.2 s run, not the window's 0.7 s left plus "a"'s run


def test_with_two_workers_a_job_that_does_not_fit_a_full_search_starts_on_the_idle_worker():
    searches = []

    def stepwise(kind):
        searches.append(FakeRunning(delay=0.01))
        return searches[-1] if kind == "steps" else None

    b = Batcher(Recorder(), max_queue=16, window=0.0, max_items=2, workers=2, stepwise=stepwise)

    async def go():
        long = asyncio.ensure_future(b.submit("steps", 100, size=2))  # ~1 s, fills max_items
        await asyncio.sleep(0.1)
        t0 = time.perf_counter()
        short = await b.submit("steps", 3, size=2)
        return short, time.perf_counter() - t0, await long

    short, waited, long = asyncio.run(go())
    b.close()
    assert short == "done after 3" and long == "done after 100"
    assert waited < 0.5 and len(searches) == 2  # its own search on the other worker


def test_a_failure_reaches_every_caller_of_the_batch():
    b = Batcher(Recorder(fail=True), max_queue=4, window=0.05, max_items=4)

    async def go():
        return await asyncio.gather(b.submit("k", 1), b.submit("k", 2), return_exceptions=True)

    out = asyncio.run(go())
    b.close()
    assert all(isinstance(e, RuntimeError) and "model failed" in str(e) for e in out)


def test_a_bad_job_fails_alone_and_its_batch_mates_get_their_results():
    calls = []

    def run(key, payloads):
        calls.append(list(payloads))
        if "bad" in payloads:
            raise ValueError("cannot decode 'bad'")
        return [f"{key}:{p}" for p in payloads]

    b = Batcher(run, max_queue=16, window=0.1, max_items=8)

    async def go():
        return await asyncio.gather(*(b.submit("k", p) for p in (1, "bad", 3)), return_exceptions=True)

    out = asyncio.run(go())
    b.close()
    assert out[0] == "k:1" and out[2] == "k:3" and isinstance(out[1], ValueError)
    assert calls[0] == [1, "bad", 3] and sorted(map(str, calls[1:])) == ["['bad']", "[1]", "[3]"]


def test_a_job_whose_result_is_an_error_gets_it_and_the_batch_is_not_run_again():
    """A request whose answer would be over a limit (attention) is known only after the search: it
    failed the whole batch, which then ran again a job at a time, every other request decoded twice."""
    calls = []

    def run(key, payloads):
        calls.append(list(payloads))
        return [ValueError(f"{p} is too large") if p == "big" else f"{key}:{p}" for p in payloads]

    b = Batcher(run, max_queue=16, window=0.1, max_items=8)

    async def outcome(payload):
        try:
            return "answered", await b.submit("k", payload)
        except ValueError as e:
            return "raised", str(e)

    async def go():
        return await asyncio.gather(*(outcome(p) for p in (1, "big", 3)))

    out = asyncio.run(go())
    b.close()
    assert out == [("answered", "k:1"), ("raised", "big is too large"), ("answered", "k:3")]
    assert calls == [[1, "big", 3]]


def test_a_batch_whose_callers_all_gave_up_stops_between_steps_and_busy_says_how_long():
    steps, stopped = [], threading.Event()

    def run(key, payloads):
        try:
            for _ in range(1000):  # a long search: 10 s unless stopped
                check_stop()
                steps.append(1)
                time.sleep(0.01)
        except SearchStopped:
            stopped.set()
            raise
        return payloads

    b = Batcher(run, max_queue=4, window=0.0, max_items=4)

    async def go():
        job = asyncio.ensure_future(b.submit("k", 1))
        await asyncio.sleep(0.3)
        busy = b.busy()
        job.cancel()  # the caller gives up (a timeout, a client gone)
        return busy

    busy = asyncio.run(go())
    assert stopped.wait(2.0) and len(steps) < 100
    assert len(busy) == 1 and 0.2 < busy[0] < 2.0
    time.sleep(0.05)
    assert b.busy() == []
    b.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_two_workers_run_two_batches_at_once(workers):
    """With 2 workers a second batch starts while the first runs (both meet at a barrier); with 1
    worker the barrier times out, as batches run one after another."""
    barrier = threading.Barrier(2, timeout=1.0)

    def run(key, payloads):
        try:
            barrier.wait()
            return [f"together:{p}" for p in payloads]
        except threading.BrokenBarrierError:
            return [f"alone:{p}" for p in payloads]

    b = Batcher(run, max_queue=16, window=0.0, max_items=1, workers=workers)

    async def go():
        return await asyncio.gather(b.submit("k", 1), b.submit("k", 2))

    out = asyncio.run(go())
    b.close()
    assert out == (["together:1", "together:2"] if workers == 2 else ["alone:1", "alone:2"])


def test_a_job_submitted_alone_is_never_batched():
    """A streamed generation talks to one client: equal kinds run in batches of their own."""
    run = Recorder(delay=0.05)
    b = Batcher(run, max_queue=16, window=0.05, max_items=8)

    async def go():
        return await asyncio.gather(*(b.submit("g", i, alone=True) for i in range(3)), b.submit("k", 9))

    assert asyncio.run(go()) == ["g:0", "g:1", "g:2", "k:9"]
    b.close()
    assert sorted(len(p) for _, p in run.calls) == [1, 1, 1, 1]


class FakeRunning:
    """A running search whose jobs are numbers of steps; each step takes ``delay`` seconds.

    Records the texts in flight at each step and the keys dropped."""

    def __init__(self, delay=0.01, fail_at=None):
        self.left, self.delay, self.fail_at = {}, delay, fail_at
        self.sizes, self.in_flight, self.dropped, self.steps = {}, [], set(), 0

    def __len__(self):
        return len(self.left)

    @property
    def texts(self):
        return sum(self.sizes.values())

    def add(self, jobs):
        for key, steps in jobs:
            self.left[key], self.sizes[key] = steps, 2  # every job is 2 texts (submit(..., size=2))
        return []

    def step(self):
        self.steps += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise RuntimeError("step failed")
        self.in_flight.append(self.texts)
        time.sleep(self.delay)
        done = []
        for key in list(self.left):
            self.left[key] -= 1
            if not self.left[key]:
                done.append((key, f"done after {self.steps}", None))
                del self.left[key], self.sizes[key]
        return done

    def drop(self, keys):
        self.dropped |= keys
        for key in keys:
            self.left.pop(key, None), self.sizes.pop(key, None)


def _stepwise(search, kind="steps"):
    return lambda k: search if k == kind else None


def test_a_job_arriving_during_a_running_search_is_answered_without_waiting_for_it():
    search, run = FakeRunning(delay=0.01), Recorder()
    b = Batcher(run, max_queue=16, window=0.0, max_items=8, stepwise=_stepwise(search))

    async def go():
        long = asyncio.ensure_future(b.submit("steps", 60, size=2))  # ~0.6 s of steps
        await asyncio.sleep(0.1)
        t0 = time.perf_counter()
        short = await b.submit("steps", 3, size=2)
        waited = time.perf_counter() - t0
        batch = await b.submit("other", 1)  # a kind run in batches, between two steps
        return short, waited, await long, batch, long.done()

    short, waited, long, batch, _ = asyncio.run(go())
    b.close()
    assert short.startswith("done after") and waited < 0.3  # 3 steps, not the long job's 60
    assert long == "done after 60" and batch == "other:1"
    assert max(search.in_flight) == 4  # both jobs were in the search at once


def test_a_job_reaching_an_idle_worker_starts_its_search_at_once_not_after_the_window():
    """Later jobs join between steps, so a stepwise job never waits ``window`` for company; a job
    run in whole batches still does."""
    search = FakeRunning(delay=0.001)
    b = Batcher(Recorder(), max_queue=16, window=0.5, max_items=8, stepwise=_stepwise(search))

    async def go():
        timings = []
        for kind, payload in (("steps", 2), ("other", 1)):
            t0 = time.perf_counter()
            await b.submit(kind, payload, size=2 if kind == "steps" else 1)
            timings.append(time.perf_counter() - t0)
        return timings

    stepwise, whole = asyncio.run(go())
    b.close()
    assert stepwise < 0.25 and whole >= 0.45  # the whole batch waited its window for company


def test_texts_in_flight_stay_within_max_items_and_the_rest_wait():
    search = FakeRunning(delay=0.002)
    b = Batcher(Recorder(), max_queue=16, window=0.0, max_items=4, stepwise=_stepwise(search))

    async def go():
        return await asyncio.gather(*(b.submit("steps", 5, size=2) for _ in range(5)))

    assert all(r.startswith("done after") for r in asyncio.run(go()))
    b.close()
    assert max(search.in_flight) == 4 and search.steps >= 15  # two jobs at a time, five in all


def test_a_job_of_more_texts_than_max_items_runs_as_one_call_not_whole_in_the_running_search():
    """Before: on an idle worker it joined the running search whole (10 texts in flight with
    ``max_items`` 4: a LibreTranslate request of 512 sentences in one encoder pass)."""
    search, run = FakeRunning(delay=0.002), Recorder()
    b = Batcher(run, max_queue=16, window=0.0, max_items=4, stepwise=_stepwise(search))

    async def go():
        return await b.submit("steps", 7, size=10), await b.submit("steps", 3, size=2)

    big, small = asyncio.run(go())
    b.close()
    assert big == "steps:7" and run.calls == [("steps", [7])]  # one call: its search batches by tokens
    assert small.startswith("done after") and max(search.in_flight) == 2


def test_the_seconds_spent_admitting_jobs_count_as_busy_seconds():
    """Admitting a job (its encoder pass and join) was left out of ``on_batch``'s seconds, so
    ``aiayn_decode_seconds_total`` understated how busy a worker was by the admissions' share."""

    class SlowAdmission(FakeRunning):
        def add(self, jobs):
            time.sleep(0.3)
            return super().add(jobs)

    seconds = []
    b = Batcher(Recorder(), max_queue=16, window=0.0, max_items=8, stepwise=_stepwise(SlowAdmission(delay=0)),
                on_batch=lambda jobs, texts, s, step: seconds.append(s))  # fmt: skip

    async def go():
        return await b.submit("steps", 2, size=2)

    assert asyncio.run(go()).startswith("done after")
    b.close()
    assert sum(seconds) >= 0.3 and seconds[0] >= 0.3


def test_a_caller_who_gives_up_leaves_the_running_search_at_the_next_step():
    search = FakeRunning(delay=0.005)
    b = Batcher(Recorder(), max_queue=16, window=0.0, max_items=8, stepwise=_stepwise(search))

    async def go():
        job = asyncio.ensure_future(b.submit("steps", 10_000, size=2))
        await asyncio.sleep(0.1)
        job.cancel()
        await asyncio.sleep(0.1)
        return await b.submit("steps", 2, size=2)

    assert asyncio.run(go()).startswith("done after")
    b.close()
    assert len(search.dropped) == 1 and len(search) == 0 and search.steps < 200


def test_a_failing_step_reaches_the_jobs_of_its_search_and_the_worker_goes_on():
    failing, fresh = FakeRunning(fail_at=3), FakeRunning()
    searches, batches = iter([failing, fresh]), []
    b = Batcher(Recorder(), max_queue=16, window=0.02, max_items=8, on_batch=lambda *a: batches.append(a),
                stepwise=lambda k: next(searches) if k == "steps" else None)  # fmt: skip

    async def go():
        first = await asyncio.gather(
            *(b.submit("steps", 10, size=2) for _ in range(2)), return_exceptions=True
        )
        return first, await b.submit("steps", 2, size=2)

    first, later = asyncio.run(go())
    b.close()
    assert [str(e) for e in first] == ["step failed"] * 2
    assert later == "done after 2"  # a new search for the next job
    assert [texts for _, texts, _, _ in batches] == [4, 4, 4, 2, 2]
    # each step's finished results, for the metrics: none from the failed step (its jobs got the error)
    assert [step for *_, step in batches] == [("steps", [])] * 4 + [("steps", ["done after 2"])]


def test_each_worker_thread_runs_on_start_before_its_first_job():
    """The server sets each worker's PyTorch threads there (``on_start``), not on the main thread."""
    started, ran = [], []

    def on_start():
        started.append(threading.current_thread())

    b = Batcher(lambda key, payloads: ran.append(threading.current_thread()) or payloads, max_queue=8,
                window=0.0, max_items=4, workers=2, on_start=on_start)  # fmt: skip

    async def go():
        return await asyncio.gather(*(b.submit("k", i) for i in range(4)))

    assert asyncio.run(go()) == [0, 1, 2, 3]
    b.close()
    assert sorted(t.name for t in started) == ["aiayn-model-0", "aiayn-model-1"]
    assert set(ran) <= set(started) and threading.main_thread() not in started


def test_closing_finishes_the_searches_that_are_running():
    """``close`` lets a running search finish its jobs (a server shutting down answers them) instead
    of abandoning them after one more step."""
    search = FakeRunning(delay=0.01)
    b = Batcher(Recorder(), max_queue=16, window=0.0, max_items=8, stepwise=_stepwise(search))

    async def go():
        job = asyncio.ensure_future(b.submit("steps", 30, size=2))  # ~0.3 s of steps
        await asyncio.sleep(0.05)
        await asyncio.get_running_loop().run_in_executor(None, b.close)
        return await job

    assert asyncio.run(go()) == "done after 30"


@pytest.mark.parametrize("kind", ["steps", "batch"])
def test_a_forced_close_stops_the_searches_at_their_next_step_and_answers_with_an_error(kind):
    """``close(finish=False)`` (a second Ctrl-C): no worker is left inside the model while the
    interpreter shuts down, and the jobs it held are answered with an error, not left hanging."""
    search = FakeRunning(delay=0.01)

    def slow(key, payloads):  # a whole-batch search of 1,000 steps that looks for a stop between them
        for _ in range(1000):
            check_stop()
            time.sleep(0.01)
        return payloads

    b = Batcher(slow, max_queue=16, window=0.0, max_items=8, stepwise=_stepwise(search))

    async def go():
        job = asyncio.ensure_future(b.submit(kind, 1000, size=2))
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(None, lambda: b.close(finish=False))
        closed = time.perf_counter() - t0
        with pytest.raises((RuntimeError, SearchStopped)):
            await job
        return closed

    assert asyncio.run(go()) < 1.0 and not any(t.is_alive() for t in b.threads)


@pytest.mark.parametrize("where", ["start", "drop", "on_batch"])
def test_a_fault_outside_the_model_calls_answers_its_jobs_and_the_worker_goes_on(where):
    """A worker round that raised outside the model's own calls (starting a search, dropping rows, a
    metrics callback) used to end the thread: its job was never answered, its queue place never given
    back, and every later request waited for its timeout. Now those jobs get the error, the worker
    stays alive and serves the next job, and the queue count is back to zero."""
    search, faults = FakeRunning(delay=0.01), {"left": 1}

    def fault_once(name):
        if where == name and faults["left"]:
            faults["left"] -= 1
            raise RuntimeError(f"fault in {name}")

    def stepwise(kind):
        if kind == "steps":
            fault_once("start")
            return search
        return None

    drop = search.drop
    search.drop = lambda keys: (fault_once("drop"), drop(keys))
    b = Batcher(Recorder(), max_queue=4, window=0.0, max_items=8, stepwise=stepwise,
                on_batch=lambda *a: fault_once("on_batch"))  # fmt: skip

    async def go():
        if where == "drop":  # a caller that gives up makes the worker drop its rows
            gone = asyncio.ensure_future(b.submit("steps", 50, size=2))
            while not b.in_flight():  # in the search (a job cancelled before it starts is only skipped)
                await asyncio.sleep(0.005)
            gone.cancel()
        first = await asyncio.wait_for(asyncio.gather(b.submit("steps", 30, size=2), return_exceptions=True),
                                       5)  # fmt: skip
        after = await asyncio.wait_for(asyncio.gather(b.submit("steps", 2, size=2), b.submit("other", 1)), 5)
        return first[0], after

    first, after = asyncio.run(go())
    alive = [t.is_alive() for t in b.threads]
    depth = b.depth()
    b.close()
    assert alive == [True] and depth == 0 and faults["left"] == 0
    assert after[1] == "other:1" and after[0].startswith("done after")
    assert isinstance(first, RuntimeError) or str(first).startswith("done after")  # in the fault, or after it
