"""Using a trained encoder-only model: texts in, labels (or mask fillers) out, and the scores.

``TextClassifier`` encodes texts as the classify task trained on them (``[bos] + pieces + [eos]``;
a text longer than training's ``max_len`` read by its ``long_text`` policy, ``data/long_text.py``:
head, tail, head and tail, or windows whose logits are averaged), batches the rows by tokens in
length order, and returns class probabilities in input order. A model saved without a policy (an
older run, an imported BERT) reads the head of each text, as many pieces as its positions allow.
``ClassifierEnsemble`` averages the class probabilities of several classifiers (``load_classifier``).
``MaskFiller`` predicts the pieces at each ``<mask>`` of a query.
``classification_metrics`` gives accuracy, macro-F1 and the confusion matrix of predictions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from aiayn.data.batching import TokenBatchSampler, collate_sequences
from aiayn.data.labelled import LabelledCorpus, LabelMap, one_field
from aiayn.data.long_text import LongText, pool_windows
from aiayn.data.tokenizer import MASK, Tokenizer
from aiayn.errors import ConfigError, DataError, ModelDirError
from aiayn.interop.model_dir import load_encoder_dir

DEFAULT_MAX_LEN = 512  # tokens per text (bos and eos included) for models without learned positions
DEFAULT_MAX_TOKENS = 8192  # padded tokens per batch


def _collate(model: nn.Module, rows, max_len: int) -> torch.Tensor:
    """``[bos] + row + [eos]``, padded, with the model's own special ids (an imported BERT's [CLS],
    [SEP] and [PAD] are not aiayn's 1, 2 and 0)."""
    c = model.config
    return collate_sequences(rows, max_len, c.pad_id, c.bos_id, c.eos_id)


def objective(model: nn.Module, meta: dict) -> str:
    """What an encoder was trained for: its ``config.json``'s ``objective`` (aiayn train records it),
    else "classify" for a model with a classification head (an imported or exported BERT
    classifier, whose vocabulary head never learnt to fill masks) and "mlm" for one without."""
    return meta.get("objective") or ("classify" if model.config.n_classes else "mlm")


def _max_len(model: nn.Module) -> int:
    c = model.config
    return c.max_len if c.positional == "learned" else max(c.max_len, DEFAULT_MAX_LEN)


class Labeller:
    """What a classifier does with its class probabilities (``probabilities``, by the subclass):
    score a labelled corpus, or rank each text's labels."""

    labels: list[str]

    def probabilities(self, texts: Sequence[str], max_tokens: int = DEFAULT_MAX_TOKENS) -> torch.Tensor:
        raise NotImplementedError

    def score(self, data: LabelledCorpus, max_tokens: int = DEFAULT_MAX_TOKENS) -> tuple[dict, list[int]]:
        """``classification_metrics`` of a labelled corpus, and the predicted class ids; a label the
        model does not know is a ``DataError`` naming its line."""
        gold = LabelMap(self.labels).ids(data)
        predicted = self.probabilities(data.texts, max_tokens).argmax(-1).tolist()
        return classification_metrics(gold, predicted, len(self.labels)), predicted

    def predict(
        self, texts: Sequence[str], top_k: int = 1, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> list[list[tuple[str, float]]]:
        """The ``top_k`` most probable labels of each text, with their probabilities."""
        if top_k < 1:
            raise ConfigError(f"top_k={top_k} must be at least 1")
        probs = self.probabilities(texts, max_tokens)
        values, index = probs.topk(min(top_k, len(self.labels)), dim=-1)
        return [[(self.labels[j], float(p)) for p, j in zip(v.tolist(), i.tolist(), strict=True)]
                for v, i in zip(values, index, strict=True)]  # fmt: skip


class TextClassifier(Labeller):
    """A fine-tuned encoder-only model, its tokenizer, its class names and how it reads long texts
    (``long_text``, over ``max_len`` tokens with bos and eos; default: the head, up to the model's
    positions)."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, labels: Sequence[str],
                 long_text: LongText | None = None, max_len: int | None = None):  # fmt: skip
        if getattr(model, "classifier", None) is None:
            raise ModelDirError(
                "this encoder has no classification head (a masked-LM checkpoint?); fine-tune it with "
                "aiayn train task=classify init_from=DIR, or use aiayn fill-mask"
            )
        self.model, self.tokenizer, self.labels = model.eval(), tokenizer, list(labels)
        self.max_len = _max_len(model) if max_len is None else max_len  # a saved 0 is refused, not replaced
        learned = model.config.max_len if model.config.positional == "learned" else None  # sinusoids grow
        if self.max_len < 3 or (learned and self.max_len > learned):
            raise ConfigError(f"max_len={self.max_len} must be in 3..{learned}: the model's learned positions"
                              if learned else f"max_len={self.max_len} must be at least 3")  # fmt: skip
        self.long_text = long_text or LongText()
        self.long_text.check(self.max_len)

    @classmethod
    def from_loaded(cls, model: nn.Module, tokenizer: Tokenizer, meta: dict) -> TextClassifier:
        """From ``load_encoder_dir``'s triple: labels and the long-text policy from ``config.json``."""
        labels = meta.get("labels") or [str(i) for i in range(model.config.n_classes)]
        n = getattr(model.config, "n_classes", None)
        if not (
            isinstance(labels, list) and len(labels) == n and len(set(labels)) == len(labels)
            and all(isinstance(y, str) and y.strip() and one_field(y) for y in labels)
        ):  # fmt: skip  # labelled.check_label's rule: a field of one output line per input, one class each
            raise ModelDirError(f"config.json: labels={labels!r} are not {n} distinct one-line names; "
                                "correct them there ('labels', or a BERT's 'id2label')")  # fmt: skip
        policy = meta.get("long_text")
        if policy is None:
            return cls(model, tokenizer, labels)
        fields = ("how", "stride", "max_len")
        if not isinstance(policy, dict) or set(policy) != set(fields) or type(policy["max_len"]) is not int:
            raise ModelDirError(f"config.json: long_text={policy!r} is not a policy (how, stride and an "
                                "integer max_len); restore the file from the training run")  # fmt: skip
        try:
            return cls(model, tokenizer, labels, LongText(policy["how"], policy["stride"]), policy["max_len"])
        except ConfigError as e:
            raise ModelDirError(f"config.json: long_text={policy!r} is not valid ({e}); restore the file "
                                "from the training run") from None  # fmt: skip

    @classmethod
    def from_dir(
        cls,
        directory: str | os.PathLike,
        device: str | torch.device = "cpu",
        long_text: LongText | None = None,
    ) -> TextClassifier:
        """The classifier in ``directory``; ``long_text`` replaces the policy saved with it (to read a
        model trained on heads in windows, say), over the same ``max_len``."""
        try:
            saved = cls.from_loaded(*load_encoder_dir(directory, device))
        except ModelDirError as e:  # which directory, where several make an ensemble
            raise ModelDirError(f"{directory}: {e}" if str(directory) not in str(e) else str(e)) from None
        if long_text is None:
            return saved
        return cls(saved.model, saved.tokenizer, saved.labels, long_text, saved.max_len)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text's ids, without bos and eos, as ``probabilities`` reads them."""
        return [np.asarray(ids, np.int64) for ids in self.tokenizer.encode_batch(list(texts))]

    @torch.no_grad()
    def probabilities(
        self,
        texts: Sequence[str],
        max_tokens: int = DEFAULT_MAX_TOKENS,
        encoded: list[np.ndarray] | None = None,
    ) -> torch.Tensor:
        """Shape: N texts -> (N, n_classes) class probabilities, in input order; ``encoded``:
        ``encode(texts)``, when the caller has it (an ensemble's members that share a tokenizer)."""
        if max_tokens < self.max_len:
            raise ConfigError(f"max_tokens={max_tokens} is less than one text's {self.max_len} tokens")
        encoded = self.encode(texts) if encoded is None else encoded
        rows, owner = self.long_text.rows(encoded, self.max_len)  # a row per text, or per window
        logits = torch.empty(len(rows), len(self.labels))  # (W, C)
        if not rows:
            return logits
        lengths = np.array([len(r) for r in rows]) + 1
        device = next(self.model.parameters()).device
        for idx in TokenBatchSampler(lengths, lengths, max_tokens, shuffle=False).batches(0):
            ids = _collate(self.model, [rows[i] for i in idx], self.max_len).to(device)
            logits[torch.from_numpy(idx)] = self.model.classify(ids).float().cpu()
        return pool_windows(logits, torch.from_numpy(owner), len(encoded)).softmax(-1)


class ClassifierEnsemble(Labeller):
    """M classifiers read as one: p(y | x) = (1/M) Σ_m p_m(y | x), the mean of their class
    probabilities, as a translation ensemble averages next-token probabilities (``models/ensemble.py``).

    The members must name the same classes in the same order; each reads a text with its own tokenizer
    and long-text policy, so their vocabularies, sizes and max_len may differ (fine-tuned with other
    seeds, or from other pre-trained encoders). ``model`` holds every member's network (for
    ``--quantize`` and ``--gemm``)."""

    def __init__(self, members: Sequence[TextClassifier]):
        if not members:
            raise ConfigError("an ensemble needs at least one classifier")
        self.members, self.labels = list(members), members[0].labels
        for i, m in enumerate(self.members[1:], start=2):
            if m.labels != self.labels:
                raise ConfigError(
                    f"ensemble member {i} has the labels {m.labels} but member 1 has {self.labels}: members "
                    "must be fine-tuned on the same classes"
                )
        self.model = nn.ModuleList(m.model for m in self.members)
        # members whose tokenizers are equal (the same encoder fine-tuned with other seeds) read one
        # encoding of the texts: each member's index of the first member with its tokenizer
        keys = [(type(m.tokenizer).__name__, m.tokenizer.model_bytes()) for m in self.members]
        self.reads_as = [keys.index(k) for k in keys]

    def probabilities(self, texts: Sequence[str], max_tokens: int = DEFAULT_MAX_TOKENS) -> torch.Tensor:
        """Shape: N texts -> (N, n_classes), the members' mean, in input order; the texts are
        tokenized once per distinct tokenizer."""
        encoded: dict[int, list[np.ndarray]] = {}
        probs = []
        for m, first in zip(self.members, self.reads_as, strict=True):
            if first not in encoded:
                encoded[first] = m.encode(texts)
            probs.append(m.probabilities(texts, max_tokens, encoded[first]))
        return torch.stack(probs).mean(0)


def load_classifier(
    directories: Sequence[str | os.PathLike],
    device: str | torch.device = "cpu",
    long_text: LongText | None = None,
) -> TextClassifier | ClassifierEnsemble:
    """The classifier in one directory (``TextClassifier.from_dir``), or the ensemble of several."""
    members = [TextClassifier.from_dir(d, device, long_text) for d in directories]
    return members[0] if len(members) == 1 else ClassifierEnsemble(members)


@dataclass(frozen=True)
class Filler:
    """One candidate for one ``<mask>``: the piece, its probability and the query filled with it."""

    token: str
    probability: float
    sequence: str


def _partial_bytes(tok: Tokenizer) -> list[int]:
    """The byte-fallback pieces that are not text on their own: bytes 0x80–0xFF (a part of some
    character's UTF-8, a filler that would read "\ufffd") and control bytes; the 95 printable ASCII
    characters stay."""
    sp = getattr(tok, "sp", None)
    if sp is None:
        return []
    values = {i: int(sp.id_to_piece(i)[1:-1], 16) for i in range(sp.get_piece_size()) if sp.is_byte(i)}
    return [i for i, byte in values.items() if not 0x20 <= byte < 0x7F]


class MaskFiller:
    """A masked-LM encoder and its tokenizer: the most probable pieces at each ``<mask>``."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, trained_max_len: int | None = None):
        if tokenizer.mask_id is None:
            raise ModelDirError(
                f"this model's vocabulary has no {MASK} piece; fill-mask needs a model pre-trained with "
                "aiayn train task=mlm"
            )
        self.model, self.tokenizer = model.eval(), tokenizer
        self.max_len = _max_len(model)
        if isinstance(trained_max_len, int) and model.config.positional == "learned":  # rows past: untrained
            self.max_len = min(self.max_len, trained_max_len)
        self.partial_bytes = _partial_bytes(tokenizer)

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, device: str | torch.device = "cpu") -> MaskFiller:
        model, tok, meta = load_encoder_dir(directory, device)
        if (trained_for := objective(model, meta)) != "mlm":
            raise ModelDirError(
                f"{directory} was trained for objective {trained_for!r} (its config.json, or a classifier's "
                "head), not as a masked LM: its predictions at <mask> mean nothing; fill-mask needs a model "
                "trained with task=mlm"
                + (" (classify texts with aiayn classify)" if trained_for == "classify" else "")
            )
        return cls(model, tok, meta.get("trained_max_len"))

    def query_ids(self, query: str) -> list[int]:
        """``query``'s ids as training masked them: a space before ``<mask>`` goes to the word that
        fills it, and so does sentencepiece's word boundary before a text that starts with ``<mask>``
        (a lone "▁" piece there, which no masked training text has)."""
        tok = self.tokenizer
        ids = tok.encode(query.replace(f" {MASK}", MASK))  # a BERT vocabulary reads its [MASK] too
        sp = getattr(tok, "sp", None)
        lone = sp.piece_to_id("\u2581") if sp is not None else None
        if lone is not None and lone != sp.unk_id():
            ids = [i for k, i in enumerate(ids) if not (i == lone and ids[k + 1 : k + 2] == [tok.mask_id])]
        return ids

    def check_query(self, query: str, ids: Sequence[int]) -> None:
        """A ``DataError`` for a query (of ``query_ids`` ``ids``) that ``fill`` cannot answer: no
        ``<mask>``, or more pieces than the model reads (a server refuses it before queueing it)."""
        if self.tokenizer.mask_id not in ids:
            raise DataError(f"the query {query!r} has no {MASK}: put {MASK} where a word should be predicted")
        if len(ids) + 2 > self.max_len:
            raise DataError(f"the query has {len(ids)} pieces; this model reads at most {self.max_len - 2}")

    @torch.no_grad()
    def fill(self, query: str, top_k: int = 5, ids: Sequence[int] | None = None) -> list[list[Filler]]:
        """For each ``<mask>`` of ``query`` in order, the ``top_k`` fillers, most probable first;
        ``ids``: ``query_ids(query)``, when the caller has them already (a server counts the masks
        when the request arrives).

        A space before ``<mask>`` belongs to the word that fills it (pieces carry their leading
        "▁"), so ``"Ein Mann <mask> Fahrrad."`` is read as ``"Ein Mann<mask> Fahrrad."``."""
        if top_k < 1:
            raise ConfigError(f"top_k={top_k} must be at least 1")
        tok = self.tokenizer
        ids = self.query_ids(query) if ids is None else list(ids)
        self.check_query(query, ids)
        device = next(self.model.parameters()).device
        batch = _collate(self.model, [np.asarray(ids, np.int64)], self.max_len).to(device)  # (1, T)
        logits = self.model(batch)[0].float()  # (T, V)
        # never predict <mask> itself, a special or what comes before <mask> (aiayn's specials, a
        # BERT's [unused] rows) — a vocabulary may put [MASK] first (its specials are named by id) —
        # nor a row past the vocabulary (a BERT's padding), nor a byte that is no text on its own
        banned = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        banned[: tok.mask_id + 1] = True
        specials = (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id)
        banned[[i for i in specials if i is not None and i >= 0]] = True
        banned[tok.vocab_size :] = True
        banned[self.partial_bytes] = True
        logits[:, banned] = -torch.inf
        probs = logits.softmax(-1)
        out = []
        for pos in (batch[0] == tok.mask_id).nonzero().flatten().tolist():
            values, index = probs[pos].topk(min(top_k, int((~banned).sum())))
            fillers = []
            for p, j in zip(values.tolist(), index.tolist(), strict=True):
                filled = list(ids)
                filled[pos - 1] = j  # pos counts bos
                fillers.append(Filler(tok.decode([j]), p, self._decode(filled)))
            out.append(fillers)
        return out

    def _decode(self, ids: list[int]) -> str:
        """The text of ``ids`` with its other masks shown: a BERT vocabulary's decode drops [MASK]."""
        tok = self.tokenizer
        if MASK in tok.decode([tok.mask_id]):
            return tok.decode(ids)
        parts: list[list[int]] = [[]]
        for i in ids:
            if i == tok.mask_id:
                parts.append([])
            else:
                parts[-1].append(i)
        return f" {MASK} ".join(tok.decode(part) for part in parts).strip()


def classification_metrics(gold: Sequence[int], predicted: Sequence[int], n_classes: int) -> dict:
    """Accuracy and macro-F1 (in %: the F1 of each class that is present or predicted, averaged with
    equal weight, as scikit-learn's ``f1_score(average="macro")``; a class in neither, e.g. one a
    dev set lacks, is left out, not counted 0), and the confusion matrix ``confusion[gold][predicted]``."""
    if len(gold) != len(predicted) or not gold:
        raise ValueError(f"need as many predictions as labels (got {len(predicted)} and {len(gold)})")
    confusion = np.zeros((n_classes, n_classes), np.int64)
    np.add.at(confusion, (np.asarray(gold), np.asarray(predicted)), 1)
    tp = np.diag(confusion).astype(float)
    denominator = confusion.sum(0) + confusion.sum(1)  # predicted + gold per class = 2tp + fp + fn
    f1 = np.divide(2 * tp, denominator, out=np.zeros(n_classes), where=denominator > 0)
    return {
        "accuracy": round(100 * float(tp.sum()) / len(gold), 2),
        "macro_f1": round(100 * float(f1[denominator > 0].mean()), 2),
        "confusion": confusion.tolist(),
    }
