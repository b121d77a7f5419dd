"""Where a user finds the documentation and how they install an extra, for messages.

Help texts, error hints and report footers name documentation by URL, never by a
repository path (``docs/...``) that an installed user does not have, and give an install
line that works today: the package is not published on a registry yet, so the line
installs it from its Git repository. Both the training side and the processor
(``goodput_processor``) take them from here; ``tests/cli/test_cli.py`` checks the URLs
against ``pyproject.toml``'s ``[project.urls]`` and the files under ``docs/``.
"""

from __future__ import annotations

import re

__all__ = ["DOCS_URL", "REPO_URL", "doc_url", "install_hint"]

#: The repository (``[project.urls] Homepage`` in ``pyproject.toml``).
REPO_URL = "https://github.com/goodput-otel/goodput-otel"
#: The documentation folder (``[project.urls] Documentation`` in ``pyproject.toml``).
DOCS_URL = REPO_URL + "/tree/main/docs"


def doc_url(page: str, section: str | None = None) -> str:
    """The URL of a documentation page, e.g. ``doc_url("accounting.md", "Warnings")``.

    ``page`` is a path under ``docs/`` (``"definitions.md"``,
    ``"instrumentation/pytorch.md"``); ``section`` a heading of that page, turned into
    GitHub's anchor (lower case, punctuation dropped, spaces as hyphens). Returns a
    string; raises nothing.
    """
    url = f"{DOCS_URL}/{page.lstrip('/')}"
    if section:
        anchor = re.sub(r"[^\w\- ]", "", section.strip().lower()).replace(" ", "-")
        url += "#" + anchor
    return url


def install_hint(extras: str) -> str:
    """The command that installs the package with ``extras`` (``"serve"``,
    ``"serve,prometheus"``), from the Git repository, and from a clone.

    Returns a string such as ``pip install 'goodput-otel[serve]@git+https://...'
    (or, in a clone of it: pip install '.[serve]')`` (no space around the ``@``, so that a
    help text wrapped at spaces keeps the requirement whole); raises nothing.
    """
    return (f"pip install 'goodput-otel[{extras}]@git+{REPO_URL}' "
            f"(or, in a clone of it: pip install '.[{extras}]')")
