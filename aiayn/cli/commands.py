"""The subcommands of ``aiayn``: each one's module and its line in ``aiayn --help``.

A table of its own, without imports, so that ``aiayn --help`` lists the commands without importing
them (each imports torch: a second or two), and a command line imports only the module of the
command it names. Each module's ``add_parser`` takes its one-line help from here.
"""

# command → (module in aiayn.cli, one-line help), in the order ``aiayn --help`` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train", "train a model from a recipe"),
    "translate": ("translate", "translate text with a trained model"),
    "evaluate": (
        "evaluate",
        "score a model on a test set: a translation model (BLEU, chrF) or a classifier (accuracy)",
    ),
    "generate": ("generate", "sample text from a language model"),
    "classify": ("classify", "label text with a fine-tuned encoder"),
    "fill-mask": ("fill_mask", "predict the words at <mask> with a masked-LM encoder"),
    "attention": ("attention", "plot attention weights as heat-maps (PNG)"),
    "serve": ("serve", "serve models over HTTP (API + web page)"),
    "average": ("average", "average the last K checkpoints of a run"),
    "plot": ("plot", "plot a run's training curves"),
    "export": ("export", "write a model for Hugging Face transformers or CTranslate2"),
    "demo": ("demo", "train a small Multi30k de→en model for a few minutes, translate, score"),
}


def summary(command: str) -> str:
    """``command``'s line in ``aiayn --help``."""
    return COMMANDS[command][1]
