"""Does the bidirectional model (``model.bidirectional=true``) beat the plain one on Multi30k?

Each arm is ``scripts/reproduce.py`` (train, average the last checkpoints, choose on validation,
test2016 with beam 5, sacreBLEU cased and lowercased) under the same short budget — the settings of
``make demo`` (inverse-√ schedule, 1,000 warm-up updates) at ``--minutes`` of training, both cores —
one arm at a time, so that every arm gets the same machine:

- equal time: plain vs bidirectional (its memory in training teacher-forced on the reference, or the
  right-to-left decoder's own greedy translation: ``r2l_memory_from``), de→en and en→de, seeds from
  ``--seeds``;
- equal updates: the bidirectional model trained for as many updates as the plain de→en seed-1 run
  made in its budget (no clock);
- the cheap classic: a plain right-to-left model (``reverse_target=true``) in the same budget, whose
  scores rerank the plain de→en model's beam (``aiayn translate --rerank-with``).

Results (each arm's reproduce.py JSON and curves) go to ``results/bidirectional/``, the summary to
``results/bidirectional-training.json`` (which keeps the arms earlier invocations recorded). Arms
already there are not run again (delete to redo).

    python benchmarks/bidirectional_training.py                 # 10 minutes an arm, ~90 minutes in all
    python benchmarks/bidirectional_training.py --minutes 5 --seeds 1
    python benchmarks/bidirectional_training.py --seeds 1 2 --kinds plain bidirectional-greedy
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiayn.atomic import write_json  # noqa: E402
from aiayn.cli.demo import machine  # noqa: E402

OUT = ROOT / "results" / "bidirectional"
DEMO = ["schedule=inverse_sqrt", "horizon=steps", "warmup=1000", "eval_every=1000", "eval_max_sentences=300"]
ARMS = {  # kind -> overrides, run at equal time in each direction
    "plain": [],
    "bidirectional": ["model.bidirectional=true", "r2l_memory_from=reference"],  # teacher-forced memory
    "bidirectional-greedy": ["model.bidirectional=true", "r2l_memory_from=greedy"],  # the default
}


def run_name(recipe: str, overrides: list[str]) -> str:
    """reproduce.py's name of a run (results/NAME.json, runs/reproduce-NAME)."""
    return recipe + "".join(f"-{o.replace('=', '')}" for o in overrides)


def arm(name: str, recipe: str, overrides: list[str]) -> dict:
    """Run one arm through reproduce.py (unless its result is already there) and return its JSON."""
    target = OUT / f"{name}.json"
    if target.is_file():
        return json.loads(target.read_text())
    cmd = [sys.executable, str(ROOT / "scripts" / "reproduce.py"), recipe, *overrides]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    produced = run_name(recipe, overrides)
    OUT.mkdir(parents=True, exist_ok=True)
    for f in (ROOT / "results").glob(f"{produced}*"):
        shutil.move(str(f), OUT / f.name.replace(produced, name))
    return json.loads(target.read_text())


def figures(r: dict) -> dict:
    return {"bleu": r["test"]["bleu"], "bleu_lc": r["test"]["bleu_lc"], "updates": r["steps"],
            "train_wall_minutes": r["train_wall_minutes"], "chosen": r["chosen"],
            "valid_bleu": r["valid_bleu"][r["chosen"]],
            "machine": r["machine"], "commit": r["commit"]}  # fmt: skip


def chosen_dir(recipe: str, overrides: list[str], result: dict) -> Path:
    """The checkpoint reproduce.py chose on validation (its run directory's best or averaged)."""
    return ROOT / "runs" / f"reproduce-{run_name(recipe, overrides)}" / result["chosen"]


def rerank_bleu(plain: Path, r2l: Path, beam: int = 5, lenpen: float = 0.6) -> dict:
    """test2016 BLEU of the plain model's beam, n-best reranked by L2R + R2L scores."""
    import dataclasses

    from aiayn.cli.evaluate import score
    from aiayn.data.corpus import load_parallel
    from aiayn.decoding.options import SearchConfig
    from aiayn.decoding.rerank import rerank
    from aiayn.decoding.translator import Translator

    forward, backward = Translator.from_dir(plain), Translator.from_dir(r2l)
    srcs, refs = (list(side) for side in zip(*load_parallel("multi30k", "test", "de", "en")))
    sources, _ = forward.encode(srcs)
    config = SearchConfig(beam=beam, lenpen=lenpen)
    nbest = forward.search(sources, dataclasses.replace(config, nbest=beam))
    best = [hyps[0] for hyps in rerank(forward, backward, sources, nbest, config)]
    scores, _ = score([forward.detokenize(h) for h in best], refs)
    return {"bleu": scores["bleu"], "bleu_lc": scores["bleu_lc"], "beam": beam}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="training budget of every arm")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="seeds of the de→en arms")
    ap.add_argument("--en-de-seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--kinds", nargs="+", default=list(ARMS), choices=list(ARMS), help="arms to run")
    ap.add_argument("--skip", nargs="*", default=[], choices=["equal-updates", "rerank"])
    args = ap.parse_args()
    budget = [f"max_minutes={args.minutes:g}", *DEMO]
    summary = {"machine": machine(), "budget_minutes": args.minutes, "settings": DEMO, "arms": {}}
    previous = ROOT / "results" / "bidirectional-training.json"
    if previous.is_file():  # arms recorded by earlier invocations stay in the summary
        before = json.loads(previous.read_text())
        summary.update({k: before[k] for k in ("arms", "rerank") if k in before})

    def save() -> None:
        write_json(ROOT / "results" / "bidirectional-training.json", summary)  # temp file + rename

    def record(name: str, recipe: str, overrides: list[str]) -> dict:
        summary["arms"][name] = {
            "recipe": recipe,
            "overrides": overrides,
            **figures(arm(name, recipe, overrides)),
        }
        save()
        print(name, summary["arms"][name], flush=True)
        return summary["arms"][name]

    for direction, seeds in (
        ("de-en", args.seeds[:1]),
        ("en-de", args.en_de_seeds),
        ("de-en", args.seeds[1:]),
    ):
        for seed in seeds:
            for kind, extra in ARMS.items():
                if kind not in args.kinds:
                    continue
                record(
                    f"{direction}-{kind}-seed{seed}",
                    f"multi30k-{direction}",
                    [*budget, f"seed={seed}", *extra],
                )
    for kind in args.kinds if "equal-updates" not in args.skip else ():
        if kind == "plain":
            continue
        plain = summary["arms"].get(f"de-en-plain-seed{args.seeds[0]}")
        if plain is None:
            sys.exit("the equal-updates arms need the plain de→en arm: add 'plain' to --kinds")
        steps = plain["updates"]
        record(
            f"de-en-{kind}-seed{args.seeds[0]}-{steps}-updates",
            "multi30k-de-en",
            [f"max_steps={steps}", "max_minutes=0", *DEMO, f"seed={args.seeds[0]}", *ARMS[kind]],
        )
    if "rerank" not in args.skip:
        seed = f"seed={args.seeds[0]}"
        r2l_overrides = [*budget, seed, "reverse_target=true"]
        r2l_arm = record(f"de-en-r2l-seed{args.seeds[0]}", "multi30k-de-en", r2l_overrides)
        plain_arm = summary["arms"][f"de-en-plain-seed{args.seeds[0]}"]
        plain = chosen_dir("multi30k-de-en", [*budget, seed], plain_arm)
        r2l = chosen_dir("multi30k-de-en", r2l_overrides, r2l_arm)
        summary["rerank"] = {"plain": str(plain.relative_to(ROOT)), "r2l": str(r2l.relative_to(ROOT)),
                             **rerank_bleu(plain, r2l)}  # fmt: skip
        save()
        print("rerank", summary["rerank"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
