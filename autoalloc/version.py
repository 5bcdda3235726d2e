"""autoalloc's version, in a leaf of its own: the package's face, the CLI, doctor and the
build (``[tool.hatch.version]``) read it here."""

__version__ = "0.1.0"
