"""Every log line of these tests is checked for secrets (tests/support/log_secrets.py)."""

from tests.support.log_secrets import (  # noqa: F401  (autouse)
    logs_hold_no_secret,
    session_logs_hold_no_secret,
)
