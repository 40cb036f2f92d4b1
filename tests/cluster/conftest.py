"""Every log line of these tests is checked for secrets (tests/support/log_secrets.py)."""

from tests.support.log_secrets import logs_hold_no_secret  # noqa: F401  (autouse)
