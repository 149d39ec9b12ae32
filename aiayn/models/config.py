"""The configs of the three models: ``LayerConfig`` plus vocabulary sizes, depth and heads.

``TransformerConfig()`` is the paper's base model (Table 3: N=6 encoder and decoder layers, source
and target embeddings shared with the output projection, §3.4). Every field is checked on
construction: a bad value or type is a ``ConfigError`` naming the field (``aiayn.modules.config``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.modules.config import LayerConfig


@dataclass
class TransformerConfig(LayerConfig):
    """The encoder–decoder of the paper (Figure 1)."""

    src_vocab_size: int = 37000  # the paper's shared BPE vocabulary for WMT en-de
    tgt_vocab_size: int = 37000
    n_encoder_layers: int = 6  # N, §3.1
    n_decoder_layers: int = 6
    share_embeddings: bool = True  # one token embedding for source and target (§3.4)
    tie_output: bool = True  # pre-softmax projection = target embedding matrix (§3.4)
    output_bias: bool = False  # a bias on the output logits (Marian's final_logits_bias)
    # > 0: the output layer scores only this many target ids (``head.pieces``, saved with the weights;
    # the translation task's output_vocab="target" sets them from the data); 0: every id (the paper)
    output_pieces: int = 0
    r2l_memory: bool = False  # decoder layers attend to a second memory, given by the caller
    bidirectional: bool = False  # a right-to-left decoder too, its states that memory (Zhang et al. 2018)

    def validate(self) -> None:
        super().validate()
        self._vocab_check("src_vocab_size")
        self._vocab_check("tgt_vocab_size")
        self._positive("n_encoder_layers", "n_decoder_layers")
        pieces = self.output_pieces
        if not isinstance(pieces, int) or isinstance(pieces, bool) or not 0 <= pieces <= self.tgt_vocab_size:
            self._fail("output_pieces", f"must be an integer in [0, tgt_vocab_size={self.tgt_vocab_size}]",
                       "use 0 for every id (training with output_vocab='target' sets it)")  # fmt: skip
        self._flag("share_embeddings", "tie_output", "output_bias", "r2l_memory", "bidirectional")
        if self.bidirectional and self.r2l_memory:
            self._fail("r2l_memory", "is set with bidirectional=True", "leave it false: a bidirectional "
                       "model builds its decoder's right-to-left memory itself")  # fmt: skip
        if self.bidirectional and self.pad_id == self.bos_id:  # a memory's first state is bos's
            self._fail("pad_id", f"equals bos_id={self.bos_id} with bidirectional=True: the right-to-left "
                       "memory's padding mask would hide its bos state",
                       "give padding its own id")  # fmt: skip
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            self._fail(
                "share_embeddings",
                f"needs src_vocab_size == tgt_vocab_size (got {self.src_vocab_size} and "
                f"{self.tgt_vocab_size})",
                "use a joint vocabulary or set share_embeddings=False",
            )


@dataclass
class StackConfig(LayerConfig):
    """One stack of layers under a vocabulary head: what the encoder-only and the decoder-only
    models share."""

    vocab_size: int = 37000
    n_layers: int = 6
    tie_output: bool = True  # output projection = the token embedding matrix (§3.4)

    def validate(self) -> None:
        super().validate()
        self._vocab_check("vocab_size")
        self._positive("n_layers")
        self._flag("tie_output")


POOLINGS = ("mean", "first", "max")


@dataclass
class EncoderConfig(StackConfig):
    """An encoder-only model: a per-token vocabulary head (masked-LM pre-training) and, with
    ``n_classes > 0``, a pooled classification head. The BERT fields (``embed_norm``,
    ``head_transform``, ``pooling="first"`` with ``pooler``, ``output_bias``) are off by default;
    all on, with ``positional="learned"``, ``activation="gelu"`` and ``emb_scale="none"``, the model
    is BERT's (Devlin et al. 2019) and exports to Hugging Face's ``Bert*`` classes."""

    n_classes: int = 0  # > 0 adds the pooled classification head
    # the sequence's vector: "mean" over real tokens, the "first" (bos = [CLS]), or each feature's "max"
    # over real tokens (Kim 2014's max-over-time pooling)
    pooling: str = "mean"
    pooler: bool = False  # BERT's pooler: tanh(W · pooled + b) before the classifier
    embed_norm: bool = False  # LayerNorm on embedding + position, before dropout (BERT)
    head_transform: bool = False  # LayerNorm(act(W · h + b)) before the vocabulary projection (BERT)
    output_bias: bool = False  # a bias on the vocabulary logits (BERT's cls.predictions.bias)
    detector: bool = False  # a per-token replaced-token detection head (ELECTRA's discriminator)
    # each position attends to itself and earlier ones only (a GPT's look-ahead mask): what causal-LM
    # pre-training (task="clm") trains; a classifier fine-tuned from it may keep it or see both ways
    causal: bool = False
    # > 0: each position attends only to those within this many positions of it (a local window, as a
    # convolution of width 2·window + 1 sees; with causal, the earlier ones of them); 0: all (the paper)
    attn_window: int = 0

    def validate(self) -> None:
        super().validate()
        window = self.attn_window
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            self._fail("attn_window", "must be an integer ≥ 0", "use 0 to attend to every position (paper)")
        if not isinstance(self.n_classes, int) or isinstance(self.n_classes, bool) or self.n_classes < 0:
            self._fail("n_classes", "must be an integer ≥ 0", "use 0 for no classification head")
        self._choice("pooling", POOLINGS)
        if self.pad_id == self.bos_id:  # a decoder may start from pad (Marian's); an encoder reads bos
            self._fail("pad_id", f"equals bos_id={self.bos_id}: the padding mask would hide bos ([CLS])",
                       "give padding its own id")  # fmt: skip
        self._flag("pooler", "embed_norm", "head_transform", "output_bias", "detector", "causal")
        if self.causal and self.n_classes and self.pooling == "first":
            self._fail("pooling", "reads the first token, which in a causal encoder sees only itself "
                       "(every text would pool alike)", "use pooling='mean' or causal=False")  # fmt: skip
        reach = self.n_layers * window  # positions after the first that its state sees, layer by layer
        if window and self.n_classes and self.pooling == "first" and reach < self.max_len - 1:
            self._fail("pooling", f"reads the first token, which under attn_window={window} sees only the "
                       f"first {reach} positions after it (the rest of a text would be ignored)",
                       "use pooling='mean' or 'max', or attn_window=0")  # fmt: skip


@dataclass
class LMConfig(StackConfig):
    """A decoder-only (GPT-style) language model: causal self-attention only."""
