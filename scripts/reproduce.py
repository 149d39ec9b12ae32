"""Reproduce a result of the README's results table from scratch and write it to results/.

    python scripts/reproduce.py multi30k-de-en      # recipe recipes/multi30k-de-en.toml
    python scripts/reproduce.py shakespeare-char
    torchrun --standalone --nproc_per_node=2 scripts/reproduce.py multi30k-de-en  # 2 DDP processes

Translation: train (tokenizer included) within the recipe's budget, average the last checkpoints,
keep whichever of {best, averaged} with beam search (and, when asked, minimum Bayes risk over a beam
of ``--mbr-beam`` and the ensemble of the last ``--ensemble K`` checkpoints; both off by default)
scores higher BLEU on the *validation* set (never the test set), try that choice again with a
length penalty of 1.0 besides 0.6 (``--lenpen``), then translate test2016 with the better and score
it with sacreBLEU (cased and lowercased BLEU, chrF, signatures). ``--evaluate-only`` evaluates an
earlier run's directory again (e.g. after the evaluation changed, or when it failed: the training
figures wait in runs/reproduce-NAME/training.json). Language model: train, then the
validation loss over the whole split.
``--members N`` (translation, no torchrun) trains N models side by side instead of one: one process
and one thread each, seeds seed … seed+N-1, each under the recipe's budget, in runs/reproduce-NAME/
member-K; the choice on validation then also weighs their ensembles (the members' best checkpoints,
or their averages, decoded as one model). ``--rerank-with DIR`` also weighs each model and
ensemble with its beam's n-best re-sorted by DIR's model (``aiayn/decoding/rerank.py``; a
bidirectional pipeline's own right-to-left model, ``scripts/reproduce_bidirectional.py --rerank``).
Writes results/NAME.json and results/NAME-{loss,lr,bleu}.png. Extra ``key=value`` arguments
override recipe fields (e.g. ``seed=2``, ``max_minutes=30``), and change NAME accordingly;
``--tag TAG`` ends NAME with ``-TAG`` (e.g. the machine), so that a run elsewhere never replaces a result
already in results/.
Under ``torchrun`` every rank trains (DistributedDataParallel) and rank 0 evaluates and writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiayn.atomic import write_bytes, write_json  # noqa: E402
from aiayn.cli.demo import machine  # noqa: E402
from aiayn.cli.evaluate import score  # noqa: E402
from aiayn.data.corpus import load_parallel  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.rerank import Reranked  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.device import resolve_device  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402
from aiayn.models.common import count_parameters  # noqa: E402
from aiayn.models.io import load_model  # noqa: E402
from aiayn.training.average import average_checkpoints, last_checkpoints  # noqa: E402
from aiayn.training.config import to_dict  # noqa: E402
from aiayn.training.distributed import barrier, init_distributed  # noqa: E402
from aiayn.training.recipe import load_recipe  # noqa: E402
from aiayn.training.trainer import Trainer  # noqa: E402
from aiayn.viz.curves import plot_curves, read_metrics  # noqa: E402


def command_line() -> str:
    """This process's command, the script relative to the repository (under torchrun: as each process
    was started; ``processes`` in the results says how many)."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def git_commit() -> str:
    try:
        # "-dirty": the tree had uncommitted changes, so the commit alone does not reproduce the figures
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


TRAINING_FILE = "training.json"  # in the run directory: the results before their evaluation
EVALUATION_FIELDS = ("valid_bleu", "chosen", "decoding", "averaged", "ensembled", "beam", "lenpen", "mbr",
                     "test", "signatures", "test_decode_seconds", "examples",
                     "evaluation_minutes")  # fmt: skip


def sources_and_references(cfg, split: str) -> tuple[list[str], list[str]]:
    """Multi30k's sentences and references; a ``lowercase`` run's validation references lowercased, as
    its models write (the choice then compares like with like), its test references as written (the
    test set is scored both cased and lowercased)."""
    corpus = load_parallel("multi30k", split, cfg.options.src_lang, cfg.options.tgt_lang)
    srcs, refs = (list(side) for side in zip(*corpus))
    return srcs, [r.lower() for r in refs] if cfg.options.lowercase and split == "valid" else refs


def member_dirs(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("member-*"), key=lambda d: int(d.name.split("-")[1]))


def train_members(recipe: Path, overrides: list[str], run_dir: Path, cfg, n: int) -> list[dict]:
    """Train ``n`` models at once, each in its own ``aiayn train`` process with one thread and its
    own seed; returns each one's last step and how it stopped (from its metrics)."""
    members = [(run_dir / f"member-{k}", cfg.seed + k - 1) for k in range(1, n + 1)]  # (out_dir, seed)
    procs = []
    for out_dir, seed in members:
        member = [f"seed={seed}", "threads=1", "progress=false", f"out_dir={out_dir}"]
        cmd = [sys.executable, "-m", "aiayn", "train", str(recipe), *overrides, *member]
        procs.append(subprocess.Popen(cmd, cwd=ROOT))
    old = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the members are stopped too
    try:
        codes = [p.wait() for p in procs]
    except BaseException:  # Ctrl-C, SIGTERM: each member stops at its next update and saves it
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
    if any(codes):
        raise SystemExit(f"a member's training failed (exit codes {codes}): no results written")
    out = []
    for d, seed in members:
        records = read_metrics(d)
        steps, minutes = max(r["step"] for r in records), max(r.get("elapsed", 0) for r in records) / 60
        reason = "max_epochs or patience"
        if steps >= cfg.max_steps:
            reason = "max_steps"
        elif cfg.max_minutes and minutes >= cfg.max_minutes - 0.1:  # its training clock ran out
            reason = "max_minutes"
        sizes = [r["max_tokens"] for r in records if "max_tokens" in r]  # short_budget may have halved them
        out.append({"dir": d.name, "seed": seed, "steps": steps, "stopped_by": reason,
                    "train_minutes": round(minutes, 2),
                    "max_tokens": sizes[-1] if sizes else cfg.max_tokens})  # fmt: skip
    return out


def candidates(run_dir: Path, args: argparse.Namespace) -> tuple[dict[str, Translator], list, list]:
    """The models the validation set chooses among: best and average of the last ``--average`` (per
    member when there are members, plus the members' ensembles), and the last-K ensemble."""
    members = member_dirs(run_dir)
    translators, averaged = {}, []
    for d in members or [run_dir]:
        prefix = f"{d.name}/" if members else ""
        translators[f"{prefix}best"] = Translator.from_dir(d / "best")
        paths = last_checkpoints(d, args.average)
        averaged += paths
        if len(paths) > 1:
            translators[f"{prefix}averaged"] = Translator.from_dir(average_checkpoints(paths, d / "averaged"))
    for kind in ("best", "averaged") if members else ():
        dirs = [d / kind for d in members if (d / kind).is_dir()]
        if len(dirs) == len(members):
            translators[f"ensemble of {kind}"] = Translator.from_dirs(dirs)
    ensembled = last_checkpoints(run_dir, args.ensemble) if args.ensemble > 1 and not members else []
    if len(ensembled) > 1:
        translators["ensemble"] = Translator.from_dirs(ensembled)
    if args.rerank_with:  # each model and ensemble also with its n-best re-sorted by the second model
        scorer = Translator.from_dir(args.rerank_with)
        for k in list(translators):
            translators[f"{k} reranked"] = Reranked(translators[k], scorer)
    return translators, averaged, ensembled


def choose_on_validation(
    translators: dict, decodings: dict[str, SearchConfig], lenpens: list[float], srcs: list, refs: list
) -> tuple[dict, str, str, SearchConfig]:
    """The (model, decoding) pair with the highest validation BLEU — ensembles and reranked models
    with beam search only — and then, for that pair alone, the length penalty among ``lenpens``
    (the decodings carry the first). Trying every length penalty with every pair would cost minutes
    of the hour; on four two-model en→de runs α = 1.0 moved the chosen pair's validation BLEU by +0.17
    to +0.34 against 0.6, and its test BLEU by −0.08 to +0.26 (docs/results.md).
    Returns ``({"model/decoding[ lenpen=α]": BLEU}, model, decoding, its search config)``."""
    pairs = [(k, d) for k in translators for d in decodings
             if d == "beam" or not (k.startswith("ensemble") or k.endswith("reranked"))]  # fmt: skip
    choice = {f"{k}/{d}": score(translators[k].translate(srcs, decodings[d]), refs)[0]["bleu"]
              for k, d in pairs}  # fmt: skip
    chosen, decoding = max(choice, key=choice.get).rsplit("/", 1)
    best, search = choice[f"{chosen}/{decoding}"], decodings[decoding]
    for alpha in lenpens[1:]:
        config = dataclasses.replace(decodings[decoding], lenpen=alpha)
        bleu = score(translators[chosen].translate(srcs, config), refs)[0]["bleu"]
        choice[f"{chosen}/{decoding} lenpen={alpha}"] = bleu
        if bleu > best:
            best, search = bleu, config
    return choice, chosen, decoding, search


def evaluate_translation(run_dir: Path, cfg, args: argparse.Namespace) -> dict:
    """Choose checkpoint and decoding on the validation set, then score test2016 with that choice.

    Checkpoints: the best one, the average of the last ``--average`` and, with ``--ensemble K``,
    an ensemble of the last K (their probabilities averaged at every step). Decodings:
    beam search (``--beam``, the first ``--lenpen``) and, with ``--mbr-beam K``, minimum Bayes risk
    (sentence BLEU) over a beam of K's hypotheses — for the single models only: over an ensemble it
    would cost more minutes of the hour. Minimum Bayes risk is off by default since 2026-11-25: in the
    three runs where it won on validation (by 0.06–0.71), it lost 0.54–1.20 on test against beam
    search on the same checkpoint (docs/results.md). Then the pair that scored highest is decoded again
    with each further ``--lenpen`` (``choose_on_validation``), and the test set is decoded once, with
    the best of these.
    """
    t0 = time.perf_counter()
    translators, paths, members = candidates(run_dir, args)
    decodings = {"beam": SearchConfig(beam=args.beam, lenpen=args.lenpen[0])}
    if args.mbr_beam:
        decodings["mbr"] = SearchConfig(beam=args.mbr_beam, lenpen=args.lenpen[0], mbr="bleu")
    srcs, refs = sources_and_references(cfg, "valid")
    choice, chosen, decoding, search = choose_on_validation(translators, decodings, args.lenpen, srcs, refs)
    t1 = time.perf_counter()
    srcs, refs = sources_and_references(cfg, "test")
    hyps = translators[chosen].translate(srcs, search)
    scores, signatures = score(hyps, refs, cfg.options.tgt_lang)  # with the tokenized BLEU of papers
    return {"valid_bleu": choice, "chosen": chosen, "decoding": decoding,
            "averaged": [str(p.relative_to(run_dir)) for p in paths],
            "ensembled": [p.name for p in members], "beam": search.beam, "lenpen": search.lenpen,
            "mbr": search.mbr, "test": scores, "signatures": signatures,
            "test_decode_seconds": round(time.perf_counter() - t1, 1),
            "examples": [{"src": s, "hyp": h} for s, h in zip(srcs[:5], hyps[:5])],
            "evaluation_minutes": round((time.perf_counter() - t0) / 60, 2)}  # fmt: skip


COSMETIC = ("threads=", "progress=", "device=", "tensorboard=")  # change speed or display, not results


def check_members(error, members: int) -> None:
    """``--members``: 0 (one model) or 2 and more (``error``: argparse's, which exits)."""
    if members == 1 or members < 0:
        error(f"--members {members}: give 2 or more models to train side by side (0: one model)")


def names_a_file(name: str) -> bool:
    """Whether ``name`` is made of letters, digits, '.', '_' and '-' only (a file's name, no path)."""
    return re.fullmatch(r"[A-Za-z0-9._-]+", name) is not None


def check_names(error, *flags: tuple[str, str | None]) -> None:
    """Each given ``(flag, value)`` names files: letters, digits, '.', '_' and '-' only (``error``:
    argparse's, which exits)."""
    for flag, value in flags:
        if value is not None and not names_a_file(value):
            error(f"{flag} {value!r}: use letters, digits, '.', '_' and '-' only: it names files")


def named_overrides(overrides: list[str]) -> str:
    """``-key1value1-key2value2`` of the overrides that change results (not ``COSMETIC``): what a
    run's name says of them (a name holding a path is refused by its caller, who asks for --name)."""
    return "".join(f"-{o.replace('=', '')}" for o in overrides if not o.startswith(COSMETIC))


def run_name(recipe: str, overrides: list[str], members: int, tag: str | None) -> str:
    """NAME of runs/reproduce-NAME and results/NAME.json: the recipe, what changes its results, the tag."""
    return (
        recipe
        + named_overrides(overrides)
        + (f"-members{members}" if members else "")
        + (f"-{tag}" if tag else "")
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", help="a recipe name in recipes/ (without .toml)")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--average", type=int, default=5, help="checkpoints to average (default 5)")
    ensemble = "last checkpoints decoded as one ensemble, also tried on validation (default 0: none)"
    ap.add_argument("--ensemble", type=int, default=0, help=ensemble)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--lenpen", type=float, nargs="+", default=[0.6, 1.0],
                    help="length penalties α: the first for every candidate, the others tried on the "
                    "validation set's choice only (default: 0.6 1.0)")  # fmt: skip
    mbr = "beam of a minimum-Bayes-risk decoding also tried on validation, e.g. 10 (default 0: none)"
    ap.add_argument("--mbr-beam", type=int, default=0, help=mbr)
    ap.add_argument("--rerank-with", metavar="DIR", type=Path,
                    help="a right-to-left model (reverse_target=true) that also re-sorts each candidate's "
                    "beam; the validation set chooses with or without it (default: none)")  # fmt: skip
    ap.add_argument("--evaluate-only", action="store_true",
                    help="no training: evaluate again the run directory an earlier run of this command left "
                    "(runs/reproduce-NAME), keeping its training figures from results/NAME.json")  # fmt: skip
    ap.add_argument("--members", type=int, default=0,
                    help="train this many models side by side, one process each, and weigh their ensemble "
                    "(translation; run it without torchrun)")  # fmt: skip
    ap.add_argument("--tag", help="ends NAME with -TAG (letters, digits, '.', '_', '-'), e.g. the machine, "
                    "so that this run's files sit beside those already in results/")  # fmt: skip
    ap.add_argument("--name", help="NAME itself (letters, digits, '.', '_', '-') instead of one made from "
                    "the recipe and the overrides, e.g. when an override holds a path")  # fmt: skip
    args = ap.parse_args()
    check_names(ap.error, ("--tag", args.tag), ("--name", args.name))
    if any(o.startswith("out_dir=") for o in args.overrides):
        ap.error("reproduce.py names its run directory itself (runs/reproduce-NAME); drop out_dir=")
    check_members(ap.error, args.members)
    if args.average < 1 or args.beam < 1 or args.mbr_beam == 1 or args.mbr_beam < 0:
        ap.error(f"--average {args.average}, --beam {args.beam}, --mbr-beam {args.mbr_beam}: give --average "
                 "and --beam ≥ 1 and --mbr-beam 0 (none) or ≥ 2, before any training")  # fmt: skip
    if args.rerank_with and (args.beam < 2 or not (args.rerank_with / "config.json").is_file()):
        ap.error(f"--rerank-with {args.rerank_with}: give a model directory (its config.json) and --beam ≥ 2")
    started, commit = time.perf_counter(), git_commit()  # the code that runs, not HEAD when it ends
    if args.name:
        name = args.name + (f"-{args.tag}" if args.tag else "")  # --tag keeps its word beside --name
    else:
        name = run_name(args.recipe, args.overrides, args.members, args.tag)
        if not names_a_file(name):  # an override holding a path: now, not after training
            ap.error(f"the name made from the overrides, {name!r}, cannot name a file: give --name NAME")
    run_dir, results = ROOT / "runs" / f"reproduce-{name}", ROOT / "results"
    recipe = ROOT / "recipes" / f"{args.recipe}.toml"
    cfg = load_recipe(recipe, [*args.overrides, f"out_dir={run_dir}"])
    if args.members and cfg.task != "translation":
        ap.error(f"--members is for translation recipes; {args.recipe} is task={cfg.task!r}")
    if args.evaluate_only:
        return evaluate_again(name, run_dir, results, cfg, args, commit)
    # under torchrun: every rank trains
    dist = init_distributed(resolve_device(cfg.device), cfg.device, cfg.ddp_timeout)
    if args.members and dist.enabled:
        ap.error("--members starts its own processes: run it with python, not torchrun")
    if dist.is_main and run_dir.exists():
        shutil.rmtree(run_dir)
    barrier(dist)
    t0 = time.perf_counter()
    if args.members:
        trained = train_members(recipe, args.overrides, run_dir, cfg, args.members)
        result = {"step": [m["steps"] for m in trained], "reason": "see members",
                  "max_tokens": [m["max_tokens"] for m in trained]}  # fmt: skip
    else:
        result = Trainer(cfg).fit()
    wall = time.perf_counter() - t0
    if not dist.is_main:
        return 0  # rank 0 evaluates and writes the results
    if result["reason"] in ("SIGINT", "SIGTERM"):
        print(f"interrupted ({result['reason']}): no results written", file=sys.stderr)
        return 1
    out = {"name": name, "recipe": f"recipes/{args.recipe}.toml", "overrides": args.overrides,
           "seed": cfg.seed, "steps": result["step"], "stopped_by": result["reason"],
           "max_tokens": result["max_tokens"],  # after short_budget: the batches the run ended with
           "train_wall_minutes": round(wall / 60, 2), "processes": args.members or dist.world_size,
           "machine": machine(), "commit": commit, "command": command_line(),
           "config": to_dict(cfg)}  # fmt: skip
    if args.members:
        out["members"] = trained
    out["parameters"] = count_parameters(load_model(member_dirs(run_dir)[0] if args.members else run_dir))
    write_json(run_dir / TRAINING_FILE, out)  # for --evaluate-only, should the evaluation fail
    if cfg.task == "lm":
        valid = [r for r in read_metrics(run_dir) if r.get("split") == "valid"]
        out["valid_loss"] = round(valid[-1]["loss"], 4)
        out["best_valid_loss"] = round(min(r["loss"] for r in valid), 4)
    else:
        out.update(evaluate_translation(run_dir, cfg, args))
    out["end_to_end_minutes"] = round((time.perf_counter() - started) / 60, 2)  # tokenizer to test score
    write_results(name, run_dir, results, out)
    return 0


def evaluate_again(
    name: str, run_dir: Path, results: Path, cfg, args: argparse.Namespace, commit: str
) -> int:
    """``--evaluate-only``: the run directory's training figures (``training.json``, written by the
    run whose checkpoints are there) with a new evaluation; an earlier evaluation of that same run
    (``results/NAME.json`` with its commit, steps and minutes) is kept under ``previous_evaluation``.
    ``results/NAME.json`` of another run (a committed figure that this run's directory replaced) is
    not read. Without ``training.json`` (runs from before it was written): ``results/NAME.json``."""
    first = (member_dirs(run_dir) or [run_dir])[0]
    training, earlier = run_dir / TRAINING_FILE, results / f"{name}.json"
    path = training if training.is_file() else earlier
    if cfg.task != "translation" or not (first / "best").is_dir() or not path.is_file():
        print(f"--evaluate-only needs a translation run's {first}/best and {path}: run the command "
              "without --evaluate-only first", file=sys.stderr)  # fmt: skip
        return 2
    old = json.loads(path.read_text())
    if path == training and earlier.is_file():
        before = json.loads(earlier.read_text())
        if all(before.get(k) == old.get(k) for k in ("commit", "steps", "train_wall_minutes")):  # this run's
            kept = (*EVALUATION_FIELDS, "previous_evaluation")
            old = {**old, **{k: before[k] for k in kept if k in before}}
    out = {k: v for k, v in old.items() if k not in (*EVALUATION_FIELDS, "previous_evaluation")}
    if any(k in old for k in EVALUATION_FIELDS):
        out["previous_evaluation"] = {k: old[k] for k in EVALUATION_FIELDS if k in old}
    out.update(evaluate_translation(run_dir, cfg, args))
    out["evaluation_commit"], out["evaluation_machine"] = commit, machine()
    out["end_to_end_minutes"] = round(old["train_wall_minutes"] + out["evaluation_minutes"], 2)
    out["note_evaluate_only"] = (
        "evaluated again with --evaluate-only: training figures (steps, train_wall_minutes, commit, "
        "machine) are the earlier run's; end_to_end_minutes = its training time + this evaluation"
    )
    write_results(name, run_dir, results, out)
    return 0


def write_results(name: str, run_dir: Path, results: Path, out: dict) -> None:
    results.mkdir(exist_ok=True)
    for d in member_dirs(run_dir) or [run_dir]:  # results/NAME[-member-K]-{loss,lr,bleu}.png
        prefix = f"{name}-{d.name}" if d != run_dir else name
        for png in plot_curves(d, d / "plots"):
            write_bytes(results / f"{prefix}-{png.name}", png.read_bytes())
    write_json(results / f"{name}.json", out)
    print(json.dumps({k: v for k, v in out.items() if k != "config"}, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AiaynError as e:  # a recipe, override, dataset or run directory that is wrong: one line
        sys.exit(f"{Path(__file__).name}: error: {e}")
