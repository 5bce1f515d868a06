from commbench.store.load import load as _load

__version__ = "0.1.0"


def load(paths):
    """Load one or many result directories into a pandas DataFrame."""
    return _load(paths)
