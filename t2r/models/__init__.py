"""Converted model classes, their configs and generation cache, registered with the transformers Auto classes.

The classes of every source are named by its adapter (`ARCHITECTURES`) and exported here by their names
(`T2RLlamaForCausalLM`, ...)."""

from t2r.models.architectures import (
    ARCHITECTURES,
    SourceAdapter,
    get_source,
    register_auto_classes,
    register_source,
    unregister_source,
)
from t2r.models.generation_cache import T2RCache

_CLASSES = {cls.__name__: cls for adapter in ARCHITECTURES.values() for cls in adapter.classes}
globals().update(_CLASSES)
for _adapter in ARCHITECTURES.values():
    register_auto_classes(_adapter)

__all__ = ["ARCHITECTURES", "SourceAdapter", "T2RCache", "get_source", "register_source", "unregister_source",
           *_CLASSES]
