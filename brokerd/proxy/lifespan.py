"""A Starlette lifespan that closes a proxy's upstream client when its server stops."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from starlette.applications import Starlette


def closing_lifespan(
    aclose: Callable[[], Awaitable[None]],
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await aclose()

    return lifespan
