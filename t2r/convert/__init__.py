"""Conversion and its calibration: swap softmax attention for a recurrent mixer (`convert`), after measuring on
the source what the settings ask for (`calibrated_convert`): which layers stay softmax (`layers="auto:N"`,
`t2r.convert.sensitivity`) and where the new forget gates start (`init="teacher"`, `t2r.convert.lookback`).
`t2r.convert.layer_spec` is the grammar of a `layers` spec.
The names load on first use (`t2r.lazy`): `t2r.convert.layer_spec` (what recipes check) imports no torch.
"""

import sys
import types

from t2r.lazy import lazy_exports

_EXPORTS = {
    "calibrated_convert": ".calibration", "calibration_rows": ".calibration", "recall_rows": ".calibration",
    "resolve_layers": ".calibration", "teacher_lookback": ".calibration", "ConversionReport": ".conversion",
    "check_convertible": ".conversion", "conversion_report": ".conversion", "convert": ".conversion",
    "count_parameters": ".conversion", "quiet_loading": ".conversion", "t2r_config": ".conversion",
    "auto_softmax_count": ".layer_spec", "check_layer_spec": ".layer_spec", "compact_ranges": ".layer_spec",
    "parse_layers": ".layer_spec", "attention_lookback": ".lookback", "LayerRanking": ".sensitivity",
    "kl_to_reference": ".sensitivity", "rank_layers": ".sensitivity",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)


class _CallablePackage(types.ModuleType):
    """Importing a submodule (`t2r.convert.settings`, read by `t2r convert --help`) binds `t2r.convert` to this
    package, over the function `t2r.convert` that `t2r/__init__` loads on first use: calling the package calls
    the function, so `t2r.convert(model, "gsa")` works either way."""

    def __call__(self, *args, **kwargs):
        return self.convert(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
