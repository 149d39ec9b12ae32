"""The same computations on a CUDA device as on the CPU: the models' outputs and attention, every
search, a training run in fp32, bf16 and fp16 (with loss scaling), an exact resume there, and
torchrun's NCCL path. Skipped where no CUDA device exists (CI); on a GPU machine:
``pytest tests/test_cuda.py``. The whole suite also runs there, training on the GPU wherever a test
leaves ``device`` at its default, ``auto``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.cli.main import main
from aiayn.decoding import LMAdapter, SearchConfig, Seq2SeqAdapter, search
from tests.decoding.fixtures import padded_sources, tiny_lm, tiny_transformer
from tests.helpers import assert_close
from tests.training.conftest import make_corpus, tiny_args

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parents[1]
DRIVER = str(ROOT / "tests" / "training" / "driver.py")
SEARCHES = {"greedy": SearchConfig(beam=1), "beam": SearchConfig(beam=4, nbest=3)}


@pytest.fixture(autouse=True)
def _full_float32():
    """TF32 matrix products differ from the CPU's by ~1e-3 by design; these comparisons are of fp32."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    return make_corpus(tmp_path)


def _losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_translation_model_computes_on_cuda_what_it_computes_on_the_cpu(norm_first):
    model, src = tiny_transformer(eos_bias=4.0, norm_first=norm_first), padded_sources()
    tgt = torch.randint(4, 50, (4, 7), generator=torch.Generator().manual_seed(2))
    on_cpu = model(src, tgt)
    assert_close("CUDA vs CPU logits", model.cuda()(src.cuda(), tgt.cuda()).cpu(), on_cpu, atol=1e-4)
    weights = model.attention_weights(src.cuda(), tgt.cuda())
    for kind, layers in model.cpu().attention_weights(src, tgt).items():
        for ours, ref in zip(weights[kind], layers, strict=True):
            assert_close(f"CUDA vs CPU attention ({kind})", ours.cpu(), ref, atol=1e-5)


@pytest.mark.parametrize("name", SEARCHES)
def test_every_search_finds_on_cuda_what_it_finds_on_the_cpu(name):
    model, cfg = tiny_transformer(eos_bias=4.0), SEARCHES[name]
    on_cpu = search(Seq2SeqAdapter(model), padded_sources(), cfg, 14)
    on_cuda = search(Seq2SeqAdapter(model.cuda()), padded_sources().cuda(), cfg, 14)
    assert [[h.tokens for h in hs] for hs in on_cuda] == [[h.tokens for h in hs] for hs in on_cpu]
    scores = [torch.tensor([[h.score for h in hs] for hs in run]) for run in (on_cuda, on_cpu)]
    assert_close(f"CUDA vs CPU search scores ({name})", *scores, atol=1e-4)
    lm, prompt = tiny_lm(), torch.randint(4, 40, (2, 5), generator=torch.Generator().manual_seed(2))
    lm_cpu = search(LMAdapter(lm), prompt, cfg, 10)
    lm_cuda = search(LMAdapter(lm.cuda()), prompt.cuda(), cfg, 10)
    assert [[h.tokens for h in hs] for hs in lm_cuda] == [[h.tokens for h in hs] for hs in lm_cpu]


def test_sampling_on_cuda_is_seeded():
    """The generator lives on the inputs' device: a seed fixes the output there too."""
    model, cfg = tiny_transformer(eos_bias=4.0).cuda(), SearchConfig(sample=True, nbest=2, top_k=20, seed=3)
    runs = [search(Seq2SeqAdapter(model), padded_sources().cuda(), cfg, 14) for _ in range(2)]
    assert [[h.tokens for h in hs] for hs in runs[0]] == [[h.tokens for h in hs] for hs in runs[1]]


def test_training_on_cuda_follows_the_cpu_run(corpus, tmp_path):
    """Six updates without dropout: the same losses on both devices (to float rounding)."""
    args = ["max_steps=6", "eval_every=6", "model.dropout=0.0"]
    for device in ("cpu", "cuda"):
        assert main(["train", *tiny_args(corpus, tmp_path / device, f"device={device}", *args)]) == 0
    cpu, cuda = _losses(tmp_path / "cpu"), _losses(tmp_path / "cuda")
    assert len(cpu) == len(cuda) == 6
    assert_close("CUDA vs CPU training losses", torch.tensor(cuda), torch.tensor(cpu), atol=1e-3)
    assert cuda[-1] < cuda[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_run_on_cuda_resumes_where_it_stopped(corpus, tmp_path, precision):
    """Dropout draws, the loss scale (fp16) and the data position come back from the checkpoint: four
    updates, a stop and four more give the losses of eight in one go."""
    args = ["device=cuda", f"precision={precision}", "eval_every=2", "keep_last=5", "model.dropout=0.3"]
    assert main(["train", *tiny_args(corpus, tmp_path / "ref", "max_steps=8", *args)]) == 0
    assert main(["train", *tiny_args(corpus, tmp_path / "run", "max_steps=4", *args)]) == 0
    assert main(["train", *tiny_args(corpus, tmp_path / "run", "max_steps=8", *args), "--resume"]) == 0
    reference, resumed = _losses(tmp_path / "ref"), _losses(tmp_path / "run")
    assert len(reference) == len(resumed) == 8
    assert all(torch.isfinite(torch.tensor(reference)))
    # CUDA's backward sums some gradients with atomics, in no fixed order: equal to rounding
    name = f"CUDA resumed vs uninterrupted ({precision})"
    assert_close(name, torch.tensor(resumed), torch.tensor(reference), atol=1e-4)
    if precision != "fp32":  # the first loss, before any update; no dropout: CUDA draws masks per dtype
        first = {}
        for p in ("fp32", precision):
            args = ["max_steps=1", "device=cuda", f"precision={p}", "model.dropout=0.0"]
            assert main(["train", *tiny_args(corpus, tmp_path / p, *args)]) == 0
            first[p] = _losses(tmp_path / p)[0]
        assert abs(first[precision] - first["fp32"]) < 0.03, first


def test_precision_auto_measures_on_cuda_and_trains(corpus, tmp_path, capsys):
    args = ["device=cuda", "precision=auto", "max_steps=2"]
    assert main(["train", *tiny_args(corpus, tmp_path / "run", *args)]) == 0
    assert "precision=auto chose" in capsys.readouterr().err


def test_torchrun_on_one_gpu_uses_nccl_and_trains_as_one_process(corpus, tmp_path):
    env = {**os.environ, "AIAYN_CACHE_DIR": str(tmp_path / "cache")}
    common = ["max_steps=6", "eval_every=6", "model.dropout=0.0", "device=cuda"]
    dumps = {kind: tmp_path / f"dump-{kind}" for kind in ("ddp", "single")}
    torchrun = ["-m", "torch.distributed.run", "--nproc_per_node=1", "--master_port=29561"]
    for kind, launcher in (("ddp", torchrun), ("single", [])):
        dumps[kind].mkdir()
        proc = subprocess.run(
            [sys.executable, *launcher, DRIVER, "--dump-params", str(dumps[kind]), "--",
             *tiny_args(corpus, tmp_path / kind, *common)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    ddp, single = (load_file(str(dumps[kind] / "rank0.safetensors")) for kind in ("ddp", "single"))
    assert ddp.keys() == single.keys()
    for name in ddp:
        assert_close("torchrun (NCCL, 1 GPU) vs 1 process on CUDA", ddp[name], single[name], atol=1e-5)
