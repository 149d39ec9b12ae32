"""The models a server holds, each wrapped with what it can do for a batch of requests.

A service runs on the batcher's worker thread only, except the tokenizing (``TranslationService.encode``,
``EncoderService.query_ids``, the language model's ``generator.encode``), which a route calls when the
request arrives, so that a text the tokenizer refuses fails its own request before it joins a batch;
the ids it makes are what the worker reads, so no text is tokenized twice. ``TranslationService.run``
translates the encoded texts of several requests in one search (they share decoding options: the
batcher groups by them) and splits the results back; with ``attention`` it adds each sentence's
attention weights (encoder self, decoder self, cross, and a bidirectional model's right-to-left ones:
per layer and head) for the page, up to a number of weights per answer (``OverLimit``, 413, past it) —
for a single model; an ensemble (several directories served as one) translates without them.
``LMService.stream`` samples one token at a time and hands each to a callback (server-sent events).
``EncoderService`` classifies texts and fills masks; several classifier directories are served as one
ensemble (the mean of their class probabilities, as ``aiayn classify --ensemble-with`` reads them),
which classifies only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from aiayn.decoding.cancel import check_stop
from aiayn.decoding.classifier import ClassifierEnsemble, MaskFiller, TextClassifier, objective
from aiayn.decoding.generator import Generator
from aiayn.decoding.maps import decoder_read, token_labels
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.sampling import draw, occurrences, seeded
from aiayn.decoding.scoring import Hypothesis
from aiayn.decoding.steps import restrict
from aiayn.decoding.translator import Translator
from aiayn.errors import AiaynError, ConfigError
from aiayn.interop.model_dir import check_kind, load_encoder_dir, model_meta
from aiayn.models.ensemble import Ensemble
from aiayn.models.prepack import prepack
from aiayn.models.quantize import quantize

REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to

LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
                  "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pt": "Portuguese",
                  "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "zh": "Chinese"}  # fmt: skip


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


class OverLimit(AiaynError):
    """An answer would be larger than the server allows (413)."""

    status = 413


def per_request(flat: list, requests: Sequence[Sequence[str]]) -> list[list]:
    """The results of all requests' texts, decoded together, handed back request by request."""
    out, start = [], 0
    for r in requests:
        out.append(flat[start : start + len(r)])
        start += len(r)
    return out


def _weights(maps: dict[str, list[torch.Tensor]]) -> dict[str, list]:
    """``{kind: [L × (1, h, T_q, T_k)]}`` -> ``{kind: [L][h][T_q][T_k]}`` floats rounded to 4 places."""
    return {kind: [[[[round(v, 4) for v in row] for row in head] for head in w[0].float().tolist()]
                   for w in layers] for kind, layers in maps.items()}  # fmt: skip


class TranslationService:
    """One translation model, or several (``directories``) decoded as one ensemble: the mean of
    their next-token probabilities (``Translator.from_dirs``), with the first one's languages."""

    kind = "translation"

    def __init__(
        self, name: str, directories: Sequence[str | os.PathLike], device: str | torch.device = "cpu"
    ):
        self.name, self.directories = name, [Path(d) for d in directories]
        self.translator = Translator.from_dirs(self.directories, device)
        self.model = self.translator.model
        meta = model_meta(self.directories[0])
        self.source, self.target = meta.get("src_lang", "src"), meta.get("tgt_lang", "tgt")

    def encode(self, texts: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Each text's source ids, and the indices of the texts cut to the source tokens the model
        reads (``max_src_len``, as the CLI cuts them; the native answer says ``truncated``);
        ``AiaynError`` naming the text the tokenizer refuses."""
        try:
            return self.translator.encode(texts)
        except (UnicodeError, RuntimeError, TypeError, ValueError) as e:  # what tokenizers raise
            raise ConfigError(f"a text cannot be tokenized: {e}") from None

    def run(
        self,
        config: SearchConfig,
        requests: Sequence[Sequence[list[int]]],
        attention: bool,
        max_attention_values: int = 0,
    ) -> list[list[dict]]:
        """One result list per request (its ``encode``d texts), one dict per text: translation,
        alternatives, scores, tokens; with ``attention``, up to ``max_attention_values`` weights per
        request (past it, that request's result is its ``OverLimit``: the batch's others stand)."""
        repeats = [n for r in requests for n in occurrences(r)]  # each request's own: others change nothing
        nbest = self.translator.search([src for r in requests for src in r], config, repeats=repeats)
        results: list = []
        for r, hyps in zip(requests, per_request(nbest, requests)):
            try:
                results.append(self.answer(r, hyps, attention, max_attention_values))
            except OverLimit as e:  # its own answer, not the batch's: no one is decoded again
                results.append(e)
        return results

    def answer(
        self,
        sources: Sequence[list[int]],
        nbest: Sequence[Sequence[Hypothesis]],
        attention: bool,
        max_attention_values: int = 0,
    ) -> list[dict]:
        """One request's result: for each source, its hypotheses (``nbest``) as text, score and tokens,
        and with ``attention`` the best one's attention weights (``OverLimit`` past the limit)."""
        t, answers = self.translator, []
        for hyps in nbest:
            items = [
                {"text": t.detokenize(h), "score": round(h.score, 4), "tokens": t.forward_order(h.tokens)}
                for h in hyps
            ]
            answers.append({"translation": items[0]["text"] if items else "", "hypotheses": items})
            if hyps and hyps[0].r2l is not None:  # a bidirectional model: the memory it read
                answers[-1]["r2l"] = t.detokenize_r2l(hyps[0])
        if attention:
            self._check_attention_size(sources, nbest, max_attention_values)
            for src, hyps, result in zip(sources, nbest, answers):
                if hyps:
                    result["attention"] = self._attention(src, hyps[0])
        return answers

    def can_run_stepwise(self, config: SearchConfig) -> bool:
        """Whether requests with these options can join a running search (``serve/running.py``):
        a single plain model, decoded by beam search or greedily."""
        return not (isinstance(self.model, Ensemble) or self.model.config.bidirectional or config.sample
                    or config.mbr or config.r2l_beam is not None)  # fmt: skip

    def _check_attention_size(
        self, sources: Sequence[list[int]], nbest: Sequence[Sequence[Hypothesis]], limit: int
    ) -> None:
        """``OverLimit`` if one request's attention weights would number more than ``limit`` (``_size``)."""
        c = self.model.config
        if isinstance(self.model, Ensemble):
            return  # no attention is returned
        total = 0
        for src, hyps in zip(sources, nbest):
            if hyps:
                n_tgt = len(decoder_read(hyps[0].tokens, c.bos_id))
                n_r2l = sum(i != c.eos_id for i in hyps[0].r2l.tokens) + 1 if c.bidirectional else 0
                total += self._size(len(src) + 1, n_tgt, n_r2l)
        self._over(total, limit)

    def check_attention_floor(self, sources: Sequence[list[int]], limit: int) -> None:
        """``OverLimit`` before any search when even the shortest translations (the decoder reading
        only its ``bos``) would carry more than ``limit`` weights: the source side alone is too large."""
        if isinstance(self.model, Ensemble):
            return
        floor = int(self.model.config.bidirectional)
        self._over(sum(self._size(len(src) + 1, 1, floor) for src in sources if src), limit)

    def _size(self, n_src: int, n_tgt: int, n_r2l: int) -> int:
        """The attention weights of one text: h·(L_enc·S² + L_dec·(T² + T·S)) for S source and T
        decoder positions, and for a bidirectional model h·L_dec·(R² + R·S + T·R) more for the R
        right-to-left ones."""
        c = self.model.config
        return c.n_heads * (
            c.n_encoder_layers * n_src**2
            + c.n_decoder_layers * (n_tgt**2 + n_tgt * n_src + n_r2l**2 + n_r2l * n_src + n_tgt * n_r2l)
        )

    @staticmethod
    def _over(total: int, limit: int) -> None:
        if total > limit:
            raise OverLimit(f"the attention weights of this request would be {total:,} numbers, over this "
                            f"server's limit of {limit:,} (--max-attention-values); send fewer or shorter "
                            "texts, a smaller max_len, or leave attention out")  # fmt: skip

    def _attention(self, src: list[int], hyp: Hypothesis) -> dict:
        """The maps of the decoder reading ``[bos] + hyp`` over ``src`` (in decoding order: a
        right-to-left model's reversed), eos dropped; a bidirectional model's also of its
        right-to-left decoder reading ``[bos] + hyp.r2l``, the memory decoding read
        (``decoding.bidirectional.r2l_inputs``), and of the fourth sublayer reading those states."""
        t = self.translator
        if isinstance(t.model, Ensemble):
            return {}  # each member attends in its own way; there is no one map to show
        c = t.model.config
        src_ids, tgt_in = src + [c.eos_id], decoder_read(hyp.tokens, c.bos_id)
        extra, pieces = {}, {}
        if c.bidirectional:
            r2l_in = [c.bos_id, *(i for i in hyp.r2l.tokens if i != c.eos_id)]
            extra["r2l_tgt"] = torch.tensor([r2l_in], device=t.device)
            pieces["r2l_tokens"] = token_labels(t.tgt_tokenizer, r2l_in, c)
        with torch.inference_mode():
            maps = t.model.attention_weights(torch.tensor([src_ids], device=t.device),
                                             torch.tensor([tgt_in], device=t.device), **extra)  # fmt: skip
        pieces["src_tokens"] = token_labels(t.src_tokenizer, src_ids, c)
        pieces["tgt_tokens"] = token_labels(t.tgt_tokenizer, tgt_in, c)
        return {**pieces, **_weights(maps)}


class LMService:
    kind = "lm"

    def __init__(self, name: str, directory: str | os.PathLike, device: str | torch.device = "cpu"):
        self.name, self.directory = name, Path(directory)
        self.generator = Generator.from_dir(directory, device)
        self.model = self.generator.model

    @torch.inference_mode()
    def stream(
        self, prompt: Sequence[int], max_new_tokens: int, config: SearchConfig, emit: Callable[[str], bool]
    ) -> tuple[str, int]:
        """Sample (or, with ``config.sample=False``, take the argmax of) one token at a time, calling
        ``emit(text_piece)`` after each; ``emit`` returning False stops (the client left). Returns the
        text and the number of tokens made (for the metrics). ``prompt``: the prompt's ids
        (``generator.encode``, which the route ran when the request arrived)."""
        g, c = self.generator, self.generator.model.config
        adapter = g.adapter()  # reads the last ``g.context`` tokens at most, as Generator.complete
        prefix = adapter.start(torch.tensor([list(prompt)], device=g.device))
        generator = seeded(config, g.device)
        out: list[int] = []
        sent = ""  # the text emitted so far
        for _ in range(max_new_tokens):
            check_stop()  # the caller gave up (a timeout): stop between two tokens
            # no padding, no id past the tokenizer's, no eos before min_len: as every search (steps.py)
            logp = restrict(adapter.step(prefix), adapter, len(out), config.min_len)  # (1, V)
            token = int(draw(logp, config, generator) if config.sample else logp.argmax())
            if token == c.eos_id:
                break
            out.append(token)
            text = g.continuation(prompt, out)
            # a character whose bytes span tokens decodes as U+FFFD until its last byte: held back
            if not text.endswith(REPLACEMENT):
                if not emit(text[len(sent) :]):
                    break
                sent = text
            prefix = torch.cat([prefix, prefix.new_tensor([[token]])], 1)
        text = g.continuation(prompt, out)
        if text != sent:  # a character left unfinished at the end: its pieces still join to the text
            emit(text[len(sent) :])
        return text, len(out)


class EncoderService:
    """One encoder-only model, or several classifiers (``directories``) read as one ensemble: the
    mean of their class probabilities (``ClassifierEnsemble``), which fills no masks."""

    kind = "encoder"

    def __init__(
        self,
        name: str,
        directories: str | os.PathLike | Sequence[str | os.PathLike],
        device: str | torch.device = "cpu",
    ):
        one = isinstance(directories, (str, os.PathLike))
        self.name, self.directories = name, [Path(d) for d in ([directories] if one else directories)]
        if len(self.directories) > 1:
            members = [self._member(d, device) for d in self.directories]
            try:
                self.classifier = ClassifierEnsemble(members)
            except ConfigError as e:  # members' labels disagree: say which model and directories
                where = ", ".join(map(str, self.directories))
                raise ConfigError(f"model {self.name!r} ({where}): {e}") from None
            self.filler = None
            self.model = self.classifier.model  # every member's network, for --quantize and --gemm
            return
        model, tok, meta = load_encoder_dir(self.directories[0], device)
        self.model = model
        self.classifier = TextClassifier.from_loaded(model, tok, meta) if model.config.n_classes else None
        # a masked LM only (an imported BERT records no objective): rtd and clm runs have <mask> in
        # their vocabulary but never learnt to fill it, as MaskFiller.from_dir says for the CLI
        masked_lm = objective(model, meta) == "mlm"
        trained = meta.get("trained_max_len")
        self.filler = MaskFiller(model, tok, trained) if tok.mask_id is not None and masked_lm else None

    def _member(self, directory: Path, device: str | torch.device) -> TextClassifier:
        """The classifier in ``directory``, an ensemble's member (which must have a classification head)."""
        model, tok, meta = load_encoder_dir(directory, device)
        if not model.config.n_classes:
            raise ConfigError(f"model {self.name!r}: {directory} has no classification head; only "
                              "classifiers are served as an ensemble of encoders")  # fmt: skip
        return TextClassifier.from_loaded(model, tok, meta)

    def classify(self, requests: Sequence[Sequence[str]], top_k: int) -> list[list[list[dict]]]:
        if self.classifier is None:
            raise ConfigError(self.unable("classifier"))
        texts = [t for r in requests for t in r]
        ranked = self.classifier.predict(texts, top_k) if texts else []
        flat = [[{"label": y, "probability": round(p, 6)} for y, p in r] for r in ranked]
        return per_request(flat, requests)

    def unable(self, can: str) -> str:
        """Why this model has no ``can`` (``"classifier"`` or ``"filler"``), in one sentence for a client."""
        if can == "classifier":
            return (f"model {self.name!r} has no classification head; classify with a model fine-tuned by "
                    "aiayn train task=classify")  # fmt: skip
        if len(self.directories) > 1:
            n = len(self.directories)
            return f"model {self.name!r} is an ensemble of {n} classifiers, which fills no masks"
        return (f"model {self.name!r} fills no masks: fill-mask needs a model pre-trained by aiayn train "
                "task=mlm, with <mask> in its vocabulary")  # fmt: skip

    def query_ids(self, query: str) -> tuple[list[int], int]:
        """``query``'s ids as the filler reads them, and how many of them are ``<mask>``; a query
        it cannot answer is refused here, before it takes a place in the queue."""
        if self.filler is None:
            raise ConfigError(self.unable("filler"))
        ids = self.filler.query_ids(query)
        self.filler.check_query(query, ids)
        return ids, ids.count(self.filler.tokenizer.mask_id)

    def fill(self, query: str, top_k: int, ids: Sequence[int]) -> list[list[dict]]:
        """The ``top_k`` fillers of each mask of ``query``, whose ``query_ids`` are ``ids``."""
        if self.filler is None:
            raise ConfigError(self.unable("filler"))
        masks = self.filler.fill(query, top_k, ids)
        return [[{**vars(f), "probability": round(f.probability, 6)} for f in fillers] for fillers in masks]


SERVICES = {"transformer": TranslationService, "lm": LMService, "encoder": EncoderService}
ENSEMBLES = ("transformer", "encoder")  # the kinds whose several directories are served as one model


def load_service(
    name: str,
    directory: str | os.PathLike | Sequence[str | os.PathLike],
    device: str | torch.device = "cpu",
    quantization: str = "none",
    gemm: str = "blas",
):
    """The service for a model directory of any kind (``ModelDirError`` if it is not one), or for
    several translation model (or classifier) directories read as one ensemble, its model quantized as
    ``quantization`` says (``aiayn.models.quantize``) and its Linear kernels chosen as ``gemm`` says
    (``aiayn.models.prepack``)."""
    directories = [directory] if isinstance(directory, (str, os.PathLike)) else list(directory)
    kinds = [check_kind(d, tuple(SERVICES)) for d in directories]
    if len(directories) > 1 and (len(set(kinds)) > 1 or kinds[0] not in ENSEMBLES):
        raise ConfigError(f"model {name!r}: an ensemble's directories must be all translation models or "
                          f"all classifiers, not {' and '.join(sorted(set(kinds)))} models")  # fmt: skip
    if kinds[0] == "lm":
        service = LMService(name, directories[0], device)
    else:
        service = SERVICES[kinds[0]](name, directories, device)
    quantize(service.model, quantization)
    prepack(service.model, gemm)
    return service
