"""Finetuning: recipes (validated YAML), the accelerate training loop, verified atomic checkpoints."""

from .batches import evaluate_loss, heldout_loss
from .errors import CheckpointError, CollapseError, NonFiniteError, RunDirError, RunError
from .loop import Interrupt, finetune
from .recipe import Recipe, RecipeError, load_recipe, save_resolved

__all__ = ["CheckpointError", "CollapseError", "Interrupt", "NonFiniteError", "Recipe", "RecipeError", "RunDirError",
           "RunError", "evaluate_loss", "finetune", "heldout_loss", "load_recipe", "save_resolved"]
