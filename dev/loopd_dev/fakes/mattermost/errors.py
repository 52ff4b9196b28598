"""The server's error shape: every failure the fake reports is an ``AppError``."""

from typing import Any


class AppError(Exception):
    """A Mattermost AppError: a stable ``id``, a message and the HTTP status it travels with."""

    def __init__(self, error_id: str, message: str, status_code: int, detailed: str = "") -> None:
        super().__init__(f"{status_code} {error_id}: {message}")
        self.error_id = error_id
        self.message = message
        self.status_code = status_code
        self.detailed = detailed

    def body(self, request_id: str) -> dict[str, Any]:
        """The JSON body the real server sends (``model.AppError``)."""
        return {
            "id": self.error_id,
            "message": self.message,
            "detailed_error": self.detailed,
            "request_id": request_id,
            "status_code": self.status_code,
        }


def not_found(what: str) -> AppError:
    return AppError(f"app.{what}.get.app_error", f"Unable to find the {what}.", 404)


def forbidden() -> AppError:
    return AppError(
        "api.context.permissions.app_error",
        "You do not have the appropriate permissions.",
        403,
    )


def unauthorized() -> AppError:
    return AppError(
        "api.context.session_expired.app_error",
        "Invalid or expired session, please login again.",
        401,
    )


def invalid_param(name: str) -> AppError:
    return AppError(
        "api.context.invalid_param.app_error",
        f"Invalid or missing {name} parameter in request URL or body.",
        400,
    )
