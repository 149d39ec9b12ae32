"""Tokenizers: subword (sentencepiece BPE or unigram) for translation, characters for an LM.

Both share one small interface (``Tokenizer``): ``encode(text) -> list[int]``, ``encode_batch``,
``decode(ids) -> str``, ``vocab_size``, fixed special ids ``pad_id=0, bos_id=1, eos_id=2,
unk_id=3`` (so a model config can record them), ``save(dir)`` and ``load_tokenizer(dir)``, which
reads the kind from ``dir/tokenizer.json``. Files are JSON plus sentencepiece's own model file;
nothing is pickled. ``encode`` returns content ids only: batching adds bos/eos (``batching.py``).
``decode`` drops pad/bos/eos and shows unk as ``"\u2047"`` (as sentencepiece prints it).

**Mask.** A subword vocabulary trained with ``mask=True`` (for masked-LM pre-training) holds the
piece ``"<mask>"`` as a user-defined symbol at id 4: the text ``"<mask>"`` always encodes to it, so a
fill-mask query is plain text. ``mask_id`` is that id, or None for a vocabulary without it.

**Round trip.** Subword models use sentencepiece's ``identity`` normalisation with extra
whitespace kept and byte fallback on, so ``decode(encode(s)) == s`` for every string ``s`` but one
character's: characters never seen in training become UTF-8 byte pieces rather than unk, while U+2581
(``"▁"``), sentencepiece's own sign for a space, comes back as a space. We chose ``identity``
over ``nmt_nfkc`` because NFKC changes text (Multi30k's valid split has a no-break space that NFKC
turns into a space), and a decoded translation should be scored against the raw reference exactly
as written. Normalise the corpus beforehand if you want NFKC folding.

**Lowercase.** ``train(lowercase=True)`` adds a normalisation rule to the model file that maps each
upper- or title-case character to ``str.lower`` of it (character by character: a final Σ becomes σ,
not ς). Every program that reads the file with sentencepiece then lowercases its input, so
``decode(encode(s))`` is ``s`` lowercased character by character (``s.lower()`` but for that σ) and
``lowercase`` is True: a model of such a vocabulary reads and
writes lowercased text, as the Multi30k literature's models do (they train on the corpus's
lowercased files).

**Determinism.** Training reads every sentence (no sampling unless ``input_sentence_size`` is set,
then with ``seed``) with a fixed thread count, so one corpus gives byte-identical model files
(unigram's result depends on ``num_threads``; keep it fixed to reproduce a vocabulary).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from aiayn.atomic import write_bytes, write_text
from aiayn.data.corpus import ParallelCorpus
from aiayn.errors import ConfigError, DataError
from aiayn.textfiles import absent, read_json

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_IDS = dict(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID)  # model-config fields
N_SPECIAL = 4
MASK = "<mask>"  # the masked-LM symbol of a vocabulary trained with mask=True
UNK_SURFACE = "\u2047"  # "⁇": what decoding an unknown token shows
META_FILE = "tokenizer.json"
SPM_FILE = "spm.model"
# sentencepiece leaves out of training, without a word, every text longer than this (its default: 4,192
# bytes): a review or a document per line would then never shape the vocabulary
MAX_SENTENCE_BYTES = 1 << 24


class Tokenizer:
    """What every tokenizer offers. Ids ``0..3`` are pad, bos, eos, unk in every vocabulary."""

    kind: str
    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    vocab_size: int
    mask_id: int | None = None  # the id of "<mask>", if the vocabulary has it
    lowercase: bool = False  # whether encode lowercases its input (so decode gives lowercased text)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def model_bytes(self) -> bytes:
        """Everything that defines the vocabulary: equal bytes, equal tokenizer (a cache key)."""
        raise NotImplementedError

    def save(self, directory: str | os.PathLike) -> Path:
        raise NotImplementedError

    def _meta(self, **extra) -> dict:
        ids = dict(pad_id=self.pad_id, bos_id=self.bos_id, eos_id=self.eos_id, unk_id=self.unk_id)
        return dict(kind=self.kind, vocab_size=self.vocab_size, **ids, **extra)

    def _write_meta(self, directory: str | os.PathLike, **extra) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = json.dumps(self._meta(**extra), ensure_ascii=False, indent=1)
        write_text(directory / META_FILE, meta + "\n")
        return directory

    def _ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        return ids

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


class _Guarded:
    """Wraps a sentence iterator for sentencepiece, which would turn our errors into RuntimeError."""

    def __init__(self, sentences: Iterable[str]):
        self.it, self.error = iter(sentences), None

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self.it
        except Exception as e:  # re-raised after training, with its own type and message
            self.error = e


# texts from which sentencepiece's threaded call for a list is faster than one call per text: starting its
# threads costs about ten texts' encoding, which it wins back only over dozens (docs/serve.md has the figures)
SP_THREADED_BATCH = 48


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece BPE or unigram model (held in memory as its serialised bytes)."""

    kind = "sentencepiece"

    def __init__(self, model: bytes):
        self.model = model
        self.sp = spm.SentencePieceProcessor(model_proto=model)
        got = (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id())
        if got != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            raise DataError(
                f"this sentencepiece model has pad/bos/eos/unk ids {got}, aiayn needs (0, 1, 2, 3);"
                " train it with SentencePieceTokenizer.train"
            )
        self.vocab_size = self.sp.get_piece_size()
        mask = self.sp.piece_to_id(MASK)
        self.mask_id = mask if mask != UNK_ID else None
        self.lowercase = self.sp.normalize("A").endswith("a")  # trained with lowercase=True ("▁a")

    @classmethod
    def train(
        cls,
        sentences: Iterable[str],
        vocab_size: int = 8000,
        model_type: str = "bpe",
        character_coverage: float = 0.9995,  # rarer characters become byte pieces
        byte_fallback: bool = True,  # no unk for unseen characters; costs 256 ids
        num_threads: int = 1,  # fixed: unigram's result depends on it
        seed: int = 0,  # only matters with input_sentence_size > 0
        input_sentence_size: int = 0,  # 0 = train on every sentence; else a seeded sample
        source: str = "",  # where the sentences come from, for error messages (e.g. the file names)
        mask: bool = False,  # add "<mask>" (id 4) for masked-LM pre-training
        lowercase: bool = False,  # a normalisation rule that lowercases every input (module docstring)
        add_dummy_prefix: bool = True,  # "▁" before each text, as before every other word (False: a stream)
    ) -> SentencePieceTokenizer:
        """Train on an iterable of sentences (streamed; sentencepiece keeps them in memory)."""
        if model_type not in ("bpe", "unigram"):
            raise ConfigError(f"model_type={model_type!r} is not one of bpe, unigram")
        spm.set_random_generator_seed(seed)
        guarded, out = _Guarded(sentences), io.BytesIO()
        with tempfile.TemporaryDirectory(prefix="aiayn-spm-") as tmp:
            rules = dict(normalization_rule_name="identity")
            if lowercase:  # sentencepiece reads a user-defined rule table only from a file
                rules = dict(normalization_rule_tsv=str(Path(tmp) / "lowercase.tsv"))
                write_text(rules["normalization_rule_tsv"], _lowercase_rules())
            try:
                spm.SentencePieceTrainer.train(
                    sentence_iterator=iter(guarded),
                    model_writer=out,
                    vocab_size=vocab_size,
                    model_type=model_type,
                    character_coverage=character_coverage,
                    byte_fallback=byte_fallback,
                    **rules,
                    remove_extra_whitespaces=False,
                    add_dummy_prefix=add_dummy_prefix,
                    max_sentence_length=MAX_SENTENCE_BYTES,
                    pad_id=PAD_ID,
                    bos_id=BOS_ID,
                    eos_id=EOS_ID,
                    unk_id=UNK_ID,
                    num_threads=num_threads,
                    user_defined_symbols=[MASK] if mask else [],
                    input_sentence_size=input_sentence_size,
                    shuffle_input_sentence=True,
                    minloglevel=2,
                )
            except RuntimeError as e:
                if guarded.error is not None:
                    raise guarded.error from None
                why = str(e).split("]")[-1].strip().rstrip(".") or "no sentences to train on"
                raise DataError(
                    f"sentencepiece could not train a {model_type} vocabulary of {vocab_size} pieces"
                    f"{' on ' + source if source else ''}: {why}. Change vocab_size or train on more text"
                ) from None
        if guarded.error is not None:
            raise guarded.error
        return cls(_without_rule_file(out.getvalue()) if lowercase else out.getvalue())

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """sentencepiece's call for a list starts threads: for a few texts (a server's request) that
        costs ten times the encoding, so they are encoded one by one; the same ids either way."""
        if len(texts) < SP_THREADED_BATCH:
            return [self.sp.encode(t, out_type=int) for t in texts]
        return self.sp.encode(list(texts), out_type=int)

    def sample_batch(self, texts: Sequence[str], dropout: float, seed: int) -> list[list[int]]:
        """One random segmentation per text (subword regularisation): a BPE model skips each merge
        with probability ``dropout`` (BPE-dropout, Provilkov et al. 2020); a unigram model samples a
        segmentation from its lattice with smoothing ``dropout`` (Kudo 2018's α). ``dropout=0`` is
        ``encode_batch``. Seeded with ``seed``, one thread: the same call repeats its ids within a
        process, but not in another process (sentencepiece, measured): save a sample that must be
        read again (``aiayn/data/subword.py``)."""
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout={dropout} must be in [0, 1)")
        if dropout == 0:
            return self.encode_batch(texts)
        spm.set_random_generator_seed(seed % (2**32 - 1))  # 2**32 - 1 means "no seed" to sentencepiece
        return self.sp.encode(list(texts), out_type=int, enable_sampling=True, alpha=dropout, nbest_size=-1,
                              num_threads=1)  # fmt: skip

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode(self._ids(ids))

    def word_starts(self) -> list[bool]:
        """For each id, whether its piece begins a word ("▁…", or a special piece): what
        whole-word masking groups by (a word is a start piece and the pieces after it)."""
        sp = self.sp
        return [
            sp.id_to_piece(i).startswith("\u2581")
            or sp.is_control(i)
            or sp.is_unknown(i)
            or i == self.mask_id
            for i in range(self.vocab_size)
        ]

    def model_bytes(self) -> bytes:
        return self.model

    def save(self, directory: str | os.PathLike) -> Path:
        directory = self._write_meta(directory, model_file=SPM_FILE)
        write_bytes(directory / SPM_FILE, self.model)
        return directory

    @classmethod
    def _load(cls, directory: Path, meta: dict) -> SentencePieceTokenizer:
        name = meta.get("model_file", SPM_FILE)
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):  # beside it only
            raise DataError(
                f"{directory / META_FILE}: 'model_file' must be a file name in {directory}, got {name!r}"
            )
        path = directory / name
        if not path.is_file():
            raise DataError(f"{path} {absent(path)}; {directory / META_FILE} says the model is there")
        model = path.read_bytes()
        if not model:
            raise DataError(f"{path} is empty, not a sentencepiece model; retrain or restore the tokenizer")
        try:
            return cls(model)
        except RuntimeError:  # sentencepiece's "INTERNAL: … [model_proto->ParseFromArray(…)]"
            raise DataError(
                f"{path} is not a valid sentencepiece model (its bytes do not parse: truncated or "
                "corrupt); retrain or restore the tokenizer"
            ) from None
        except DataError as e:
            raise DataError(f"{path}: {e}") from None


class CharTokenizer(Tokenizer):
    """One id per character: the four specials, then the training text's characters, sorted.
    A character not seen in training encodes to ``unk_id`` and decodes to ``"\u2047"``."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        self.chars = list(chars)
        if any(len(c) != 1 for c in self.chars) or len(set(self.chars)) != len(self.chars):
            raise DataError("a character vocabulary needs distinct single characters")
        self.stoi = {c: i for i, c in enumerate(self.chars, start=N_SPECIAL)}
        self.surface = ["", "", "", UNK_SURFACE, *self.chars]  # what each id decodes to
        self.vocab_size = N_SPECIAL + len(self.chars)

    @classmethod
    def train(cls, text: str | Iterable[str]) -> CharTokenizer:
        """The vocabulary of a string or of an iterable of strings (e.g. ``TextCorpus.chunks()``)."""
        chars: set[str] = set()
        for piece in [text] if isinstance(text, str) else text:
            chars.update(piece)
        if not chars:
            raise DataError("cannot build a character vocabulary from empty text")
        return cls(sorted(chars))

    def encode(self, text: str) -> list[int]:
        get = self.stoi.get
        return [get(c, UNK_ID) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join([self.surface[i] for i in self._ids(ids)])

    def model_bytes(self) -> bytes:
        return json.dumps(self.chars, ensure_ascii=False).encode("utf-8")

    def save(self, directory: str | os.PathLike) -> Path:
        return self._write_meta(directory, chars=self.chars)

    @classmethod
    def _load(cls, directory: Path, meta: dict) -> CharTokenizer:
        chars = meta.get("chars")
        if not isinstance(chars, list) or not chars or not all(isinstance(c, str) for c in chars):
            raise DataError(f"{directory / META_FILE}: has no list of characters under 'chars'")
        try:
            return cls(chars)
        except DataError as e:
            raise DataError(f"{directory / META_FILE}: {e}") from None


KINDS = {cls.kind: cls for cls in (SentencePieceTokenizer, CharTokenizer)}


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
    """The tokenizer saved in ``directory`` (its kind read from ``tokenizer.json``)."""
    directory = Path(directory)
    path = directory / META_FILE
    if not path.is_file():
        raise DataError(f"{path} {absent(path)}; point to a folder written by tokenizer.save(folder)")
    meta = read_json(path, "", DataError, fix="it is truncated or corrupt: retrain or restore the tokenizer")
    kind = meta.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise DataError(
            f"{path}: not a tokenizer description (needs JSON with kind one of {', '.join(KINDS)})"
        )
    cls = KINDS[kind]
    tok = cls._load(directory, meta)
    saved = (meta.get("vocab_size"), meta.get("pad_id"), meta.get("unk_id"))
    if saved != (tok.vocab_size, PAD_ID, UNK_ID):
        raise DataError(
            f"{path}: vocab_size/pad_id/unk_id {saved} do not match the model files; retrain or restore "
            "the tokenizer"
        )
    return tok


def _lowercase_rules() -> str:
    """sentencepiece's rule table (hex code points, tab, hex code points) for ``str.lower`` of every
    character it changes (surrogates left out: they are not characters). It follows this Python's
    Unicode version, so a model file trained on another Python may differ in a few rare letters."""
    lines = []
    for c in range(0x110000):
        if 0xD800 <= c < 0xE000 or (low := chr(c).lower()) == chr(c):
            continue
        lines.append(f"{c:X}\t{' '.join(f'{ord(x):X}' for x in low)}\n")
    return "".join(lines)


def _without_rule_file(model: bytes) -> bytes:
    """``model`` without the name of the rule table it was trained from, a temporary file: the rules
    themselves are compiled into the file (``precompiled_charsmap``), and the same corpus then gives
    the same bytes in every process (a two-model ensemble checks that its vocabularies are equal)."""
    from sentencepiece import sentencepiece_model_pb2  # needs protobuf

    proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    proto.normalizer_spec.ClearField("normalization_rule_tsv")
    return proto.SerializeToString()


def train_translation_tokenizers(
    corpus: ParallelCorpus, vocab_size: int = 8000, joint: bool = True, **options
) -> tuple[SentencePieceTokenizer, SentencePieceTokenizer]:
    """Subword tokenizers for a translation corpus: one joint vocabulary for both sides (returned
    twice, the same object, for shared embeddings) or one per side. ``options`` go to ``train``."""
    train = SentencePieceTokenizer.train
    if joint:
        both = f"{corpus.src.path} and {corpus.tgt.path}"
        tok = train(corpus.sentences("both"), vocab_size, **options, source=both)
        return tok, tok
    src = train(corpus.sentences("src"), vocab_size, **options, source=str(corpus.src.path))
    return src, train(corpus.sentences("tgt"), vocab_size, **options, source=str(corpus.tgt.path))


def save_translation_tokenizers(directory: str | os.PathLike, src: Tokenizer, tgt: Tokenizer) -> Path:
    """Save into ``directory/src`` and ``directory/tgt`` (a joint vocabulary is written twice)."""
    directory = Path(directory)
    src.save(directory / "src")
    tgt.save(directory / "tgt")
    return directory


def load_translation_tokenizers(directory: str | os.PathLike) -> tuple[Tokenizer, Tokenizer]:
    """The pair saved by ``save_translation_tokenizers``; ``src is tgt`` when the vocabulary is
    joint (identical model files), which is when a model may share its embeddings."""
    directory = Path(directory)
    src, tgt = load_tokenizer(directory / "src"), load_tokenizer(directory / "tgt")
    return (src, src) if src.model_bytes() == tgt.model_bytes() else (src, tgt)
