"""Train a bidirectional translator on cached right-to-left translations, everything inside one budget.

    python scripts/reproduce_bidirectional.py multi30k-de-en weight_decay=0.1
    python scripts/reproduce_bidirectional.py multi30k-en-de lr=0.0035 lowercase=true --jackknife

The stages (Su et al. 2019, ABDNMT-Transformer's recipe, as ``make reproduce-multi30k-*-bidirectional``):

1. a right-to-left model (``reverse_target=true``, and ``--r2l``'s overrides) trained for
   ``--r2l-share`` of ``--minutes`` (``horizon="budget"``: it ends annealed); with ``--jackknife``
   two, one per half of the training pairs, side by side (one process each);
2. its translations of every training and validation source, made once into the cache
   (``aiayn/training/pseudo.py``);
3. the bidirectional model (``model.bidirectional=true r2l_memory_from=cache``) trained for what is
   left of the budget after the wall-clock of stages 1 and 2 (their start-up and evaluations
   included), then chosen on validation and scored on test2016 by ``scripts/reproduce.py``; with
   ``--rerank`` the choice also weighs its beams re-sorted by stage 1's model (free: it is trained).

So the training clock of all stages together is the plain recipe's ``max_minutes``: the comparison
with ``scripts/reproduce.py RECIPE`` is at equal total time, the right-to-left model and its cache
counted. Writes results/NAME.json (reproduce.py's, plus ``stages``: each stage's minutes) and curves.
``--processes 2`` runs stages 1 (without ``--jackknife``) and 3 as two DistributedDataParallel
processes, as ``make reproduce-multi30k-de-en``. ``--members 2`` trains stage 3 as two bidirectional
models side by side instead, one process (one core) each, and lets validation weigh their ensemble
(``reproduce.py --members``), as ``make reproduce-multi30k-en-de`` trains its plain models.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from reproduce import check_members, check_names, command_line  # noqa: E402

from aiayn.atomic import write_json  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.training.distributed import DistInfo  # noqa: E402
from aiayn.training.recipe import load_recipe  # noqa: E402
from aiayn.training.task import get_task  # noqa: E402
from aiayn.viz.curves import read_metrics  # noqa: E402


def launcher(processes: int) -> list[str]:
    """The command that starts Python: ``processes`` DistributedDataParallel ranks, or one."""
    if processes > 1:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={processes}",
        ]
    return [sys.executable]


def run(cmd: list[str]) -> float:
    """Run ``cmd`` in the repository root; its wall-clock seconds (a stage that fails ends the
    pipeline with one line: the stage has said why)."""
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{Path(__file__).name}: a stage failed (exit status {done.returncode}): no results")
    return time.perf_counter() - t0


def train_r2l(recipe: Path, overrides: list[str], minutes: float, out: Path, processes: int,
              jackknife: bool) -> tuple[list[Path], float]:  # fmt: skip
    """Stage 1: the right-to-left model(s) and the wall-clock seconds they took."""
    common = [*overrides, "reverse_target=true", f"max_minutes={minutes:g}", "progress=false"]
    for d in out.parent.glob(f"{out.name}*"):  # an earlier pipeline's: this one starts afresh
        shutil.rmtree(d)
    if not jackknife:
        cmd = [*launcher(processes), "-m", "aiayn", "train", str(recipe), *common, f"out_dir={out}"]
        return [out], run(cmd)
    dirs = [out.with_name(f"{out.name}-half{h}") for h in (1, 2)]
    t0 = time.perf_counter()
    train = [sys.executable, "-m", "aiayn", "train", str(recipe), *common, "threads=1"]
    procs = [
        subprocess.Popen([*train, f"train_half={h}", f"out_dir={d}"], cwd=ROOT) for h, d in zip((1, 2), dirs)
    ]
    if any(p.wait() for p in procs):
        raise SystemExit("a right-to-left half model failed to train: no results")
    return dirs, time.perf_counter() - t0


# A right-to-left model whose best validation BLEU is under this did not learn to translate: its cache
# would teach the bidirectional model noise (a 12-minute stage at the recipe's peak learning rate, on a
# machine slow enough to halve its batches, diverged so; docs/results.md, issue 58).
MIN_R2L_BLEU = 1.0


def check_r2l(dirs: list[Path]) -> list[float | None]:
    """Stop the pipeline when a right-to-left model's best validation BLEU is under ``MIN_R2L_BLEU``,
    naming the run and what to change, instead of translating the corpus with it and training on that.
    Returns each model's best validation BLEU (None without a validation), for the results file."""
    best = []
    for d in dirs:
        valid = [r for r in read_metrics(d) if r.get("split") == "valid" and "bleu" in r]
        scores = [(r["bleu"], r["step"]) for r in valid]
        bleu, step = max(scores) if scores else (None, None)
        best.append(bleu)
        if bleu is not None and bleu < MIN_R2L_BLEU:
            raise SystemExit(
                f"{d}: the right-to-left model did not learn (best validation BLEU {bleu:g}, at update "
                f"{step}); its translations would be noise: give it more of the budget (--r2l-share), a "
                "lower lr, or a longer budget (--minutes)"
            )
    return best


# the vocabulary's fields: they train stage 1's tokenizer, which the later stages read through r2l_model
VOCABULARY = ("tokenizer=", "vocab_size=", "joint_vocab=")


def after_r2l(overrides: list[str]) -> list[str]:
    """``overrides`` for a stage that reads the right-to-left model: without the vocabulary's fields
    (given again there, they would be refused as doing nothing)."""
    return [o for o in overrides if not o.startswith(VOCABULARY)]


def r2l_overrides(dirs: list[Path]) -> list[str]:
    jack = [f"r2l_jackknife={dirs[1]}"] if len(dirs) == 2 else []
    return [f"r2l_model={dirs[0]}", *jack]


def build_cache(recipe: Path, overrides: list[str]) -> float:
    """Stage 2: the final run's data, its cache of translations included, built as its training
    will read it (a later start is then a cache hit); the seconds it took."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_recipe(recipe, [*overrides, f"out_dir={tmp}"])
        get_task(cfg.task)(cfg, Path(tmp), DistInfo())
    return time.perf_counter() - t0


def train_final(recipe: str, overrides: list[str], minutes: float, name: str, processes: int,
                extra: list[str] = ()) -> dict:  # fmt: skip
    """Stage 3: ``scripts/reproduce.py`` (train, choose on validation, test2016); its results."""
    cmd = [*launcher(processes), str(ROOT / "scripts" / "reproduce.py"), recipe, *overrides,
           f"max_minutes={minutes:g}", "progress=false", "--name", name, *extra]  # fmt: skip
    run(cmd)
    return json.loads((ROOT / "results" / f"{name}.json").read_text())


def pipeline(recipe: str, overrides: list[str], final: list[str], name: str, args) -> dict:
    """Stages 1–3 for the final run's ``final`` overrides (the bidirectional model's, or a control's
    that reads the same cache); results/NAME.json with the stages' minutes."""
    path = ROOT / "recipes" / f"{recipe}.toml"
    budget = args.minutes or load_recipe(path, overrides).max_minutes
    r2l_dir = ROOT / "runs" / f"reproduce-{name}-r2l"
    stage1 = [*overrides, *getattr(args, "r2l", [])]
    dirs, r2l_s = train_r2l(path, stage1, budget * args.r2l_share, r2l_dir, args.processes, args.jackknife)
    r2l_bleu = check_r2l(dirs)
    reads = [*after_r2l(overrides), *final, *r2l_overrides(dirs)]
    cache_s = build_cache(path, reads)
    left = budget - (r2l_s + cache_s) / 60
    if left < 1:
        raise SystemExit(
            f"stages 1 and 2 took {(r2l_s + cache_s) / 60:.1f} of {budget:g} minutes: lower --r2l-share"
        )
    extra = list(getattr(args, "reproduce", []))
    members = getattr(args, "members", 0)
    if members:  # side by side, one process each (reproduce.py starts them): no torchrun for stage 3
        extra += ["--members", str(members)]
    if getattr(args, "rerank", False):  # stage 1's model re-sorts the final beams where validation says so
        extra += ["--rerank-with", str(dirs[0] / "best")]
    out = train_final(recipe, reads, round(left, 2), name, 1 if members else args.processes, extra)
    out["stages"] = {"budget_minutes": budget, "r2l_minutes": round(r2l_s / 60, 2),
                     "cache_minutes": round(cache_s / 60, 2), "final_max_minutes": round(left, 2),
                     "r2l_share": args.r2l_share, "jackknife": args.jackknife, "members": members,
                     "r2l_overrides": list(getattr(args, "r2l", [])), "r2l_valid_bleu": r2l_bleu,
                     "r2l_models": [str(d.relative_to(ROOT)) for d in dirs],
                     "final_command": out.get("command")}  # fmt: skip
    out["command"] = command_line()  # the whole pipeline's
    out["total_minutes"] = round((r2l_s + cache_s) / 60 + out["train_wall_minutes"], 2)
    write_json(ROOT / "results" / f"{name}.json", out)
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", help="a translation recipe in recipes/ (without .toml)")
    ap.add_argument(
        "overrides", nargs="*", metavar="key=value", help="for every stage (e.g. weight_decay=0.1)"
    )
    ap.add_argument(
        "--minutes", type=float, default=0, help="the whole budget (default: the recipe's max_minutes)"
    )
    ap.add_argument(
        "--r2l-share", type=float, default=0.3, help="the right-to-left model's share (default 0.3)"
    )
    ap.add_argument("--jackknife", action="store_true", help="two right-to-left models, one per half")
    ap.add_argument("--rerank", action="store_true",
                    help="stage 1's right-to-left model also re-sorts the final model's beam where "
                    "validation says so (reproduce.py --rerank-with); not with --jackknife")  # fmt: skip
    ap.add_argument("--processes", type=int, default=1, help="DistributedDataParallel processes (default 1)")
    ap.add_argument("--members", type=int, default=0,
                    help="stage 3 trains this many bidirectional models side by side, one process "
                    "each, and validation also weighs their ensemble (default 0: one model)")  # fmt: skip
    ap.add_argument("--r2l", nargs="*", default=[], metavar="key=value",
                    help="more overrides for stage 1 only (e.g. lr=0.0025)")  # fmt: skip
    ap.add_argument("--final", nargs="*", default=[], metavar="key=value",
                    help="more overrides for stage 3 only (e.g. r2l_memory_dropout=0.1)")  # fmt: skip
    ap.add_argument("--name", help="results/NAME.json (default: RECIPE-bidirectional[-jackknife][-membersN])")
    ap.add_argument("--tag", help="ends NAME with -TAG (letters, digits, '.', '_', '-'), e.g. the machine, "
                    "so that this run's files sit beside those already in results/")  # fmt: skip
    return ap


def run_name(args: argparse.Namespace) -> str:
    """results/NAME.json's NAME: ``--name``, or RECIPE-bidirectional[-jackknife][-membersN]; then
    ``-TAG``."""
    jackknife = "-jackknife" if args.jackknife else ""
    members = f"-members{args.members}" if args.members else ""
    name = args.name or f"{args.recipe}-bidirectional{jackknife}{members}"
    return name + (f"-{args.tag}" if args.tag else "")


def main() -> int:
    args = parser().parse_args()
    if not 0 < args.r2l_share < 1:
        parser().error(f"--r2l-share {args.r2l_share}: give a share of the budget in (0, 1)")
    if not (args.minutes >= 0 and args.processes >= 1):
        parser().error("--minutes must be ≥ 0 (0: the recipe's) and --processes ≥ 1")
    check_members(parser().error, args.members)
    if args.rerank and args.jackknife:
        parser().error("--rerank reads one right-to-left model of the corpus; --jackknife trains two halves")
    check_names(parser().error, ("--name", args.name), ("--tag", args.tag))
    name = run_name(args)
    final = ["model.bidirectional=true", "r2l_memory_from=cache", *args.final]
    # every stage's overrides, checked before the first one trains (and an earlier pipeline's runs go)
    path, r2l_dir = ROOT / "recipes" / f"{args.recipe}.toml", ROOT / "runs" / f"reproduce-{name}-r2l"
    load_recipe(path, [*args.overrides, *args.r2l, "reverse_target=true"])
    stage3 = [*after_r2l(args.overrides), *final, *r2l_overrides([r2l_dir] * (2 if args.jackknife else 1))]
    load_recipe(path, stage3)
    out = pipeline(args.recipe, args.overrides, final, name, args)
    print(json.dumps({k: out[k] for k in ("name", "stages", "total_minutes", "test")}, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AiaynError as e:  # a recipe, override, dataset or run directory that is wrong: one line
        sys.exit(f"{Path(__file__).name}: error: {e}")
