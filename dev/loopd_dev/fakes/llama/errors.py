"""The server's error envelope, raised as one owned exception type.

Every handler raises :class:`ApiError`; the app turns it into
``{"error":{"code":..,"message":..,"type":..}}`` with the matching HTTP status, as the real
server does.
"""

from typing import Any

_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """An error answer: HTTP status, envelope type, message and any extra envelope keys."""

    def __init__(
        self, status: int, message: str, *, error_type: str | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or _TYPES_BY_STATUS.get(status, "server_error")
        self.extra = extra

    def envelope(self) -> dict[str, Any]:
        """The JSON body, key order as the real server writes it."""
        error: dict[str, Any] = {"code": self.status, "message": self.message}
        error["type"] = self.error_type
        error.update(self.extra)
        return {"error": error}


def invalid_request(message: str) -> ApiError:
    return ApiError(400, message)


def server_error(message: str) -> ApiError:
    return ApiError(500, message)


def loading_model() -> ApiError:
    return ApiError(503, "Loading model")


def not_found() -> ApiError:
    return ApiError(404, "File Not Found")


def exceed_context(n_prompt_tokens: int, n_ctx: int) -> ApiError:
    return ApiError(
        400,
        f"request ({n_prompt_tokens} tokens) exceeds the available context size "
        f"({n_ctx} tokens), try increasing it",
        error_type="exceed_context_size_error",
        n_prompt_tokens=n_prompt_tokens,
        n_ctx=n_ctx,
    )
