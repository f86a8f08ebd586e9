"""lm-eval's own command line with t2r's converted model types registered.

    python -m t2r.lm_eval --model hf --model_args pretrained=CONVERTED_DIR,max_length=2048 --tasks hellaswag
    python -m t2r.lm_eval run ... | ls tasks | validate --tasks ...

lm-eval has no plugin hook for model code, so `--model hf` cannot load a `t2r_llama` checkpoint by itself;
this imports t2r (which registers the types with transformers' Auto classes) and then runs lm-eval's CLI on
the same arguments. `accelerate launch -m t2r.lm_eval ...` runs it data-parallel.
"""

from __future__ import annotations

import sys


def main() -> None:
    import t2r  # noqa: F401  (registers the converted model types with AutoConfig/AutoModelForCausalLM)

    try:
        from lm_eval.__main__ import cli_evaluate  # absolute import: the installed lm-eval, not this module
    except ImportError as err:
        raise SystemExit(f"lm-eval is not installed ({err}): pip install -e .[eval]") from err
    cli_evaluate()


if __name__ == "__main__":
    sys.exit(main())
