"""``python -m loopd_dev.fakes.llama --uds PATH | --port N``: the fake as a process.

It writes one line, ``listening on <url or path>``, once it accepts connections, and runs until
it is signalled or told to die over ``POST /_fake/die``.
"""

import argparse
import sys
from collections.abc import Sequence

import anyio

from .engine import Pace
from .render import TemplateOptions
from .server import serve_fake_llama
from .state import FakeLlama, ModelSpec


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m loopd_dev.fakes.llama", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--uds", help="listen on this Unix socket path")
    where.add_argument("--port", type=int, help="listen on this loopback TCP port (0: any)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--model", action="append", default=[], help="model id to serve (repeatable)"
    )
    parser.add_argument("--single", action="store_true", help="single-model mode, not router")
    parser.add_argument("--slots", type=int, default=2, help="slots per model")
    parser.add_argument("--ctx-size", type=int, default=8192, help="context per slot")
    parser.add_argument("--tokens-per-second", type=float, default=None)
    parser.add_argument("--prompt-tokens-per-second", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--sse-ping-interval", type=float, default=30)
    parser.add_argument(
        "--drop-past-reasoning",
        action="store_true",
        help="render reasoning only after the last user message, as some templates do",
    )
    return parser.parse_args(argv)


def build_fake(args: argparse.Namespace) -> FakeLlama:
    template = TemplateOptions(drop_past_reasoning=args.drop_past_reasoning)
    names = args.model or ["fake-model"]
    specs = [ModelSpec(n, args.slots, args.ctx_size, template) for n in names]
    pace = Pace(args.tokens_per_second, args.prompt_tokens_per_second, args.batch_size)
    return FakeLlama(
        specs, router=not args.single, pace=pace, sse_ping_interval=args.sse_ping_interval
    )


async def run(args: argparse.Namespace) -> None:
    fake = build_fake(args)
    port = None if args.uds else args.port
    async with serve_fake_llama(fake, uds=args.uds, host=args.host, port=port or 0) as running:
        sys.stdout.write(f"listening on {args.uds or running.base_url}\n")
        sys.stdout.flush()
        await running.wait_dead()


def main(argv: Sequence[str] | None = None) -> None:
    anyio.run(run, parse_args(argv))


if __name__ == "__main__":
    main()
