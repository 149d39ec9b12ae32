"""Saving and loading a model as a directory: ``config.json`` + ``model.safetensors``.

No pickle: weights are safetensors (tied and shared tensors stored once), the config is JSON.
Each file is written to a temporary name and renamed, so an interrupted save never leaves a
half-written file under the real name. Tokenizers and trainer state live beside these files and
are written by their own modules.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as _load_weights
from safetensors.torch import save_model as _save_weights
from torch import nn

from aiayn.atomic import atomic_path, write_json
from aiayn.models.config import EncoderConfig, LMConfig, TransformerConfig
from aiayn.models.encoder import EncoderModel
from aiayn.models.lm import LanguageModel
from aiayn.models.transformer import Transformer
from aiayn.modules.config import LayerConfig
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
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(KINDS)}")
    cls, cfg_cls = KINDS[kind]
    return cls(cfg_cls.from_dict(config))


def save_model(model: nn.Module, directory: str | os.PathLike, **extra: object) -> Path:
    """Write ``config.json`` (kind, config, version, ``extra`` fields) and ``model.safetensors``."""
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
    steps = sorted(p for p in path.glob("step-*") if (p / CONFIG_FILE).is_file()) if path.is_dir() else []
    return steps[-1] if steps else path


def read_config(directory: str | os.PathLike) -> dict:
    """The parsed ``config.json`` of a model (or run) directory, with errors that name the path."""
    directory = resolve_model_dir(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory {directory} does not exist (or is not a directory)")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {directory} is not an aiayn model directory")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or "kind" not in meta or "config" not in meta:
        raise ValueError(f"{path} lacks the 'kind' and 'config' fields of an aiayn model")
    return meta


def load_model(directory: str | os.PathLike, device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model from ``config.json`` and load ``model.safetensors`` strictly, in eval mode."""
    directory = resolve_model_dir(directory)
    meta = read_config(directory)
    try:
        model = build_model(meta["kind"], meta["config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{directory / CONFIG_FILE}: {e}") from None
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} is missing")
    try:
        _load_weights(model, weights, strict=True)
    except (SafetensorError, RuntimeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{weights} is corrupt or does not match config.json ({first})") from None
    return model.to(device).eval()
