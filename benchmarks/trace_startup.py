"""Where a t2r command's time goes before it gets going: runs the command line in this process while a
watchdog writes every thread's Python stack to a file every few seconds (faulthandler), and prints
torch.compile's per-phase compile times at exit. Read the stacks in order: long runs of the same frame are the
start-up's parts (tokenising, ranking, compiling a kernel, autotuning).

    python benchmarks/trace_startup.py --every 15 --for 300 --stacks stacks.txt -- finetune --config R.yaml
    accelerate launch --config_file recipes/accelerate/fsdp2-2gpu.yaml benchmarks/trace_startup.py \
        --stacks 'stacks-{rank}.txt' -- finetune --config R.yaml       # one file a process ($RANK)
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import os
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=15.0, help="seconds between stack dumps")
    parser.add_argument("--for", dest="duration", type=float, default=300.0, help="stop dumping after this long")
    parser.add_argument("--stacks", required=True,
                        help="file the stacks are appended to; {rank} in it becomes the process's $RANK")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the t2r command line")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    stacks = open(args.stacks.replace("{rank}", os.environ.get("RANK", "0")), "a", buffering=1)
    start = time.perf_counter()

    def dump() -> None:
        while time.perf_counter() - start < args.duration:
            time.sleep(args.every)
            stacks.write(f"\n===== {time.perf_counter() - start:.0f} s =====\n")
            faulthandler.dump_traceback(stacks, all_threads=True)

    threading.Thread(target=dump, daemon=True).start()

    def compile_times() -> None:
        try:
            from torch._dynamo.utils import compile_times as times

            print(f"[trace_startup] {time.perf_counter() - start:.1f} s; torch.compile times:\n"
                  f"{times(repr='str', aggregate=True)}", file=sys.stderr)
        except Exception as error:  # the report must never hide the command's own exit
            print(f"[trace_startup] no compile times: {error}", file=sys.stderr)

    atexit.register(compile_times)
    # as the `t2r` script: `import t2r` then skips its eager imports, and the command line starts what it starts
    # before torch (the reader server) as it would; under another argv[0] torch was imported first
    sys.argv = ["t2r", *command]
    from t2r.cli.app import main as t2r_main

    return t2r_main(command)


if __name__ == "__main__":
    sys.exit(main())
