"""Property-based: random option values and random corruptions of a model directory, thrown at
``translate``, ``evaluate`` and ``export``. Whatever happens, the command returns (0, 1, or
argparse's 2) and never raises — no traceback — and never modifies an input (the model directory,
the source and reference files) nor a directory that is not aiayn's."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aiayn.cli.main import main
from tests.cli.test_safety import DE, EN, snapshot
from tests.decoding.fixtures import translation_dir

ODD = st.sampled_from(["nan", "inf", "-inf", "1e9", "x", ""])  # argparse or validation refuses these
INTS = st.one_of(*[st.integers(1, 6)] * 4, st.integers(-2, 60), ODD)
FLOATS = st.one_of(*[st.floats(0.1, 1.0)] * 4, st.floats(allow_nan=True, allow_infinity=True, width=32), ODD)
OPTIONS = {
    "--beam": INTS, "--nbest": INTS, "--max-len": INTS, "--min-len": INTS, "--max-len-b": INTS,
    "--max-tokens": INTS, "--top-k": INTS, "--seed": INTS, "--lenpen": FLOATS, "--temperature": FLOATS,
    "--top-p": FLOATS, "--lenpen-kind": st.sampled_from(["gnmt", "simple", "log"]),
}  # fmt: skip
FLAGS = ["--sample", "--no-cache"]
MODEL_FILES = ["config.json", "model.safetensors", "tokenizer.json"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
CONFIG_FIELDS = ["d_model", "n_heads", "d_ff", "n_encoder_layers", "src_vocab_size", "pad_id", "eos_id",
                 "dropout", "positional", "max_len", "share_embeddings", "ln_eps", "activation"]  # fmt: skip


@st.composite
def corruptions(draw):
    """One way to damage the model directory, as (description, function of the directory)."""
    kind = draw(st.sampled_from(["truncate", "flip", "delete", "kind", "config", "field", *["none"] * 6]))
    name = draw(st.sampled_from(MODEL_FILES))
    if kind == "truncate":
        keep = draw(st.integers(0, 400))
        return kind, lambda d: (d / name).write_bytes((d / name).read_bytes()[:keep])
    if kind == "flip":
        where, byte = draw(st.integers(0, 300)), draw(st.integers(0, 255))

        def flip(d: Path) -> None:
            data = bytearray((d / name).read_bytes())
            data[where % len(data)] = byte
            (d / name).write_bytes(bytes(data))

        return kind, flip
    if kind == "delete":
        return kind, lambda d: (d / name).unlink()
    if kind in ("kind", "config"):
        value = draw(JSON_VALUES)
        return kind, lambda d: _set(d / "config.json", [kind], value)
    if kind == "field":
        field, value = draw(st.sampled_from(CONFIG_FIELDS)), draw(JSON_VALUES)
        return kind, lambda d: _set(d / "config.json", ["config", field], value)
    return kind, lambda d: None


def _set(path: Path, keys: list[str], value) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    target = data
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    return translation_dir(tmp_path_factory.mktemp("fuzz") / "model", eos_bias=4.0)


def _workspace(original: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="aiayn-fuzz-"))
    shutil.copytree(original, root / "model")
    (root / "in.txt").write_text("\n".join(DE) + "\n", encoding="utf-8")
    (root / "ref.txt").write_text("\n".join(EN) + "\n", encoding="utf-8")
    (root / "notes").mkdir()
    (root / "notes" / "mine.txt").write_text("not aiayn's\n", encoding="utf-8")
    return root


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own refusal of a value of the wrong type
        assert e.code == 2, argv
        return 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    command=st.sampled_from(["translate", "evaluate", "export"]),
    options=st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), max_size=3).flatmap(
        lambda keys: st.fixed_dictionaries({k: OPTIONS[k] for k in keys})
    ),
    flags=st.lists(st.sampled_from(FLAGS), unique=True, max_size=2),
    damage=corruptions(),
    out=st.sampled_from(
        ["out.txt", "out.txt", "in.txt", "ref.txt", "model", "model/config.json", "notes", "new/x"]
    ),
)
def test_random_options_and_corruptions_never_raise_nor_touch_an_input(
    original, capsys, command, options, flags, damage, out
):
    root = _workspace(original)
    try:
        damage[1](root / "model")
        model = str(root / "model")
        if command == "export":
            argv = ["export", "--model", model, "--to", "hf", str(root / out)]
        else:
            argv = [command, "--model", model, *[f"{k}={v}" for k, v in options.items()], *flags]
            if command == "translate":
                argv += ["--input", str(root / "in.txt"), "--output", str(root / out)]
            else:
                argv += [
                    "--src",
                    str(root / "in.txt"),
                    "--ref",
                    str(root / "ref.txt"),
                    "--output",
                    str(root / out),
                ]
        before = snapshot(root)
        code = _run(argv)
        err = capsys.readouterr().err
        event(f"{command} exit {code}")
        if code == 1:
            event(
                "error: " + " ".join(w for w in err.split("error: ")[-1].split()[:6] if "aiayn-fuzz" not in w)
            )
        assert code in (0, 1, 2), (argv, err)
        if code == 1:
            assert err.strip().splitlines()[-1].startswith(f"aiayn {command}: error: "), err
        after = snapshot(root)
        inputs = ["model/", "in.txt", "notes/"] + (["ref.txt"] if command == "evaluate" else [])
        protected = [k for k in before if any(k == i or k.startswith(i) for i in inputs)]
        changed = sorted(k for k in protected if after.get(k) != before[k])
        assert not changed, (damage[0], argv, changed, err)
    finally:
        shutil.rmtree(root, ignore_errors=True)
