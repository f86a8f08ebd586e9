"""Finetuning: recipes (validated YAML), the accelerate training loop, atomic checkpoints."""

from .loop import Interrupt, evaluate_loss, finetune
from .recipe import Recipe, RecipeError, load_recipe, save_resolved

__all__ = ["Interrupt", "Recipe", "RecipeError", "evaluate_loss", "finetune", "load_recipe", "save_resolved"]
