"""The kinds of job the batcher runs, each a small frozen dataclass naming its model and options.

A job kind is also the batcher's key: jobs of equal kinds (same class, same model, same options) are
decoded together in one call of ``run(service, payloads)``, which returns one result per payload. A
new kind of work is one more class here and the route that submits it; the worker side
(``Server._run``) does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from aiayn.decoding.options import SearchConfig
from aiayn.serve.running import RunningTranslations
from aiayn.serve.services import EncoderService, LMService, TranslationService


@dataclass(frozen=True)
class JobKind:
    """Work for the model named ``model``; subclasses add the options its jobs share."""

    model: str
    alone: ClassVar[bool] = False  # True: each job runs in a batch of its own

    def run(self, service: Any, payloads: list[Any]) -> list[Any]:
        raise NotImplementedError

    def output_tokens(self, results: list[Any]) -> int:
        """Tokens produced by a batch, for the throughput metrics (0 where not counted)."""
        return 0

    def running(self, service: Any) -> Any:
        """A running search that jobs of this kind join between decoding steps (iteration-level
        batching, ``Batcher``), or None: they run in batches."""
        return None


@dataclass(frozen=True)
class Translation(JobKind):
    """Each payload is one request's texts, encoded (``TranslationService.encode``); each result,
    that request's list of translations."""

    config: SearchConfig
    attention: bool  # add each text's attention weights (for the page)
    max_attention_values: int = 0  # with attention: the most weights one answer may carry

    def run(self, service: TranslationService, payloads: list[list[list[int]]]) -> list[list[dict]]:
        return service.run(self.config, payloads, self.attention, self.max_attention_values)

    def output_tokens(self, results: list[list[dict]]) -> int:
        best = (x["hypotheses"][:1] for r in results for x in r)
        return sum(len(h["tokens"]) for hyps in best for h in hyps)

    def running(self, service: TranslationService) -> RunningTranslations | None:
        if not service.can_run_stepwise(self.config):
            return None
        return RunningTranslations(service, self.config, self.attention, self.max_attention_values)


@dataclass(frozen=True)
class Classification(JobKind):
    """Each payload is one request's texts; each result, the ``top_k`` labels of each text."""

    top_k: int

    def run(self, service: EncoderService, payloads: list[list[str]]) -> list[list[list[dict]]]:
        return service.classify(payloads, self.top_k)


@dataclass(frozen=True)
class MaskFilling(JobKind):
    """Each payload is one text with ``<mask>``s and its ids (``EncoderService.query_ids``); each
    result, the ``top_k`` pieces at each mask."""

    top_k: int

    def run(self, service: EncoderService, payloads: list[tuple[str, list[int]]]) -> list[list[list[dict]]]:
        return [service.fill(query, self.top_k, ids) for query, ids in payloads]


@dataclass(frozen=True)
class Prompt:
    """What one generation request asks for: its prompt's ids (tokenized once, by the route); ``emit``
    receives each piece of text as it is made and returns False when the client has gone (sampling
    then stops)."""

    ids: tuple[int, ...]
    max_new_tokens: int
    config: SearchConfig
    emit: Callable[[str], bool]


@dataclass(frozen=True)
class Generation(JobKind):
    """One prompt continued by a language model. It streams to one client, so it runs alone; its
    result is the text and the number of tokens made."""

    alone: ClassVar[bool] = True

    def run(self, service: LMService, payloads: list[Prompt]) -> list[tuple[str, int]]:
        (prompt,) = payloads
        return [service.stream(prompt.ids, prompt.max_new_tokens, prompt.config, prompt.emit)]

    def output_tokens(self, results: list[tuple[str, int]]) -> int:
        return sum(tokens for _, tokens in results)
