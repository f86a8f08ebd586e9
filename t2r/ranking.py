"""The names of the layer rankings (`t2r.convert.sensitivity` measures them), without torch: the command line
and recipes check them before anything heavy loads.

Criteria: `kl` (text KL), `recall` (MQAR answer loss), `halo` (recall over KL, capped), `kl+recall` (both,
each normalised by its mean). Sweeps: `convert-one` (each layer converted alone), `keep-one` (each layer kept
softmax with all others converted)."""

CRITERIA = ("kl", "recall", "halo", "kl+recall")
SWEEPS = ("convert-one", "keep-one")
