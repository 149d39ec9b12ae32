"""Export a translation model to CTranslate2, the fast CPU/GPU inference engine.

Written against the ``ctranslate2`` package's model-spec API, the way its own fairseq, OpenNMT and
Marian converters work: a ``TransformerSpec`` is filled with our weights, vocabularies and options,
then ``Converter.convert`` validates, optionally quantizes (int8, int16, float16, …) and saves it.

What maps: post- or pre-norm (CTranslate2's ``pre_norm``, with the final LayerNorm of a pre-norm
stack), every activation of ``LayerConfig`` (ReLU, GELU, tanh-GELU, SiLU), the embedding scale
(``"emb"``: CTranslate2's √d_model; ``"prj"``: the ÷√d_model folded into the output projection,
which CTranslate2 stores apart from the embedding; ``"none"``), any position table, written
explicitly (learned: its ``max_len`` rows; sinusoidal in either layout: ``SINUSOID_ROWS`` at least,
since aiayn computes them at any position and translates sources past ``max_len``), shared or separate
embeddings, an output bias, LayerNorm ε, linear layers without bias. Source sentences get ``</s>``
appended by CTranslate2 (``add_source_eos``), as aiayn's batching does.

What does not: a bidirectional model or a right-to-left memory (CTranslate2's decoder has no
fourth sublayer), heads whose width is not d_model / n_heads, and a tokenizer other than
sentencepiece (CTranslate2 needs the vocabulary as pieces). Each is a ``ModelDirError`` naming the
field.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from aiayn.atomic import atomic_dir
from aiayn.data.tokenizer import SentencePieceTokenizer, Tokenizer
from aiayn.errors import ModelDirError
from aiayn.interop.hf import position_rows
from aiayn.models.io import check_float32
from aiayn.models.transformer import Transformer

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int16", "float16", "bfloat16", "int8_float16",
                 "int8_bfloat16")  # fmt: skip


def check_exportable(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer) -> None:
    c, problems = model.config, []
    if c.bidirectional or c.r2l_memory:
        problems.append("it decodes with a right-to-left memory (bidirectional / r2l_memory), which "
                        "CTranslate2's decoder has no sublayer for")  # fmt: skip
    head = c.d_model // c.n_heads
    if c.d_model % c.n_heads or (c.d_k or head) != head or (c.d_v or head) != head:
        problems.append(f"its heads are not d_model/n_heads wide (d_k={c.d_k}, d_v={c.d_v})")
    for side, tok in (("source", src_tok), ("target", tgt_tok)):
        if not isinstance(tok, SentencePieceTokenizer):
            problems.append(
                f"its {side} tokenizer is {type(tok).__name__}; CTranslate2 reads aiayn's sentencepiece "
                "vocabularies, whose ids are their pieces' (an OPUS-MT model's vocab.json ids are not)"
            )
    if problems:
        raise ModelDirError("cannot export to CTranslate2: " + "; ".join(problems))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy().copy()


def build_spec(model: Transformer, src_tok: SentencePieceTokenizer, tgt_tok: SentencePieceTokenizer):
    """The filled ``ctranslate2.specs.TransformerSpec`` of ``model``."""
    from ctranslate2.specs import common_spec, transformer_spec

    check_exportable(model, src_tok, tgt_tok)
    c = model.config
    act = common_spec.Activation
    activation = {"relu": act.RELU, "gelu": act.GELU, "gelu_tanh": act.GELUTanh, "silu": act.SWISH}
    spec = transformer_spec.TransformerSpec.from_config(
        (c.n_encoder_layers, c.n_decoder_layers), c.n_heads, pre_norm=c.norm_first,
        activation=activation[c.activation],
    )  # fmt: skip
    spec.config.layer_norm_epsilon = c.ln_eps
    spec.config.add_source_eos = True
    d = c.d_model

    def linear(s, layer, rows: slice | None = None, scale: float = 1.0):
        w = layer.weight if rows is None else layer.weight[rows]
        s.weight = _np(w) * scale
        if layer.bias is not None:
            s.bias = _np(layer.bias if rows is None else layer.bias[rows])

    def norm(s, layer):
        s.gamma = _np(layer.weight)
        s.beta = _np(layer.bias) if layer.bias is not None else np.zeros(d, np.float32)

    def stack_inputs(s, embed):
        table = s.embeddings[0] if isinstance(s.embeddings, list) else s.embeddings  # the encoder has a list
        table.weight = _np(embed.tokens.embedding.weight)
        s.scale_embeddings = c.emb_scale == "emb"
        n = position_rows(c.max_len, c.positional)
        s.position_encodings.encodings = _np(embed.positions(torch.zeros(1, n, d))[0])  # (n, d)

    stack_inputs(spec.encoder, model.src_embed)
    stack_inputs(spec.decoder, model.tgt_embed)
    for s, ours in zip(spec.encoder.layer, model.encoder.layers, strict=True):
        linear(s.self_attention.linear[0], ours.self_attn.w_qkv)
        linear(s.self_attention.linear[1], ours.self_attn.w_o)
        norm(s.self_attention.layer_norm, ours.self_attn_res.norm)
        linear(s.ffn.linear_0, ours.ff.w_1)
        linear(s.ffn.linear_1, ours.ff.w_2)
        norm(s.ffn.layer_norm, ours.ff_res.norm)
    for s, ours in zip(spec.decoder.layer, model.decoder.layers, strict=True):
        linear(s.self_attention.linear[0], ours.self_attn.w_qkv)
        linear(s.self_attention.linear[1], ours.self_attn.w_o)
        norm(s.self_attention.layer_norm, ours.self_attn_res.norm)
        linear(s.attention.linear[0], ours.cross_attn.w_qkv, slice(0, d))  # W^Q
        linear(s.attention.linear[1], ours.cross_attn.w_qkv, slice(d, 3 * d))  # [W^K; W^V]
        linear(s.attention.linear[2], ours.cross_attn.w_o)
        norm(s.attention.layer_norm, ours.cross_attn_res.norm)
        linear(s.ffn.linear_0, ours.ff.w_1)
        linear(s.ffn.linear_1, ours.ff.w_2)
        norm(s.ffn.layer_norm, ours.ff_res.norm)
    if c.norm_first:
        norm(spec.encoder.layer_norm, model.encoder.norm)
        norm(spec.decoder.layer_norm, model.decoder.norm)
    head = model.head
    spec.decoder.projection.weight = _np(head.proj.weight) * head.scale  # "prj": ÷√d_model folded in
    if (bias := head.full_bias()) is not None:  # −∞ outside the pieces of an output_pieces model
        spec.decoder.projection.bias = _np(bias)
    for register, tok in (
        (spec.register_source_vocabulary, src_tok),
        (spec.register_target_vocabulary, tgt_tok),
    ):
        register([tok.sp.id_to_piece(i) for i in range(tok.vocab_size)])
    piece = tgt_tok.sp.id_to_piece  # the special tokens by the config's ids, not CTranslate2's defaults
    spec.config.decoder_start_token = spec.config.bos_token = piece(c.bos_id)  # Marian's: bos = pad
    spec.config.eos_token, spec.config.unk_token = piece(c.eos_id), piece(c.unk_id)
    return spec


def export_ctranslate2(
    model: Transformer,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    directory: str | os.PathLike,
    quantization: str = "float32",
) -> Path:
    """Write a CTranslate2 model directory (``model.bin`` + vocabularies) for ``ctranslate2.Translator``.

    ``directory`` must be new or empty: CTranslate2's converter deletes what is there first, so a
    directory with files in it is refused (``aiayn export --force`` replaces an earlier export). The
    converter writes into a temporary directory that takes the name only once it is complete
    (``atomic_dir``): a failure or a kill half-way leaves ``directory`` as it was."""
    try:
        from ctranslate2.converters.converter import Converter
    except ImportError:
        raise ModelDirError(
            "exporting to CTranslate2 needs the ctranslate2 package: pip install ctranslate2"
        ) from None
    if quantization not in QUANTIZATIONS:
        raise ModelDirError(f"quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    check_float32(model, "export")  # CTranslate2 quantizes the float32 weights itself
    check_exportable(model, src_tok, tgt_tok)
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ModelDirError(
            f"{directory} exists and is not an empty directory; the converter would delete it first: "
            "export into a new or empty directory"
        )

    class _Ours(Converter):
        def _load(self):
            return build_spec(model, src_tok, tgt_tok)

    quant = None if quantization == "float32" else quantization
    with atomic_dir(directory) as tmp:
        _Ours().convert(str(tmp), quantization=quant, force=True)
    return directory
