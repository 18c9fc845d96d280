"""Where checkpoints live: a local path or an fsspec URL (``s3://bucket/run``, ``gs://...``), one way to reach both.

A location is a ``str`` or a :class:`~pathlib.Path`. Local locations stay :class:`~pathlib.Path` through
:func:`child`, so the callers that read them keep their paths; a URL stays a ``str``. Reading and writing go
through fsspec's filesystem for the location (its local filesystem for paths), whose credentials and endpoint come
from the environment as that filesystem documents it (for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
and ``FSSPEC_S3_ENDPOINT_URL`` for a store other than AWS's); on a cluster, set them on every node before
``ray start``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

__all__ = ["Location", "absolute", "child", "filesystem", "fs_path", "is_url", "read_text", "write_text"]

Location = str | Path

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_url(location: Location) -> bool:
    """Whether ``location`` names a filesystem by URL (``s3://...``) rather than a local path."""
    return isinstance(location, str) and bool(_URL.match(location))


def child(location: Location, *names: str) -> Location:
    """``location/name/...``: a :class:`~pathlib.Path` for a local location, a URL for a URL."""
    if is_url(location):
        return "/".join([str(location).rstrip("/"), *names])
    return Path(location).joinpath(*names)


def absolute(location: Location) -> Location:
    """A URL as it is; a local path resolved (what logs and errors name)."""
    return location if is_url(location) else Path(location).resolve()


def filesystem(location: Location) -> tuple[Any, str]:
    """fsspec's filesystem for ``location`` and the location's path on it."""
    from fsspec.core import url_to_fs  # noqa: PLC0415 - fsspec comes with torch; imported where needed

    return url_to_fs(str(location))


def fs_path(location: Location) -> str:
    """``location``'s path on its fsspec filesystem."""
    return filesystem(location)[1]


def read_text(location: Location) -> str:
    fs, path = filesystem(location)
    return fs.cat_file(path).decode()


def write_text(location: Location, text: str) -> None:
    fs, path = filesystem(location)
    fs.pipe_file(path, text.encode())
