"""Credentials kept out of what txlog shows: error messages, reprs, log records, and root
URLs (which all of these show)."""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

from ..errors import StorageError

# Option names whose values are credentials, in fsspec backends' spellings
# (s3fs key/secret/token, botocore aws_*, adlfs account_key/sas_token/
# connection_string/client_secret, gcsfs token): matched on the last word.
_SECRET_NAME = re.compile(r"(secret|token|password|passwd|key|credentials?|sas|signature|"
                          r"connection_string|key_id)$", re.IGNORECASE)
# The same credentials when they come from the environment instead.
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
               "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET")
MIN_SECRET_LENGTH = 4  # shorter values would be scrubbed out of ordinary words
REDACTED = "***"
_secrets: set[str] = set()
_secrets_longest_first: tuple[str, ...] = ()  # replaced whole, so readers need no lock
_secrets_lock = threading.Lock()
_scrubber_installed = False


def is_secret_option(name: str) -> bool:
    """Whether a storage option's value is a credential, to be shown as ``***``."""
    return bool(_SECRET_NAME.search(str(name)))


def _secret_values(options: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(options, dict):
        for name, value in options.items():
            if isinstance(value, dict):
                found |= _secret_values(value)
            elif is_secret_option(name) and isinstance(value, str):
                found.add(value)
    return found


def redact(text: str) -> str:
    """``text`` with every credential this process has been given replaced by ``***``.

    Store clients put credentials into text txlog does not write itself:
    botocore's debug log prints signed request headers (the access key id,
    the session token), and a server's error message may echo a request.
    """
    for secret in _secrets_longest_first:
        text = text.replace(secret, REDACTED)
    return text


def redacted_options(options: Any) -> Any:
    """Storage options fit to show: credential values replaced by ``***``."""
    if isinstance(options, dict):
        return {name: redacted_options(value) if isinstance(value, dict)
                else REDACTED if is_secret_option(name) else value
                for name, value in options.items()}
    return options


def register_secrets(storage_options: dict[str, Any] | None) -> None:
    """Remember the credentials among ``storage_options`` (and the environment's).

    From then on every log record of this process has them scrubbed, and so
    do txlog's storage errors.  A process-wide log-record factory is the one
    place that sees the records of every logger (botocore's included) before
    any handler formats them; it is installed only once a credential is known.
    """
    global _scrubber_installed, _secrets_longest_first
    values = _secret_values(storage_options or {})
    values |= {os.environ[name] for name in _SECRET_ENV if os.environ.get(name)}
    values = {v for v in values if len(v) >= MIN_SECRET_LENGTH}
    with _secrets_lock:
        if values <= _secrets:
            return
        _secrets.update(values)
        _secrets_longest_first = tuple(sorted(_secrets, key=len, reverse=True))
        if _scrubber_installed:
            return
        _scrubber_installed = True
        previous = logging.getLogRecordFactory()

        def scrubbing_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            try:
                message = record.getMessage()
            except Exception:  # a broken format string is logging's to report
                return record
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, None
            if record.exc_info and record.exc_info[0] is not None:
                text = logging.Formatter().formatException(record.exc_info)
                if redact(text) != text:
                    record.exc_text = redact(text)
            return record

        logging.setLogRecordFactory(scrubbing_factory)


_USERINFO = re.compile(r"^[a-z0-9+.-]+://[^/@]*:[^/@]*@", re.IGNORECASE)


def refuse_credentials_in_url(url: str, scheme: str) -> None:
    """The root URL is shown in errors, reprs and logs; a password inside it would be too."""
    if _USERINFO.match(url):
        raise StorageError(
            f"{scheme}:// root: credentials inside the URL (user:password@) are refused; "
            "pass them as storage_options or through the backend's environment variables")
