"""Logging for every treemail process: readable lines by default, one JSON object per line on request.

``--log-format json`` (or TREEMAIL_LOG_FORMAT=json) is for log shippers
(Loki, Elasticsearch, CloudWatch): each record is one line with ``ts``,
``level``, ``logger`` and ``message``, and ``exc`` when there is a
traceback, so a multi-line traceback never splits into several records.
TREEMAIL_LOG sets the level (WARNING by default).
"""

import json
import logging
import os
import sys
from datetime import datetime, timezone

FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup(log_format: str | None = None) -> None:
    """``log_format`` from --log-format (already checked), else TREEMAIL_LOG_FORMAT.

    A bad environment value falls back with a warning instead of failing:
    it is read before any subcommand, and must not break ``--help`` or a
    command that logs nothing.
    """
    problems = []
    chosen = (log_format or os.environ.get("TREEMAIL_LOG_FORMAT") or "text").lower()
    if chosen not in FORMATS:
        problems.append(f"TREEMAIL_LOG_FORMAT={chosen!r} is not text or json; using text")
        chosen = "text"
    level = (os.environ.get("TREEMAIL_LOG") or "WARNING").upper()
    if not isinstance(logging.getLevelName(level), int):
        problems.append(f"TREEMAIL_LOG={level!r} is not a log level (DEBUG, INFO, WARNING, ERROR); using WARNING")
        level = "WARNING"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for problem in problems:
        logging.getLogger("treemail").warning(problem)
