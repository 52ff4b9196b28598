"""A small ``multipart/form-data`` reader for ``POST /files`` (the stdlib's MIME parser does the
work; Starlette's own form parsing needs a package this project does not install)."""

from dataclasses import dataclass
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser


class MultipartError(ValueError):
    """The body is not the multipart form it claims to be."""


@dataclass(frozen=True)
class FormPart:
    name: str
    filename: str | None
    content_type: str
    content: bytes


def parse_form_data(content_type: str, body: bytes) -> list[FormPart]:
    """Split a ``multipart/form-data`` body into its parts, in order."""
    if (
        not content_type.lower().startswith("multipart/form-data")
        or "boundary=" not in content_type
    ):
        raise MultipartError(f"expected multipart/form-data with a boundary: {content_type!r}")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    if not isinstance(message, EmailMessage) or not message.is_multipart():
        raise MultipartError("the body has no parts")
    parts = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise MultipartError("a part has no name")
        payload = part.get_payload(decode=True)
        content = payload if isinstance(payload, bytes) else b""
        parts.append(FormPart(name, part.get_filename(), part.get_content_type(), content))
    return parts
