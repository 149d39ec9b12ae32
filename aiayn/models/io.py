"""Saving and loading a model as a directory: ``config.json`` + ``model.safetensors``.

No pickle: weights are safetensors (tied and shared tensors stored once), the config is JSON.
Each file is written to a temporary name and renamed, so an interrupted save never leaves a
half-written file under the real name. Tokenizers and trainer state live beside these files and
are written by their own modules. A directory that cannot be loaded (missing, not JSON, a ``kind``
or config field of the wrong type, weights of other shapes) is a ``ModelDirError`` naming the file.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model as _load_weights
from safetensors.torch import save_model as _save_weights
from torch import nn

from aiayn.atomic import atomic_path, write_json
from aiayn.errors import ConfigError, ModelDirError
from aiayn.models.bidirectional import build_transformer
from aiayn.models.config import EncoderConfig, LMConfig, TransformerConfig
from aiayn.models.encoder import EncoderModel
from aiayn.models.lm import LanguageModel
from aiayn.models.prepack import is_packed
from aiayn.models.quantize import is_quantized
from aiayn.models.transformer import Transformer
from aiayn.modules.attention import MultiHeadAttention
from aiayn.modules.config import LayerConfig
from aiayn.textfiles import absent, read_json
from aiayn.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
KINDS: dict[str, tuple[type[nn.Module], type[LayerConfig]]] = {
    "transformer": (Transformer, TransformerConfig),
    "lm": (LanguageModel, LMConfig),
    "encoder": (EncoderModel, EncoderConfig),
}


def model_kind(model: nn.Module) -> str:
    for kind, (cls, _) in KINDS.items():
        if isinstance(model, cls):
            return kind
    raise TypeError(f"not an aiayn model: {type(model).__name__}")


def build_model(kind: str, config: dict) -> nn.Module:
    """A fresh model of ``kind`` ("transformer", "lm", "encoder") from a config dict."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise ConfigError(f"unknown model kind {kind!r}; expected one of {sorted(KINDS)}")
    cls, cfg_cls = KINDS[kind]
    return (build_transformer if cls is Transformer else cls)(cfg_cls.from_dict(config))


def check_float32(model: nn.Module, doing: str) -> None:
    """A ``ConfigError`` for a model whose weights are not all float32: made for inference (int8,
    bfloat16, prepacked: ``quantize``, ``prepack``) or cast (``model.half()``). A model directory holds
    float32 weights, and so does an export (a packed model's are not all there; a cast one's would
    be written beside float32 tensors the export adds; a prepared one's cross-attention lacks ``w_qkv``)."""
    split = any(isinstance(m, MultiHeadAttention) and m.row_blocks is not None for m in model.modules())
    cast = any(p.dtype != torch.float32 for p in model.parameters())
    if is_quantized(model) or is_packed(model) or split or cast:
        raise ConfigError(f"this model is not float32 (quantized, prepacked or cast for inference): "
                          f"{doing} the float32 model (load it again, {doing} it, then quantize or "
                          "prepack)")  # fmt: skip


def save_model(model: nn.Module, directory: str | os.PathLike, **extra: object) -> Path:
    """Write ``config.json`` (kind, config, version, ``extra`` fields) and ``model.safetensors``; a
    model that is not float32 is refused (``check_float32``)."""
    check_float32(model, "save")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        _save_weights(model, str(tmp), metadata={"format": "pt"})
    meta = {"kind": model_kind(model), "config": model.config.to_dict(), "aiayn_version": __version__}
    write_json(directory / CONFIG_FILE, {**meta, **extra})
    return directory


def resolve_model_dir(path: str | os.PathLike) -> Path:
    """``path`` itself if it holds a model; for a training run directory, its ``best``
    checkpoint, or else its latest ``step-*`` checkpoint."""
    path = Path(path)
    if (path / CONFIG_FILE).is_file():
        return path
    if (path / "best" / CONFIG_FILE).is_file():
        return (path / "best").resolve()
    steps = [p for p in path.glob("step-*") if (p / CONFIG_FILE).is_file()] if path.is_dir() else []
    # by number: step-1000000 comes after step-999999 (their names sort the other way)
    steps.sort(key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else -1)
    return steps[-1] if steps else path


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def read_config(directory: str | os.PathLike) -> dict:
    """The parsed ``config.json`` of a model (or run) directory, checked: ``kind`` one of ``KINDS``
    and ``config`` a valid config of that kind. Every problem is a ``ModelDirError`` naming the path."""
    directory = resolve_model_dir(directory)
    if not directory.is_dir():
        raise ModelDirError(
            f"model directory {directory} does not exist (or is not a directory); give a directory "
            "written by aiayn train or save_model"
        )
    path = directory / CONFIG_FILE
    missing = f"{directory} is not an aiayn model directory (nor a training run with a checkpoint)"
    meta = read_json(path, missing, fix="restore it or save the model again")
    if "kind" not in meta or "config" not in meta:
        raise ModelDirError(f"{path} lacks the 'kind' and 'config' fields of an aiayn model")
    kind, config = meta["kind"], meta["config"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise ModelDirError(
            f"{path}: field 'kind' is {_json_type(kind)} ({json.dumps(kind)}); expected one of "
            f"{', '.join(map(repr, sorted(KINDS)))}"
        )
    if not isinstance(config, dict):
        raise ModelDirError(f"{path}: field 'config' must be a JSON object, got {_json_type(config)}")
    try:
        KINDS[kind][1].from_dict(config)
    except ConfigError as e:
        raise ModelDirError(f"{path}: {e}") from None
    for key in ("src_lang", "tgt_lang"):  # a language code, which scoring and serving read as one
        if key in meta and not (isinstance(meta[key], str) and meta[key].strip()):
            raise ModelDirError(f"{path}: field {key!r} must be a language code such as \"de\", got "
                                f"{_json_type(meta[key])} ({json.dumps(meta[key])})")  # fmt: skip
    return meta


LAYER_FIELDS = ("n_layers", "n_encoder_layers", "n_decoder_layers")
# a layer's index in a tensor name: aiayn's and Marian's layers.N, BERT's layer.N, GPT-2's h.N
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers?|h)\.(\d+)\.")


def layers_held(names: Iterable[str]) -> int:
    """How many layers the deepest stack among tensors ``names`` has (0: none)."""
    return max((int(m.group(1)) for name in names if (m := LAYER_INDEX.search(name))), default=-1) + 1


def _stored_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes in the safetensors header, read once, before any model is built."""
    try:
        with safe_open(weights, framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError) as e:
        raise ModelDirError(
            f"{weights} is corrupt or truncated ({e}); restore it or save the model again"
        ) from None


def _check_layer_counts(weights: Path, stored: dict, config: dict) -> None:
    """Refuse a config with more layers than the weights file holds before any model is built: a
    ``config.json`` asking for a million layers would otherwise spend minutes and gigabytes building
    them (even on the meta device) before the shapes are compared."""
    held = layers_held(stored)
    for field in LAYER_FIELDS:
        if isinstance(config.get(field), int) and config[field] > held:
            raise ModelDirError(f"{weights.parent / CONFIG_FILE}: {field}={config[field]} but {weights} "
                                f"holds {held} layers; the weights do not belong to this config")  # fmt: skip


def _check_shapes(weights: Path, stored: dict, model: nn.Module) -> None:
    """Compare the tensor shapes in the safetensors header (``stored``) with the model's before
    loading, so a mismatch names the tensor and both shapes (torch's own message does not fit on one
    line)."""
    for name, tensor in model.state_dict().items():
        want = tuple(tensor.shape)
        if name in stored and stored[name] != want:
            raise ModelDirError(
                f"{weights}: tensor {name} has shape {stored[name]} but {CONFIG_FILE} implies {want}; "
                "the weights do not belong to this config"
            )
    groups: dict[int, list[str]] = {}  # tied tensors (one object, several names) are stored once
    saved = set(model.state_dict())
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, t in named:
        if name in saved:
            groups.setdefault(id(t), []).append(name)
    missing = [names[0] for names in groups.values() if not any(n in stored for n in names)]
    unexpected = sorted(set(stored) - {n for names in groups.values() for n in names})
    problems = [
        f"{what} tensor(s) {sorted(names)[:3]}{' …' if len(names) > 3 else ''}"
        for what, names in (("lacks", missing), ("has unexpected", unexpected))
        if names
    ]
    if problems:
        raise ModelDirError(f"{weights} {' and '.join(problems)}; the weights do not belong to {CONFIG_FILE}")


def load_model(directory: str | os.PathLike, device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model from ``config.json`` and load ``model.safetensors`` strictly, in eval mode.

    A missing, corrupt or mismatched file is a ``ModelDirError`` naming it (and, for weights that do
    not fit the config, the tensor and both shapes)."""
    directory = resolve_model_dir(directory)
    meta = read_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise ModelDirError(f"{weights} {absent(weights)}: the model directory is incomplete")
    stored = _stored_shapes(weights)
    _check_layer_counts(weights, stored, meta["config"])
    with torch.device("meta"):  # shapes only: a config that does not fit its weights costs no memory
        _check_shapes(weights, stored, build_model(meta["kind"], meta["config"]))
    model = build_model(meta["kind"], meta["config"])  # checked by read_config
    try:
        _load_weights(model, weights, strict=True)
    except (SafetensorError, RuntimeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(f"{weights} is corrupt or does not match {CONFIG_FILE} ({first})") from None
    return model.to(device).eval()
