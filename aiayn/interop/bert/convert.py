"""Hugging Face BERT (``BertForMaskedLM``, ``BertForSequenceClassification``) in and out of aiayn's
``EncoderModel``.

BERT is the encoder-only model with its options set: post-norm layers, learned positions, a
LayerNorm on embedding + position (``embed_norm``), no embedding scale (``emb_scale="none"``); a
masked-LM head that transforms the states (dense, activation, LayerNorm: ``head_transform``) before
the vocabulary projection (tied or not) plus a bias (``output_bias``); a classifier that reads the
first token ([CLS], our ``bos``: ``pooling="first"``) through a tanh ``pooler``. Weights map one to
one (``name_map``), except that HF's separate query, key and value projections are the rows
[q; k; v] of our ``w_qkv``, and the token-type embeddings, which aiayn lacks (one segment only):

- **Export** writes them as zeros, so that BERT computes our function whatever ``token_type_ids``
  it is given; ``emb_scale`` is folded into untied matrices (``"emb"``: word embeddings × √d_model;
  ``"prj"``: decoder = E / √d_model), ``bias=False`` and ``output_bias=False`` become zero biases.
  What BERT cannot express is a ``ModelDirError`` naming the field and the value BERT needs
  (``check_exportable``). A classifier exports as ``BertForSequenceClassification``, which has no
  masked-LM head: ours, if it has one, is left out.
- **Import** adds ``token_type_embeddings[0]`` into the position table: exact for single-segment
  input (``token_type_ids`` all zeros, BERT's default), which is all aiayn's tasks feed; a model
  fed a second segment would need the other row. A ``BertForPreTraining`` checkpoint (the original
  ``bert-base-uncased`` files) loads as its masked-LM head; its next-sentence head and pooler are
  dropped, as ``BertForMaskedLM.from_pretrained`` drops them. A classifier's vocabulary head is
  tied to the embeddings (the checkpoint has none; it is never used).

BERT's tokenizer is WordPiece (``vocab.txt``, ``aiayn.interop.bert.tokenizer.WordPieceTokenizer``):
[CLS], [SEP], [PAD] and [UNK] become the model's bos, eos, pad and unk ids, and aiayn's batching
writes each text as [CLS] … [SEP], as BERT does. ``export_bert(…, tok=…)`` writes a WordPiece
tokenizer as ``vocab.txt`` + ``tokenizer_config.json``, which transformers' ``AutoTokenizer`` reads;
any other (a sentencepiece vocabulary has no ``vocab.txt`` form) goes into ``aiayn_tokenizer/``,
out of the way of HF's ``tokenizer.json``, and ``load_bert_dir`` prefers it when it is there; a
sentencepiece one is also written as HF's fast-tokenizer files (``fast_tokenizer.py``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import Tensor

from aiayn import textfiles
from aiayn.data.tokenizer import KINDS, META_FILE, SentencePieceTokenizer, Tokenizer, load_tokenizer
from aiayn.errors import ModelDirError
from aiayn.interop import hf
from aiayn.interop.bert.fast_tokenizer import save_fast_tokenizer
from aiayn.interop.bert.tokenizer import WordPieceTokenizer, load_bert_tokenizer
from aiayn.models.config import EncoderConfig
from aiayn.models.encoder import EncoderModel
from aiayn.models.io import check_float32

# BertConfig's defaults, for fields a config.json leaves out
DEFAULTS = dict(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
    layer_norm_eps=1e-12, pad_token_id=0, position_embedding_type="absolute", is_decoder=False,
    add_cross_attention=False, tie_word_embeddings=True, problem_type=None,
)  # fmt: skip
HIDDEN_ACT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}
MASKED_LM = ("BertForMaskedLM", "BertForPreTraining")  # architectures read as the masked-LM model
CLASSIFIER = "BertForSequenceClassification"
WORDS, POSITIONS, TOKEN_TYPES = (
    f"bert.embeddings.{x}_embeddings.weight" for x in ("word", "position", "token_type")
)
DECODER, BIAS, DECODER_BIAS = (
    "cls.predictions.decoder.weight",
    "cls.predictions.bias",
    "cls.predictions.decoder.bias",
)
BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")  # stored by old transformers
NOT_MASKED_LM = ("bert.pooler.", "cls.seq_relationship.")  # BertForPreTraining's pooler and NSP head
OLD_NAMES = {"gamma": "weight", "beta": "bias"}  # LayerNorm parameters in checkpoints converted from TF
AIAYN_TOKENIZER = hf.AIAYN_TOKENIZER
# An encoder's own config.json fields that an export keeps as ``aiayn_<name>``: the positions it was
# trained on (a learned table has rows past them that no update reached), and a classifier's way of
# reading long texts and the columns of its tables (so ``aiayn evaluate`` reads them as it did)
KEPT = ("trained_max_len", "long_text", "text_column", "label_column")


def name_map(c: EncoderConfig, tie: bool | None = None) -> hf.NameMap:
    """Every aiayn tensor of a BERT-shaped ``EncoderModel`` and the HF tensor(s) it is made of.

    A classifier maps its pooler and classifier, a masked-LM model its head transform, decoder
    and bias; the vocabulary projection is the word embedding matrix when ``tie``.
    """
    m = hf.NameMap()
    m.add("embed.tokens.embedding.weight", WORDS)
    m.add("embed.positions.weight", POSITIONS)
    m.linear("embed.norm", "bert.embeddings.LayerNorm")
    for i in range(c.n_layers):
        ours, theirs = f"encoder.layers.{i}", f"bert.encoder.layer.{i}"
        m.linear(
            f"{ours}.self_attn.w_qkv", *(f"{theirs}.attention.self.{x}" for x in ("query", "key", "value"))
        )
        m.linear(f"{ours}.self_attn.w_o", f"{theirs}.attention.output.dense")
        m.linear(f"{ours}.self_attn_res.norm", f"{theirs}.attention.output.LayerNorm")
        m.linear(f"{ours}.ff.w_1", f"{theirs}.intermediate.dense")
        m.linear(f"{ours}.ff.w_2", f"{theirs}.output.dense")
        m.linear(f"{ours}.ff_res.norm", f"{theirs}.output.LayerNorm")
    tie = c.tie_output if tie is None else tie
    if c.n_classes:
        m.linear("classifier.pooler", "bert.pooler.dense")
        m.linear("classifier.out", "classifier")
    else:
        m.linear("transform.dense", "cls.predictions.transform.dense")
        m.linear("transform.norm", "cls.predictions.transform.LayerNorm")
        m.add("head.bias", BIAS)
    if tie:
        m.add("head.proj.weight", WORDS)
    elif not c.n_classes:
        m.add("head.proj.weight", DECODER)
    return m


# -- import ---------------------------------------------------------------------------------------


def bert_labels(hf_config: dict) -> list[str]:
    """A classifier's class names in id order, from ``id2label`` (``num_labels`` ``LABEL_i`` without it)."""
    id2label = hf_config.get("id2label")
    if not id2label:
        n = hf_config.get("num_labels", 2)
        return [f"LABEL_{i}" for i in range(n if isinstance(n, int) and n > 0 else 2)]
    names = {str(k): v for k, v in id2label.items()} if isinstance(id2label, dict) else {}
    labels = [names.get(str(i)) for i in range(len(names))]
    if not names or not all(isinstance(y, str) for y in labels):
        raise ModelDirError(f"id2label must map the class ids 0, 1, … to names, got {id2label!r}")
    return labels


def special_ids(tok: Tokenizer | None, vocab_size: int, pad_id: int) -> dict[str, int]:
    """The tokenizer's pad/bos/eos/unk; without one, BERT's [UNK] [CLS] [SEP] = 100, 101, 102 (every
    Google vocabulary's), or in a smaller vocabulary the first three ids other than pad: the model
    itself only reads pad, to mask padding."""
    if tok is not None:
        return dict(pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id, unk_id=tok.unk_id)
    unk, bos, eos = (100, 101, 102) if vocab_size > 102 else [i for i in range(4) if i != pad_id][:3]
    return dict(pad_id=pad_id, bos_id=bos, eos_id=eos, unk_id=unk)


def config_from_bert(
    hf_config: dict, classifier: bool = False, tok: Tokenizer | None = None
) -> EncoderConfig:
    """The aiayn config of a BERT ``config.json`` (a dict): the masked-LM model, or with
    ``classifier`` the sequence classifier; special ids from ``tok`` (see ``special_ids``)."""
    hf_config = {**DEFAULTS, **{k: v for k, v in hf_config.items() if v is not None}}
    if hf_config["position_embedding_type"] != "absolute":
        raise ModelDirError(
            f"position_embedding_type={hf_config['position_embedding_type']!r}: aiayn's positions are "
            "absolute (a learned table, 'absolute'); relative position embeddings have no aiayn equivalent"
        )
    if hf_config["is_decoder"] or hf_config["add_cross_attention"]:
        raise ModelDirError(
            "this BERT is a decoder (is_decoder or add_cross_attention); aiayn reads BERT encoders"
        )
    if classifier and hf_config["problem_type"] not in (None, "single_label_classification"):
        raise ModelDirError(
            f"problem_type={hf_config['problem_type']!r}: aiayn's classifier picks one label by softmax "
            "(single_label_classification)"
        )
    if classifier and len(bert_labels(hf_config)) < 2:  # transformers: num_labels=1 means regression
        raise ModelDirError(
            f"num_labels={len(bert_labels(hf_config))} without a problem_type: transformers reads such a "
            "model as regression (one score); aiayn's classifier picks one of two labels or more by softmax"
        )
    vocab = hf_config["vocab_size"]
    if classifier:  # the vocabulary head, which the checkpoint lacks, is tied (and never used)
        head = dict(n_classes=len(bert_labels(hf_config)), pooling="first", pooler=True, tie_output=True)
    else:
        head = dict(head_transform=True, output_bias=True, tie_output=hf_config["tie_word_embeddings"])
    return EncoderConfig(
        d_model=hf_config["hidden_size"],
        n_heads=hf_config["num_attention_heads"],
        d_ff=hf_config["intermediate_size"],
        dropout=float(hf_config["hidden_dropout_prob"]),  # classifier_dropout too: aiayn has one rate
        attn_dropout=float(hf_config["attention_probs_dropout_prob"]),
        activation=hf.activation_from_hf(hf_config["hidden_act"], "hidden_act"),
        norm_first=False,
        ln_eps=float(hf_config["layer_norm_eps"]),
        positional="learned",
        max_len=hf_config["max_position_embeddings"],
        emb_scale="none",
        embed_norm=True,
        vocab_size=vocab,
        n_layers=hf_config["num_hidden_layers"],
        **special_ids(tok, vocab, hf_config["pad_token_id"]),
        **head,
    )


def is_classifier(hf_config: dict, state: dict[str, Tensor], source: str) -> bool:
    """Whether a checkpoint is ``BertForSequenceClassification`` (else a masked-LM model): by its
    ``architectures``, or for ``BertModel`` or none named, by the head tensors it holds."""
    name = hf.architecture(hf_config)
    if name in MASKED_LM or name == CLASSIFIER:
        return name == CLASSIFIER
    if name not in (None, "BertModel"):
        raise ModelDirError(
            f"{source}: architectures={hf_config['architectures']}: aiayn reads {', '.join(MASKED_LM)} "
            f"(as the masked-LM model) and {CLASSIFIER}"
        )
    if "classifier.weight" in state or "cls.predictions.transform.dense.weight" in state:
        return "classifier.weight" in state
    raise ModelDirError(
        f"{source}: no masked-LM head (cls.predictions.*) and no classifier (classifier.*): a bare BertModel "
        "has nothing for aiayn's EncoderModel to predict with"
    )


def _canonical(state: dict[str, Tensor], c: EncoderConfig, source: str) -> dict[str, Tensor]:
    """The checkpoint with one name per tensor, as ``name_map(c)`` expects: old names (LayerNorm
    ``gamma``/``beta``) renamed, stored buffers and the heads a masked-LM model does not use dropped,
    token type 0 folded into the positions, tied copies checked and merged."""
    renamed = {}
    for name, t in state.items():
        stem, _, leaf = name.rpartition(".")
        if name not in BUFFERS:
            renamed[f"{stem}.{OLD_NAMES[leaf]}" if leaf in OLD_NAMES else name] = t
    state = renamed
    types = state.pop(TOKEN_TYPES, None)
    if types is not None and POSITIONS in state:
        if types.dim() != 2 or types.shape[1:] != state[POSITIONS].shape[1:]:
            raise ModelDirError(f"{source}: {TOKEN_TYPES} has shape {tuple(types.shape)}, {POSITIONS} "
                                f"{tuple(state[POSITIONS].shape)}")  # fmt: skip
        state[POSITIONS] = state[POSITIONS] + types[0]  # one segment: token type 0 everywhere
    if c.n_classes:
        return state
    state = {k: v for k, v in state.items() if not k.startswith(NOT_MASKED_LM)}
    if c.tie_output:
        state[WORDS] = hf.take_alias(state, (WORDS, DECODER), "tie_word_embeddings", source)
        state[BIAS] = hf.take_alias(state, (BIAS, DECODER_BIAS), "the decoder's bias", source)
    else:  # transformers 5 computes with the decoder's own bias then (4.x kept one bias under both names)
        bias = state.pop(DECODER_BIAS, None)
        state[BIAS] = bias if bias is not None else state.pop(BIAS, None)
    return {k: v for k, v in state.items() if v is not None}


def bert_tokenizer(directory: str | os.PathLike) -> Tokenizer | None:
    """The tokenizer of a BERT directory: aiayn's own in ``aiayn_tokenizer/`` (what ``export_bert``
    writes) or in ``tokenizer.json`` if that file is aiayn's (an aiayn model directory, or an older
    export; HF's fast tokenizers use the same file name), else the WordPiece ``vocab.txt``, else None."""
    directory = Path(directory)
    for folder in (directory / AIAYN_TOKENIZER, directory):
        if (folder / META_FILE).is_file():
            meta = textfiles.read_json(folder / META_FILE, "", ModelDirError)
            if meta.get("kind") in KINDS:
                return load_tokenizer(folder)
    if (directory / "vocab.txt").is_file():
        return load_bert_tokenizer(directory)
    return None


def load_bert(directory: str | os.PathLike, tok: Tokenizer | None = None) -> EncoderModel:
    """A BERT directory as an aiayn ``EncoderModel`` (float32, CPU, eval mode): the masked-LM model,
    or the classifier for ``BertForSequenceClassification``. Special ids come from ``tok`` or the
    directory's tokenizer (``bert_tokenizer``). A config.json aiayn cannot read or weights that do
    not fit it are a ``ModelDirError`` naming the file."""
    directory = Path(directory)
    hf_config, state = hf.read_hf_config(directory), hf.read_hf_weights(directory)
    tok = bert_tokenizer(directory) if tok is None else tok
    classifier = is_classifier(hf_config, state, str(directory))
    try:
        cfg = config_from_bert(hf_config, classifier, tok)
    except (TypeError, ValueError) as e:  # ConfigError included: a field of the wrong type or range
        raise ModelDirError(f"{directory / hf.HF_CONFIG}: {e}") from None
    hf.check_depth(cfg, state, directory / hf.HF_CONFIG)
    state = _canonical(state, cfg, str(directory))
    return name_map(cfg).load(lambda: EncoderModel(cfg), state, str(directory))


def load_bert_dir(
    directory: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[EncoderModel, Tokenizer, dict]:
    """``(model, tokenizer, meta)`` of a BERT directory, in eval mode, as ``aiayn classify`` and
    ``aiayn fill-mask`` run it; ``meta`` is ``{"kind": "encoder"}`` plus, for a classifier, its
    ``labels`` (``id2label`` in id order) and, for an aiayn export, its ``long_text`` policy."""
    directory = Path(directory)
    tok = bert_tokenizer(directory)
    if tok is None:
        raise ModelDirError(
            f"{directory} has no tokenizer: expected BERT's vocab.txt or aiayn's {META_FILE} (which aiayn "
            "export writes); download or copy the tokenizer files into the directory"
        )
    model = load_bert(directory, tok)
    if tok.vocab_size > model.config.vocab_size:
        raise ModelDirError(
            f"{directory}: the tokenizer has {tok.vocab_size} tokens, the model's vocabulary only "
            f"{model.config.vocab_size} (config.json vocab_size); the files do not belong together"
        )
    meta: dict = {"kind": "encoder"}
    hf_config = hf.read_hf_config(directory)
    if model.config.n_classes:
        meta["labels"] = bert_labels(hf_config)  # checked by load_bert
    meta.update(kept_fields(hf_config))  # an aiayn export: read texts as the model was trained to
    return model.to(device).eval(), tok, meta


def kept_fields(hf_config: dict) -> dict:
    """The fields of ``KEPT`` that an aiayn export wrote into ``hf_config``, under their own names."""
    return {k: hf_config[f"aiayn_{k}"] for k in KEPT if f"aiayn_{k}" in hf_config}


# -- export ---------------------------------------------------------------------------------------


def check_exportable(model: EncoderModel) -> None:
    """A ``ModelDirError`` naming the first ``EncoderConfig`` field that BERT cannot express."""
    c = model.config
    head = c.d_model // c.n_heads
    if c.d_model % c.n_heads:
        raise ModelDirError(
            f"cannot export as BERT: EncoderConfig.d_model={c.d_model} is not divisible by "
            f"n_heads={c.n_heads} (BERT's heads are d_model/n_heads wide)"
        )
    needs = [
        ("norm_first", c.norm_first, False, "BERT is post-norm"),
        ("positional", c.positional, "learned", "BERT learns its positions"),
        ("embed_norm", c.embed_norm, True, "BERT normalises embedding + position"),
        ("d_k", c.d_k or head, head, "BERT's heads are d_model/n_heads wide"),
        ("d_v", c.d_v or head, head, "BERT's heads are d_model/n_heads wide"),
        ("detector", c.detector, False, "ELECTRA's replaced-token head; fine-tune the encoder, export that"),
        ("causal", c.causal, False, "BERT's attention sees both ways"),
        ("attn_window", c.attn_window, 0, "BERT's attention sees every position"),
    ]
    if c.n_classes:
        needs += [("pooling", c.pooling, "first", "BERT's classifier reads [CLS], the first token"),
                  ("pooler", c.pooler, True, "BERT's classifier has a tanh pooler")]  # fmt: skip
    else:
        needs += [("head_transform", c.head_transform, True, "BertForMaskedLM transforms the states first")]
    for name, got, want, why in needs:
        if got != want:
            raise ModelDirError(
                f"cannot export as BERT: EncoderConfig.{name}={got!r}, BERT needs {want!r} ({why})"
            )


def export_bert(
    model: EncoderModel,
    directory: str | os.PathLike,
    labels: list[str] | None = None,
    tok: Tokenizer | None = None,
    kept: dict | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` that ``transformers`` loads as
    ``BertForMaskedLM`` (``n_classes == 0``) or ``BertForSequenceClassification`` (``labels``, the
    class names, become ``id2label``), and the model's tokenizer ``tok`` if given: WordPiece as HF's
    files, any other in ``aiayn_tokenizer/`` (module docstring). See there for what is rewritten.

    ``kept`` (the model's ``config.json`` fields) gives those of ``KEPT`` to keep as
    ``aiayn_<name>``, which ``load_bert_dir`` reads back: ``trained_max_len`` (so that the export's
    ``fill-mask`` refuses a query past the trained positions, as the model's does), a classifier's
    ``long_text`` (how it reads texts longer than the ``max_len`` it was trained at, so the export
    classifies long texts as the model did) and the ``text_column`` and ``label_column`` of its
    tables. The fast tokenizer truncates at the trained length, not at the untrained positions beyond."""
    check_float32(model, "export")
    check_exportable(model)
    c = model.config
    classify = c.n_classes > 0
    if labels is not None and len(labels) != c.n_classes:
        raise ModelDirError(f"{len(labels)} labels for a model with n_classes={c.n_classes}")
    labels = labels or [str(i) for i in range(c.n_classes)]
    state = {k: v.detach() for k, v in model.state_dict().items()}
    emb = "embed.tokens.embedding.weight"
    if c.emb_scale == "emb":  # BERT never scales its embeddings: fold √d_model in, and untie
        state[emb] = state[emb] * math.sqrt(c.d_model)
    elif c.emb_scale == "prj" and c.tie_output:
        state["head.proj.weight"] = state["head.proj.weight"] / math.sqrt(c.d_model)
    tie = c.tie_output and c.emb_scale == "none"
    state.setdefault("head.bias", state[emb].new_zeros(c.vocab_size))
    tensors = name_map(c, tie).to_hf(state)
    tensors[TOKEN_TYPES] = state[emb].new_zeros(2, c.d_model)  # one segment: type embeddings add nothing
    if not classify:  # HF ties these to the above when tie_word_embeddings; written for any reader
        tensors.setdefault(DECODER, tensors[WORDS])
        tensors[DECODER_BIAS] = tensors[BIAS]
    config = {
        "architectures": [CLASSIFIER if classify else MASKED_LM[0]],
        "model_type": "bert", "vocab_size": c.vocab_size, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
        "hidden_act": HIDDEN_ACT[c.activation], "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.attn_dropout, "max_position_embeddings": c.max_len,
        "type_vocab_size": 2, "layer_norm_eps": c.ln_eps, "pad_token_id": c.pad_id,
        "position_embedding_type": "absolute", "tie_word_embeddings": tie, "initializer_range": 0.02,
        "dtype": str(state[emb].dtype).removeprefix("torch."),
    }  # fmt: skip
    if classify:
        ids = {y: i for i, y in enumerate(labels)}
        config.update(num_labels=c.n_classes, id2label=dict(enumerate(labels)), label2id=ids,
                      classifier_dropout=c.dropout)  # fmt: skip
    config.update({f"aiayn_{k}": v for k, v in (kept or {}).items() if k in KEPT and v not in (None, "")})
    directory = hf.write_hf_directory(directory, config, tensors)
    long_text = config.get("aiayn_long_text")
    trained = long_text.get("max_len") if isinstance(long_text, dict) else config.get("aiayn_trained_max_len")
    max_len = min(trained, c.max_len) if isinstance(trained, int) else c.max_len  # transformers cuts there
    if isinstance(tok, WordPieceTokenizer):
        tok.save(directory, max_len)
    elif tok is not None:
        tok.save(directory / AIAYN_TOKENIZER)
    if isinstance(tok, SentencePieceTokenizer):  # and the files transformers' AutoTokenizer reads
        save_fast_tokenizer(tok, directory, max_len)
    elif not isinstance(tok, WordPieceTokenizer):  # none for transformers: AutoTokenizer must say so
        hf.write_tokenizer_config(directory, max_len)
    return directory
