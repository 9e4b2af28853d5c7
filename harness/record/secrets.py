"""Recognise credentials so that none is ever written, in any redaction mode.

Two nets: field/header *names* that carry credentials (Authorization, cookies, api-key, ...) are dropped
whole, and string *values* shaped like well-known key formats (Bearer tokens, sk-..., AKIA..., ...) are
replaced by `[redacted]` wherever text is kept (prompts, messages, params, session/tenant ids).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"

_SECRET_NAME = re.compile(
    r"(^|_)(authorization|auth|cookie|set_cookie|password|passwd|secret|credentials?|bearer|signature)(_|$)"
    r"|api_?key|subscription_key|private_key|secret_key|access_key"
    r"|(^|_)(access|refresh|id|auth|session|bearer|security|csrf|xsrf)_token$|^token$"
)
_SECRET_VALUE = re.compile(
    r"\b(?:Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\bsk-[A-Za-z0-9_-]{16,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bhf_[A-Za-z0-9]{30,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
)


def is_secret_name(name: str) -> bool:
    """True for header or body-field names that carry credentials (case and '-'/'_' insensitive)."""
    return bool(_SECRET_NAME.search(name.lower().replace("-", "_")))


def scrub_text(text: str) -> str:
    """`text` with every credential-shaped substring replaced by `[redacted]`."""
    return _SECRET_VALUE.sub(REDACTED, text)


def scrub(value: Any) -> Any:
    """A copy of a JSON value without credential-named keys and with credential-shaped strings redacted."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if not is_secret_name(str(k))}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return scrub_text(value)
    return value
