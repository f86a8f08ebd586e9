"""`t2r convert` and `t2r rank-layers`."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

from t2r import manifest
from t2r.cli import threads
from t2r.cli.common import default_device, dtype_arg
from t2r.cli.convert_flags import given_convert_settings, mixer_options, mixer_registry
from t2r.model_dir import CONVERSION_FILE
from t2r.paths import check_model_spec, offline_if_unreachable

CPU_RECIPE = "recipes/smollm2-gsa-cpu.yaml"


def convert_settings(args, command: str):
    """The `ConvertSettings` the flags of `command` ask for (defaults where left out), checked with the target's
    options before anything loads: a ValueError names a bad one."""
    from t2r.convert.settings import ConvertSettings

    settings = ConvertSettings(**given_convert_settings(args, command), options=mixer_options(args))
    settings.mixer_options()
    return settings


def run_convert(args) -> int:
    settings = convert_settings(args, "convert")
    check_model_spec(args.model)  # a missing local path: named at once, before torch loads
    check_output_dir(args.out, args.model, args.overwrite)
    offline_if_unreachable(args.model)
    threads.note()
    from t2r.convert import auto_softmax_count, calibrated_convert, conversion_report
    from t2r.data.config import DataConfig
    from t2r.model_dir import save_converted, staging_dir
    from t2r.sources import load_source

    source, tokenizer = load_source(args.model, dtype=dtype_arg(args.dtype), device=default_device(args.device))
    out = Path(args.out)
    tmp = staging_dir(out)  # written aside, then renamed: never a half-saved model in --out
    shutil.rmtree(tmp, ignore_errors=True)
    ranking_dir = tmp / "layer_ranking"
    model = calibrated_convert(source, tokenizer, settings.target, layers=settings.layers, init=settings.init,
                               data=DataConfig(path=settings.data) if settings.data else None,
                               rows=settings.calibration_rows, length=settings.calibration_length,
                               ranking_dir=ranking_dir, source=args.model, copy=False, rank_by=settings.rank_by,
                               rank_sweep=settings.rank_sweep, kept_window=settings.kept_window,
                               **settings.options)
    if auto_softmax_count(settings.layers) is not None:
        bounded = sorted(int(k) for k in model.config.t2r_layer_options or {})
        converted = [i for i, mixer in enumerate(model.config.t2r_mixers) if mixer != "softmax" and i not in bounded]
        kept = f", the kept layers {bounded} with window {settings.kept_window}" if bounded else ""
        print(f"{settings.layers}: converting layers {converted}{kept}; ranking in {ranking_dir.name}/")
    print(conversion_report(source, model))
    save_converted(model, tokenizer, out, source=args.model, target=settings.target, converted_by="t2r convert",
                   made_by=" ".join(["t2r", *sys.argv[1:]]), started=True)  # the ranking, already in tmp, stays
    print(f"saved to {out}")
    note = fresh_conversion_note(out)
    if note:
        print(note)
    return 0


def run_rank_layers(args) -> int:
    settings = convert_settings(args, "rank-layers")
    check_model_spec(args.model)
    offline_if_unreachable(args.model)
    threads.note()
    from t2r.convert import calibration_rows, rank_layers, recall_rows
    from t2r.data.config import DataConfig
    from t2r.sources import load_source

    source, tokenizer = load_source(args.model, dtype=dtype_arg(args.dtype), device=default_device(args.device))
    ids = calibration_rows(tokenizer, DataConfig(path=settings.data) if settings.data else None,
                           settings.calibration_rows, settings.calibration_length)
    recall = recall_rows(tokenizer, settings.calibration_rows) if settings.rank_by != "kl" else None
    ranking = rank_layers(source, settings.target, ids, recall=recall, criterion=settings.rank_by,
                          sweep=settings.rank_sweep, **settings.options)
    path = ranking.write(args.out, args.keep)
    print(ranking.table())
    if args.keep:
        print(f"keep as softmax: {ranking.most_sensitive(args.keep)}; convert: {ranking.converted_layers(args.keep)}")
    print(f"written to {path} and {path.with_suffix('.png')}")
    return 0


def fresh_conversion_note(directory) -> str | None:
    """What to know about a model directory that `t2r convert` wrote (its CONVERSION_FILE) and no finetuning
    has written over (`t2r finetune` saves its recipe.yaml next to the weights); None for any other model."""
    path = Path(directory).expanduser()
    if not path.is_dir() or not (path / CONVERSION_FILE).is_file() or (path / "recipe.yaml").is_file():
        return None
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    mixers = sorted(set(config.get("t2r_mixers") or []) - {"softmax"})
    if not mixers:
        return None
    run = f"{path.resolve().name}-finetune"  # runs/<it>: not the main job's run directory (runs/smollm2-gsa-cpu)
    finetune = (f"t2r finetune --config {CPU_RECIPE} {shlex.quote(f'model.source={directory}')} convert.target=none "
                f"convert.options={{}} {shlex.quote(f'name={run}')}")
    reasons = [starts_as_source(mixer, (config.get("t2r_options") or {}).get(mixer, {})) for mixer in mixers]
    if all(reasons):
        state = f"note: this model is freshly converted ({', '.join(mixers)}) and untrained: {'; '.join(reasons)}."
    else:
        state = (f"note: this model is freshly converted ({', '.join(mixers)}) and untrained: its new layers do not "
                 "compute softmax attention yet, so its text is nonsense until it is finetuned.")
    return (f"{state} Finetune it (the recipe's model.source is the converted directory; convert.target=none "
            f"trains it as it is; the run goes to runs/{run}) with:\n  {finetune}")


def starts_as_source(mixer: str, saved_options: dict) -> str | None:
    """Why a fresh `mixer` layer with these saved options computes what the source did (its options class says,
    `MixerOptions.starts_as_source`), or None."""
    spec = mixer_registry().MIXERS.get(mixer)
    try:
        return spec.options_from_config(saved_options).starts_as_source() if spec is not None else None
    except (TypeError, ValueError):  # options this t2r does not read: no claim either way
        return None


def check_output_dir(out: str, model: str, overwrite: bool) -> None:
    """ValueError unless `out` may receive a converted model: not a file, not the source model's directory,
    and (unless `overwrite`, which replaces the directory) empty or absent."""
    path = Path(out).expanduser()
    if path.is_file():
        raise ValueError(f"--out {out!r} is a file; give a directory for the converted model")
    source = Path(model).expanduser()
    source_dir = source.parent if source.is_file() else source
    if source_dir.exists() and path.exists() and path.resolve() == source_dir.resolve():
        raise ValueError(f"--out {out!r} is the source model's directory: converting into it would overwrite the "
                         "model being converted; choose another --out")
    held = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    if held and not overwrite:
        raise ValueError(f"--out {out!r} is not empty ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}); "
                         "pass --overwrite to replace the model t2r wrote there, or choose another --out")
    foreign = foreign_entries(path) if held else []
    if foreign:
        raise ValueError(f"--out {out!r} holds files t2r did not write ({', '.join(foreign[:4])}"
                         f"{', ...' if len(foreign) > 4 else ''}): --overwrite replaces only a model t2r wrote; move "
                         "them away or choose another --out")


SAVED_BY_T2R = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", CONVERSION_FILE)
"""What `t2r convert` wrote before its directories carried a manifest (besides weight shards and layer_ranking/)."""


def foreign_entries(path: Path) -> list[str]:
    """The files and folders under `path` that t2r did not write there, by name (`photos/` for a folder of them):
    all but those its manifest lists, or, for a conversion written before manifests, its known names."""
    try:
        listed = manifest.read(path)
    except ValueError:
        listed = None
    files = [p.relative_to(path) for p in path.rglob("*") if p.is_file() or p.is_symlink()]
    if listed is not None:
        ours = lambda name: str(name) in listed or str(name) == manifest.MANIFEST  # noqa: E731
    elif (path / CONVERSION_FILE).is_file():
        ours = lambda name: (str(name) in SAVED_BY_T2R or name.parts[0] == "layer_ranking"  # noqa: E731
                             or (len(name.parts) == 1 and name.match("model-*-of-*.safetensors")))
    else:
        ours = lambda name: False  # noqa: E731
    found = {name.parts[0] + ("/" if len(name.parts) > 1 else "") for name in files if not ours(name)}
    found |= {p.name + "/" for p in path.iterdir() if p.is_dir() and not any(p.iterdir())}  # empty folders
    return sorted(found)
