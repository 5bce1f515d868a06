__version__ = "0.1.0"


def load(paths):
    """Load one or many result directories into a pandas DataFrame."""
    from commbench.store.results import load as _load

    return _load(paths)
