"""MarianMT (OPUS-MT) checkpoints as aiayn ``Transformer``s, and aiayn ``Transformer``s as MarianMT.

HF's ``MarianMTModel`` is the paper's encoder–decoder with a few named differences, each of which
is an aiayn option: post-norm layers (our default); sinusoidal positions with all sines before all
cosines (``positional="sinusoidal_halves"``, positions from 0); embeddings × √d_model only when
``scale_embedding`` (``emb_scale="emb"`` or ``"none"``); ``final_logits_bias`` (``output_bias``);
SiLU ("swish") in OPUS-MT's feed-forward layers (``activation="silu"``); and decoding starts from
the pad token (``bos_id = pad_id``). Weights map one to one, except that HF's separate q/k/v
projections are stacked into our ``w_qkv`` as rows [q; k; v].

Export writes the directory that ``MarianMTModel.from_pretrained`` reads. Models in the paper's
interleaved sinusoid layout are exported exactly by permuting the d_model axis (see
``halves_permutation``); what Marian cannot express (pre-norm, learned positions, a right-to-left
memory, d_k ≠ d_model/h, LayerNorm ε ≠ 1e-5) is refused with the reason; an output layer that scores
only some ids (``output_pieces``) becomes −∞ in ``final_logits_bias`` at the others. The
tokenizer is beside this module (``tokenizer.py``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import Tensor

from aiayn.errors import ModelDirError
from aiayn.interop import hf
from aiayn.models.config import TransformerConfig
from aiayn.models.io import check_float32
from aiayn.models.transformer import Transformer
from aiayn.modules.embedding import sinusoidal_table

# MarianConfig's defaults, for fields a config.json leaves out (HF fills them the same way)
DEFAULTS = dict(
    vocab_size=58101, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
    decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, activation_function="gelu",
    max_position_embeddings=1024, scale_embedding=False, pad_token_id=58100, eos_token_id=0,
    decoder_start_token_id=58100, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
)  # fmt: skip
HF_LN_EPS = 1e-5  # MarianMTModel's LayerNorms use nn.LayerNorm's default ε, not a config field
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
SHARED, ENC_EMBED, DEC_EMBED = (
    f"model.{m}.weight" for m in ("shared", "encoder.embed_tokens", "decoder.embed_tokens")
)


def _same(hf_config: dict, encoder_key: str, decoder_key: str, what: str) -> int:
    enc, dec = hf_config[encoder_key], hf_config[decoder_key]
    if enc != dec:
        raise ModelDirError(
            f"{encoder_key}={enc} but {decoder_key}={dec}: aiayn uses one {what} for both stacks"
        )
    return enc


def config_from_marian(hf_config: dict, unk_id: int | None = None) -> TransformerConfig:
    """The aiayn config of a MarianMT ``config.json`` (a dict). ``unk_id`` comes from vocab.json."""
    hf_config = {**DEFAULTS, **{k: v for k, v in hf_config.items() if v is not None}}
    eos = hf_config["eos_token_id"]
    if isinstance(eos, list):
        if len(eos) != 1:
            raise ModelDirError(f"eos_token_id={eos}: aiayn models have exactly one end-of-sentence id")
        eos = eos[0]
    src_vocab = hf_config["vocab_size"]
    # shared embeddings: one vocabulary, whatever decoder_vocab_size says (transformers ignores it then)
    shared = hf_config["share_encoder_decoder_embeddings"]
    tgt_vocab = src_vocab if shared else hf_config.get("decoder_vocab_size") or src_vocab
    pad = hf_config["pad_token_id"]
    if unk_id is None:  # not used by the model; any id that is not pad or eos
        unk_id = next(i for i in range(3) if i not in (pad, eos))
    return TransformerConfig(
        d_model=hf_config["d_model"],
        n_heads=_same(hf_config, "encoder_attention_heads", "decoder_attention_heads", "n_heads"),
        d_ff=_same(hf_config, "encoder_ffn_dim", "decoder_ffn_dim", "d_ff"),
        dropout=float(hf_config["dropout"]),
        attn_dropout=float(hf_config["attention_dropout"]),
        ff_dropout=float(hf_config["activation_dropout"]),
        activation=hf.activation_from_hf(hf_config["activation_function"]),
        norm_first=False,
        ln_eps=HF_LN_EPS,
        positional="sinusoidal_halves",
        max_len=hf_config["max_position_embeddings"],
        emb_scale="emb" if hf_config["scale_embedding"] else "none",
        pad_id=pad,
        bos_id=hf_config["decoder_start_token_id"],  # = pad in every OPUS-MT model
        eos_id=eos,
        unk_id=unk_id,
        src_vocab_size=src_vocab,
        tgt_vocab_size=tgt_vocab,
        n_encoder_layers=hf_config["encoder_layers"],
        n_decoder_layers=hf_config["decoder_layers"],
        share_embeddings=hf_config["share_encoder_decoder_embeddings"],
        tie_output=hf_config["tie_word_embeddings"],
        output_bias=True,
    )


def _embedding_names(share: bool, tie: bool) -> tuple[str, str, str]:
    """HF names of the source embedding, target embedding and output projection."""
    src, tgt = (SHARED, SHARED) if share else (ENC_EMBED, DEC_EMBED)
    return src, tgt, tgt if tie else "lm_head.weight"


def name_map(c: TransformerConfig, tie: bool | None = None) -> hf.NameMap:
    """Every aiayn tensor of a Marian-shaped ``Transformer`` and the HF tensors it is made of.

    HF stores ``final_logits_bias`` as (1, V); the map speaks of it flattened to (V,).
    """
    m = hf.NameMap()
    src, tgt, head = _embedding_names(c.share_embeddings, c.tie_output if tie is None else tie)
    m.add("src_embed.tokens.embedding.weight", src)
    m.add("tgt_embed.tokens.embedding.weight", tgt)
    m.add("head.proj.weight", head)
    m.add("head.bias", "final_logits_bias")
    sublayers = [("self_attn", "self_attn", "self_attn_layer_norm")]  # (ours, HF attention, HF norm)
    cross = [("cross_attn", "encoder_attn", "encoder_attn_layer_norm")]
    for stack, n, extra in (("encoder", c.n_encoder_layers, []), ("decoder", c.n_decoder_layers, cross)):
        for i in range(n):
            ours, theirs = f"{stack}.layers.{i}", f"model.{stack}.layers.{i}"
            for attn, hf_attn, hf_norm in sublayers + extra:
                m.linear(f"{ours}.{attn}.w_qkv", *(f"{theirs}.{hf_attn}.{x}_proj" for x in "qkv"))
                m.linear(f"{ours}.{attn}.w_o", f"{theirs}.{hf_attn}.out_proj")
                m.linear(f"{ours}.{attn}_res.norm", f"{theirs}.{hf_norm}")
            m.linear(f"{ours}.ff.w_1", f"{theirs}.fc1")
            m.linear(f"{ours}.ff.w_2", f"{theirs}.fc2")
            m.linear(f"{ours}.ff_res.norm", f"{theirs}.final_layer_norm")
    return m


def _canonical(state: dict[str, Tensor], c: TransformerConfig, source: str) -> dict[str, Tensor]:
    """The checkpoint with one name per tensor, as ``name_map(c)`` expects, read as transformers 5
    reads it, and the fixed positional tables checked and dropped (HF recomputes them; so do we).

    ``c.share_embeddings`` must already say what ``shares_embeddings`` found.
    """
    state = dict(state)
    for name in POSITIONS:
        table = state.pop(name, None)
        if table is not None:
            ours = sinusoidal_table(table.size(0), c.d_model, halves=True)
            # within the rounding of the table's own type: a float16 or bfloat16 checkpoint's is coarser
            tolerance = max(1e-4, 2 * torch.finfo(table.dtype).eps) if table.is_floating_point() else 1e-4
            if (
                table.shape != ours.shape
                or (table.float() - ours.to(table.dtype).float()).abs().max() > tolerance
            ):
                raise ModelDirError(f"{source}: {name} is not Marian's sinusoidal table")
    if c.share_embeddings:  # one matrix, whatever names it was saved under
        tied = ("lm_head.weight",) if c.tie_output else ()
        state[SHARED] = hf.take_alias(
            state, (SHARED, ENC_EMBED, DEC_EMBED, *tied), "shared embeddings", source
        )
    else:
        shared = state.pop(SHARED, None)  # unused, or the fallback of an untied model
        for name in (ENC_EMBED, DEC_EMBED):
            if name not in state and shared is not None:
                state[name] = shared
        if c.tie_output:
            state[DEC_EMBED] = hf.take_alias(
                state, (DEC_EMBED, "lm_head.weight"), "tie_word_embeddings", source
            )
    bias = state.pop("final_logits_bias", None)
    state["final_logits_bias"] = torch.zeros(c.tgt_vocab_size) if bias is None else bias.reshape(-1)
    return {k: v for k, v in state.items() if v is not None}


def shares_embeddings(hf_config: dict, state: dict[str, Tensor]) -> bool:
    """Whether encoder and decoder read one embedding matrix, as transformers 5 runs the model.

    ``share_encoder_decoder_embeddings`` alone does not say: with ``tie_word_embeddings=False``
    transformers 5 ties nothing and reads ``encoder.embed_tokens`` and ``decoder.embed_tokens``
    separately (4.x shared them and saved equal copies under both names, which we share again).
    """
    hf_config = {**DEFAULTS, **hf_config}
    if not hf_config["share_encoder_decoder_embeddings"]:
        return False
    if hf_config["tie_word_embeddings"]:
        return True
    enc, dec = (state.get(name, state.get(SHARED)) for name in (ENC_EMBED, DEC_EMBED))
    return enc is None or dec is None or torch.equal(enc, dec)


def _vocab_unk(directory: Path) -> int | None:
    path = directory / "vocab.json"
    if path.is_file():
        unk = hf.read_json(path, "").get("<unk>")
        return unk if isinstance(unk, int) and not isinstance(unk, bool) else None
    return None


def load_marian(directory: str | os.PathLike) -> Transformer:
    """A MarianMT directory as an aiayn ``Transformer`` (float32, CPU, eval mode).

    A config.json aiayn cannot read or weights that do not fit it are a ``ModelDirError`` naming
    the file."""
    directory = Path(directory)
    hf_config = hf.read_hf_config(directory)
    hf.check_architectures(hf_config, ("MarianMTModel",), directory / hf.HF_CONFIG)
    state = hf.read_hf_weights(directory)
    unk = _vocab_unk(directory)  # a broken vocab.json is named alone, not as config.json's fault
    try:
        cfg = config_from_marian(hf_config, unk).replace(share_embeddings=shares_embeddings(hf_config, state))
    except (TypeError, ValueError) as e:  # ConfigError included: a field of the wrong type or range
        raise ModelDirError(f"{directory / hf.HF_CONFIG}: {e}") from None
    hf.check_depth(cfg, state, directory / hf.HF_CONFIG)
    state = _canonical(state, cfg, str(directory))
    return name_map(cfg).load(lambda: Transformer(cfg), state, str(directory))


def halves_permutation(d_model: int) -> Tensor:
    """``perm`` such that ``interleaved_table[:, perm] == halves_table``: [0, 2, 4, …, 1, 3, 5, …].

    Applying one fixed permutation to the d_model axis of every tensor that reads or writes the
    residual stream changes no output (LayerNorm statistics and dot products are order-free), so
    a model with the paper's interleaved sinusoids is exactly a Marian model in permuted coordinates.
    """
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


READS_RESIDUAL = ("embedding.weight", "head.proj.weight", "w_qkv.weight", "w_1.weight")  # d_model on dim 1
WRITES_RESIDUAL = ("w_o.weight", "w_o.bias", "w_2.weight", "w_2.bias", "norm.weight", "norm.bias")  # dim 0


def permute_residual(state: dict[str, Tensor], perm: Tensor) -> dict[str, Tensor]:
    out = {}
    for k, t in state.items():
        if k.endswith(READS_RESIDUAL):
            t = t[:, perm]
        elif k.endswith(WRITES_RESIDUAL):
            t = t[perm]
        out[k] = t
    return out


def check_exportable(c: TransformerConfig) -> None:
    problems = []
    if c.norm_first:
        problems.append("it is pre-norm (norm_first=True) and Marian is post-norm")
    if c.positional == "learned":
        problems.append("its positions are learned and Marian's are fixed sinusoids")
    if c.r2l_memory:
        problems.append("it has a right-to-left memory (r2l_memory=True)")
    if c.bidirectional:
        problems.append("it is bidirectional (a right-to-left decoder and a fourth sublayer in each decoder "
                        "layer: bidirectional=True), which MarianMT has no equivalent of")  # fmt: skip
    head = c.d_model // c.n_heads
    if c.d_model % c.n_heads or (c.d_k or head) != head or (c.d_v or head) != head:
        problems.append(f"its heads are not d_model/n_heads wide (d_k={c.d_k}, d_v={c.d_v})")
    if c.ln_eps != HF_LN_EPS:
        problems.append(f"its LayerNorm ε is {c.ln_eps}, Marian's is fixed at {HF_LN_EPS}")
    if problems:
        raise ModelDirError("cannot export as MarianMT: " + "; ".join(problems))


def export_marian(model: Transformer, directory: str | os.PathLike) -> Path:
    """Write ``model`` as a MarianMT directory (config.json + model.safetensors) that HF loads.

    ``emb_scale="prj"`` (output ÷ √d_model) becomes an untied ``lm_head`` holding the scaled
    matrix; ``bias=False`` becomes zero biases; the interleaved sinusoid layout is permuted.
    """
    check_float32(model, "export")
    c = model.config
    check_exportable(c)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if c.positional == "sinusoidal":
        state = permute_residual(state, halves_permutation(c.d_model))
    tie = c.tie_output and c.emb_scale != "prj"
    if c.emb_scale == "prj" and c.tie_output:
        state["head.proj.weight"] = state["head.proj.weight"] / math.sqrt(c.d_model)
    state.pop("head.pieces", None)  # an output_pieces model: −∞ in final_logits_bias outside its pieces
    full = model.head.full_bias()
    state["head.bias"] = torch.zeros(c.tgt_vocab_size) if full is None else full.to(state["head.proj.weight"])
    tensors = name_map(c, tie).to_hf(state)
    tensors["final_logits_bias"] = tensors["final_logits_bias"].reshape(1, -1)
    if c.share_embeddings and not tie:  # transformers 5 then reads each stack's own copy
        tensors[ENC_EMBED] = tensors[DEC_EMBED] = tensors[SHARED]
    dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    rows = hf.position_rows(c.max_len, c.positional)  # sinusoids (learned positions are refused)
    config = {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": c.src_vocab_size,
        "decoder_vocab_size": c.tgt_vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.n_encoder_layers,
        "decoder_layers": c.n_decoder_layers,
        "encoder_attention_heads": c.n_heads,
        "decoder_attention_heads": c.n_heads,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "activation_function": hf.ACTIVATIONS_TO_HF[c.activation],
        "max_position_embeddings": rows,  # a hard limit in HF, where aiayn's sinusoids go on
        "scale_embedding": c.emb_scale == "emb",
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
        "decoder_start_token_id": c.bos_id,
        "forced_eos_token_id": None,  # aiayn's decoders do not force eos at max_length
        "share_encoder_decoder_embeddings": c.share_embeddings,
        "tie_word_embeddings": tie,
        "dropout": c.dropout,
        "attention_dropout": c.attn_dropout,
        "activation_dropout": c.ff_dropout,
        "is_encoder_decoder": True,
        "dtype": dtype,
    }
    out = hf.write_hf_directory(directory, config, tensors)
    # max_length: transformers' own default is 20 tokens (OPUS-MT's configs say 512); the position table's
    # length is the most the export can decode
    hf.write_generation_config(out, c.pad_id, decoder_start_token_id=c.bos_id, eos_token_id=c.eos_id,
                               forced_eos_token_id=None, max_length=rows)  # fmt: skip
    return out
