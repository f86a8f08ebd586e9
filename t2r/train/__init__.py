"""Finetuning: recipes (validated YAML), the accelerate training loop, verified atomic checkpoints, and `t2r run`'s
finetune-then-evaluate (`finetune_and_evaluate`).

The names load on first use (`t2r.lazy`): importing the package imports no torch."""

from t2r.lazy import lazy_exports

_EXPORTS = {
    "heldout_loss": ".batches", "CheckpointError": ".errors",
    "CollapseError": ".errors", "NonFiniteError": ".errors", "RunDirError": ".errors", "RunError": ".errors",
    "Interrupt": ".finetuning", "finetune": ".finetuning",
    "RunResult": ".pipeline", "finetune_and_evaluate": ".pipeline",
    "Recipe": ".recipe", "RecipeError": ".recipe", "load_recipe": ".recipe", "save_resolved": ".recipe",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
