"""The built-in training tasks, one module each; importing this package registers them."""

from aiayn.training.tasks.classify import ClassifyTask
from aiayn.training.tasks.clm import CLMTask
from aiayn.training.tasks.lm import LMTask
from aiayn.training.tasks.mlm import MLMTask
from aiayn.training.tasks.rtd import RTDTask
from aiayn.training.tasks.translation import TranslationTask

__all__ = ["CLMTask", "ClassifyTask", "LMTask", "MLMTask", "RTDTask", "TranslationTask"]
