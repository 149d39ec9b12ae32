"""Reading and writing Hugging Face model directories, and the name map between their weights and ours.

An HF directory holds ``config.json`` (with ``model_type``) and weights as ``model.safetensors``,
``pytorch_model.bin`` or a sharded ``*.index.json`` of either. ``.bin`` files are unpickled with
``torch.load(weights_only=True)``, which refuses anything but tensors and plain containers.

A ``NameMap`` lists, for every aiayn tensor, the HF tensors it is made of: several are stacked
along dim 0 (HF's ``q_proj``, ``k_proj``, ``v_proj`` make our ``w_qkv``), and GPT-2's ``Conv1D``
weights are stored transposed. The same map loads (``to_aiayn``) and exports (``to_hf``), and
loading is strict: every aiayn tensor must be filled with the right shape and every HF tensor used.
A file that is missing, corrupt or does not fit is a ``ModelDirError`` naming it.
This module knows no architecture; ``marian/``, ``gpt2/`` and ``bert/`` build the maps. It also
reads ``vocab.json`` files and imports the optional ``tokenizers`` library for their tokenizers.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from aiayn import textfiles
from aiayn.atomic import atomic_path, write_json
from aiayn.errors import ModelDirError
from aiayn.models.io import LAYER_FIELDS, layers_held

# rows of an exported table of computed (sinusoidal) positions, which aiayn extends to any position: past
# its default source limit (1,024 tokens) and the output margin (+50); a hard limit in the readers
SINUSOID_ROWS = 2048


def position_rows(max_len: int, positional: str) -> int:
    """The positions an export holds: a learned table's ``max_len`` rows; sinusoids, which aiayn
    computes at any position, at least ``SINUSOID_ROWS`` (a model's ``max_len`` cut its exports short)."""
    return max_len if positional == "learned" else max(max_len, SINUSOID_ROWS)


HF_CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"  # what transformers' generate reads first
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
AIAYN_TOKENIZER = "aiayn_tokenizer"  # an export's folder for a tokenizer transformers cannot read

# HF activation_function -> ours, and back (HF "gelu_new" is the tanh approximation of GELU)
ACTIVATIONS_FROM_HF = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
ACTIVATIONS_TO_HF = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "swish"}


def activation_from_hf(name: str, field: str = "activation_function") -> str:
    """Our activation for HF's ``name`` (``field`` is the config key it came from, for the error)."""
    if not isinstance(name, str) or name not in ACTIVATIONS_FROM_HF:
        raise ModelDirError(f"{field}={name!r} has no aiayn equivalent ({sorted(ACTIVATIONS_FROM_HF)})")
    return ACTIVATIONS_FROM_HF[name]


def read_json(path: Path, missing: str) -> dict:
    """A JSON object from an HF directory; ``missing`` says what its absence means."""
    return textfiles.read_json(path, missing, ModelDirError, fix="restore it or fetch the model again")


def read_vocab(path: Path, missing: str) -> dict[str, int]:
    """A piece -> id map from a ``vocab.json``, checked: every id is an integer ≥ 0, each piece's own
    (an id shared by two pieces would decode as either)."""
    vocab = read_json(path, missing)
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in vocab.values()):
        raise ModelDirError(f"{path} does not map pieces to integer ids ≥ 0; download or restore it again")
    if len(set(vocab.values())) < len(vocab):
        first: dict[int, str] = {}
        piece, i = next((p, i) for p, i in vocab.items() if first.setdefault(i, p) != p)
        raise ModelDirError(
            f"{path} gives id {i} to both {first[i]!r} and {piece!r}; download or restore it again"
        )
    return vocab


def hf_tokenizers(what: str):
    """HF's ``tokenizers`` library, which reads GPT-2's and BERT's tokenizer files; an optional
    dependency, so its absence is a one-line error that says how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise ModelDirError(f"{what} needs the tokenizers package: pip install 'aiayn[hf]'") from None
    return tokenizers


def read_hf_config(directory: str | os.PathLike) -> dict:
    return read_json(Path(directory) / HF_CONFIG, f"{directory} is not a model directory")


def _load_one(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's message is a page on weights_only; ours says what matters
        raise ModelDirError(
            f"{path} is corrupt or not a plain tensor file (torch.load(weights_only=True) refuses it)"
        ) from None
    except OSError as e:  # a file that cannot be read is not a corrupt one
        raise ModelDirError(f"{path} cannot be read ({e.strerror or e})") from None
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 -- torch's safe unpickler fails in many ways on junk (IndexError, …)
        first = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else ""  # one sentence
        why = f"{type(e).__name__}: {first}" if first else type(e).__name__
        raise ModelDirError(f"{path} is corrupt or not a plain tensor file ({why})") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ModelDirError(f"{path} does not hold a flat name -> tensor dictionary")
    return state


def read_hf_weights(directory: str | os.PathLike) -> dict[str, Tensor]:
    """Every tensor of an HF directory, by name; safetensors preferred over pickle."""
    directory = Path(directory)
    for single, index in ((SAFETENSORS, SAFETENSORS_INDEX), (PICKLE, PICKLE_INDEX)):
        if (directory / single).is_file():
            return _load_one(directory / single)
        if (directory / index).is_file():
            weight_map = read_json(directory / index, "").get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ModelDirError(f"{directory / index} has no 'weight_map' of tensor names to shard files")
            state: dict[str, Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                if Path(shard).name != shard or shard in (".", ".."):  # a shard beside the index only
                    raise ModelDirError(
                        f"{directory / index} names shard {shard!r}: not a file name in {directory}"
                    )
                path = directory / shard
                if not path.is_file():
                    raise ModelDirError(f"{path} {textfiles.absent(path)}: {directory / index} lists it")
                state.update(_load_one(path))
            return state
    raise ModelDirError(f"{directory} has no {SAFETENSORS}, {PICKLE} or sharded index of either")


def take_alias(
    state: dict[str, Tensor], names: tuple[str, ...], what: str, source: str = ""
) -> Tensor | None:
    """Remove ``names`` from ``state`` and return their one value (None if none is there).

    Checkpoints may store a tied matrix under several names (e.g. ``model.shared.weight`` and
    ``lm_head.weight``); they must agree, or the config's tying would silently drop one of them.
    """
    found = [(n, state.pop(n)) for n in names if n in state]
    for name, t in found[1:]:
        if t.shape != found[0][1].shape or not torch.equal(t, found[0][1]):
            raise ModelDirError(
                f"{source}{': ' if source else ''}{found[0][0]} and {name} differ, but the config ties "
                f"them ({what}); this checkpoint does not match its config.json"
            )
    return found[0][1] if found else None


@dataclass(frozen=True)
class Entry:
    """One aiayn tensor = the HF tensors ``hf`` stacked along dim 0 (each transposed if ``conv1d``)."""

    ours: str
    hf: tuple[str, ...]
    conv1d: bool = False


@dataclass
class NameMap:
    entries: list[Entry] = field(default_factory=list)

    def add(self, ours: str, *hf: str, conv1d: bool = False) -> None:
        self.entries.append(Entry(ours, hf, conv1d))

    def linear(self, ours: str, *hf: str, conv1d: bool = False) -> None:
        """``ours.weight``/``ours.bias`` from the ``.weight``/``.bias`` of each HF module in ``hf``."""
        for p in ("weight", "bias"):
            self.add(f"{ours}.{p}", *(f"{h}.{p}" for h in hf), conv1d=conv1d and p == "weight")

    def to_aiayn(self, hf_state: dict[str, Tensor], expected: dict[str, Tensor], source: str) -> dict:
        """aiayn's state dict from HF tensors; ``expected`` (our model's state dict) gives the shapes.

        Strict: a missing HF tensor, a shape that does not match the config, an aiayn tensor with no
        entry, or an HF tensor that no entry uses is an error naming the tensor.
        """
        out: dict[str, Tensor] = {}
        for e in self.entries:
            missing = [h for h in e.hf if h not in hf_state]
            if missing:
                raise ModelDirError(f"{source}: tensor {missing[0]} is missing")
            parts = [hf_state[h].t() if e.conv1d else hf_state[h] for h in e.hf]
            t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            want = expected[e.ours].shape
            if t.shape != want:
                names = " + ".join(e.hf)
                raise ModelDirError(
                    f"{source}: {names} has shape {tuple(t.shape)}, config.json implies {tuple(want)}"
                )
            out[e.ours] = t
        unfilled = sorted(set(expected) - set(out))
        unused = sorted(set(hf_state) - {h for e in self.entries for h in e.hf})
        if unfilled:
            raise ModelDirError(f"{source}: no weights for {unfilled[:3]} (an aiayn tensor the map lacks)")
        if unused:
            raise ModelDirError(f"{source}: unexpected tensors {unused[:3]}{' …' if len(unused) > 3 else ''}")
        return out

    def load(self, build: Callable[[], nn.Module], hf_state: dict[str, Tensor], source: str) -> nn.Module:
        """``build()``'s model holding the HF tensors, in eval mode. The shapes are checked against a
        model built on the meta device first, so a config.json whose sizes do not fit its weights (a
        vocab_size of a billion) is a ``ModelDirError`` naming the tensor, not memory spent to fail."""
        with torch.device("meta"):
            expected = build().state_dict()
        mapped = self.to_aiayn(hf_state, expected, source)
        model = build()
        model.load_state_dict(mapped, strict=True)
        return model.eval()

    def to_hf(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """HF tensors from aiayn's state dict: stacked entries are split into equal parts.

        A bias the aiayn model lacks (built with ``bias=False``) is written as zeros, since HF's
        layers always have one; a name two entries share (tied matrices) must get one value.
        """
        out: dict[str, Tensor] = {}
        for e in self.entries:
            t = state.get(e.ours)
            if t is None and e.ours.endswith(".bias"):
                weight = state[e.ours.removesuffix("bias") + "weight"]
                t = weight.new_zeros(weight.size(0))
            for name, part in zip(e.hf, t.chunk(len(e.hf), dim=0)):
                part = (part.t() if e.conv1d else part).contiguous()
                if name in out and not torch.equal(out[name], part):
                    raise ValueError(f"{name} would get two different values (a tie the config lacks)")
                out[name] = part
        return out


def check_depth(cfg: object, state: dict[str, Tensor], source: str | os.PathLike) -> None:
    """A ``ModelDirError`` for a config.json with more layers than its weights hold, before the name
    map and the model are built: both grow with the layer count, and a million layers would spend
    minutes and gigabytes to fail."""
    held = layers_held(state)
    for name in LAYER_FIELDS:
        n = getattr(cfg, name, None)
        if isinstance(n, int) and n > held:
            raise ModelDirError(f"{source}: {n} layers ({name}) but the weights hold {held}; the weights "
                                "do not belong to this config")  # fmt: skip


def check_architectures(hf_config: dict, readable: tuple[str, ...], source: str | os.PathLike) -> None:
    """A ``ModelDirError`` for a checkpoint whose ``architectures`` name a head aiayn does not read
    (GPT-2's sequence classifier, Marian's causal LM, …), instead of a missing or unexpected tensor
    later; a config that names none is read by its tensors."""
    name = architecture(hf_config)
    if name is not None and name not in readable:
        raise ModelDirError(
            f"{source}: architectures={hf_config['architectures']}: aiayn reads {', '.join(readable)}"
        )


def architecture(hf_config: dict) -> str | None:
    """The first class a ``config.json``'s ``architectures`` names (None: it names none)."""
    names = hf_config.get("architectures") or []
    return names[0] if isinstance(names, list) and names else None


def write_generation_config(
    directory: Path, pad_id: int | None, never: tuple[int, ...] = (), **ids: int | float | None
) -> None:
    """``generation_config.json``: transformers' ``generate`` on an export never emits padding
    (``bad_words_ids``, as OPUS-MT's own configs have it), nor the ids in ``never``, which aiayn's
    searches never do; ``ids`` the special ids it starts and stops with (``eos_token_id=…``) and
    other settings (``max_length``). ``pad_id=None``: the model has no padding token of its own."""
    banned = [*([[pad_id]] if pad_id is not None else []), *([i] for i in never if i != pad_id)]
    banning = {"bad_words_ids": banned} if banned else {}  # transformers refuses an empty list
    write_json(directory / GENERATION_CONFIG, {**banning, "pad_token_id": pad_id, **ids})


def write_tokenizer_config(directory: Path, max_len: int, **specials: str) -> None:
    """``tokenizer_config.json`` naming the fast tokenizer class, its length and its ``specials``
    (``bos_token=…``). With no ``tokenizer.json`` beside it (an export without transformers' tokenizer
    files), ``AutoTokenizer`` then fails loudly, where the ``model_type``'s own class (``BertTokenizer``,
    ``GPT2Tokenizer``) would be built with no vocabulary at all and encode every word as unknown."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, **specials}
    write_json(directory / "tokenizer_config.json", config)


def write_hf_directory(directory: str | os.PathLike, config: dict, tensors: dict[str, Tensor]) -> Path:
    """``config.json`` + ``model.safetensors`` (each tensor its own copy: safetensors refuses aliases),
    the first files of an export. ``directory`` must be new or empty: files of an earlier export would
    stay beside this one's and be read with it (a ``tokenizer.json`` that no longer fits), so a directory
    with files in it is refused (``aiayn export`` writes into a temporary directory and swaps it in)."""
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ModelDirError(f"{directory} exists and is not an empty directory: an earlier export's files "
                            "would stay beside this one's; export into a new or empty directory "
                            "(aiayn export --force replaces one)")  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").clone().contiguous() for k, v in tensors.items()}
    with atomic_path(directory / SAFETENSORS) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
    write_json(directory / HF_CONFIG, config)
    return directory
