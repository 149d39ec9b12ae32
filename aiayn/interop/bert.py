"""Export an encoder-only model as Hugging Face BERT (``BertForMaskedLM``, ``BertForSequenceClassification``).

BERT is the encoder-only model with its options set: post-norm layers, learned positions, a
LayerNorm on embedding + position (``embed_norm``), no embedding scale (``emb_scale="none"``), biases
everywhere; a masked-LM head that transforms the states (dense, activation, LayerNorm:
``head_transform``) before the vocabulary projection (tied or not) plus a bias; a classifier that reads
the first token ([CLS], our ``bos``: ``pooling="first"``) through a tanh ``pooler``. A model with those
fields exports tensor for tensor (token-type embeddings are written as zeros: one segment); a field
that does not map is a ``ModelDirError`` naming it and the value BERT needs. The exported directory
is for ``transformers``; aiayn's tokenizer files are copied beside it by ``aiayn export`` (BERT's
WordPiece ``vocab.txt`` cannot express a sentencepiece vocabulary).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from aiayn.errors import ModelDirError
from aiayn.interop.hf import write_hf_directory
from aiayn.models.encoder import EncoderModel

HIDDEN_ACT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}


def check_exportable(model: EncoderModel) -> None:
    c = model.config
    head = c.d_model // c.n_heads
    needs = [
        ("norm_first", c.norm_first, False, "BERT is post-norm"),
        ("positional", c.positional, "learned", "BERT learns its positions"),
        ("embed_norm", c.embed_norm, True, "BERT normalises embedding + position"),
        ("emb_scale", c.emb_scale, "none", "BERT does not scale its embeddings"),
        ("bias", c.bias, True, "BERT's linear layers and LayerNorms have biases"),
        ("d_k", c.d_k or head, head, "BERT's heads are d_model/n_heads wide"),
        ("d_v", c.d_v or head, head, "BERT's heads are d_model/n_heads wide"),
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


def _norm(prefix: str, norm) -> dict[str, Tensor]:
    return {f"{prefix}.weight": norm.weight, f"{prefix}.bias": norm.bias}


def _linear(prefix: str, linear, rows: slice | None = None) -> dict[str, Tensor]:
    rows = rows or slice(None)
    return {f"{prefix}.weight": linear.weight[rows], f"{prefix}.bias": linear.bias[rows]}


def bert_tensors(model: EncoderModel) -> dict[str, Tensor]:
    """Our tensors under BERT's names (``bert.`` prefix; ``cls.`` or ``classifier.`` for the head)."""
    c, d = model.config, model.config.d_model
    e = model.embed
    out = {
        "bert.embeddings.word_embeddings.weight": e.tokens.embedding.weight,
        "bert.embeddings.position_embeddings.weight": e.positions.weight,
        "bert.embeddings.token_type_embeddings.weight": torch.zeros(2, d),
        **_norm("bert.embeddings.LayerNorm", e.norm),
    }
    for i, layer in enumerate(model.encoder.layers):
        p = f"bert.encoder.layer.{i}"
        qkv = layer.self_attn.w_qkv
        for j, name in enumerate(("query", "key", "value")):
            out.update(_linear(f"{p}.attention.self.{name}", qkv, slice(j * d, (j + 1) * d)))
        out.update(_linear(f"{p}.attention.output.dense", layer.self_attn.w_o))
        out.update(_norm(f"{p}.attention.output.LayerNorm", layer.self_attn_res.norm))
        out.update(_linear(f"{p}.intermediate.dense", layer.ff.w_1))
        out.update(_linear(f"{p}.output.dense", layer.ff.w_2))
        out.update(_norm(f"{p}.output.LayerNorm", layer.ff_res.norm))
    if c.n_classes:
        out.update(_linear("bert.pooler.dense", model.classifier.pooler))
        out.update(_linear("classifier", model.classifier.out))
    else:
        out.update(_linear("cls.predictions.transform.dense", model.transform.dense))
        out.update(_norm("cls.predictions.transform.LayerNorm", model.transform.norm))
        out["cls.predictions.decoder.weight"] = model.head.proj.weight
        bias = model.head.bias if model.head.bias is not None else torch.zeros(c.vocab_size)
        out["cls.predictions.bias"] = bias
        out["cls.predictions.decoder.bias"] = bias
    return out


def export_bert(model: EncoderModel, directory: str | os.PathLike, labels: list[str] | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` that ``transformers`` loads as BERT."""
    check_exportable(model)
    c = model.config
    classify = c.n_classes > 0
    labels = labels or [str(i) for i in range(c.n_classes)]
    config = {
        "architectures": ["BertForSequenceClassification" if classify else "BertForMaskedLM"],
        "model_type": "bert", "vocab_size": c.vocab_size, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
        "hidden_act": HIDDEN_ACT[c.activation], "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.attn_dropout, "max_position_embeddings": c.max_len,
        "type_vocab_size": 2, "layer_norm_eps": c.ln_eps, "pad_token_id": c.pad_id,
        "position_embedding_type": "absolute", "tie_word_embeddings": c.tie_output,
        "initializer_range": 0.02,
    }  # fmt: skip
    if classify:
        ids = {y: i for i, y in enumerate(labels)}
        config.update(num_labels=c.n_classes, id2label=dict(enumerate(labels)), label2id=ids,
                      classifier_dropout=c.dropout)  # fmt: skip
    return write_hf_directory(directory, config, bert_tensors(model))
