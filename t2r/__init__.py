"""t2r: turn pretrained Transformers (Llama, Mistral, Qwen2) into linear-time RNNs.

`import t2r` registers the converted model types with transformers' Auto classes, so a converted
model saved with `save_pretrained` loads back through `AutoModelForCausalLM.from_pretrained(dir)`.
"""

from t2r import ops
from t2r.convert import ConversionReport, conversion_report, convert, t2r_config
from t2r.layers import MIXERS, MixerOptions
from t2r.models import ARCHITECTURES, T2RCache

__version__ = "0.1.0"

__all__ = [
    "ARCHITECTURES", "ConversionReport", "MIXERS", "MixerOptions", "T2RCache",
    "conversion_report", "convert", "ops", "t2r_config",
]
