from importlib.metadata import version as _version

VERSION = _version("kvx")
