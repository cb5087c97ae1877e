"""conveyor's version, as its package metadata gives it."""

from importlib import metadata

try:
    __version__ = metadata.version("conveyor")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
