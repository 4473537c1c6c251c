"""The client half of the ``better-compute`` command: it talks to a running service over HTTP.

- :mod:`app.client.api`: the HTTP client (``ServiceClient``), paging, and the two client-side errors
  (an error answer of the service, an unreachable service);
- :mod:`app.client.flags`: reserve/preview flags -> the request body, and API field paths -> flags;
- :mod:`app.client.render`: ``-o table|wide|json|yaml`` output (tables by rich).

The commands are the ``*_commands`` modules here (shared pieces in :mod:`app.client.common`);
``app/cli.py`` registers them.
"""

from enum import StrEnum

# Exit codes of every client command (docs/cli.md); scripts tell "no" from an error by them.
EXIT_OK = 0  # done, or placed / would fit
EXIT_API_ERROR = 1  # the service answered an error, or could not be reached
EXIT_USAGE = 2  # the command line is wrong (click uses 2 for its own usage errors too)
EXIT_NOT_PLACED = 3  # reserve went pending (or is still queued); preview: it would not fit


class Output(StrEnum):
    """The ``-o`` choices of every client command (docs/cli.md, "Output")."""

    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
