"""Translation requests decoded by one running search: they join and leave between steps.

``RunningTranslations`` is what the batcher steps for one job kind (``Batcher``'s iteration-level
scheduling): ``add`` encodes the texts of newly arrived requests and primes their rows' cache
(``decoding.running.RunningSearch``; their first token comes with the next ``step``), ``step``
advances every text by one token, and a request is answered as soon as its last text is done —
never later because of another request's longer texts.
A request whose caller gave up is dropped between two steps (``drop``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from aiayn.decoding.options import SearchConfig
from aiayn.decoding.running import RunningSearch
from aiayn.decoding.scoring import Hypothesis
from aiayn.serve.services import TranslationService

Outcome = tuple[Hashable, object, Exception | None]  # (job key, result, error)


@dataclass
class _Request:
    sources: list[list[int]]
    nbest: list[list[Hypothesis]]
    waiting: int = 0  # texts not done yet


class RunningTranslations:
    """The requests of one kind (one model, one set of decoding options) in one running search.

    ``len()`` is the number of requests in flight, ``texts`` their texts not done yet.
    """

    def __init__(self, service: TranslationService, config: SearchConfig, attention: bool,
                 max_attention_values: int = 0):  # fmt: skip
        self.service, self.attention, self.max_attention_values = service, attention, max_attention_values
        self.search = RunningSearch(service.model, config)
        self.requests: dict[Hashable, _Request] = {}

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def texts(self) -> int:
        return sum(r.waiting for r in self.requests.values())

    def add(self, jobs: Sequence[tuple[Hashable, list[list[int]]]]) -> list[Outcome]:
        """Start the requests ``(key, encoded sources)``; returns those already answered (blank
        texts only), the others answer from later ``step``s."""
        tags, sources = [], []
        for key, payload in jobs:
            request = _Request(list(payload), [[] for _ in payload])
            for i, src in enumerate(payload):
                if src:  # a blank text translates to "" at once
                    tags.append((key, i))
                    sources.append(src)
                    request.waiting += 1
            self.requests[key] = request
        keys = [key for key, _ in jobs]
        if sources:
            try:
                self.search.add(*self.service.translator.batch(sources, self.search.config), tags)
            except Exception:
                self.drop(set(keys))
                raise
        return self._answered([], keys)

    def step(self) -> list[Outcome]:
        return self._answered(self.search.step(), [])

    def drop(self, keys: set[Hashable]) -> None:
        """Forget the requests ``keys``; their texts leave the search."""
        gone = [(k, self.requests.pop(k)) for k in keys if k in self.requests]
        self.search.drop({(k, i) for k, request in gone for i in range(len(request.sources))})

    def _answered(self, done: list, check: list[Hashable]) -> list[Outcome]:
        """Record the finished texts; the requests (among those touched, and ``check``) now complete."""
        touched = list(check)
        for (key, i), hyps in done:
            request = self.requests[key]
            request.nbest[i] = hyps
            request.waiting -= 1
            touched.append(key)
        out = []
        for key in dict.fromkeys(touched):
            request = self.requests.get(key)
            if request is None or request.waiting:
                continue
            del self.requests[key]
            try:
                result = self.service.answer(request.sources, request.nbest, self.attention,
                                             self.max_attention_values)  # fmt: skip
                out.append((key, result, None))
            except Exception as e:  # noqa: BLE001 -- this request's own error (e.g. OverLimit)
                out.append((key, None, e))
        return out
