"""Finetuning: recipes (validated YAML), the accelerate training loop, atomic checkpoints."""

from .loop import Interrupt, evaluate_loss, finetune, heldout_loss
from .recipe import Recipe, RecipeError, load_recipe, save_resolved

__all__ = ["Interrupt", "Recipe", "RecipeError", "evaluate_loss", "finetune", "heldout_loss", "load_recipe",
           "save_resolved"]
