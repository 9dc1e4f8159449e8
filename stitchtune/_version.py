"""The package's version, in a module of its own: the modules that stamp it (compiled graphs, the CLI) import
it from here, not from the package's ``__init__`` (which imports :mod:`stitchtune.deploy.compiled` on demand:
the two would be an import circle). ``stitchtune.__version__`` is the same string."""

__version__ = "0.1.0"
