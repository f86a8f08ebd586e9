"""Conversion and its calibration: swap softmax attention for a recurrent mixer (`convert`), after measuring on
the source what the settings ask for (`calibrated_convert`): which layers stay softmax (`layers="auto:N"`,
`t2r.convert.sensitivity`) and where the new forget gates start (`init="teacher"`, `t2r.convert.lookback`).
`t2r.convert.layer_spec` is the grammar of a `layers` spec.
"""

from t2r.convert.calibration import calibrated_convert, calibration_rows, recall_rows, resolve_layers, teacher_lookback
from t2r.convert.conversion import (
    ConversionReport,
    check_convertible,
    conversion_report,
    convert,
    count_parameters,
    quiet_loading,
    t2r_config,
)
from t2r.convert.layer_spec import auto_softmax_count, check_layer_spec, compact_ranges, parse_layers
from t2r.convert.lookback import attention_lookback
from t2r.convert.sensitivity import LayerRanking, kl_to_reference, rank_layers

__all__ = [
    "ConversionReport", "LayerRanking", "attention_lookback", "auto_softmax_count", "calibrated_convert",
    "calibration_rows", "check_convertible", "check_layer_spec", "compact_ranges", "conversion_report", "convert",
    "count_parameters", "kl_to_reference", "parse_layers", "quiet_loading", "rank_layers", "recall_rows",
    "resolve_layers",
    "t2r_config", "teacher_lookback",
]
