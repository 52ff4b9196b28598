"""``python -m loopd_dev.demo --port 8065``: the fake Mattermost with the demo's chat page at ``/``.

The fake's own options, and whom the page acts as. It prints the fake's JSON line, as
``python -m loopd_dev.fakes.mattermost`` does, and runs until interrupted.
"""

import contextlib
import sys

import anyio

from loopd_dev.demo.page import PageOptions, page_routes
from loopd_dev.fakes.mattermost.__main__ import parser, run


def main(argv: list[str] | None = None) -> None:
    options = parser("python -m loopd_dev.demo")
    options.add_argument("--person", default="alice", help="the user the page posts as")
    options.add_argument("--channel", default="dev", help="the channel the page shows")
    options.add_argument("--status-url", help="loopd's status page, linked from the page")
    args = options.parse_args(sys.argv[1:] if argv is None else argv)
    page = PageOptions(person=args.person, channel=args.channel, status_url=args.status_url)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run, args, page_routes(page))


if __name__ == "__main__":
    main()
